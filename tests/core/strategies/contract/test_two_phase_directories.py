"""Two-phase commit of the directory strategies (issue 9): review, prepare, apply, abort.

Every test runs on real directories in every mode: copy_on_write, overlay (kernel OverlayFS)
and overlay (userspace fallback). The oracle is :func:`tests.support.fidelity_tree.tree_state`
(type, mode, owner, xattrs, link groups, holes, content, mtime of every path).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given

from sandbox_core.errors import SandboxCommitError, SandboxError, TwoPhaseUnavailableError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.strategies.overlay import OverlaySandbox
from sandbox_core.tree import staging as tree_staging
from sandbox_core.tree import sync
from tests.support.directory_sandboxes import STRATEGIES, new_sandbox
from tests.support.fidelity_tree import differences, tree_state
from tests.support.tree_generators import PROPERTY, Workdir, apply_edit, build, edits, same, trees
from tests.support.two_phase_dirs import edit, make_source, staged_beside

REPO_ROOT = Path(__file__).resolve().parents[4]
TXID = "plan-1.1"


@pytest.fixture
def sandbox(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BaseSandbox]:
    src = make_source(tmp_path)
    made = new_sandbox(request.param, src, tmp_path / "root")
    made.create("tpc")
    yield made
    made.cleanup()
    assert staged_beside(src) == []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        assert not point.startswith(os.path.realpath(tmp_path) + "/"), f"mount left: {point}"


def modes(func: Any) -> Any:
    return pytest.mark.parametrize("sandbox", STRATEGIES, indirect=True)(func)


def original_of(sandbox: BaseSandbox) -> Path:
    return Path(sandbox.original_path)


# -- review ---------------------------------------------------------------------------------------


@modes
def test_review_counts_and_a_stable_digest_equal_to_the_prepare_digest(
    sandbox: BaseSandbox,
) -> None:
    src = original_of(sandbox)
    before = tree_state(src)
    edit(sandbox)
    first, second = sandbox.review(), sandbox.review()
    assert first == second
    assert first.digest.startswith("sha256:") and len(first.digest) == 7 + 64
    assert (first.added, first.changed, first.deleted) == (["new.txt"], ["a.txt"], ["d/c.txt"])
    assert (first.lines_added, first.lines_removed) == (2 + 2, 1 + 2)
    assert first.bytes_changed == len("one\nTWO\nthree\nfour\n") + len("n1\nn2\n")
    assert first.conflicts == []
    assert sandbox.status is SandboxStatus.ACTIVE
    assert tree_state(src) == before and staged_beside(src) == []

    prepared = sandbox.prepare(TXID, "msg")
    assert prepared.digest == first.digest
    assert prepared.summary is not None and prepared.summary.added == ["new.txt"]
    assert sandbox.review().digest == first.digest
    sandbox.abort_prepared(TXID)
    assert sandbox.review().digest == first.digest


METADATA_EDITS = {
    "chmod": lambda p: os.chmod(p / "a.txt", 0o600),
    "chown": lambda p: os.chown(p / "a.txt", 1234, 1234),
    "xattr": lambda p: os.setxattr(p / "a.txt", "user.tag", b"v"),
    "dir-mode": lambda p: os.chmod(p / "d", 0o2750),  # noqa: S103 (set-gid on purpose)
    "symlink-target": lambda p: (os.unlink(p / "link"), os.symlink("keep.txt", p / "link")),
    "hard-link": lambda p: os.link(p / "keep.txt", p / "keep-link.txt"),
    "same-size-content": lambda p: (p / "b.bin").write_bytes(b"\x00\x02binary"),
}


@modes
@pytest.mark.parametrize("change", sorted(METADATA_EDITS))
def test_a_metadata_only_change_changes_the_digest(sandbox: BaseSandbox, change: str) -> None:
    edit(sandbox)
    view = Path(sandbox.get_path(""))
    digest = sandbox.review().digest
    METADATA_EDITS[change](view)
    assert sandbox.review().digest != digest
    prepared = sandbox.prepare(TXID)
    assert prepared.digest == sandbox.review().digest
    sandbox.abort_prepared(TXID)


@modes
def test_a_touch_alone_is_no_change(sandbox: BaseSandbox) -> None:
    edit(sandbox)
    digest = sandbox.review().digest
    os.utime(sandbox.get_path("keep.txt"), ns=(1, 1))
    assert sandbox.review().digest == digest


# -- prepare --------------------------------------------------------------------------------------


def test_a_conflicting_prepare_touches_nothing(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    sandbox = CopyOnWriteSandbox("res", str(src), sandbox_root=str(tmp_path / "root"))
    sandbox.create("tpc")
    try:
        edit(sandbox)
        (src / "a.txt").write_text("changed in the original\n")
        before = tree_state(src)
        assert sandbox.review().conflicts == ["a.txt"]
        with pytest.raises(SandboxCommitError) as caught:
            sandbox.prepare(TXID)
        assert caught.value.conflicts == ["a.txt"]
        assert not differences(tree_state(src), before)
        assert staged_beside(src) == []
        assert sandbox.status is SandboxStatus.ACTIVE
        sandbox.abort_prepared(TXID)  # nothing prepared: a no-op
    finally:
        sandbox.cleanup()


@modes
def test_a_failed_prepare_leaves_nothing_staged(sandbox: BaseSandbox) -> None:
    src = original_of(sandbox)
    edit(sandbox)
    before = tree_state(src)
    real = tree_staging.copy_entry
    calls: list[str] = []

    def fail_second(*args: Any, **kwargs: Any) -> None:
        calls.append(str(args[0]))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(*args, **kwargs)

    with (
        mock.patch.object(tree_staging, "copy_entry", fail_second),
        pytest.raises(SandboxCommitError),
    ):
        sandbox.prepare(TXID)
    assert len(calls) == 2
    assert not differences(tree_state(src), before)
    assert staged_beside(src) == []
    assert sandbox.status is SandboxStatus.ACTIVE
    with pytest.raises(SandboxCommitError, match="nothing is prepared"):
        sandbox.apply_prepared(TXID)


@modes
def test_prepare_then_abort_leaves_nothing_and_the_original_untouched(
    sandbox: BaseSandbox,
) -> None:
    src = original_of(sandbox)
    before = tree_state(src)
    edit(sandbox)
    prepared = sandbox.prepare(TXID)
    staging = Path(prepared.details["staging"])
    assert staging.parent == src.parent and staging.name.endswith(f".{sandbox.sandbox_id}")
    assert TXID in staging.name
    assert os.stat(staging).st_dev == os.stat(src).st_dev  # renames, never copies, at apply
    assert tree_state(src) == before
    sandbox.abort_prepared(TXID)
    sandbox.abort_prepared(TXID)  # idempotent
    assert staged_beside(src) == []
    assert tree_state(src) == before
    assert sandbox.status is SandboxStatus.ACTIVE
    with pytest.raises(SandboxCommitError):
        sandbox.apply_prepared(TXID)
    result = sandbox.commit("one-shot after an abort")
    assert result.added_files == ["new.txt"]
    assert (src / "new.txt").read_text() == "n1\nn2\n"


@modes
def test_a_staged_area_survives_recover_sync_and_a_one_shot_commit(
    sandbox: BaseSandbox, tmp_path: Path
) -> None:
    src = original_of(sandbox)
    edit(sandbox)
    prepared = sandbox.prepare(TXID)
    staging = Path(prepared.details["staging"])
    assert sync.recover_sync(src) == []
    other = CopyOnWriteSandbox("res", str(src), sandbox_root=str(tmp_path / "other"))
    other.create("other")
    Path(other.get_path("other.txt")).write_text("from another sandbox")
    other.commit()  # runs recover_sync on the same original
    other.cleanup()
    assert staging.is_dir()
    result = sandbox.apply_prepared(TXID)
    assert result.metadata["txid"] == TXID
    assert (src / "other.txt").exists() and (src / "new.txt").exists()
    assert staged_beside(src) == []


# -- apply ----------------------------------------------------------------------------------------


@modes
def test_apply_equals_the_one_shot_commit_and_rolls_back(sandbox: BaseSandbox) -> None:
    src = original_of(sandbox)
    before = tree_state(src)
    edit(sandbox)
    intended = tree_state(Path(sandbox.get_path("")))
    review = sandbox.review()
    prepared = sandbox.prepare(TXID, "two-phase")
    assert prepared.digest == review.digest
    result = sandbox.apply_prepared(TXID)
    assert sandbox.status is SandboxStatus.COMMITTED
    assert (result.added_files, result.changed_files, result.deleted_files) == (
        ["new.txt"], ["a.txt"], ["d/c.txt"],
    )  # fmt: skip
    assert result.metadata["txid"] == TXID and result.metadata["message"] == "two-phase"
    same(tree_state(src), intended, "original after apply")
    assert sandbox.apply_prepared(TXID) == result  # idempotent
    assert staged_beside(src) == []
    sandbox.rollback()  # compensation from COMMITTED
    same(tree_state(src), before, "original after rollback from COMMITTED")
    sandbox.activate()
    with pytest.raises(SandboxCommitError, match="nothing is prepared"):
        sandbox.apply_prepared(TXID)  # undone: the old result is not given again
    assert sandbox.status is SandboxStatus.ACTIVE


@modes
def test_a_concurrent_change_to_a_staged_path_refuses_the_apply(sandbox: BaseSandbox) -> None:
    src = original_of(sandbox)
    edit(sandbox)
    sandbox.prepare(TXID)
    os.chmod(src / "a.txt", 0o640)  # metadata only: the stamps still see it
    before = tree_state(src)
    with pytest.raises(SandboxCommitError) as caught:
        sandbox.apply_prepared(TXID)
    assert caught.value.conflicts == ["a.txt"]
    assert not differences(tree_state(src), before)
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.abort_prepared(TXID)
    assert staged_beside(src) == []


@modes
def test_apply_and_abort_from_a_reopened_sandbox(sandbox: BaseSandbox) -> None:
    src = original_of(sandbox)
    edit(sandbox)
    intended = tree_state(Path(sandbox.get_path("")))
    sandbox.prepare(TXID)
    record = json.loads(json.dumps(sandbox.to_record()))
    reopened = type(sandbox).reopen(record)
    reopened.abort_prepared("another-txid")  # nothing staged under it
    reopened.apply_prepared(TXID)
    same(tree_state(src), intended, "original after apply in a reopened sandbox")
    with pytest.raises(SandboxError):
        reopened.abort_prepared(TXID)  # decided and applied: only apply may touch it
    reopened.rollback()
    sandbox._status = SandboxStatus.CLEANED_UP  # the reopened one owns the cleanup
    reopened.cleanup()


@modes
def test_cleanup_removes_a_staged_commit_whose_plan_was_lost(sandbox: BaseSandbox) -> None:
    src = original_of(sandbox)
    before = tree_state(src)
    edit(sandbox)
    sandbox.prepare(TXID)
    sandbox.prepare("plan-2.1")
    assert len(staged_beside(src)) == 2
    sandbox.cleanup()
    assert staged_beside(src) == []
    assert tree_state(src) == before


KILL_SCRIPT = textwrap.dedent(
    """
    import json, os, pickle, sys
    from pathlib import Path
    from sandbox_core.tree import sync
    from tests.support.fidelity_tree import tree_state
    from tests.support.directory_sandboxes import new_sandbox

    kind, src, root, out, kill_at = sys.argv[1:6]
    s = new_sandbox(kind, Path(src), Path(root))
    s.create("plan-kill")
    Path(s.get_path("a.txt")).write_text("changed")
    Path(s.get_path("b.bin")).write_bytes(b"changed too")
    Path(s.get_path("new.txt")).write_text("new")
    os.unlink(s.get_path("d/c.txt"))
    os.chmod(s.get_path("d"), 0o700)
    intended = tree_state(s.get_path(""))
    s.prepare("plan-kill.1")
    Path(out, "record.json").write_text(json.dumps(s.to_record()))
    Path(out, "intended.pickle").write_bytes(pickle.dumps(intended))
    calls = []
    def hook(path):
        calls.append(path)
        if len(calls) == int(kill_at):
            os._exit(9)
    sync.fault_hook = hook
    s.apply_prepared("plan-kill.1")
    """
)


@pytest.mark.parametrize("kind", STRATEGIES)
@pytest.mark.parametrize("kill_at", [1, 3, 6], ids=["first-swap", "mid", "after-swaps"])
def test_sigkill_mid_apply_then_apply_again_finishes_exactly(
    tmp_path: Path, kind: str, kill_at: int
) -> None:
    """Killed after ``kill_at`` fault-hook calls of the apply (one per swapped path, the last
    once every path is in); the apply in this (fresh) process rolls forward to exactly the
    sandbox's tree, and rollback from COMMITTED then restores the tree before."""
    src = make_source(tmp_path)
    before = tree_state(src)
    done = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, kind, str(src), str(tmp_path / "root"),
         str(tmp_path), str(kill_at)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    assert tree_state(src) != before  # the kill left a half-applied commit
    intended = pickle.loads((tmp_path / "intended.pickle").read_bytes())  # noqa: S301 (ours)
    record = json.loads((tmp_path / "record.json").read_text())
    cls = CopyOnWriteSandbox if kind == "copy_on_write" else OverlaySandbox
    sync.recover_sync(src)  # a one-shot commit's recovery never undoes a decided apply
    sandbox = cls.reopen(record)
    try:
        with pytest.raises(SandboxError):
            sandbox.abort_prepared("plan-kill.1")
        result = sandbox.apply_prepared("plan-kill.1")
        assert result.added_files == ["new.txt"]
        same(tree_state(src), intended, "original after the resumed apply")
        assert staged_beside(src) == []
        sandbox.rollback()
        same(tree_state(src), before, "original after rollback from COMMITTED")
    finally:
        sandbox.cleanup()


