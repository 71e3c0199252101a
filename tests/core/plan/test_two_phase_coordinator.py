"""The two-phase plan commit coordinator's rules on real directories (issue 9, §1 and §2).

Participants are the small file fakes of tests/support/two_phase_fakes.py; the crash tests with
every real strategy are in tests/core/plan/test_two_phase_crash.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.errors import TwoPhaseUnavailableError
from sandbox_core.host.manager import SandboxManager
from sandbox_core.plan.journal import JournalPhase, JournalReason, MemoryCommitJournal, StepState
from sandbox_core.plan.review import plan_digest
from sandbox_core.plan.saga import InjectedFaultError
from sandbox_core.plan.two_phase import TwoPhasePlanCommit, independent_chains, plan_txid
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.strategies.factory import SandboxFactory
from sandbox_core.strategies.overlay import OverlaySandbox
from tests.support.two_phase_fakes import (
    StagedFileSandbox,
    VolatileSandbox,
    leftovers,
    make_original,
)


def _manager(tmp_path: Path) -> SandboxManager:
    factory = SandboxFactory()
    factory.register("staged_fake", StagedFileSandbox)
    factory.register("volatile_fake", VolatileSandbox)
    return SandboxManager(factory, cleanup_on_exit=False)


def _plan(
    tmp_path: Path, manager: SandboxManager, count: int, volatile: int = 0, **options: object
) -> list[Path]:
    originals = []
    for index in range(count + volatile):
        original = make_original(tmp_path / "originals", f"r{index}")
        strategy = "staged_fake" if index < count else "volatile_fake"
        sandbox = manager.get_or_create_sandbox(
            "plan",
            f"r{index}",
            str(original),
            strategy,
            sandbox_root=str(tmp_path / "boxes"),
            **options,
        )
        Path(sandbox.get_path("value")).write_text(f"new {index}\n")
        originals.append(original)
    return originals


def _texts(originals: list[Path]) -> list[str]:
    return [(o / "value").read_text() for o in originals]


def test_plan_commits_in_two_phases(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 3, volatile=1)
    journal = MemoryCommitJournal()
    results = manager.commit_plan("plan", journal=journal)
    assert [r.success for r in results] == [True] * 4
    assert _texts(originals) == [f"new {i}\n" for i in range(4)]
    assert leftovers(originals) == []
    state = journal.load()
    assert state is not None
    assert (state.mode, state.phase, state.reason) == (
        "two_phase",
        JournalPhase.COMMITTED,
        JournalReason.COMMITTED,
    )
    assert state.txid == plan_txid("plan", 1)
    assert state.decided_at is not None
    assert [s.last_resource for s in state.steps] == [False, False, False, True]
    assert all(s.prepared and s.prepared["txid"] == state.txid for s in state.steps)
    assert all(r.metadata["txid"] == state.txid for r in results)
    assert all(sb.status is SandboxStatus.COMMITTED for sb in manager.list_sandboxes("plan"))


def test_conflict_in_last_sandbox_touches_no_original(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 5)
    (originals[4] / "value").write_text("moved on\n")
    journal = MemoryCommitJournal()
    results = manager.commit_plan("plan", journal=journal)
    assert len(results) == 1 and not results[0].success
    meta = results[0].metadata
    sandboxes = manager.list_sandboxes("plan")
    assert meta["failed_sandbox_id"] == sandboxes[4].sandbox_id
    assert meta["conflicts"] == ["value"]
    assert meta["rolled_back_ids"] == [] and meta["touched_originals"] == 0
    assert meta["reason"] == "CommitFailed"
    assert results[0].error and results[0].error.startswith("Atomic commit failed")
    assert _texts(originals) == ["base\n"] * 4 + ["moved on\n"]
    assert leftovers(originals) == []
    assert all(sb.status is SandboxStatus.ACTIVE for sb in sandboxes)
    state = journal.load()
    assert state is not None and state.phase is JournalPhase.FAILED
    assert [s.state for s in state.steps] == [StepState.ABORTED] * 4 + [StepState.FAILED]


def test_review_digest_approves_and_a_later_edit_is_refused(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 3)
    review = manager.review_plan("plan")
    assert review.digest == plan_digest(review.sandboxes)
    assert not review.has_conflicts
    sandbox = manager.list_sandboxes("plan")[1]
    Path(sandbox.get_path("value")).write_text("edited after approval\n")
    results = manager.commit_plan("plan", approved_digest=review.digest)
    assert not results[0].success
    assert results[0].metadata["reason"] == "ChangedSinceApproval"
    assert results[0].metadata["approved_digest"] == review.digest
    assert _texts(originals) == ["base\n"] * 3
    assert leftovers(originals) == []
    again = manager.review_plan("plan")
    assert manager.commit_plan("plan", approved_digest=again.digest)[0].success
    assert _texts(originals)[1] == "edited after approval\n"


def test_two_volatile_participants_refuse_two_phase_and_auto_falls_back(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 1, volatile=2)
    with pytest.raises(TwoPhaseUnavailableError):
        manager.commit_plan("plan")
    assert _texts(originals) == ["base\n"] * 3
    journal = MemoryCommitJournal()
    results = manager.commit_plan("plan", mode="auto", journal=journal)
    assert [r.success for r in results] == [True] * 3
    assert all(r.metadata["mode"] == "saga" for r in results)
    assert "last resource" in results[0].metadata["fallback_reason"]
    state = journal.load()
    assert state is not None and state.mode == "saga" and state.fallback_reason


def test_prepare_refusing_two_phase_falls_back_with_nothing_left(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 2, refuse_two_phase=True)
    with pytest.raises(TwoPhaseUnavailableError):
        manager.commit_plan("plan")
    assert leftovers(originals) == [] and _texts(originals) == ["base\n"] * 2
    results = manager.commit_plan("plan", mode="auto")
    assert [r.success for r in results] == [True, True]
    assert results[0].metadata["fallback_reason"] == "this fake refuses two phases"


def test_last_resource_failing_is_the_abort_decision(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 2, volatile=1, fail_apply=True)
    results = manager.commit_plan("plan")
    assert not results[0].success
    assert results[0].metadata["failed_sandbox_id"] == manager.list_sandboxes("plan")[2].sandbox_id
    assert _texts(originals) == ["base\n"] * 3
    assert leftovers(originals) == []


def test_injected_prepare_fault_aborts_everything(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 3)
    sandboxes = manager.list_sandboxes("plan")

    def hook(point: str, index: int, sandbox_id: str) -> None:
        if (point, index) == ("before_prepare", 3):
            raise InjectedFaultError("injected")

    journal = MemoryCommitJournal()
    results = TwoPhasePlanCommit(journal, fault_hook=hook).run("plan", sandboxes)
    assert not results[0].success
    assert leftovers(originals) == [] and _texts(originals) == ["base\n"] * 3


def test_directory_sandboxes_share_one_chain_beside_the_others(tmp_path: Path) -> None:
    """copy_on_write, overlay and none do their prepare and apply as Python file-system calls,
    which threads only slow down (the GIL): they run one after another in one chain, whatever
    their originals, while the other participants' chains stay apart."""
    directories: list[Any] = [
        CopyOnWriteSandbox("c1", str(tmp_path / "a")),
        OverlaySandbox("o1", str(tmp_path / "b"), mode="fallback"),
        CopyOnWriteSandbox("c2", str(tmp_path / "c")),
    ]
    others: list[Any] = [StagedFileSandbox("s", str(tmp_path / "d")), StagedFileSandbox("t", "x")]
    pairs: list[Any] = [(None, sb) for sb in [directories[0], *others, *directories[1:]]]
    assert independent_chains([1, 2, 3, 4, 5], pairs) == [[1, 4, 5], [2], [3]]


