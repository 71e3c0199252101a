"""The directory strategies' cheaper change detection (issue 7, performance): a commit walks only
the copy and looks at the original by ``lstat`` at the changed paths; create takes both sides
of the baseline from one walk of the copy; a commit's backup keeps the replaced entries by op
index. Each must give exactly the answers of the full two-tree comparison it replaces."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast
from unittest import mock

import pytest

from sandbox_core.errors import SandboxCommitError, SandboxCreationError
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.tree import snapshot as fs
from sandbox_core.tree.baseline import (
    Baseline,
    copy_with_baseline,
    drifted,
    pending_since,
    read_touched,
    reset_copy,
    touched_since,
)
from sandbox_core.tree.scan import TreeChanges
from sandbox_core.tree.snapshot import refresh_snapshot, snapshot_tree
from sandbox_core.tree.sync import sync_tree, undo_sync
from tests.support.fidelity_tree import assert_same_tree, tree_state

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the directory fidelity runs as root")


def _rich_tree(root: Path) -> None:
    """Every kind of entry a signature distinguishes, odd names and modes included."""
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "f").write_text("x")
    (root / "a" / "f").chmod(0o4755)
    os.chown(root / "a" / "f", 1234, 5678)
    os.utime(root / "a" / "f", ns=(1, 1_234_567_890_123_456_789))
    (root / "a" / "b").chmod(0o3777)
    os.mkfifo(root / "fifo")
    os.symlink("../nowhere @ 1 2 3", root / "a" / "link")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))
    os.mknod(root / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (Path(os.fsdecode(bytes(root) + b"/bad\xff\nname"))).write_text("y")
    with open(root / "sparse", "wb") as handle:
        handle.truncate(1 << 20)
    os.link(root / "a" / "f", root / "hard")


def test_create_baseline_from_one_walk_equals_both_walks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _rich_tree(src)
    baseline = copy_with_baseline(src, tmp_path / "copy")
    assert baseline.original == snapshot_tree(src)
    assert baseline.copy == snapshot_tree(tmp_path / "copy", stamps=True)


def _edit_both(src: Path, copy: Path) -> None:
    (copy / "a" / "f").write_text("sandbox")  # both sides: a conflict
    (src / "a" / "f").write_text("original")
    (copy / "new").write_text("n")  # sandbox only
    (src / "theirs").write_text("t")  # original only
    os.chmod(copy / "fifo", 0o640)
    shutil.rmtree(src / "a" / "b")  # original only
    os.unlink(src / "a" / "link")  # the original swaps a file for a directory ...
    (src / "a" / "link").mkdir()
    os.unlink(copy / "a" / "link")  # ... the sandbox for another link: a conflict
    os.symlink("elsewhere", copy / "a" / "link")
    (src / "sub").mkdir()  # a directory becomes a symlink under a path the sandbox adds
    (copy / "sub").mkdir()
    (copy / "sub" / "x").write_text("x")


def test_drift_by_lstat_equals_the_walk_of_the_original(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    src.mkdir()
    _rich_tree(src)
    baseline = copy_with_baseline(src, copy)
    _edit_both(src, copy)
    shutil.rmtree(src / "sub")
    os.symlink(copy, src / "sub")  # the walk never enters a symlink; lstat through it would
    pending = pending_since(baseline, src, copy)
    touched = touched_since(baseline, copy)
    assert touched == pending.touched
    every = pending.drift | pending.touched | {"sub/x", "a/b/none", "missing"}
    assert drifted(baseline, src, every) == pending.drift & every
    assert "sub/x" not in drifted(baseline, src, ["sub/x"])  # absent in both: no drift
    unknown = Baseline(None, None)
    assert touched_since(unknown, copy) is None
    assert drifted(unknown, src, every) == set()


def test_copy_on_write_conflicts_and_kept_changes_unchanged(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _rich_tree(src)
    sandbox = CopyOnWriteSandbox("res", str(src), sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan")
    copy = Path(sandbox.get_path(""))
    _edit_both(src, copy)
    with pytest.raises(SandboxCommitError) as caught:
        sandbox.commit()
    assert caught.value.conflicts == ["a/f", "a/link", "hard"]  # hard: a/f's inode
    # Without the conflicting paths the sandbox's own changes land, the original's are kept.
    (src / "a" / "f").write_text("x")
    os.utime(src / "a" / "f", ns=(1, 1_234_567_890_123_456_789))
    (copy / "a" / "f").write_text("x")
    os.utime(copy / "a" / "f", ns=(1, 1_234_567_890_123_456_789))
    shutil.rmtree(src / "a" / "link")
    os.symlink("../nowhere @ 1 2 3", src / "a" / "link")
    result = sandbox.commit()
    assert sorted(result.added_files) == ["new", "sub/x"]
    assert (src / "new").read_text() == "n" and (src / "theirs").read_text() == "t"
    assert not (src / "a" / "b").exists()
    assert stat.S_IMODE(os.lstat(src / "fifo").st_mode) == 0o640
    assert os.readlink(src / "a" / "link") == "elsewhere"
    sandbox.cleanup()


def test_undo_reads_backups_of_both_layouts(tmp_path: Path) -> None:
    src, target = tmp_path / "src", tmp_path / "target"
    for root in (src, target):
        (root / "d" / "e").mkdir(parents=True)
        (root / "d" / "e" / "f").write_text("old")
        (root / "g").write_text("old")
    (src / "d" / "e" / "f").write_text("new")
    (src / "g").write_text("new")
    backup = tmp_path / "backup"
    changes = TreeChanges(changed=["d/e/f", "g"])
    sync_tree(src, target, changes=changes, backup_dir=backup)
    assert (target / "g").read_text() == "new"
    record = json.loads((backup / "undo.json").read_text(encoding="utf-8"))
    assert record["layout"] == "old" and sorted(os.listdir(backup / "old")) == ["0", "1"]
    # A version-1 backup (``tree/<path>``, written before the layout changed) still undoes.
    legacy = tmp_path / "legacy"
    (legacy / "tree" / "d" / "e").mkdir(parents=True)
    for index, op in enumerate(record["ops"]):
        os.rename(backup / "old" / str(index), legacy / "tree" / op["path"])
    (legacy / "undo.json").write_text(json.dumps({"version": 1, "ops": record["ops"]}))
    undo_sync(legacy, target)
    assert (target / "g").read_text() == "old"
    assert (target / "d" / "e" / "f").read_text() == "old"


def test_fallback_policy_check_from_the_walk_finds_what_the_scan_finds(tmp_path: Path) -> None:
    """Case 05 in fallback mode: the ``.git`` files are taken from the baseline walk; a file
    inside a ``.git`` directory and a symlink named ``.git`` are skipped, as the scan skips."""
    from sandbox_core.strategies.overlay.sandbox import (
        _refuse_external_gitfiles,
        _refuse_listed_gitfiles,
    )

    src = tmp_path / "src"
    (src / ".git" / "x").mkdir(parents=True)
    (src / ".git" / "x" / ".git").write_text(f"gitdir: {tmp_path}/elsewhere\n")  # skipped
    os.symlink(f"{tmp_path}/elsewhere", src / ".git" / "y")
    (src / "a").mkdir()
    os.symlink(f"{tmp_path}/elsewhere", src / "a" / ".git")  # a link, never read
    _refuse_external_gitfiles(src)
    _refuse_listed_gitfiles(src, snapshot_tree(src))
    (src / "a" / "b").mkdir()
    (src / "a" / "b" / ".git").write_text(f"gitdir: {tmp_path}/elsewhere/.git\n")
    for check in (_refuse_external_gitfiles, lambda root: _refuse_listed_gitfiles(
        root, snapshot_tree(root)
    )):  # fmt: skip
        with pytest.raises(SandboxCreationError, match=r"a/b/\.git is a git file pointing"):
            check(src)


def test_create_baseline_walks_the_original_when_the_copy_loses_a_field(tmp_path: Path) -> None:
    """A copy on a filesystem with coarser timestamps (simulated: mtimes cut to seconds after
    ``cp -a``) must not become the original's snapshot: every file would read as changed."""
    from unittest import mock

    from sandbox_core.tree import baseline as fs

    src = tmp_path / "src"
    src.mkdir()
    _rich_tree(src)
    (src / "z").write_text("z")
    os.utime(src / "z", ns=(1, 1_700_000_000_123_456_789))
    real = fs.backup_directory

    def coarse_copy(source: Path, dest: Path) -> None:
        real(source, dest)
        for dirpath, _, names in os.walk(dest):
            for name in names:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns // 10**9 * 10**9),
                         follow_symlinks=False)  # fmt: skip

    with mock.patch.object(fs, "backup_directory", coarse_copy):
        baseline = copy_with_baseline(src, tmp_path / "copy")
    assert baseline.original == snapshot_tree(src)
    assert baseline.copy == snapshot_tree(tmp_path / "copy", stamps=True)