# -- property: prepare+apply and prepare+abort over random trees and edits ------------------------


@pytest.mark.parametrize("kind", STRATEGIES)
@PROPERTY
@given(spec=trees(), changes=edits())
def test_prepare_apply_and_prepare_abort_keep_the_trees_exact(
    kind: str, spec: Any, changes: Any
) -> None:
    work = Workdir()
    try:
        src = work.path / "src"
        build(os.fsencode(src), spec)
        before = tree_state(src)
        sandbox = new_sandbox(kind, src, work.path / "root")
        sandbox.create("prop")
        view = os.fsencode(sandbox.get_path(""))
        for change in changes:
            apply_edit(view, change)
        intended = tree_state(view)
        review = sandbox.review()

        prepared = sandbox.prepare("prop-abort.1")
        assert prepared.digest == review.digest
        sandbox.abort_prepared("prop-abort.1")
        same(tree_state(src), before, "original after prepare + abort")
        assert staged_beside(src) == []
        same(tree_state(view), intended, "sandbox after prepare + abort")

        assert sandbox.prepare("prop-apply.1").digest == review.digest
        sandbox.apply_prepared("prop-apply.1")
        same(tree_state(src), intended, "original after prepare + apply")
        assert staged_beside(src) == []

        sandbox.rollback()
        same(tree_state(src), before, "original after rollback from COMMITTED")
        same(tree_state(view), before, "sandbox after rollback from COMMITTED")
        sandbox.cleanup()
    finally:
        work.close()


