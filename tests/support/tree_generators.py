"""Generators of the property tests on directory trees (hypothesis): random small trees
holding every kind the fidelity contract names, random edits made in a sandbox view, and the
checks the properties share (:func:`same`, :class:`Workdir`).

:data:`PROPERTY` bounds the examples of a normal run (``SANDBOX_HYPOTHESIS_EXAMPLES`` raises the
count) and keeps hypothesis's own storage out of the repository.
"""

from __future__ import annotations

import os
import shutil
import stat
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase

from sandbox_core.strategies.overlay import mount as _overlay_mount
from tests.support.fidelity_tree import bind_socket, differences, tree_state

EXAMPLES = int(os.environ.get("SANDBOX_HYPOTHESIS_EXAMPLES", "8"))
# Nothing of hypothesis's own storage (example database, constants cache) goes into the
# repository: all of it lives in the system temp dir.
HYPOTHESIS_HOME = os.path.join(tempfile.gettempdir(), "sandbox-core-hypothesis")
set_hypothesis_home_dir(HYPOTHESIS_HOME)
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # Kept outside the repository (and shared by runs on this machine).
    database=DirectoryBasedExampleDatabase(os.path.join(HYPOTHESIS_HOME, "examples")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

NAMES = [b"a", b"b.txt", b"caf\xe9", b"new\nline", b"s p"]
DIRS = [b"d", b"e\xff"]
MODES = [0o644, 0o600, 0o755, 0o4755, 0o2750, 0o640]
DIR_MODES = [0o755, 0o2775, 0o1777, 0o700]
OWNERS = [(0, 0), (1234, 1234), (0, 1234)]
KINDS = ["file", "sparse", "symlink", "fifo", "socket", "chardev", "blockdev", "hardlink"]
SPARSE_SIZE = 1 << 20


def acl(user_perm: int) -> bytes:
    """A ``system.posix_acl_access`` value: owner rw, named user 1234, group r, mask, other r."""
    entries = [(0x01, 6, 0xFFFFFFFF), (0x02, user_perm, 1234), (0x04, 4, 0xFFFFFFFF),
               (0x10, 4 | user_perm, 0xFFFFFFFF), (0x20, 4, 0xFFFFFFFF)]  # fmt: skip
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


# -- trees ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    rel: bytes
    kind: str
    mode: int
    owner: tuple[int, int]
    data: bytes = b""
    xattr: bytes | None = None
    acl_perm: int | None = None


DirSpec = tuple[bytes, int, tuple[int, int]]
TreeSpec = tuple[list[DirSpec], list[Node]]


@st.composite
def trees(draw: st.DrawFn) -> TreeSpec:
    """Directories (mode, owner; ``b""`` is the root) and nodes below the root or one of them."""
    dirs = draw(st.lists(st.sampled_from(DIRS), unique=True, max_size=2))
    dir_specs = [
        (d, draw(st.sampled_from(DIR_MODES)), draw(st.sampled_from(OWNERS))) for d in [b"", *dirs]
    ]
    nodes: list[Node] = []
    used: set[bytes] = set(dirs)
    for _ in range(draw(st.integers(1, 6))):
        parent = draw(st.sampled_from([b"", *dirs]))
        rel = os.path.join(parent, draw(st.sampled_from(NAMES))) if parent else draw(
            st.sampled_from(NAMES)
        )
        if rel in used:
            continue
        used.add(rel)
        kind = draw(st.sampled_from(KINDS))
        files = [n.rel for n in nodes if n.kind in ("file", "sparse")]
        if kind == "hardlink" and not files:
            kind = "file"
        nodes.append(
            Node(
                rel,
                kind,
                draw(st.sampled_from(MODES)),
                draw(st.sampled_from(OWNERS)),
                data=draw(st.sampled_from(files)) if kind == "hardlink" else draw(
                    st.binary(max_size=64)
                ),

                xattr=draw(st.none() | st.binary(min_size=1, max_size=8))
                if kind in ("file", "sparse")
                else None,
                acl_perm=draw(st.none() | st.sampled_from([4, 6])) if kind == "file" else None,
            )
        )
    return dir_specs, nodes


def build(root: bytes, spec: TreeSpec) -> None:
    dir_specs, nodes = spec
    os.mkdir(root)
    for rel, mode, (uid, gid) in dir_specs:
        path = os.path.join(root, rel) if rel else root
        if rel:
            os.mkdir(path)
        os.chown(path, uid, gid)
        os.chmod(path, mode)
    for node in nodes:
        path = os.path.join(root, node.rel)
        if node.kind == "hardlink":
            os.link(os.path.join(root, node.data), path)
            continue
        make_special(path, node.kind, node.data)
        if node.kind != "symlink":
            os.chown(path, *node.owner)
            os.chmod(path, node.mode)
        else:
            os.lchown(path, *node.owner)
        if node.xattr is not None:
            os.setxattr(path, "user.k", node.xattr)
        if node.acl_perm is not None:
            os.setxattr(path, "system.posix_acl_access", acl(node.acl_perm))


def make_special(path: bytes, kind: str, data: bytes = b"") -> None:
    if kind == "file":
        with open(path, "wb") as handle:
            handle.write(data)
    elif kind == "sparse":
        with open(path, "wb") as handle:
            handle.truncate(SPARSE_SIZE)
            handle.seek(SPARSE_SIZE // 2)
            handle.write(data or b"x")
    elif kind == "symlink":
        os.symlink(b"target-" + data[:8].hex().encode(), path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        bind_socket(path)
    elif kind == "chardev":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    elif kind == "blockdev":
        os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(7, 0))
    elif kind == "dir":
        os.mkdir(path)


# -- edits ---------------------------------------------------------------------------------------


# top_*: the top directory's own mode, owner and xattrs (docs/fidelity.md).
EDIT_KINDS = ["write", "append", "sparse_write", "chmod", "chown", "link", "unlink", "rename",
              "swap", "special", "xattr", "new_file",
              "top_chmod", "top_chown", "top_xattr"]  # fmt: skip
Edit = tuple[str, int, Any]


def edits() -> st.SearchStrategy[list[Edit]]:
    """Each edit picks its target by index into the paths present when it runs."""
    edit = st.tuples(
        st.sampled_from(EDIT_KINDS),
        st.integers(0, 50),
        st.one_of(
            st.binary(max_size=16),
            st.sampled_from(MODES + DIR_MODES),
            st.sampled_from(OWNERS),
            st.sampled_from(NAMES),
            st.sampled_from(["fifo", "socket", "chardev", "file", "dir", "symlink"]),
        ),
    )
    return st.lists(edit, max_size=6)


def paths_in(root: bytes) -> list[bytes]:
    return sorted(os.fsencode(rel) for rel in tree_state(root))


def apply_edit(root: bytes, edit: Edit) -> None:
    """Apply one edit inside the sandbox view; edits the view refuses (e.g. an overlay rename
    returning EXDEV) are skipped: the oracle reads what the view shows."""
    kind, index, arg = edit
    if kind.startswith("top_"):  # the top directory's own metadata (docs/fidelity.md)
        kind, present = kind.removeprefix("top_"), [b"."]
    else:
        present = paths_in(root)
    target = os.path.join(root, present[index % len(present)]) if present else None
    target = root if present == [b"."] else target
    st_target = os.lstat(target) if target else None
    is_file = st_target is not None and stat.S_ISREG(st_target.st_mode)
    is_dir = st_target is not None and stat.S_ISDIR(st_target.st_mode)
    # New names go into the root or a directory (set-gid ones give new entries their group).
    parents = [root] + [os.path.join(root, rel) for rel in present
                        if stat.S_ISDIR(os.lstat(os.path.join(root, rel)).st_mode)]  # fmt: skip
    parent = parents[(index // 7) % len(parents)]
    new_name = os.path.join(parent, arg if isinstance(arg, bytes) and arg in NAMES else b"zz")
    try:
        if kind in ("write", "append") and is_file and isinstance(arg, bytes):
            with open(target, "ab" if kind == "append" else "r+b") as handle:  # type: ignore[arg-type]
                handle.write(arg or b"!")
        elif kind == "sparse_write" and is_file and isinstance(arg, bytes):
            fd = os.open(target, os.O_WRONLY)  # type: ignore[arg-type]
            try:
                os.pwrite(fd, arg or b"#", SPARSE_SIZE // 4)
            finally:
                os.close(fd)
        elif kind == "chmod" and isinstance(arg, int) and st_target is not None:
            if not stat.S_ISLNK(st_target.st_mode):
                os.chmod(target, arg)  # type: ignore[arg-type]
        elif kind == "chown" and isinstance(arg, tuple) and target is not None:
            os.lchown(target, *arg)
        elif kind == "link" and st_target is not None and not is_dir:
            if not os.path.lexists(new_name):
                os.link(target, new_name, follow_symlinks=False)  # type: ignore[arg-type]
        elif kind == "unlink" and target is not None:
            shutil.rmtree(target) if is_dir else os.unlink(target)
        elif kind == "rename" and target is not None and not os.path.lexists(new_name):
            if not new_name.startswith(target + b"/") and new_name != target:
                os.rename(target, new_name)  # type: ignore[arg-type]
        elif kind == "swap" and target is not None and isinstance(arg, str):
            shutil.rmtree(target) if is_dir else os.unlink(target)
            make_special(target, arg, b"swapped")  # type: ignore[arg-type]
        elif kind == "special" and isinstance(arg, str) and not os.path.lexists(new_name):
            make_special(new_name, arg, b"made in the sandbox")
        elif kind == "xattr" and (is_file or is_dir) and isinstance(arg, bytes):
            os.setxattr(target, "user.k", arg or b"v")  # type: ignore[arg-type]
        elif kind == "new_file" and not os.path.lexists(new_name):
            make_special(new_name, "file", b"new")
    except OSError:
        pass


# -- the properties ------------------------------------------------------------------------------


def same(actual: dict[bytes, Any], expected: dict[bytes, Any], label: str) -> None:
    diff = differences(actual, expected)
    assert not diff, f"{label}:\n" + "\n".join(diff[:30])


class Workdir:
    """A fresh directory per example (pytest's tmp_path is per test, not per example)."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="fidelity-", dir="/var/tmp"))

    def close(self) -> None:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(str(self.path) + "/"):
                _overlay_mount.unmount(Path(point))
        shutil.rmtree(self.path, ignore_errors=True)
