"""verify7: new directory inputs against docs/fidelity.md (issue 7, section 1), on every
directory strategy and mode (copy_on_write, overlay kernel, overlay fallback). Runs as root.

Inputs that hold (plain tests): a default POSIX ACL inherited by files and folders made in the
sandbox; xattrs on a symlink; names that are not UTF-8 or hold newlines, tabs, leading dashes
and 255 bytes; a renamed folder holding one name of a hard-link group; a write into the middle
of a sparse file; folders of mode 000; FIFOs and device nodes renamed, re-moded and linked.

A tree with another file system mounted inside it (tmpfs, a bind mount, a nested path with a
space) is refused at create naming the mount point; a mount made inside the original later
refuses the commit, prepare, apply and rollback before anything is written (docs/fidelity.md).
"""

from __future__ import annotations

import os
import re
import stat
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxCommitError, SandboxCreationError, SandboxRollbackError
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from tests.support.directory_sandboxes import STRATEGIES, Make
from tests.support.fidelity_tree import assert_same_tree, tree_state

Edit = Callable[[Path], None]


def _acl(entries: list[tuple[int, int, int]]) -> bytes:
    """A ``system.posix_acl_*`` value: version 2, then (tag, perm, id) per entry."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


UNDEFINED = 0xFFFFFFFF
DEFAULT_ACL = _acl([(0x01, 7, UNDEFINED), (0x02, 7, 1234), (0x04, 5, UNDEFINED),
                    (0x08, 5, 2345), (0x10, 7, UNDEFINED), (0x20, 5, UNDEFINED)])  # fmt: skip


def _round_trip(make: Make, src: Path, edit: Edit) -> None:
    """create, edit, commit (original == intended), rollback (original == before)."""
    before = tree_state(src, top=True)
    sandbox = make(src)
    sandbox.create("plan-v7")
    assert_same_tree(sandbox.get_path(""), before, "after create", top=True)
    edit(Path(sandbox.get_path("")))
    intended = tree_state(sandbox.get_path(""), top=True)
    sandbox.commit()
    assert_same_tree(src, intended, "after commit", top=True)
    sandbox.rollback()
    assert_same_tree(src, before, "after rollback from COMMITTED", top=True)
    assert_same_tree(sandbox.get_path(""), before, "sandbox after rollback", top=True)


def _write(path: bytes | Path, data: bytes, mode: str = "wb") -> None:
    with open(path, mode) as handle:
        handle.write(data)


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_default_acl_is_inherited_in_the_sandbox_and_kept(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    (src / "shared").mkdir(parents=True)
    os.setxattr(src / "shared", "system.posix_acl_default", DEFAULT_ACL)
    (src / "shared" / "old.txt").write_text("old\n")

    def edit(top: Path) -> None:
        (top / "shared" / "new.txt").write_text("new\n")
        (top / "shared" / "sub").mkdir()
        (top / "shared" / "sub" / "f").write_text("f\n")
        assert "system.posix_acl_access" in os.listxattr(top / "shared" / "new.txt")
        assert "system.posix_acl_default" in os.listxattr(top / "shared" / "sub")

    _round_trip(make, src, edit)


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_xattrs_on_a_symlink_are_kept(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.symlink("target", src / "link")
    os.setxattr(src / "link", "trusted.origin", b"v1", follow_symlinks=False)

    def edit(top: Path) -> None:
        os.setxattr(top / "link", "trusted.origin", b"v2", follow_symlinks=False)
        os.setxattr(top / "link", "trusted.added", b"n", follow_symlinks=False)

    _round_trip(make, src, edit)


NAMES = [b"nl\nname", b"bad\xff\xfe", b"-rf", b"--help", b" lead", b"trail ", b"a\\b", b"*",
         b"tab\there", b"x" * 255]  # fmt: skip


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_byte_names_edited_renamed_and_deleted(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    src.mkdir()
    top = bytes(src)
    for name in NAMES:
        _write(os.path.join(top, name), b"o:" + name)
    os.mkdir(os.path.join(top, b"dir\nnl\xff"))
    _write(os.path.join(top, b"dir\nnl\xff", b"in\xfe"), b"in")

    def edit(sandbox_top: Path) -> None:
        base = bytes(sandbox_top)
        for name in (b"nl\nname", b"bad\xff\xfe", b"-rf", b"x" * 255):
            _write(os.path.join(base, name), b"+", "ab")
        os.unlink(os.path.join(base, b"--help"))
        os.rename(os.path.join(base, b"tab\there"), os.path.join(base, b"ren\n\xfe"))
        _write(os.path.join(base, b"dir\nnl\xff", b"in\xfe"), b"+", "ab")

    _round_trip(make, src, edit)


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_sparse_file_written_in_the_middle(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "disk.img", "wb") as handle:
        handle.truncate(4 << 20)
        handle.seek(1 << 20)
        handle.write(b"data")

    def edit(top: Path) -> None:
        fd = os.open(top / "disk.img", os.O_RDWR)
        try:
            os.pwrite(fd, b"more", (2 << 20) + 100)
        finally:
            os.close(fd)
        with open(top / "empty.img", "wb") as handle:
            handle.truncate(4 << 20)

    _round_trip(make, src, edit)


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_mode_000_folder_and_file(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    (src / "locked").mkdir(parents=True)
    (src / "locked" / "f").write_text("x\n")
    (src / "unreadable").write_text("n\n")
    (src / "unreadable").chmod(0)
    (src / "locked").chmod(0)

    def edit(top: Path) -> None:
        (top / "locked" / "f").write_text("y\n")
        (top / "locked" / "g").write_text("g\n")
        (top / "unreadable").write_text("m\n")

    _round_trip(make, src, edit)


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_special_files_renamed_remoded_and_linked(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.mkfifo(src / "pipe")
    os.mknod(src / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))

    def edit(top: Path) -> None:
        os.rename(top / "pipe", top / "pipe2")
        os.chmod(top / "null", 0o600)
        os.link(top / "pipe2", top / "pipe3")

    _round_trip(make, src, edit)


# -- a file system mounted inside the tree (docs/fidelity.md, "Mount points inside the tree") ---


def _mount_tmpfs(point: Path) -> None:
    point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], check=True)


def _umount(point: Path) -> None:
    subprocess.run(["umount", str(point)], check=True)


@pytest.fixture
def mounts(make: Make) -> Iterator[list[Path]]:
    """Mount points a test made; unmounted (lazily) before ``make`` checks none is left."""
    made: list[Path] = []
    yield made
    for point in reversed(made):
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


MOUNT_KINDS = ["tmpfs", "bind", "nested-with-space"]


def _mount_inside(src: Path, kind: str, mounts: list[Path]) -> str:
    """Mount something inside ``src`` the way ``kind`` says; the relative mount point."""
    rel = {"tmpfs": "cache", "bind": "data", "nested-with-space": "a/b c/vol"}[kind]
    point = src / rel
    if kind == "bind":  # same file system, another mount: renames across it fail too (EXDEV)
        elsewhere = src.parent / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        (elsewhere / "f").write_text("f0\n")
        point.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(elsewhere), str(point)], check=True)
    else:
        _mount_tmpfs(point)
        (point / "f").write_text("f0\n")
    mounts.append(point)
    return rel


@pytest.mark.parametrize("kind", MOUNT_KINDS)
@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_tree_with_a_mount_point_inside_is_refused_at_create(
    tmp_path: Path,
    make: Make,
    mounts: list[Path],
    kind: str,
) -> None:
    """Policy: refused up front naming the mount point; the original is not touched."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "top.txt").write_text("t0\n")
    rel = _mount_inside(src, kind, mounts)
    before = tree_state(src)
    sandbox = make(src)

    with pytest.raises(SandboxCreationError, match="mounted file systems at " + re.escape(rel)):
        sandbox.create("plan-mnt")

    assert_same_tree(src, before, "after a refused create")
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("tree"))


