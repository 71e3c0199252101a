"""Fidelity cases 10, 24, 34, 36, 37 (issue 7), each on every directory strategy and mode:
copy_on_write, overlay on a real OverlayFS mount (kernel) and the userspace fallback, plus
checkpoint/restore. The contract is docs/fidelity.md; the oracle is tests/support/fidelity_tree.py.
Runs as root (owners, device nodes, trusted xattrs), as the test tiers do.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.status import SandboxStatus
from tests.support.directory_sandboxes import STRATEGIES, Make, new_sandbox
from tests.support.fidelity_tree import assert_same_tree, bind_socket, tree_state


def strategies(func: Any) -> Any:
    return pytest.mark.parametrize("make", STRATEGIES, indirect=True)(func)


def mode_of(path: Path) -> str:
    return oct(stat.S_IMODE(os.lstat(path).st_mode))


def owner_of(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


# -- case 10: permission bits and ownership survive the sync-back -------------------------------


@strategies
def test_case10_modes_and_owner_survive_commit_under_umask_077(
    tmp_path: Path, make: Make
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    src.chmod(0o2775)
    files = {"run.sh": ("#!/bin/sh\necho ok\n", 0o755), "secret": ("s\n", 0o600),
             "shared.txt": ("t\n", 0o664), "data.txt": ("d\n", 0o644),
             "untouched": ("u\n", 0o640)}  # fmt: skip
    for name, (text, mode) in files.items():
        (src / name).write_text(text)
        (src / name).chmod(mode)
    subprocess.run(["chown", "-R", "1234:1234", str(src)], check=True)
    untouched_mtime = os.lstat(src / "untouched").st_mtime_ns
    old_umask = os.umask(0o077)
    try:
        sandbox = make(src)
        sandbox.create("p10")
        with open(sandbox.get_path("run.sh"), "a") as handle:
            handle.write("# more\n")
        with open(sandbox.get_path("shared.txt"), "a") as handle:
            handle.write("more\n")
        Path(sandbox.get_path("data.txt")).chmod(0o755)
        new = Path(sandbox.get_path("new.txt"))
        new.write_text("n\n")
        new.chmod(0o640)
        sandbox.commit()
    finally:
        os.umask(old_umask)

    expected = {"run.sh": "0o755", "shared.txt": "0o664", "secret": "0o600",
                "data.txt": "0o755", "new.txt": "0o640", "untouched": "0o640"}  # fmt: skip
    assert mode_of(src) == "0o2775"
    assert {name: mode_of(src / name) for name in expected} == expected
    for name in files:
        assert owner_of(src / name) == (1234, 1234), name
    # A new file under a set-gid directory gets the directory's group, as the kernel gives it.
    assert owner_of(src / "new.txt") == (0, 1234)
    assert os.lstat(src / "untouched").st_mtime_ns == untouched_mtime
    assert subprocess.run([str(src / "run.sh")], capture_output=True, text=True).stdout == "ok\n"


# -- case 24: set-uid / set-gid bits survive commit and rollback --------------------------------


@strategies
def test_case24_setuid_and_setgid_survive_commit_and_rollback(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "tool").write_text("#!/bin/sh\necho v1\n")
    (src / "tool").chmod(0o4755)
    (src / "grp").write_text("x\n")
    os.chown(src / "grp", -1, 1234)
    (src / "grp").chmod(0o2755)
    (src / "plain").write_text("y\n")
    before = tree_state(src)
    sandbox = make(src)
    sandbox.create("p24")
    with open(sandbox.get_path("tool"), "a") as handle:
        handle.write("echo v2\n")
    with open(sandbox.get_path("grp"), "a") as handle:
        handle.write("z\n")
    assert mode_of(Path(sandbox.get_path("tool"))) == "0o4755"
    assert mode_of(Path(sandbox.get_path("grp"))) == "0o2755"

    sandbox.commit()

    assert (mode_of(src / "tool"), mode_of(src / "grp")) == ("0o4755", "0o2755")
    assert (src / "tool").read_text() == "#!/bin/sh\necho v1\necho v2\n"
    assert owner_of(src / "grp") == (0, 1234)

    sandbox.rollback()

    assert (mode_of(src / "tool"), mode_of(src / "grp")) == ("0o4755", "0o2755")
    assert_same_tree(src, before, "after rollback from COMMITTED")


# -- case 34: hard links inside the tree survive commit and rollback ----------------------------


@strategies
def test_case34_hard_links_survive_commit_and_rollback(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    (src / "a" / "cfg").write_text("v1\n")
    os.link(src / "a" / "cfg", src / "b" / "cfg")
    (src / "other").write_text("x\n")
    before = tree_state(src)
    sandbox = make(src)
    sandbox.create("p34")
    with open(sandbox.get_path("a/cfg"), "a") as handle:
        handle.write("v2\n")
    intended = tree_state(sandbox.get_path(""))

    sandbox.commit()

    assert_same_tree(src, intended, "after commit")
    if intended[b"b/cfg"]["links"]:  # the sandbox kept the link: so does the original
        assert os.lstat(src / "a" / "cfg").st_ino == os.lstat(src / "b" / "cfg").st_ino
        assert os.lstat(src / "a" / "cfg").st_nlink == 2
        assert (src / "b" / "cfg").read_text() == "v1\nv2\n"

    sandbox.rollback()

    assert_same_tree(src, before, "after rollback from COMMITTED")
    assert os.lstat(src / "a" / "cfg").st_ino == os.lstat(src / "b" / "cfg").st_ino
    assert (src / "b" / "cfg").read_text() == "v1\n"


def test_case34_copy_on_write_keeps_the_link_the_sandbox_shows(tmp_path: Path) -> None:
    """The case as written: in a copy_on_write sandbox both names are one inode, so the edit
    shows under both, and the commit leaves one inode with two links holding v1 v2."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    (src / "a" / "cfg").write_text("v1\n")
    os.link(src / "a" / "cfg", src / "b" / "cfg")
    sandbox = new_sandbox("copy_on_write", src, tmp_path / "root")
    sandbox.create("p34")
    with open(sandbox.get_path("a/cfg"), "a") as handle:
        handle.write("v2\n")
    assert Path(sandbox.get_path("b/cfg")).read_text() == "v1\nv2\n"
    sandbox.commit()
    assert os.lstat(src / "a" / "cfg").st_ino == os.lstat(src / "b" / "cfg").st_ino
    assert os.lstat(src / "b" / "cfg").st_nlink == 2
    assert (src / "b" / "cfg").read_text() == "v1\nv2\n"
    sandbox.cleanup()


