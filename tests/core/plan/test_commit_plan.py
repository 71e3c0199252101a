"""``sandbox_core.plan.commit.commit_plan``: the one plan-commit policy (seed 002, issue 9).

Promises checked on real directories (copy_on_write sandboxes): ``"auto"`` falls back to the
saga when a participant cannot prepare (nothing touched before, the fallback announced and
recorded) and ``"two_phase"`` refuses instead; a failed two-phase attempt is never followed by
the saga; a plan whose changes no longer hash to the approved digest is refused in either mode
before any original is touched, and recorded; a review that fails before the saga is
``PlanReviewError``. The odd participants are plain objects shaped like the plan's Protocols
(an executor's handle is one too), never ``BaseSandbox`` subclasses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox_core.errors import PlanReviewError, SandboxError, TwoPhaseUnavailableError
from sandbox_core.plan.commit import commit_plan
from sandbox_core.plan.journal import JournalPhase, JournalReason, MemoryCommitJournal
from sandbox_core.plan.review import review_plan
from sandbox_core.protocol import ChangeSummary, CommitResult, PreparedCommit
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.factory import SandboxFactory

PLAN = "plan-commit"


class Handle:
    """A participant that is not an in-process sandbox: it forwards to one, like an executor's
    handle, and can refuse two phases, prepare only in memory, or fail its review."""

    def __init__(
        self,
        inner: Any,
        *,
        refuse: bool = False,
        durable: bool = True,
        review_fails: bool = False,
    ) -> None:
        self.inner = inner
        self.strategy = inner.strategy
        self.resource_id = inner.resource_id
        self.prepares_durably = durable
        self._refuse = refuse
        self._review_fails = review_fails

    @property
    def sandbox_id(self) -> str:
        return str(self.inner.sandbox_id)

    @property
    def status(self) -> SandboxStatus:
        return SandboxStatus(self.inner.status)

    @property
    def rollbackable(self) -> bool:
        return bool(self.inner.rollbackable)

    def commit(self, message: str | None = None) -> CommitResult:
        result: CommitResult = self.inner.commit(message)
        return result

    def rollback(self) -> None:
        self.inner.rollback()

    def review(self) -> ChangeSummary:
        if self._review_fails:
            raise SandboxError("the workspace cannot be read")
        summary: ChangeSummary = self.inner.review()
        return summary

    def prepare(self, txid: str, message: str | None = None) -> PreparedCommit:
        if self._refuse:
            raise TwoPhaseUnavailableError("max_prepared_transactions is 0 on this server")
        prepared: PreparedCommit = self.inner.prepare(txid, message)
        return prepared

    def apply_prepared(self, txid: str) -> CommitResult:
        result: CommitResult = self.inner.apply_prepared(txid)
        return result

    def abort_prepared(self, txid: str) -> None:
        self.inner.abort_prepared(txid)


def _sandboxes(tmp_path: Path, count: int) -> tuple[list[Any], list[Path]]:
    """``count`` ACTIVE copy_on_write sandboxes of real directories, each holding ``f.txt``
    changed from ``base`` to ``new <i>``."""
    factory = SandboxFactory()
    boxes, originals = [], []
    for index in range(count):
        original = tmp_path / f"original-{index}"
        original.mkdir()
        (original / "f.txt").write_text("base\n")
        sandbox = factory.create(
            "copy_on_write", f"r{index}", str(original), sandbox_root=str(tmp_path / "boxes")
        )
        sandbox.create(PLAN)
        Path(sandbox.get_path("f.txt")).write_text(f"new {index}\n")
        boxes.append(sandbox)
        originals.append(original)
    return boxes, originals


def _texts(originals: list[Path]) -> list[str]:
    return [(o / "f.txt").read_text() for o in originals]


def _entries(originals: list[Path]) -> list[list[str]]:
    """What each original holds: a staging area left beside a target would show here."""
    return [sorted(p.name for p in o.iterdir()) for o in originals]


def test_auto_falls_back_to_the_saga_when_a_participant_cannot_prepare(tmp_path: Path) -> None:
    boxes, originals = _sandboxes(tmp_path, 2)
    participants = [boxes[0], Handle(boxes[1], refuse=True)]
    with pytest.raises(TwoPhaseUnavailableError, match="max_prepared_transactions"):
        commit_plan(PLAN, participants, MemoryCommitJournal(), mode="two_phase")
    assert _texts(originals) == ["base\n", "base\n"]
    assert _entries(originals) == [["f.txt"], ["f.txt"]]
    assert all(sb.status is SandboxStatus.ACTIVE for sb in boxes)

    journal = MemoryCommitJournal()
    announced: list[str] = []
    results = commit_plan(
        PLAN, participants, journal, mode="auto", attempt=3, on_fallback=announced.append
    )
    assert [r.success for r in results] == [True, True]
    assert {r.metadata["mode"] for r in results} == {"saga"}
    assert all("max_prepared_transactions" in r.metadata["fallback_reason"] for r in results)
    assert len(announced) == 1 and "max_prepared_transactions" in announced[0]
    assert _texts(originals) == ["new 0\n", "new 1\n"]
    assert _entries(originals) == [["f.txt"], ["f.txt"]]
    state = journal.load()
    assert state is not None
    assert (state.mode, state.phase) == ("saga", JournalPhase.COMMITTED)
    assert state.attempt == 4  # the aborted two-phase attempt took 3
    assert state.fallback_reason and "max_prepared_transactions" in state.fallback_reason


def test_two_participants_that_cannot_prepare_durably_fall_back_before_preparing(
    tmp_path: Path,
) -> None:
    boxes, originals = _sandboxes(tmp_path, 2)
    participants = [Handle(sb, durable=False) for sb in boxes]
    with pytest.raises(TwoPhaseUnavailableError, match="last resource"):
        commit_plan(PLAN, participants, MemoryCommitJournal())
    journal = MemoryCommitJournal()
    results = commit_plan(PLAN, participants, journal, mode="auto")
    assert [r.success for r in results] == [True, True]
    assert _texts(originals) == ["new 0\n", "new 1\n"]
    state = journal.load()
    assert state is not None and state.mode == "saga"
    assert state.attempt == 1  # nothing was prepared, so no two-phase attempt was recorded


def test_a_failed_two_phase_attempt_is_never_followed_by_the_saga(tmp_path: Path) -> None:
    boxes, originals = _sandboxes(tmp_path, 2)
    (originals[1] / "f.txt").write_text("moved on\n")  # a conflict in the last participant
    journal = MemoryCommitJournal()
    announced: list[str] = []
    results = commit_plan(PLAN, boxes, journal, mode="auto", on_fallback=announced.append)
    assert not results[0].success
    assert results[0].metadata["reason"] == "CommitFailed"
    assert results[0].metadata["touched_originals"] == 0
    assert announced == []
    state = journal.load()
    assert state is not None and state.mode == "two_phase"
    assert state.phase is JournalPhase.FAILED
    assert _texts(originals) == ["base\n", "moved on\n"]
    assert _entries(originals) == [["f.txt"], ["f.txt"]]


@pytest.mark.parametrize("mode", ["two_phase", "saga"])
def test_a_plan_changed_since_approval_is_refused_before_any_original_is_touched(
    tmp_path: Path, mode: str
) -> None:
    boxes, originals = _sandboxes(tmp_path, 2)
    approved = review_plan(PLAN, boxes).digest
    Path(boxes[1].get_path("f.txt")).write_text("edited after the approval\n")
    journal = MemoryCommitJournal()
    results = commit_plan(PLAN, boxes, journal, mode=mode, approved_digest=approved)
    assert len(results) == 1 and not results[0].success
    meta = results[0].metadata
    assert meta["reason"] == "ChangedSinceApproval"
    assert meta["approved_digest"] == approved and meta["digest"] != approved
    assert meta["touched_originals"] == 0
    assert (results[0].error or "").startswith("Atomic commit failed")
    assert _texts(originals) == ["base\n", "base\n"]
    assert _entries(originals) == [["f.txt"], ["f.txt"]]
    assert all(sb.status is SandboxStatus.ACTIVE for sb in boxes)
    state = journal.load()
    assert state is not None
    assert state.phase is JournalPhase.FAILED
    assert state.reason is JournalReason.CHANGED_SINCE_APPROVAL
    assert state.approved_digest == approved and state.digest == meta["digest"]

    again = review_plan(PLAN, boxes).digest
    done = commit_plan(
        PLAN, boxes, journal, mode=mode, attempt=state.attempt + 1, approved_digest=again
    )
    assert [r.success for r in done] == [True, True]
    assert _texts(originals) == ["new 0\n", "edited after the approval\n"]


def test_a_review_that_fails_before_the_saga_touches_nothing(tmp_path: Path) -> None:
    boxes, originals = _sandboxes(tmp_path, 2)
    participants = [boxes[0], Handle(boxes[1], review_fails=True)]
    journal = MemoryCommitJournal()
    with pytest.raises(PlanReviewError, match="could not be reviewed again") as raised:
        commit_plan(PLAN, participants, journal, mode="saga", approved_digest="sha256:0")
    assert isinstance(raised.value.__cause__, SandboxError)
    assert journal.load() is None
    assert _texts(originals) == ["base\n", "base\n"]


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    boxes, originals = _sandboxes(tmp_path, 1)
    journal = MemoryCommitJournal()
    with pytest.raises(ValueError, match="mode must be one of two_phase, saga, auto"):
        commit_plan(PLAN, boxes, journal, mode="eventually")
    assert journal.load() is None and _texts(originals) == ["base\n"]
