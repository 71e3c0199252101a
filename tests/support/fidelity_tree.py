"""Metadata-complete snapshots of a directory tree, the oracle of the fidelity tests.

:func:`tree_state` records, for every path below a root (names as bytes: not UTF-8, newlines):
type, permission bits (set-uid/set-gid/sticky included), owner and group, device number, link
target, content digest, data segments (where the holes are) and allocated data blocks of files,
xattrs (POSIX ACLs included; the overlay's private ``*.overlay.*`` names excluded), mtime of
everything but directories (a directory's mtime moves with its children), and the hard-link
group (the other names of the same inode inside the tree). Two trees are "the same" for
docs/fidelity.md exactly when their states are equal.

Allocated blocks are counted from the ``SEEK_DATA``/``SEEK_HOLE`` map (512-byte units of the
data segments, all-zero blocks counted as holes), not from ``st_blocks``: ext4 also counts
an inode's external xattr block in ``st_blocks``, and an overlay's upper files carry the
overlay's private xattrs, so ``st_blocks`` differs by one block with the data exactly the
same (found by the property test).
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path
from typing import Any

PathLike = str | bytes | os.PathLike[str]

KINDS = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "chardev",
    stat.S_IFBLK: "blockdev",
}


def _xattrs(path: bytes) -> tuple[tuple[str, bytes], ...]:
    names = os.listxattr(path, follow_symlinks=False)
    return tuple(
        sorted(
            (name, os.getxattr(path, name, follow_symlinks=False))
            for name in names
            if ".overlay." not in name
        )
    )


BLOCK = 4096


def _segments(path: bytes, size: int) -> tuple[tuple[int, int], ...]:
    """Data segments of a file (SEEK_DATA/SEEK_HOLE), i.e. where its holes are not, with
    all-zero blocks counted as holes: ``cp -a`` and ``rsync -S`` turn zero runs of a sparse
    file into holes (never a hole into data), and both read back the same bytes."""
    blocks: list[int] = []
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        position = 0
        while position < size:
            try:
                start = os.lseek(fd, position, os.SEEK_DATA)
            except OSError:
                break
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            for offset in range(start - start % BLOCK, end, BLOCK):
                if os.pread(fd, BLOCK, offset).strip(b"\0"):
                    blocks.append(offset)
            position = end
    finally:
        os.close(fd)
    out: list[tuple[int, int]] = []
    for offset in blocks:
        if out and out[-1][1] == offset:
            out[-1] = (out[-1][0], offset + BLOCK)
        else:
            out.append((offset, offset + BLOCK))
    return tuple((start, min(end, size)) for start, end in out)


def _digest(path: bytes) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_state(root: PathLike, *, top: bool = False) -> dict[bytes, dict[str, Any]]:
    """The state of every path below ``root``, keyed by relative bytes; with ``top`` also
    ``root``'s own mode, owner and xattrs under ``b"."`` (what a commit gives the original's top
    directory, docs/fidelity.md).

    Never opens a FIFO, socket or device; never follows a symlink.
    """
    base = os.fsencode(root)
    state: dict[bytes, dict[str, Any]] = {}
    if top:
        st_top = os.lstat(base)
        state[b"."] = {
            "kind": "dir",
            "mode": oct(stat.S_IMODE(st_top.st_mode)),
            "uid": st_top.st_uid,
            "gid": st_top.st_gid,
            "xattrs": _xattrs(base),
        }
    inodes: dict[int, list[bytes]] = {}
    pending = [b""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(os.path.join(base, rel_dir) if rel_dir else base) as it:
            items = list(it)
        for item in items:
            rel = os.path.join(rel_dir, item.name) if rel_dir else item.name
            path = os.path.join(base, rel)
            st = os.lstat(path)
            kind = KINDS[stat.S_IFMT(st.st_mode)]
            entry: dict[str, Any] = {
                "kind": kind,
                "mode": oct(stat.S_IMODE(st.st_mode)),
                "uid": st.st_uid,
                "gid": st.st_gid,
                "xattrs": _xattrs(path),
            }
            if kind == "dir":
                pending.append(rel)
            else:
                entry["mtime_ns"] = st.st_mtime_ns
                inodes.setdefault(st.st_ino, []).append(rel)
            if kind == "symlink":
                entry["target"] = os.readlink(path)
            elif kind == "file":
                entry["size"] = st.st_size
                entry["sha256"] = _digest(path)
                entry["segments"] = _segments(path, st.st_size)
                entry["blocks"] = sum(end - start for start, end in entry["segments"]) // 512
            elif kind in ("chardev", "blockdev"):
                entry["rdev"] = st.st_rdev
            state[rel] = entry
    for names in inodes.values():
        group = tuple(sorted(names)) if len(names) > 1 else ()
        for rel in names:
            state[rel]["links"] = group
    return state


def differences(a: dict[bytes, dict[str, Any]], b: dict[bytes, dict[str, Any]]) -> list[str]:
    """Readable list of what differs between two states (empty when equal)."""
    out: list[str] = []
    for rel in sorted(a.keys() | b.keys()):
        left, right = a.get(rel), b.get(rel)
        if left == right:
            continue
        if left is None or right is None:
            out.append(f"{rel!r}: only in {'second' if left is None else 'first'}")
            continue
        fields = sorted(k for k in left.keys() | right.keys() if left.get(k) != right.get(k))
        out += [f"{rel!r}.{k}: {left.get(k)!r} != {right.get(k)!r}" for k in fields]
    return out


def assert_same_tree(
    actual: PathLike, expected: dict[bytes, dict[str, Any]], label: str, *, top: bool = False
) -> None:
    """Fail with the differing attributes when ``actual``'s state is not ``expected`` (``top``:
    as :func:`tree_state`)."""
    diff = differences(tree_state(actual, top=top), expected)
    assert not diff, f"{label}: {Path(os.fsdecode(actual))} differs:\n" + "\n".join(diff[:40])


def bind_socket(path: str | bytes | os.PathLike[str]) -> None:
    """Leave a UNIX socket file at ``path`` (nothing listens on it).

    Bound by its base name from inside its directory: sandbox paths under pytest's temp folder
    exceed AF_UNIX's 108-byte limit on sun_path.
    """
    raw = os.fsencode(path)
    parent, name = os.path.split(raw)
    sock = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    try:
        os.chdir(parent or b".")
        sock.bind(name)
    finally:
        os.chdir(cwd)
        sock.close()