def test_refresh_snapshot_equals_a_new_walk_after_type_swaps(tmp_path: Path) -> None:
    """``refresh_snapshot`` looks below a replaced path only when it was a directory: after a
    file edit, a directory replaced by a file and a file replaced by a directory the refreshed
    snapshot equals a new walk (no stale entry below the former directory, the new one's
    children present)."""
    root = tmp_path / "t"
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "sub" / "x").write_text("x")
    (root / "f").write_text("f")
    (root / "g").write_text("g")
    snapshot = snapshot_tree(root, stamps=True)
    shutil.rmtree(root / "d")
    (root / "d").write_text("now a file")
    (root / "f").unlink()
    (root / "f" / "inner").mkdir(parents=True)
    (root / "f" / "inner" / "y").write_text("y")
    with open(root / "g", "a", encoding="utf-8") as handle:
        handle.write("more")
    refresh_snapshot(snapshot, root, ["d", "f", "g"])
    assert snapshot == snapshot_tree(root, stamps=True)


def test_baseline_read_beside_the_walks_gives_the_same_answers(tmp_path: Path) -> None:
    """A baseline given as a function (read while ``find`` walks) answers as the loaded one."""
    src = tmp_path / "src"
    src.mkdir()
    _rich_tree(src)
    copy = tmp_path / "copy"
    baseline = copy_with_baseline(src, copy)
    manifest = tmp_path / "manifest"
    baseline.save(manifest)
    (copy / "a" / "f").write_text("changed")
    (src / "a" / "new").write_text("theirs")
    loaded, touched = read_touched(lambda: Baseline.load(manifest), copy)
    assert loaded == baseline
    # "hard" shares the edited inode; a directory's signature ignores its mtime.
    assert touched == touched_since(baseline, copy) == {"a/f", "hard"}
    lazy = pending_since(lambda: Baseline.load(manifest), src, copy)
    eager = pending_since(baseline, src, copy)
    assert (lazy.drift, lazy.touched) == (eager.drift, eager.touched)
    assert "a/new" in lazy.drift