@pytest.mark.parametrize("restored", [False, True], ids=["edited", "checkpoint-restored"])
@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_a_mount_made_after_create_refuses_commit_and_keeps_the_edits(
    tmp_path: Path,
    make: Make,
    mounts: list[Path],
    restored: bool,
) -> None:
    """A commit (and a two-phase prepare) is refused before anything is written, naming the
    mount point as a conflict; the sandbox stays ACTIVE with its edits, and commits once the
    file system is unmounted. Never ERRORED, never a half-committed original."""
    src = tmp_path / "src"
    (src / "cache").mkdir(parents=True)
    (src / "top.txt").write_text("t0\n")
    sandbox = make(src)
    sandbox.create("plan-mnt")
    Path(sandbox.get_path("top.txt")).write_text("t1\n")
    Path(sandbox.get_path("new.txt")).write_text("n\n")
    if restored:
        checkpoints = CheckpointManager(state_dir=tmp_path / "state")
        checkpoint = checkpoints.create_checkpoint(sandbox, "plan-mnt", "pre")  # type: ignore[arg-type]
        Path(sandbox.get_path("top.txt")).write_text("lost\n")
        assert checkpoints.rollback_to(checkpoint)
    intended = tree_state(sandbox.get_path(""))
    _mount_tmpfs(src / "cache")
    mounts.append(src / "cache")
    before = tree_state(src)

    with pytest.raises(SandboxCommitError) as refused:
        sandbox.commit()
    assert refused.value.conflicts == ["cache"]
    with pytest.raises(SandboxCommitError) as not_prepared:
        sandbox.prepare("tx-mnt")
    assert not_prepared.value.conflicts == ["cache"]

    assert sandbox.status is SandboxStatus.ACTIVE
    assert_same_tree(src, before, "after a refused commit")
    assert_same_tree(sandbox.get_path(""), intended, "the edits after a refused commit")
    _umount(src / "cache")
    mounts.remove(src / "cache")
    sandbox.commit()
    assert_same_tree(src, intended, "after the commit")


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_a_mount_made_between_prepare_and_apply_refuses_the_apply(
    tmp_path: Path,
    make: Make,
    mounts: list[Path],
) -> None:
    src = tmp_path / "src"
    (src / "cache").mkdir(parents=True)
    (src / "top.txt").write_text("t0\n")
    sandbox = make(src)
    sandbox.create("plan-mnt")
    Path(sandbox.get_path("top.txt")).write_text("t1\n")
    intended = tree_state(sandbox.get_path(""))
    sandbox.prepare("tx-mnt")
    _mount_tmpfs(src / "cache")
    mounts.append(src / "cache")
    before = tree_state(src)

    with pytest.raises(SandboxCommitError) as refused:
        sandbox.apply_prepared("tx-mnt")

    assert refused.value.conflicts == ["cache"]
    assert sandbox.status is SandboxStatus.ACTIVE
    assert_same_tree(src, before, "after a refused apply")
    _umount(src / "cache")
    mounts.remove(src / "cache")
    sandbox.apply_prepared("tx-mnt")
    assert_same_tree(src, intended, "after the apply")


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_a_mount_made_after_commit_refuses_the_rollback_until_unmounted(
    tmp_path: Path,
    make: Make,
    mounts: list[Path],
) -> None:
    src = tmp_path / "src"
    (src / "cache").mkdir(parents=True)
    (src / "top.txt").write_text("t0\n")
    before = tree_state(src)
    sandbox = make(src)
    sandbox.create("plan-mnt")
    Path(sandbox.get_path("top.txt")).write_text("t1\n")
    sandbox.commit()
    committed = tree_state(src)
    _mount_tmpfs(src / "cache")
    mounts.append(src / "cache")

    with pytest.raises(SandboxRollbackError, match="cache"):
        sandbox.rollback()

    assert sandbox.status is SandboxStatus.COMMITTED  # the undo is still owed (case 21)
    _umount(src / "cache")
    mounts.remove(src / "cache")
    assert_same_tree(src, committed, "after a refused rollback")
    sandbox.rollback()
    assert_same_tree(src, before, "after the rollback")