# -- case 36: a socket in the original is kept --------------------------------------------------


@strategies
def test_case36_socket_in_the_original_survives_commit_and_rollback(
    tmp_path: Path, make: Make
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    bind_socket(src / "ctl.sock")
    before = tree_state(src)
    sandbox = make(src)
    sandbox.create("p36")
    assert stat.S_ISSOCK(os.lstat(sandbox.get_path("ctl.sock")).st_mode)
    Path(sandbox.get_path("a.txt")).write_text("edited\n")

    sandbox.commit()

    assert stat.S_ISSOCK(os.lstat(src / "ctl.sock").st_mode)
    assert (src / "a.txt").read_text() == "edited\n"

    sandbox.rollback()

    assert sandbox.status is SandboxStatus.ROLLED_BACK
    assert (src / "a.txt").read_text() == "a\n"
    assert_same_tree(src, before, "after rollback from COMMITTED")


# -- case 37: special files made inside a sandbox are committed, never read ---------------------


@strategies
def test_case37_fifo_made_in_the_sandbox_is_committed_with_the_edit(
    tmp_path: Path, make: Make
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    before = tree_state(src)
    sandbox = make(src)
    sandbox.create("p37")
    Path(sandbox.get_path("a.txt")).write_text("edited\n")
    os.mkfifo(sandbox.get_path("run.fifo"))  # nobody writes to it: reading it would hang
    bind_socket(Path(sandbox.get_path("srv.sock")))
    os.mknod(sandbox.get_path("null"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    intended = tree_state(sandbox.get_path(""))

    result = sandbox.commit()

    assert sandbox.status is SandboxStatus.COMMITTED
    assert sorted(result.added_files) == ["null", "run.fifo", "srv.sock"]
    assert (src / "a.txt").read_text() == "edited\n"
    assert stat.S_ISFIFO(os.lstat(src / "run.fifo").st_mode)
    assert stat.S_ISSOCK(os.lstat(src / "srv.sock").st_mode)
    assert os.lstat(src / "null").st_rdev == os.makedev(1, 3)
    assert_same_tree(src, intended, "after commit")

    sandbox.rollback()

    assert sandbox.status is SandboxStatus.ROLLED_BACK
    assert_same_tree(src, before, "after rollback from COMMITTED")


# -- checkpoint/restore keeps the same attributes -----------------------------------------------


@strategies
def test_checkpoint_restore_keeps_special_files_links_owners_and_holes(
    tmp_path: Path, make: Make
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    sandbox = make(src)
    sandbox.create("pck")
    view = Path(sandbox.get_path(""))
    (view / "d").mkdir()
    (view / "d").chmod(0o2770)
    os.chown(view / "d", 1234, 1234)
    (view / "d" / "tool").write_text("t\n")
    (view / "d" / "tool").chmod(0o4750)
    os.link(view / "d" / "tool", view / "tool-link")
    with open(view / "sparse", "wb") as handle:
        handle.truncate(1 << 20)
        handle.seek(1 << 19)
        handle.write(b"x")
    os.setxattr(view / "a.txt", "user.note", b"kept")
    os.mkfifo(view / "pipe")
    bind_socket(view / "s.sock")
    at_checkpoint = tree_state(view)
    manager = CheckpointManager(state_dir=tmp_path / "state")
    checkpoint = manager.create_checkpoint(sandbox, "pck", "pre")
    (view / "d" / "tool").write_text("changed\n")
    (view / "pipe").unlink()
    (view / "new").write_text("n\n")

    assert manager.rollback_to(checkpoint)

    assert_same_tree(view, at_checkpoint, "after restore")
    sandbox.commit()
    assert_same_tree(src, at_checkpoint, "original after committing the restored sandbox")


# -- regressions found by test_fidelity_property.py --------------------------------------------


@strategies
def test_hard_link_made_in_the_sandbox_to_an_untouched_file_is_committed_as_a_link(
    tmp_path: Path, make: Make
) -> None:
    """Kernel overlay: ``ln a zz`` copies ``a`` up unchanged; the commit must still replace
    ``a`` so that both names are one inode in the original (the link group changed)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("a\n")
    before = tree_state(src)
    sandbox = make(src)
    sandbox.create("plink")
    os.link(sandbox.get_path("a"), sandbox.get_path("zz"))
    intended = tree_state(sandbox.get_path(""))
    sandbox.commit()
    assert_same_tree(src, intended, "after commit")
    assert os.lstat(src / "a").st_ino == os.lstat(src / "zz").st_ino
    sandbox.rollback()
    assert_same_tree(src, before, "after rollback from COMMITTED")


@strategies
def test_xattr_set_on_a_directory_in_the_sandbox_is_committed(tmp_path: Path, make: Make) -> None:
    """Kernel overlay: a metadata-only change of a directory is staged once (it failed with
    EEXIST when the link closure staged the directory a second time)."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "a").write_text("a\n")
    before = tree_state(src)
    sandbox = make(src)
    sandbox.create("pxattr")
    os.setxattr(sandbox.get_path("d"), "user.k", b"v")
    sandbox.commit()
    assert os.getxattr(src / "d", "user.k") == b"v"
    sandbox.rollback()
    assert_same_tree(src, before, "after rollback from COMMITTED")


def test_zero_block_of_a_sparse_file_may_become_a_hole_never_the_reverse(tmp_path: Path) -> None:
    """``cp -a`` (copy_on_write create) turns an allocated all-zero block of a sparse file into
    a hole: same bytes, one block less. The oracle counts zero blocks as holes; data never
    becomes a hole and a hole never becomes data."""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "a", "wb") as handle:
        handle.truncate(1 << 20)
        handle.seek(1 << 19)
        handle.write(b"\0")
    sandbox = new_sandbox("copy_on_write", src, tmp_path / "root")
    sandbox.create("pzero")
    copy = Path(sandbox.get_path("a"))
    assert copy.read_bytes() == (src / "a").read_bytes()
    assert os.lstat(copy).st_blocks <= os.lstat(src / "a").st_blocks
    assert_same_tree(copy.parent, tree_state(src), "sandbox after create")
    sandbox.cleanup()


def test_overlay_fallback_commit_keeps_changes_made_to_the_original_since_create(
    tmp_path: Path,
) -> None:
    """The fallback applies only what the sandbox changed, as the kernel mode does (before,
    its commit made the original equal to the copy, undoing the original's own later edits)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "mine").write_text("1\n")
    (src / "theirs").write_text("1\n")
    sandbox = new_sandbox("overlay-fallback", src, tmp_path / "root")
    sandbox.create("pdrift")
    Path(sandbox.get_path("mine")).write_text("sandbox\n")
    (src / "theirs").write_text("edited in the original\n")
    (src / "added").write_text("added in the original\n")

    result = sandbox.commit()

    assert result.changed_files == ["mine"]
    assert (src / "mine").read_text() == "sandbox\n"
    assert (src / "theirs").read_text() == "edited in the original\n"
    assert (src / "added").read_text() == "added in the original\n"
    sandbox.cleanup()


@strategies
def test_name_linked_outside_the_tree_is_replaced_not_written_through(
    tmp_path: Path, make: Make
) -> None:
    """docs/fidelity.md: a changed name whose inode also has a name outside the tree gets a
    new inode (the outside name keeps the old content). Rollback restores the content from a
    copy of the kept entry (the backup stays usable if the rollback is retried), so the outside
    link is not rejoined."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "cfg").write_text("v1\n")
    outside = tmp_path / "outside-cfg"
    os.link(src / "cfg", outside)
    sandbox = make(src)
    sandbox.create("pout")
    Path(sandbox.get_path("cfg")).write_text("v2\n")
    sandbox.commit()
    assert (src / "cfg").read_text() == "v2\n"
    assert outside.read_text() == "v1\n"
    sandbox.rollback()
    assert (src / "cfg").read_text() == "v1\n"
    assert outside.read_text() == "v1\n"
    assert os.lstat(src / "cfg").st_ino != os.lstat(outside).st_ino


@strategies
def test_top_directory_keeps_its_own_mode_owner_and_xattrs(tmp_path: Path, make: Make) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.chown(src, 1234, 1234)
    src.chmod(0o2770)
    os.setxattr(src, "user.top", b"1")
    (src / "f").write_text("f\n")
    top = (os.lstat(src).st_mode, os.lstat(src).st_uid, os.lstat(src).st_gid)
    sandbox = make(src)
    sandbox.create("ptop")
    view = Path(sandbox.get_path(""))
    assert (os.lstat(view).st_mode, os.lstat(view).st_uid, os.lstat(view).st_gid) == top
    assert os.getxattr(view, "user.top") == b"1"
    (view / "g").write_text("g\n")
    sandbox.commit()
    assert (os.lstat(src).st_mode, os.lstat(src).st_uid, os.lstat(src).st_gid) == top
    assert owner_of(src / "g") == (0, 1234)
    sandbox.rollback()
    assert (os.lstat(src).st_mode, os.lstat(src).st_uid, os.lstat(src).st_gid) == top
    assert os.getxattr(src, "user.top") == b"1"
