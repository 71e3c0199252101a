"""Filesystem utilities (seed 002, "Filesystem Utilities") on real trees, incl. tmpfs mounts."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core.tree import snapshot
from sandbox_core.tree import sync as fs
from sandbox_core.tree.copy import copy_entry
from sandbox_core.tree.ops import backup_directory, safe_restore
from sandbox_core.tree.scan import TreeChanges, scan_tree
from sandbox_core.tree.snapshot import compute_changes
from sandbox_core.tree.sync import recover_sync, sync_tree, undo_sync
from sandbox_core.tree.textdiff import compute_diff

SHM = Path("/dev/shm")


def _write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)


def _snapshot(root: Path) -> dict[str, tuple[str, int, str | None]]:
    """Exact comparable state: kind, mode and content (file bytes / link target) per path."""
    out: dict[str, tuple[str, int, str | None]] = {}
    for rel, entry in scan_tree(root).items():
        content: str | None = entry.target
        if entry.kind == "file":
            content = (root / rel).read_bytes().hex()
        out[rel] = (entry.kind, entry.mode, content)
    return out


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".sandbox-" in p.name)


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[Path]:
    """A private directory on /dev/shm (tmpfs: another filesystem than tmp_path here)."""
    assert os.stat(SHM).st_dev != os.stat(tmp_path).st_dev
    # Unique per run: two test runs on one machine (CI beside a developer) share /dev/shm.
    path = Path(tempfile.mkdtemp(prefix=f"fsutils-{tmp_path.name}-", dir=SHM))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=True)


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    _write(src / "a" / "b" / "f", "hi\n")
    _write(src / "exec.sh", "#!/bin/sh\n", 0o755)
    (src / "empty").mkdir()
    (src / "a" / "b" / "up").symlink_to("../..")
    (src / "dangling").symlink_to("/nonexistent/target")
    (src / "a" / "rel").symlink_to("b/f")
    os.utime(src / "a" / "b" / "f", ns=(1_000_000_000, 1_234_567_890_123))
    return src


# -- backup_directory ------------------------------------------------------------------------


def test_backup_directory_copies_links_as_links_and_keeps_modes_and_times(
    sample: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "dst"
    backup_directory(sample, dst)
    assert _snapshot(dst) == _snapshot(sample)
    assert os.readlink(dst / "a" / "b" / "up") == "../.."
    assert os.readlink(dst / "dangling") == "/nonexistent/target"
    assert (dst / "empty").is_dir()
    assert stat.S_IMODE((dst / "exec.sh").stat().st_mode) == 0o755
    assert (dst / "a" / "b" / "f").stat().st_mtime_ns == 1_234_567_890_123
    dirs = sorted(
        str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_dir() and not p.is_symlink()
    )
    assert dirs == ["a", "a/b", "empty"]


def test_python_copy_matches_cp(sample: Path, tmp_path: Path) -> None:
    copy_entry(sample, tmp_path / "py")
    backup_directory(sample, tmp_path / "cp")
    assert scan_tree(tmp_path / "py") == scan_tree(tmp_path / "cp")


def test_backup_directory_refuses_existing_destination_and_non_directories(
    sample: Path, tmp_path: Path
) -> None:
    (tmp_path / "dst").mkdir()
    with pytest.raises(FileExistsError):
        backup_directory(sample, tmp_path / "dst")
    with pytest.raises(NotADirectoryError):
        backup_directory(sample / "exec.sh", tmp_path / "other")
    with pytest.raises(NotADirectoryError):
        backup_directory(sample / "a" / "rel", tmp_path / "other")


def test_backup_directory_reports_cp_failure_as_oserror(sample: Path, tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cp -a failed"):
        backup_directory(sample, tmp_path / "missing-parent" / "x" / "dst")


# -- safe_restore ----------------------------------------------------------------------------


def test_safe_restore_swaps_content_and_leaves_nothing_beside(sample: Path, tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    backup_directory(sample, backup)
    expected = _snapshot(sample)
    _write(sample / "a" / "b" / "f", "changed\n")
    _write(sample / "new.txt", "new\n")
    safe_restore(backup, sample)
    assert _snapshot(sample) == expected
    assert not backup.exists()
    assert _leftovers(tmp_path) == []


def test_safe_restore_from_other_filesystem_stages_beside_original(
    sample: Path, tmp_path: Path, shm_dir: Path
) -> None:
    backup = shm_dir / "backup"
    backup_directory(sample, backup)
    expected = _snapshot(sample)
    subprocess.run(["rm", "-rf", str(sample / "a")], check=True)
    safe_restore(backup, sample)  # case 09: a plain rename would raise EXDEV
    assert _snapshot(sample) == expected
    assert not backup.exists()
    assert _leftovers(tmp_path) == []


def test_safe_restore_into_missing_original_and_missing_backup(
    sample: Path, tmp_path: Path
) -> None:
    backup = tmp_path / "backup"
    backup_directory(sample, backup)
    target = tmp_path / "restored"
    safe_restore(backup, target)
    assert _snapshot(target) == _snapshot(sample)
    with pytest.raises(FileNotFoundError):
        safe_restore(tmp_path / "nope", target)


# -- compute_changes / compute_diff ----------------------------------------------------------


def test_compute_changes_lists_added_changed_deleted_and_type_swaps(
    sample: Path, tmp_path: Path
) -> None:
    mod = tmp_path / "mod"
    backup_directory(sample, mod)
    _write(mod / "a" / "b" / "f", "hi\nmore\n")
    (mod / "a" / "rel").unlink()
    (mod / "a" / "rel").symlink_to("b/g")
    (mod / "exec.sh").chmod(0o644)
    subprocess.run(["rm", "-r", str(mod / "a" / "b" / "up")], check=True)
    (mod / "empty").rmdir()
    _write(mod / "empty", "now a file\n")  # dir -> file
    (mod / "dangling").unlink()
    (mod / "dangling").mkdir()  # symlink -> dir
    _write(mod / "dangling" / "x", "x\n")
    changes = compute_changes(sample, mod)
    assert changes == TreeChanges(
        added=["dangling/x"],
        changed=["a/b/f", "a/rel", "dangling", "empty", "exec.sh"],
        deleted=["a/b/up"],
    )
    assert compute_changes(sample, sample).is_empty


def test_compute_changes_checks_content_when_only_mtime_differs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a / "same", "abc")
    _write(b / "same", "abc")
    _write(a / "diff", "abc")
    _write(b / "diff", "abd")
    os.utime(b / "same", ns=(1, 2))
    os.utime(b / "diff", ns=(1, 2))
    assert compute_changes(a, b) == TreeChanges(changed=["diff"])


def test_compute_diff_is_exact_unified_text(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a / "t.txt", "one\ntwo\n")
    _write(b / "t.txt", "one\nTWO\n")
    _write(a / "gone.txt", "bye\n")
    (a / "bin").write_bytes(b"\x00\x01")
    (b / "bin").write_bytes(b"\x00\x02")
    (b / "link").symlink_to("t.txt")
    _write(a / "mode.sh", "x\n", 0o644)
    _write(b / "mode.sh", "x\n", 0o755)
    assert compute_diff(a, b) == textwrap.dedent(
        """\
        diff --git a/bin b/bin
        Binary files a/bin and b/bin differ
        diff --git a/gone.txt b/gone.txt
        deleted file mode 100644
        --- a/gone.txt
        +++ /dev/null
        @@ -1 +0,0 @@
        -bye
        diff --git a/link b/link
        new file mode 120000
        --- /dev/null
        +++ b/link
        @@ -0,0 +1 @@
        +t.txt
        diff --git a/mode.sh b/mode.sh
        old mode 100644
        new mode 100755
        diff --git a/t.txt b/t.txt
        --- a/t.txt
        +++ b/t.txt
        @@ -1,2 +1,2 @@
         one
        -two
        +TWO
        """
    )
    assert compute_diff(a, a) == ""


# -- sync_tree / undo_sync / recover_sync ----------------------------------------------------


def _modify(tree: Path) -> None:
    _write(tree / "a" / "b" / "f", "changed\n")
    (tree / "exec.sh").unlink()
    (tree / "empty").rmdir()
    _write(tree / "empty", "file now\n")
    _write(tree / "new" / "deep" / "n.txt", "n\n")
    (tree / "a").chmod(0o700)


def test_sync_tree_applies_everything_and_undo_restores_exactly(
    sample: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    backup_directory(sample, source)
    _modify(source)
    old, new = _snapshot(sample), _snapshot(source)
    progress: list[tuple[int, int]] = []
    changes = sync_tree(
        source,
        sample,
        backup_dir=tmp_path / "keep",
        on_progress=lambda d, t: progress.append((d, t)),
    )
    assert _snapshot(sample) == new
    assert changes == TreeChanges(
        added=["new", "new/deep", "new/deep/n.txt"],
        changed=["a", "a/b/f", "empty"],
        deleted=["exec.sh"],
    )
    # O(changes): one swap per changed root (a/b/f, empty, exec.sh, new) + the chmod of a.
    assert progress[-1] == (5, 5)
    undo = json.loads((tmp_path / "keep" / "undo.json").read_text(encoding="utf-8"))
    assert sorted(op["path"] for op in undo["ops"] if op["old"] and not op["meta"]) == [
        "a/b/f",
        "empty",
        "exec.sh",
    ]
    assert len(list((tmp_path / "keep" / "old").iterdir())) == 3  # kept by op index
    assert _leftovers(tmp_path) == []
    undo_sync(tmp_path / "keep", sample)
    assert _snapshot(sample) == old
    assert _leftovers(tmp_path) == []


def test_sync_tree_with_a_subset_of_changes_touches_only_those(
    sample: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    backup_directory(sample, source)
    _modify(source)
    sync_tree(source, sample, changes=TreeChanges(changed=["a/b/f"]))
    assert (sample / "a" / "b" / "f").read_text() == "changed\n"
    assert (sample / "exec.sh").exists()
    assert (sample / "empty").is_dir()


def test_sync_tree_creates_missing_parents_of_an_added_path(sample: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    backup_directory(sample, source)
    _write(source / "x" / "y" / "z.txt", "z\n")
    sync_tree(source, sample, changes=TreeChanges(added=["x/y/z.txt"]))
    assert (sample / "x" / "y" / "z.txt").read_text() == "z\n"


def test_sync_tree_error_midway_leaves_target_exactly_old(
    sample: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    backup_directory(sample, source)
    _modify(source)
    old = _snapshot(sample)
    calls: list[str] = []

    def fail_after_two(path: str) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(5, "injected I/O error")

    monkeypatch.setattr(fs, "fault_hook", fail_after_two)
    with pytest.raises(OSError, match="injected"):
        sync_tree(source, sample)
    assert _snapshot(sample) == old
    assert _leftovers(tmp_path) == []


def test_sync_tree_into_a_mount_point_stages_inside_and_hides_staging(
    sample: Path, tmp_path: Path
) -> None:
    target = tmp_path / "mnt"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
    try:
        staging = fs.staging_dir_for(target)
        assert Path(staging).parent == target
        assert Path(staging).name.startswith(".sandbox-staging-")
        sync_tree(sample, target)
        assert _snapshot(target) == _snapshot(sample)
        assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in sample.iterdir())
    finally:
        subprocess.run(["umount", str(target)], check=True)


_KILL_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from sandbox_core.tree import sync as fs
    kill_at = int(sys.argv[3])
    seen = []
    def hook(path):
        seen.append(path)
        if (kill_at == -1 and path == "") or len(seen) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    fs.fault_hook = hook
    fs.sync_tree(sys.argv[1], sys.argv[2], backup_dir=sys.argv[4])
    """
)