def test_staging_keys_are_checked(tmp_path: Path) -> None:
    for bad in ("", "../x", "a/b", "x y", "x" * 200):
        with pytest.raises(ValueError):
            tree_staging.prepared_dir_for(tmp_path, bad)
    assert tree_staging.prepared_dir_for(tmp_path, "plan-1.1.ID").endswith("prepared-plan-1.1.ID")


@modes
def test_a_txid_that_would_leave_its_directory_is_refused(sandbox: BaseSandbox) -> None:
    src = original_of(sandbox)
    before = sorted(os.listdir(src.parent))
    edit(sandbox)
    with pytest.raises(SandboxCommitError, match="invalid two-phase staging key"):
        sandbox.prepare("../../escape")
    with pytest.raises(SandboxCommitError, match="invalid two-phase staging key"):
        sandbox.apply_prepared("../escape")
    with pytest.raises(SandboxError, match="invalid two-phase staging key"):
        sandbox.abort_prepared("a/b")
    assert sorted(os.listdir(src.parent)) == before
    assert sandbox.status is SandboxStatus.ACTIVE


@pytest.fixture
def mounted_source(tmp_path: Path) -> Iterator[Path]:
    """An original that is a mount point (a tmpfs), so its staging area is a hidden child."""
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(src)], check=True)
    try:
        (src / "a.txt").write_text("one\n")
        yield src
    finally:
        subprocess.run(["umount", "-l", str(src)], check=True)