# -- the top directory's own metadata (docs/fidelity.md, "the top directory itself") -------------


TOP_EDITS = ["mode", "owner", "xattr", "acl", "all"]


def _edit_top(top: Path, what: str) -> None:
    if what in ("owner", "all"):
        os.chown(top, 1234, 2345)
    if what in ("mode", "all"):
        top.chmod(0o2750)
    if what in ("xattr", "all"):
        os.setxattr(top, "user.top", b"sandbox")
        os.removexattr(top, "user.old")
    if what in ("acl", "all"):
        os.setxattr(top, "system.posix_acl_default", DEFAULT_ACL)


@pytest.mark.parametrize("what", TOP_EDITS)
@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_top_directory_mode_owner_and_xattrs_are_committed_and_rolled_back(
    tmp_path: Path,
    make: Make,
    what: str,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.setxattr(src, "user.old", b"1")
    (src / "f").write_text("f\n")

    def edit(top: Path) -> None:
        _edit_top(top, what)
        if what == "all":
            (top / "f").write_text("g\n")

    _round_trip(make, src, edit)


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_top_directory_changed_only_in_the_original_is_kept(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.setxattr(src, "user.old", b"1")
    sandbox = make(src)
    sandbox.create("plan-top")
    Path(sandbox.get_path("new.txt")).write_text("n\n")
    src.chmod(0o700)  # the application's own change, after create
    os.setxattr(src, "user.app", b"2")
    kept = tree_state(src, top=True)[b"."]

    sandbox.commit()

    assert tree_state(src, top=True)[b"."] == kept
    assert (src / "new.txt").read_text() == "n\n"


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_top_directory_changed_on_both_sides(tmp_path: Path, make: Make) -> None:
    """copy_on_write refuses it as a conflict on ``"."`` (nothing written, still ACTIVE); the
    overlay's sandbox wins, as it does for any path."""
    src = tmp_path / "src"
    src.mkdir()
    os.setxattr(src, "user.old", b"1")
    sandbox = make(src)
    sandbox.create("plan-top")
    Path(sandbox.get_path("")).chmod(0o750)
    src.chmod(0o700)
    before = tree_state(src, top=True)

    if isinstance(sandbox, CopyOnWriteSandbox):
        with pytest.raises(SandboxCommitError) as refused:
            sandbox.commit()
        assert refused.value.conflicts == ["."]
        assert sandbox.status is SandboxStatus.ACTIVE
        assert_same_tree(src, before, "after a refused commit", top=True)
    else:
        sandbox.commit()
        assert oct(os.lstat(src).st_mode & 0o7777) == oct(0o750)
        sandbox.rollback()
        assert_same_tree(src, before, "after rollback", top=True)


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_top_directory_change_in_two_phase_and_after_a_rollback(
    tmp_path: Path,
    make: Make,
) -> None:
    """prepare/apply lands the top's metadata (and the review digest covers it); a rollback of
    the ACTIVE sandbox resets the view's top too."""
    src = tmp_path / "src"
    src.mkdir()
    os.setxattr(src, "user.old", b"1")
    before = tree_state(src, top=True)
    sandbox = make(src)
    sandbox.create("plan-top")
    Path(sandbox.get_path("")).chmod(0o711)
    sandbox.rollback()
    assert_same_tree(sandbox.get_path(""), before, "view after rollback", top=True)

    untouched = sandbox.review().digest
    _edit_top(Path(sandbox.get_path("")), "all")
    intended = tree_state(sandbox.get_path(""), top=True)
    reviewed = sandbox.review().digest
    assert reviewed != untouched
    prepared = sandbox.prepare("tx-top")
    assert prepared.digest == reviewed
    assert_same_tree(src, before, "after prepare", top=True)
    sandbox.apply_prepared("tx-top")
    assert_same_tree(src, intended, "after apply", top=True)
    sandbox.rollback()
    assert_same_tree(src, before, "after rollback from COMMITTED", top=True)
