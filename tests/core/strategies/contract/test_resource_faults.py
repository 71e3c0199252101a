"""Resource faults: a full (ENOSPC) or read-only (EROFS) file system during a commit, a
two-phase prepare or apply, a rollback or a checkpoint restore of a directory sandbox
(case 42; docs/fidelity.md, "Resource faults").

The property, for copy_on_write, overlay (kernel and fallback) and none: the fault at ANY
write of the step leaves the original exactly as before (a decided two-phase apply: rolled
forward by the retry), nothing staged beside it, the sandbox in its status with its edits (never
ERRORED), an error that says what happened (``SandboxNoSpaceError`` "no space left",
``SandboxPermissionError`` "read-only"; never a conflict), and the retry succeeds once the
cause is gone. Checked on real small tmpfs volumes (full, bound read-only) and by injecting
the fault at the k-th write-class system call, k drawn by hypothesis over every write the step
makes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCommitNoSpaceError,
    SandboxCommitPermissionError,
    SandboxNoSpaceError,
    SandboxPermissionError,
    SandboxRollbackError,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.none import NoSandbox
from sandbox_core.strategies.overlay import OverlaySandbox
from sandbox_core.strategies.overlay import mount as overlay_mount
from sandbox_core.tree.original_lock import clear_if_free
from tests.support.directory_sandboxes import STRATEGIES, new_sandbox
from tests.support.fidelity_tree import differences, tree_state
from tests.support.resource_faults import WriteFaults, small_volume
from tests.support.tree_generators import PROPERTY
from tests.support.two_phase_dirs import edit, make_source, staged_beside

MIB = 1 << 20
FAULTS = [errno.ENOSPC, errno.EROFS]


def _random_mib() -> bytes:
    return os.urandom(MIB)


def _expected_error(code: int) -> type[Exception]:
    return SandboxNoSpaceError if code == errno.ENOSPC else SandboxPermissionError


def _says(code: int, exc: BaseException) -> bool:
    text = str(exc)
    return ("no space left" in text) if code == errno.ENOSPC else ("read-only" in text)


def _no_mounts_under(root: Path) -> None:
    real = os.path.realpath(root)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(real + "/") and "/vol" not in point[len(real) :]:
            overlay_mount.unmount(Path(point))
            pytest.fail(f"mount left behind: {point}")


# -- case 42 on real tmpfs volumes ----------------------------------------------------------------


@pytest.mark.parametrize("kind", STRATEGIES)
def test_case_42_a_full_volume_keeps_the_sandbox_active_and_the_retry_commits(
    tmp_path: Path, kind: str
) -> None:
    """Case 42 A: 4 MiB on an 8 MiB tmpfs, the sandbox rewrites 4 MiB and adds 1 MiB; the
    commit runs out of space. The original is unchanged, nothing is left on the volume (its
    free space is what it was after create), the sandbox is ACTIVE with its edits and the
    error says "no space left"; once the volume grows the same sandbox commits."""
    with small_volume(tmp_path / "vol", 8) as vol:
        src = vol.path / "src"
        src.mkdir()
        for i in range(4):
            (src / f"f{i}").write_bytes(_random_mib())
        sandbox = new_sandbox(kind, src, tmp_path / "root")
        sandbox.create("case-42")
        try:
            before, free_after_create = tree_state(src), vol.free_blocks()
            entries_after_create = sorted(os.listdir(vol.path))
            for i in range(4):
                Path(sandbox.get_path(f"f{i}")).write_bytes(_random_mib())
            Path(sandbox.get_path("new")).write_bytes(_random_mib())
            edited = tree_state(sandbox.get_path("."))

            with pytest.raises(SandboxCommitNoSpaceError) as caught:
                sandbox.commit("fill it")
            assert "no space left" in str(caught.value)
            assert not caught.value.conflicts
            assert sandbox.status is SandboxStatus.ACTIVE
            assert differences(tree_state(src), before) == []
            assert sorted(os.listdir(vol.path)) == entries_after_create == ["src"]
            assert vol.free_blocks() == free_after_create
            assert differences(tree_state(sandbox.get_path(".")), edited) == []

            vol.resize(64)
            sandbox.commit("room now")
            assert sandbox.status is SandboxStatus.COMMITTED
            assert differences(tree_state(src), edited) == []
        finally:
            sandbox.cleanup()
        _no_mounts_under(tmp_path)


@pytest.mark.parametrize("kind", [*STRATEGIES, pytest.param("none", id="none")])
def test_case_42_b_a_read_only_volume_is_a_permission_error_and_the_retry_commits(
    tmp_path: Path, kind: str
) -> None:
    """Case 42 B: the volume is bound read-only before the commit: a
    ``SandboxCommitPermissionError`` saying "read-only", the sandbox ACTIVE, the original
    unchanged; writable again, the same sandbox commits."""
    with small_volume(tmp_path / "vol", 8) as vol:
        src = vol.path / "src"
        src.mkdir()
        (src / "g").write_text("old\n")
        vol.read_only(False)  # the bind mount first, as in the case
        sandbox = (
            NoSandbox("res", str(src))
            if kind == "none"
            else new_sandbox(kind, src, tmp_path / "root")
        )
        sandbox.create("case-42")
        try:
            if kind != "none":
                Path(sandbox.get_path("f")).write_text("new file\n")
            before = tree_state(src)
            vol.read_only(True)
            if kind == "none":
                sandbox.commit("nothing to write")  # its writes landed already: nothing fails
                assert sandbox.status is SandboxStatus.COMMITTED
                return
            with pytest.raises(SandboxCommitPermissionError) as caught:
                sandbox.commit("read-only")
            assert "read-only" in str(caught.value)
            assert not caught.value.conflicts
            assert sandbox.status is SandboxStatus.ACTIVE
            assert differences(tree_state(src), before) == []
            assert sorted(os.listdir(vol.path)) == ["src"]
            assert Path(sandbox.get_path("f")).read_text() == "new file\n"

            vol.read_only(False)
            sandbox.commit("writable again")
            assert sandbox.status is SandboxStatus.COMMITTED
            assert (src / "f").read_text() == "new file\n"
        finally:
            vol.read_only(False)
            sandbox.cleanup()
        _no_mounts_under(tmp_path)


@pytest.mark.parametrize("kind", STRATEGIES)
def test_case_42_a_full_volume_during_prepare_stages_nothing_and_the_plan_can_prepare_again(
    tmp_path: Path, kind: str
) -> None:
    """A two-phase prepare that runs out of space on the original's volume: nothing staged,
    the sandbox ACTIVE, the error says "no space left"; once there is room, prepare and apply
    land the edits."""
    with small_volume(tmp_path / "vol", 4) as vol:
        src = vol.path / "src"
        src.mkdir()
        (src / "f0").write_bytes(_random_mib())
        sandbox = new_sandbox(kind, src, tmp_path / "root")
        sandbox.create("case-42")
        try:
            before, free = tree_state(src), vol.free_blocks()
            for i in range(4):
                Path(sandbox.get_path(f"n{i}")).write_bytes(_random_mib())
            with pytest.raises(SandboxCommitNoSpaceError, match="no space left"):
                sandbox.prepare("tx-1")
            assert sandbox.status is SandboxStatus.ACTIVE
            assert differences(tree_state(src), before) == []
            assert staged_beside(src) == [] and vol.free_blocks() == free
            vol.resize(64)
            sandbox.prepare("tx-1")
            sandbox.apply_prepared("tx-1")
            assert sandbox.status is SandboxStatus.COMMITTED
            assert all((src / f"n{i}").stat().st_size == MIB for i in range(4))
        finally:
            sandbox.cleanup()
        _no_mounts_under(tmp_path)


# -- the property: a fault at the k-th write of every step -----------------------------------

STEPS = ["commit", "prepare", "apply", "abort", "rollback", "rollback_committed", "restore"]
KINDS = [*STRATEGIES, pytest.param("none", id="none")]


class _World:
    """One sandbox over a small source, with its edits, ready for ``step``."""

    def __init__(self, kind: str, step: str) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="resource-faults-"))
        self.src = make_source(self.workdir)
        self.kind, self.step = kind, step
        self.sandbox: BaseSandbox = (
            NoSandbox("res", str(self.src))
            if kind == "none"
            else new_sandbox(kind, self.src, self.workdir / "root")
        )
        self.sandbox.create("faults")
        self.before = tree_state(self.src)
        self.snapshot = self.workdir / "checkpoint"
        if step == "restore":
            assert isinstance(self.sandbox, OverlaySandbox)
            Path(self.sandbox.get_path("at-checkpoint.txt")).write_text("kept\n")
            self.sandbox.create_checkpoint_snapshot(self.snapshot)
        if kind != "none":
            edit(self.sandbox)
        self.edited = tree_state(self.sandbox.get_path("."))
        if step == "apply" or step == "abort":
            self.sandbox.prepare("tx-1")
        if step == "rollback_committed":
            self.sandbox.commit("landed")
            self.committed = tree_state(self.src)

    def run(self) -> None:
        sandbox = self.sandbox
        if self.step == "commit":
            sandbox.commit("m")
        elif self.step == "prepare":
            sandbox.prepare("tx-1")
        elif self.step == "apply":
            sandbox.apply_prepared("tx-1")
        elif self.step == "abort":
            sandbox.abort_prepared("tx-1")
        elif self.step in ("rollback", "rollback_committed"):
            sandbox.rollback()
        else:
            assert isinstance(sandbox, OverlaySandbox)
            sandbox.restore_checkpoint_snapshot(self.snapshot)

    def view(self) -> dict[bytes, dict[str, object]]:
        return tree_state(self.sandbox.get_path("."))

    def close(self) -> None:
        try:
            self.sandbox.cleanup()
            assert staged_beside(self.src) == []
            _no_mounts_under(self.workdir)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _applicable(kind: str, step: str) -> bool:
    if kind == "none":
        return step in ("commit", "prepare", "apply", "abort", "rollback")
    if step == "restore":
        return kind.startswith("overlay")
    return True


CASES = [
    pytest.param(kind.values[0], step, id=f"{kind.id}-{step}", marks=kind.marks)
    for kind in KINDS
    for step in STEPS
    if _applicable(kind.values[0], step)
]


@pytest.fixture(scope="module")
def write_counts() -> dict[tuple[str, str], int]:
    """How many write-class calls each (kind, step) makes, from a run without faults."""
    return {}


def _count(kind: str, step: str, counts: dict[tuple[str, str], int]) -> int:
    if (kind, step) not in counts:
        world = _World(kind, step)
        try:
            with WriteFaults() as faults:
                world.run()
            counts[(kind, step)] = faults.calls
        finally:
            world.close()
    return counts[(kind, step)]


def _check_after_fault(world: _World, code: int, exc: BaseException) -> None:
    sandbox, step = world.sandbox, world.step
    assert isinstance(exc, _expected_error(code)), f"{type(exc).__name__}: {exc}"
    assert _says(code, exc), str(exc)
    assert not (isinstance(exc, SandboxCommitError) and exc.conflicts)
    assert "uncommitted" not in str(exc) and "conflict" not in str(exc)
    assert sandbox.status is not SandboxStatus.ERRORED
    if step == "rollback_committed":
        assert isinstance(exc, SandboxRollbackError)
        assert sandbox.status is SandboxStatus.COMMITTED
        # Either the undo did not happen, or it landed whole (its view is then rebuilt by
        # the retry): never half.
        assert tree_state(world.src) in (world.committed, world.before)
        return
    assert sandbox.status is SandboxStatus.ACTIVE
    if step == "apply":
        return  # the decision stands: only the retry (below) may finish it
    assert differences(tree_state(world.src), world.before) == []
    if step != "abort":
        assert staged_beside(world.src) == []
    if step in ("commit", "prepare", "rollback", "restore"):
        assert differences(world.view(), world.edited) == [], "the sandbox lost its edits"


def _check_done(world: _World) -> None:
    sandbox, step = world.sandbox, world.step
    if step in ("commit", "apply"):
        assert sandbox.status is SandboxStatus.COMMITTED
        assert differences(tree_state(world.src), world.edited) == []
        left = staged_beside(world.src)
        if left == [f".{world.src.name}.sandbox-lock"]:
            # The fault stopped the release of the original's lock: the free lock file stays
            # until cleanup clears it (clear_if_free); it holds nothing.
            clear_if_free(str(world.src))
            left = staged_beside(world.src)
        assert left == []
    elif step == "prepare":
        assert differences(tree_state(world.src), world.before) == []
        sandbox.apply_prepared("tx-1")
        assert differences(tree_state(world.src), world.edited) == []
    elif step == "abort":
        assert staged_beside(world.src) == []
        assert differences(tree_state(world.src), world.before) == []
    elif step in ("rollback", "rollback_committed"):
        assert sandbox.status is SandboxStatus.ROLLED_BACK
        assert differences(tree_state(world.src), world.before) == []
        if world.kind != "none":
            assert differences(world.view(), world.before) == []
    else:
        assert b"at-checkpoint.txt" in world.view() and b"new.txt" not in world.view()


@pytest.mark.parametrize(("kind", "step"), CASES)
@PROPERTY
@given(data=st.data())
def test_a_full_or_read_only_file_system_at_any_write_is_undone_and_retryable(
    kind: str, step: str, data: st.DataObject, write_counts: dict[tuple[str, str], int]
) -> None:
    """Case 42, every strategy and protocol step: ENOSPC or EROFS at the k-th write (k drawn
    over every write the step makes) keeps the original exactly as before (an apply: rolled
    forward by the retry), removes the staging, keeps the status (never ERRORED) and the
    edits, raises the error that names it; the retry succeeds."""
    total = _count(kind, step, write_counts)
    if total == 0:
        # Only removals (abort) or nothing at all (none): a full disk cannot stop it.
        assert step == "abort" or kind == "none"
        return
    k = data.draw(st.integers(1, total), label="k")
    code = data.draw(st.sampled_from(FAULTS), label="errno")
    world = _World(kind, step)
    try:
        faults = WriteFaults(fail_at=k, errno_=code)
        raised: BaseException | None = None
        try:
            with faults:
                world.run()
        except Exception as exc:  # the oracle below says which are right
            raised = exc
        if raised is not None:
            assert faults.fired, f"failed without the fault: {raised!r}"
            _check_after_fault(world, code, raised)
            world.run()  # the same operation, once the cause is gone
        _check_done(world)
    finally:
        world.close()


def test_the_error_classes_say_what_kind_they_are() -> None:
    """ENOSPC is a retryable no-space error of the phase, EROFS a permission error of the phase
    (as git_worktree answers it, CLI exit code 9); neither is a conflict."""
    from sandbox_core.strategies.resource_faults import resource_error, resource_fault

    full = OSError(errno.ENOSPC, "No space left on device", "/v/f")
    ro = OSError(errno.EROFS, "Read-only file system", "/v/f")
    commit_full = resource_error("commit", "S", full)
    assert isinstance(commit_full, SandboxCommitNoSpaceError) and commit_full.retryable
    assert commit_full.path == "/v/f" and commit_full.conflicts == []
    assert isinstance(resource_error("commit", "S", ro), SandboxCommitPermissionError)
    rollback_ro = resource_error("rollback", "S", ro)
    assert isinstance(rollback_ro, SandboxRollbackError) and rollback_ro.refused
    wrapped = OSError(errno.EIO, "cp -a failed: cp: error writing 'x': No space left on device")
    found = resource_fault(RuntimeError("outer").with_traceback(None))
    assert found is None
    try:
        try:
            raise wrapped
        except OSError as inner:
            raise ValueError("outer") from inner
    except ValueError as outer:
        assert resource_fault(outer) is not None
        assert resource_fault(outer).errno == errno.ENOSPC  # type: ignore[union-attr]


# -- the plan protocol: a fault anywhere in a saga or a two-phase plan commit ---------------

PLAN_KINDS = ["copy_on_write", "overlay-fallback"]


class _Plan:
    """A manager with a store, and one edited sandbox per kind of :data:`PLAN_KINDS`."""

    def __init__(self) -> None:
        from sandbox_core.host.manager import SandboxManager
        from sandbox_core.host.store import SandboxStore
        from sandbox_core.strategies.factory import SandboxFactory

        self.workdir = Path(tempfile.mkdtemp(prefix="resource-faults-plan-"))
        self.store = SandboxStore(self.workdir / "state")
        self.manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False, store=self.store)
        self.sources: list[Path] = []
        self.before: list[dict[bytes, dict[str, object]]] = []
        self.edited: list[dict[bytes, dict[str, object]]] = []
        for index, kind in enumerate(PLAN_KINDS):
            src = make_source(self.workdir / f"o{index}")
            strategy, options = (
                ("copy_on_write", {})
                if kind == "copy_on_write"
                else ("overlay", {"mode": kind.removeprefix("overlay-")})
            )
            sandbox = self.manager.get_or_create_sandbox(
                "plan", f"r{index}", str(src), strategy,
                sandbox_root=str(self.workdir / "root"), **options,
            )  # fmt: skip
            self.sources.append(src)
            self.before.append(tree_state(src))
            edit(sandbox)
            self.edited.append(tree_state(sandbox.get_path(".")))
            self.manager.persist("plan")

    def statuses(self) -> list[str]:
        in_memory = [sb.status.value for sb in self.manager.list_sandboxes("plan")]
        stored = [str(record["status"]) for record in self.store.records()]
        return in_memory + stored

    def close(self) -> None:
        try:
            self.manager.cleanup_all("plan")
            for src in self.sources:
                assert staged_beside(src) == []
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def plan_counts() -> dict[str, int]:
    return {}


@pytest.mark.parametrize("mode", ["saga", "two_phase"])
@PROPERTY
@given(data=st.data())
def test_a_resource_fault_anywhere_in_a_plan_commit_never_marks_a_sandbox_errored(
    mode: str, data: st.DataObject, plan_counts: dict[str, int]
) -> None:
    """Case 42 and the security review ("ERRORED counts as finished, so the TTL then deletes
    the edits"): ENOSPC or EROFS at any write of a plan commit (the sandboxes' writes, the
    plan journal, the store's records) leaves no sandbox ERRORED, in memory or in the store;
    each original is as before or committed, and committing the plan again lands every edit."""
    if mode not in plan_counts:
        plan = _Plan()
        try:
            with WriteFaults() as counting:
                plan.manager.commit_plan("plan", mode=mode)  # type: ignore[arg-type]
            plan_counts[mode] = counting.calls
        finally:
            plan.close()
    k = data.draw(st.integers(1, plan_counts[mode]), label="k")
    code = data.draw(st.sampled_from(FAULTS), label="errno")
    plan = _Plan()
    try:
        faults = WriteFaults(fail_at=k, errno_=code)
        results = None
        with faults, contextlib.suppress(Exception):
            results = plan.manager.commit_plan("plan", mode=mode)  # type: ignore[arg-type]
        assert SandboxStatus.ERRORED.value not in plan.statuses(), (faults.where, results)
        journal = plan.manager.journal_for("plan").load()
        if journal is None or journal.phase != "applying":
            # Until the decision every original is as before; a decided two-phase apply is
            # rolled forward by the retry below (it may stop between two renames).
            for src, before, edited in zip(plan.sources, plan.before, plan.edited, strict=True):
                assert tree_state(src) in (before, edited)
        for retry in range(3):  # the fault's attempt; a retry that may only finish that one
            if results is not None and all(result.success for result in results):
                break
            if any(
                sb.status is SandboxStatus.ROLLED_BACK for sb in plan.manager.list_sandboxes("plan")
            ):
                # The saga compensated a landed commit: the plan must be rerun (case 38), and
                # nothing of it stays in the originals.
                for src, before in zip(plan.sources, plan.before, strict=True):
                    assert differences(tree_state(src), before) == []
                return
            if retry == 2:
                # A retry that found the faulted attempt's journal finished it the one way it
                # can (compensated, nothing landed); the next commit is a new attempt.
                assert all("interrupted" in str(result.error) for result in results), results
            results = plan.manager.commit_plan("plan", mode=mode)  # type: ignore[arg-type]
        for src, edited in zip(plan.sources, plan.edited, strict=True):
            assert differences(tree_state(src), edited) == []
    finally:
        plan.close()


@pytest.mark.parametrize("action", ["commit", "rollback", "restore"])
@pytest.mark.parametrize("code", FAULTS)
def test_a_resource_fault_keeps_its_class_through_the_agents_wire(action: str, code: int) -> None:
    """What a remote sandbox (the workspace agent) raises for a full or read-only file system
    is what a local one raises: the operator then retries a full volume later and reports a
    read-only one as a permission problem, instead of a plain commit failure."""
    from sandbox_core.agent.wire import core_error, error_reply
    from sandbox_core.strategies.resource_faults import resource_error

    local = resource_error(action, "S", OSError(code, os.strerror(code), "/v/f"))
    _, body = error_reply(local)
    remote = core_error(body["error"])
    assert type(remote) is type(local)
    assert str(remote) == str(local) and _says(code, remote)
    assert isinstance(remote, _expected_error(code))