@pytest.mark.overlay_kernel  # needs root to mount the tmpfs
@pytest.mark.parametrize("kind", ["copy_on_write", "overlay-fallback"])
def test_a_mount_point_original_stages_inside_itself_invisibly(
    mounted_source: Path, tmp_path: Path, kind: str
) -> None:
    src = mounted_source
    sandbox = new_sandbox(kind, src, tmp_path / "root")
    sandbox.create("tpc")
    try:
        Path(sandbox.get_path("a.txt")).write_text("two\n")
        digest = sandbox.review().digest
        prepared = sandbox.prepare(TXID)
        staging = Path(prepared.details["staging"])
        assert staging.parent == src and staging.name.startswith(".sandbox-staging-prepared-")
        assert sandbox.review().digest == digest  # the staged area is not a change
        assert sync.recover_sync(src) == [] and staging.is_dir()
        sandbox.apply_prepared(TXID)
        assert (src / "a.txt").read_text() == "two\n"
        assert staged_beside(src) == []
    finally:
        sandbox.cleanup()


@pytest.mark.overlay_kernel
def test_a_kernel_overlay_of_a_mount_point_cannot_prepare(
    mounted_source: Path, tmp_path: Path
) -> None:
    """Its staging area would be written inside the mounted lower directory: refused up front,
    so the plan falls back to the saga (or fails) with nothing touched."""
    sandbox = new_sandbox("overlay-kernel", mounted_source, tmp_path / "root")
    sandbox.create("tpc")
    try:
        Path(sandbox.get_path("a.txt")).write_text("two\n")
        with pytest.raises(TwoPhaseUnavailableError, match="mount point"):
            sandbox.prepare(TXID)
        assert (mounted_source / "a.txt").read_text() == "one\n"
        assert staged_beside(mounted_source) == []
        assert sandbox.status is SandboxStatus.ACTIVE
    finally:
        sandbox.cleanup()