@pytest.mark.parametrize(("kill_at", "expect"), [(1, "old"), (3, "old"), (5, "old"), (-1, "new")])
def test_recover_sync_after_sigkill_gives_exactly_old_or_new(
    sample: Path, tmp_path: Path, kill_at: int, expect: str
) -> None:
    source = tmp_path / "source"
    backup_directory(sample, source)
    _modify(source)
    old, new = _snapshot(sample), _snapshot(source)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILL_CHILD,
            str(source),
            str(sample),
            str(kill_at),
            str(tmp_path / "keep"),
        ],
        cwd=Path(__file__).resolve().parents[3],
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL
    assert len(_leftovers(tmp_path)) == 1  # the crashed sync's journaled staging area
    outcomes = recover_sync(sample)
    assert outcomes == (["completed"] if expect == "new" else ["rolled_back"])
    assert _snapshot(sample) == (new if expect == "new" else old)
    assert _leftovers(tmp_path) == []
    assert recover_sync(sample) == []


def test_recover_sync_discards_a_sync_that_died_while_staging(sample: Path, tmp_path: Path) -> None:
    staging = Path(fs.staging_dir_for(sample))
    staging.mkdir()
    (staging / "new").mkdir()
    _write(staging / "new" / "0", "half-staged")
    old = _snapshot(sample)
    assert recover_sync(sample) == ["discarded"]
    assert _snapshot(sample) == old
    assert _leftovers(tmp_path) == []