@pytest.mark.parametrize("workers", [1, 8], ids=["in-order", "concurrent"])
def test_recover_before_decision_aborts_and_after_decision_rolls_forward(
    tmp_path: Path, workers: int
) -> None:
    """In order (``max_workers=1``) a crash at step 2 leaves exactly steps 1-2 done; with
    independent participants run at once step 3 may be done too: either way recovery ends
    all or nothing."""
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 3)
    sandboxes = manager.list_sandboxes("plan")

    class Crash(BaseException):
        pass

    def crash_at(where: tuple[str, int]):  # type: ignore[no-untyped-def]
        def hook(point: str, index: int, sandbox_id: str) -> None:
            if (point, index) == where:
                raise Crash

        return hook

    journal = MemoryCommitJournal()
    with pytest.raises(Crash):
        TwoPhasePlanCommit(
            journal, fault_hook=crash_at(("after_prepare", 2)), max_workers=workers
        ).run("plan", sandboxes)
    staged = len(leftovers(originals))
    assert staged == 2 if workers == 1 else staged in (2, 3)
    by_id = {sb.sandbox_id: sb for sb in sandboxes}
    state = TwoPhasePlanCommit(journal).recover(lambda step: by_id[step.sandbox_id])
    assert state is not None
    assert (state.phase, state.reason) == (JournalPhase.ROLLED_BACK, JournalReason.INTERRUPTED)
    assert leftovers(originals) == [] and _texts(originals) == ["base\n"] * 3

    journal = MemoryCommitJournal()
    with pytest.raises(Crash):
        TwoPhasePlanCommit(
            journal, fault_hook=crash_at(("after_apply", 2)), max_workers=workers
        ).run("plan", sandboxes, attempt=2)
    texts = _texts(originals)
    assert texts[:2] == ["new 0\n", "new 1\n"]
    assert texts[2] == "base\n" if workers == 1 else texts[2] in ("base\n", "new 2\n")
    state = TwoPhasePlanCommit(journal).recover(lambda step: by_id[step.sandbox_id])
    assert state is not None and state.phase is JournalPhase.COMMITTED
    assert _texts(originals) == [f"new {i}\n" for i in range(3)]
    assert leftovers(originals) == []
    assert TwoPhasePlanCommit(journal).recover(lambda step: None) == state