def test_reset_copy_walks_the_original_after_its_restore(tmp_path: Path) -> None:
    """Rollback from COMMITTED undoes the commit while the copy is walked; the original is
    walked after the undo, so the copy ends equal to the restored original (not the committed
    one), and ``meanwhile`` runs once, after the undo."""
    src, copy, backup = tmp_path / "src", tmp_path / "copy", tmp_path / "backup"
    src.mkdir()
    _rich_tree(src)
    baseline = copy_with_baseline(src, copy)
    (copy / "a" / "f").write_text("sandbox")
    (copy / "new").write_text("n")
    os.unlink(copy / "sparse")
    sync_tree(copy, src, backup_dir=backup)  # the commit: the original equals the copy
    order: list[str] = []

    def restore(restored: Callable[[], None]) -> None:
        order.append("restore")
        undo_sync(backup, src, on_applied=lambda: (order.append("restored"), restored()))
        order.append("journaled")

    def meanwhile() -> None:
        order.append("meanwhile")
        shutil.rmtree(backup)

    new = reset_copy(baseline, src, copy, restore_original=restore, meanwhile=meanwhile)
    assert order == ["restore", "restored", "journaled", "meanwhile"]
    assert (src / "a" / "f").read_text() == "x" and not (src / "new").exists()
    assert_same_tree(copy, tree_state(src), "the copy after the reset")
    assert new.original == snapshot_tree(src)
    assert new.copy == snapshot_tree(copy, stamps=True)