def test_sync_never_follows_links_to_directories(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _write(outside / "precious.txt", "keep me\n")
    target, source = tmp_path / "target", tmp_path / "source"
    target.mkdir()
    (target / "ext").symlink_to(outside)  # a link to a directory, deleted by the sync
    _write(target / "d" / "x", "x\n")
    source.mkdir()
    (source / "d").symlink_to(outside)  # a directory replaced by a link to a directory
    changes = sync_tree(source, target, backup_dir=tmp_path / "keep")
    assert changes == TreeChanges(changed=["d"], deleted=["d/x", "ext"])
    assert (target / "d").is_symlink()
    assert not (target / "ext").exists()
    assert (outside / "precious.txt").read_text() == "keep me\n"
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt"]
    undo_sync(tmp_path / "keep", target)
    assert (target / "ext").is_symlink()
    assert (target / "d" / "x").read_text() == "x\n"
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt"]


# -- find's output (issue 7: a walk's text goes to a file in memory, not a pipe) ----------------


def test_a_walk_longer_than_a_pipe_is_read_whole(tmp_path: Path) -> None:
    names = {f"{i:05d}-" + "n" * 120 for i in range(1500)}  # about 190 KiB of names
    for name in names:
        (tmp_path / name).write_bytes(b"")
    find = shutil.which("find")
    assert find is not None
    assert set(snapshot._run_find(find, str(tmp_path), ["-printf", "%P\\0"])) == names


def test_a_failed_walk_says_what_find_said(tmp_path: Path) -> None:
    find = shutil.which("find")
    assert find is not None
    with pytest.raises(OSError) as failed:
        snapshot._run_find(find, str(tmp_path), ["-no-such-test"])
    assert failed.value.errno == errno.EIO
    assert "find failed" in str(failed.value) and "no-such-test" in str(failed.value)