def test_plan_txid_is_safe_and_deterministic() -> None:
    txid = plan_txid("my plan/with ../odd chars" * 5, 12)
    assert txid == plan_txid("my plan/with ../odd chars" * 5, 12)
    assert len(txid) <= 64
    assert all(c.isalnum() or c in "._-" for c in txid)
    assert plan_txid("p", 1) != plan_txid("p", 2)
    with pytest.raises(ValueError):
        plan_txid("p", 0)


def test_apply_failing_after_the_decision_stays_open_and_recover_finishes(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 3)
    sandboxes = manager.list_sandboxes("plan")

    def hook(point: str, index: int, sandbox_id: str) -> None:
        if (point, index) == ("before_apply", 2):
            raise InjectedFaultError("disk unplugged")

    journal = MemoryCommitJournal()
    results = TwoPhasePlanCommit(journal, fault_hook=hook).run("plan", sandboxes)
    assert not results[0].success
    meta = results[0].metadata
    assert meta["phase"] == "applying" and meta["touched_originals"] == 2
    assert meta["failed_sandbox_id"] == sandboxes[1].sandbox_id
    assert "run recover" in (results[0].error or "")
    assert _texts(originals) == ["new 0\n", "base\n", "new 2\n"]
    by_id = {sb.sandbox_id: sb for sb in sandboxes}
    state = TwoPhasePlanCommit(journal).recover(lambda step: by_id[step.sandbox_id])
    assert state is not None and state.phase is JournalPhase.COMMITTED
    assert _texts(originals) == [f"new {i}\n" for i in range(3)]
    assert leftovers(originals) == []


def test_independent_chains_keep_overlapping_originals_in_order(tmp_path: Path) -> None:
    """Same original (two git sandboxes of one repository, two of one database), nested
    originals, and an original that cannot be told share a chain, in commit order."""
    repo, other, inner = tmp_path / "repo", tmp_path / "other", tmp_path / "repo" / "sub"
    dsn, dsn2 = "postgresql://u@h/db?options=-csearch_path%3Da", "postgresql://u@h/db"
    originals: list[object] = [str(repo), str(other), dsn, str(repo), dsn2, str(inner), "sqlite:x"]
    pairs: list[Any] = [(None, StagedFileSandbox("r", str(o))) for o in originals]
    chains = independent_chains(list(range(1, len(pairs) + 1)), pairs)
    assert chains == [[1, 4, 6], [2], [3, 5], [7]]
    # Not an in-process sandbox (an executor's handle, the operator's guard around one): it
    # keeps the whole plan in order.
    wrapped = type("Handle", (), {"original_path": str(tmp_path / "third")})()
    chains = independent_chains(list(range(1, len(pairs) + 2)), [*pairs, (None, wrapped)])
    assert chains == [list(range(1, 9))]


@pytest.mark.parametrize("workers", [1, 8], ids=["in-order", "concurrent"])
def test_independent_participants_are_prepared_at_once(tmp_path: Path, workers: int) -> None:
    """With independent originals the prepares overlap in time (threads); with
    ``max_workers=1`` they run one after another in commit order."""
    manager = _manager(tmp_path)
    originals = _plan(tmp_path, manager, 3)
    sandboxes = manager.list_sandboxes("plan")
    running: list[int] = []
    order: list[int] = []
    peak = [0]
    lock = threading.Lock()

    def hook(point: str, index: int, sandbox_id: str) -> None:
        if point == "before_prepare":
            with lock:
                running.append(index)
                order.append(index)
                peak[0] = max(peak[0], len(running))
            time.sleep(0.2)
        elif point == "after_prepare":
            with lock:
                running.remove(index)

    coordinator = TwoPhasePlanCommit(MemoryCommitJournal(), fault_hook=hook, max_workers=workers)
    results = coordinator.run("plan", sandboxes)
    assert all(r.success for r in results), results[0].error
    assert _texts(originals) == [f"new {i}\n" for i in range(3)]
    if workers == 1:
        assert (peak[0], order) == (1, [1, 2, 3])
    else:
        assert peak[0] > 1