def test_reset_copy_leaves_the_copy_alone_when_the_restore_fails(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    src.mkdir()
    _rich_tree(src)
    baseline = copy_with_baseline(src, copy)
    (copy / "new").write_text("n")
    before = tree_state(copy)

    def restore(restored: Callable[[], None]) -> None:
        raise OSError(5, "injected: the undo failed")

    with pytest.raises(OSError, match="injected"):
        reset_copy(baseline, src, copy, restore_original=restore)
    assert tree_state(copy) == before


def test_baseline_load_refuses_a_torn_manifest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _rich_tree(src)
    manifest = tmp_path / "manifest"
    saved = copy_with_baseline(src, tmp_path / "copy")
    saved.save(manifest)
    assert Baseline.load(manifest) == saved  # odd names (surrogate-escaped bytes) included
    manifest.write_bytes(manifest.read_bytes()[:-7])  # a torn write
    with pytest.raises(ValueError, match="corrupt baseline manifest"):
        Baseline.load(manifest)


def test_baseline_reads_the_manifest_of_the_previous_version(tmp_path: Path) -> None:
    """A sandbox made before the manifest format changed keeps its baseline (NUL-separated
    text: the original's pairs, the copy's pairs, the top's metadata as JSON)."""
    manifest = tmp_path / "manifest"
    root = {"mode": 0o755, "uid": 0, "gid": 0, "xattrs": {}}
    fields = ["sandbox-baseline-1", "a", "f 644 0 0 1 1.0", "", "a", "f 644 0 0 1 1.0 @2 3 1", ""]
    manifest.write_bytes("\0".join([*fields, json.dumps(root)]).encode())
    assert Baseline.load(manifest) == Baseline(
        {"a": "f 644 0 0 1 1.0"}, {"a": "f2 3 1 644 0 0 1"}, root
    )
    manifest.write_bytes("\0".join(fields[:2] + fields[3:]).encode())  # a signature lost
    with pytest.raises(ValueError, match="corrupt baseline manifest"):
        Baseline.load(manifest)


def test_one_walk_of_signatures_and_stamps_equals_both_walks_with_and_without_find(
    tmp_path: Path,
) -> None:
    """``find``'s formats and the Python walk print the same text for every kind of entry, and
    the create's single walk (signature and stamp of each entry) equals the two walks."""
    _rich_tree(tmp_path)
    sigs, stamps = fs._snapshot_both(tmp_path)
    assert sigs == snapshot_tree(tmp_path)
    assert stamps == snapshot_tree(tmp_path, stamps=True)
    with mock.patch.object(fs.shutil, "which", return_value=None):
        assert fs._snapshot_both(tmp_path) == (sigs, stamps)
        assert snapshot_tree(tmp_path, stamps=True) == stamps
    st = os.lstat(tmp_path / "fifo")
    ctime = f"{st.st_ctime_ns // 10**9}.{st.st_ctime_ns % 10**9:09d}0"
    assert stamps["fifo"] == f"p{ctime} {st.st_ino} 1 644 0 0"
    st = os.lstat(tmp_path / "a" / "f")
    ctime = f"{st.st_ctime_ns // 10**9}.{st.st_ctime_ns % 10**9:09d}0"
    mode = f"{stat.S_IMODE(st.st_mode):o}"
    assert stamps["a/f"] == f"f{ctime} {st.st_ino} 2 {mode} 1234 5678 1"
    assert {value[0] for value in stamps.values()} == {"d", "f", "l", "p", "s", "c"}


def test_a_change_in_the_same_clock_tick_as_the_snapshot_still_shows(tmp_path: Path) -> None:
    """ctime comes from a clock that ticks every few milliseconds (seconds on some
    filesystems): a write, ``chmod`` or ``chown`` right after a snapshot may keep it. The stamp
    still differs by size, mode, owner or group."""
    path = tmp_path / "f"
    path.write_text("x")
    before = os.lstat(path)
    fields = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_ctime_ns")

    def same_tick(**changed: int) -> os.stat_result:
        values = {name: getattr(before, name) for name in fields} | changed
        return cast(os.stat_result, SimpleNamespace(**values))

    stamp = fs._stamp(before)
    assert fs._stamp(same_tick()) == stamp
    assert fs._stamp(same_tick(st_size=before.st_size + 1)) != stamp  # a write
    assert fs._stamp(same_tick(st_mode=before.st_mode ^ 0o100)) != stamp  # a chmod
    assert fs._stamp(same_tick(st_uid=before.st_uid + 1)) != stamp  # a chown
    assert fs._stamp(same_tick(st_gid=before.st_gid + 1)) != stamp
