"""PlanCommit two-phase pieces without a cluster (issue 9): the approval decision, the bounded
review on the status, the two-phase journal kept on the status (every phase and step state
round-trips, so a restarted operator resumes from it), and the journal guard of the fallback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sandbox_operator.resources.approval import ApprovalState, approval_decision, review_status
from sandbox_operator.resources.journal import journal_of_status, status_of_journal
from sandbox_operator.resources.plancommit import (
    FallbackGuardJournal,
    older_plancommits,
    two_phase_outcome,
)

from sandbox_api.models import PlanCommitAction, PlanCommitPhase, PlanCommitSpec
from sandbox_core.plan.journal import (
    JournalPhase,
    JournalReason,
    JournalState,
    JournalStep,
    StepState,
)
from sandbox_core.plan.review import PlanReview
from sandbox_core.protocol import ChangeSummary

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def spec(**values: Any) -> PlanCommitSpec:
    return PlanCommitSpec.model_validate({"planId": "p", "approval": "Required", **values})


def test_approval_waits_without_a_digest_and_counts_down_the_timeout() -> None:
    assert approval_decision(spec(), DIGEST, T0, T0).state is ApprovalState.WAITING
    decision = approval_decision(spec(approvalTimeoutSeconds=10), DIGEST, T0, T0)
    assert decision.state is ApprovalState.WAITING
    assert decision.remaining_seconds == 10


def test_approval_matches_only_the_reviewed_digest() -> None:
    matched = approval_decision(spec(approvedDigest=DIGEST), DIGEST, T0, T0)
    assert matched.state is ApprovalState.MATCHED
    refused = approval_decision(spec(approvedDigest=OTHER), DIGEST, T0, T0)
    assert refused.state is ApprovalState.MISMATCH


@pytest.mark.parametrize("approved", [None, DIGEST, OTHER])
def test_the_timeout_is_strict_whatever_the_digest(approved: str | None) -> None:
    late = T0 + timedelta(seconds=5)
    decision = approval_decision(
        spec(approvalTimeoutSeconds=5, approvedDigest=approved), DIGEST, T0, late
    )
    assert decision.state is ApprovalState.EXPIRED


def test_spec_defaults_are_two_phase_without_approval() -> None:
    plain = PlanCommitSpec.model_validate({"planId": "p"})
    assert plain.mode.value == "TwoPhase"
    assert not plain.approval_required
    assert PlanCommitPhase.EXPIRED.is_terminal
    assert not PlanCommitPhase.AWAITING_APPROVAL.is_terminal


def test_the_review_on_the_status_keeps_twenty_paths_and_the_counts() -> None:
    summary = ChangeSummary(
        sandbox_id="S1",
        resource_id="r",
        strategy="copy_on_write",
        digest=DIGEST,
        added=[f"a{i:02}.txt" for i in range(15)],
        changed=[f"c{i:02}.txt" for i in range(10)],
        deleted=["gone.txt"],
        lines_added=30,
        conflicts=["c00.txt"],
    )
    review = PlanReview(plan_id="p", digest=OTHER, sandboxes=[summary])
    status = review_status(review, {"S1": "s1"}, "2026-01-01T00:00:00Z")
    row = status["sandboxes"][0]
    assert status["digest"] == OTHER and status["truncated"] is True
    assert status["hasConflicts"] is True
    assert (row["name"], row["added"], row["changed"], row["deleted"]) == ("s1", 15, 10, 1)
    assert len(row["paths"]) == 20
    assert row["paths"][0] == "A a00.txt" and row["paths"][15] == "M c00.txt"
    assert row["linesAdded"] == 30 and row["conflicts"] == ["c00.txt"]


TWO_PHASE_PHASES = [
    JournalPhase.PREPARING,
    JournalPhase.APPLYING,
    JournalPhase.ABORTING,
    JournalPhase.COMMITTED,
    JournalPhase.FAILED,
    JournalPhase.ROLLED_BACK,
]
TWO_PHASE_STEPS = [
    StepState.PENDING,
    StepState.PREPARING,
    StepState.PREPARED,
    StepState.ABORTED,
    StepState.COMMITTING,
    StepState.COMMITTED,
    StepState.FAILED,
]


@given(
    phase=st.sampled_from(TWO_PHASE_PHASES),
    states=st.lists(st.sampled_from(TWO_PHASE_STEPS), min_size=1, max_size=4),
    reason=st.sampled_from(list(JournalReason)),
    attempt=st.integers(min_value=1, max_value=50),
    last=st.booleans(),
)
def test_a_two_phase_journal_round_trips_through_the_status(
    phase: JournalPhase,
    states: list[StepState],
    reason: JournalReason,
    attempt: int,
    last: bool,
) -> None:
    """What recovery reads back is what was saved: phase, txid, attempt, decision, reason, and
    per step its state, last-resource flag, prepared digest and conflicts."""
    steps = [
        JournalStep(
            sandbox_id=f"S{i}",
            resource_id=f"r{i}",
            strategy="copy_on_write",
            state=state,
            last_resource=last and i == len(states) - 1,
            prepared={"sandbox_id": f"S{i}", "txid": "tx.1", "digest": DIGEST}
            if state in (StepState.PREPARED, StepState.COMMITTED)
            else None,
            conflicts=["f.txt"] if state is StepState.FAILED else [],
        )
        for i, state in enumerate(states)
    ]
    state = JournalState(
        plan_id="p",
        attempt=attempt,
        phase=phase,
        reason=reason,
        mode="two_phase",
        txid="tx.1",
        digest=OTHER,
        approved_digest=DIGEST,
        decided_at=T0 if phase is JournalPhase.APPLYING else None,
        steps=steps,
    )
    status = status_of_journal(state, PlanCommitAction.COMMIT, {}, None, 1)
    if not phase.is_terminal:
        assert status["phase"] == PlanCommitPhase.COMMITTING.value
    back = journal_of_status("p", status)
    assert back is not None
    assert back.mode == "two_phase"
    # Terminal ones are never resumed (an interrupted Commit shows Failed like a failed one).
    assert back.phase is phase or (phase.is_terminal and back.phase.is_terminal)
    assert back.reason is reason
    assert (back.txid, back.attempt, back.digest, back.approved_digest) == (
        "tx.1",
        attempt,
        OTHER,
        DIGEST,
    )
    assert back.decided_at == state.decided_at
    for saved, read in zip(steps, back.steps, strict=True):
        if not (phase.is_terminal and saved.state is StepState.PENDING):
            assert read.state is saved.state
        assert read.last_resource is saved.last_resource
        assert read.conflicts == saved.conflicts
        assert (read.prepared or {}).get("digest") == (saved.prepared or {}).get("digest")


def test_a_saga_journal_has_no_two_phase_header() -> None:
    state = JournalState(
        plan_id="p", phase=JournalPhase.COMMITTING, steps=[JournalStep(sandbox_id="S")]
    )
    status = status_of_journal(state, PlanCommitAction.COMMIT, {}, None, 1)
    assert status["mode"] == "Saga" and "twoPhase" not in status
    back = journal_of_status("p", status)
    assert back is not None and back.mode == "saga" and back.phase is JournalPhase.COMMITTING


class ListJournal:
    def __init__(self) -> None:
        self.saved: list[JournalState] = []
        self.last_state: JournalState | None = None

    def load(self) -> JournalState | None:
        return self.last_state

    def save(self, state: JournalState) -> None:
        self.saved.append(state)
        self.last_state = state


def test_the_fallback_guard_never_shows_an_unavailable_attempt_as_terminal() -> None:
    inner = ListJournal()
    guard = FallbackGuardJournal(inner)  # type: ignore[arg-type]
    unavailable = JournalState(
        plan_id="p",
        mode="two_phase",
        phase=JournalPhase.FAILED,
        reason=JournalReason.COMMIT_FAILED,
        steps=[
            JournalStep(
                sandbox_id="S",
                state=StepState.FAILED,
                error="TwoPhaseUnavailableError: max_prepared_transactions is 0",
            )
        ],
    )
    guard.save(unavailable)
    assert inner.saved[-1].phase is JournalPhase.ABORTING
    conflict = unavailable.model_copy(deep=True)
    conflict.steps[0].error = "SandboxCommitError: conflict on f.txt"
    guard.save(conflict)
    assert inner.saved[-1].phase is JournalPhase.FAILED  # real failures pass through


def test_outcome_labels_and_attempt_numbers() -> None:
    def state(phase: JournalPhase, reason: JournalReason) -> JournalState:
        return JournalState(plan_id="p", mode="two_phase", phase=phase, reason=reason)

    assert two_phase_outcome(state(JournalPhase.COMMITTED, JournalReason.COMMITTED)) == "committed"
    changed = state(JournalPhase.FAILED, JournalReason.CHANGED_SINCE_APPROVAL)
    assert two_phase_outcome(changed) == "changed_since_approval"
    interrupted = state(JournalPhase.ROLLED_BACK, JournalReason.INTERRUPTED)
    assert two_phase_outcome(interrupted) == "interrupted"

    def body(name: str, created: str, plan: str = "p") -> dict[str, Any]:
        meta = {"name": name, "uid": name, "creationTimestamp": created}
        return {"metadata": meta, "spec": {"planId": plan}}

    me = body("c", "2026-01-01T00:00:03Z")
    others = [
        body("a", "2026-01-01T00:00:01Z"),
        body("b", "2026-01-01T00:00:02Z"),
        body("x", "2026-01-01T00:00:00Z", plan="other"),
        body("d", "2026-01-01T00:00:04Z"),
        me,
    ]
    assert older_plancommits(me, others) == 2


def test_a_failed_two_phase_attempt_is_never_followed_by_a_saga(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only a plan that cannot use two phases runs the saga; one whose two-phase attempt failed
    ends with that attempt (a saga would commit what it aborted). The fault is injected."""
    from sandbox_operator.executors.local import LocalExecutor
    from sandbox_operator.kube.events import no_events
    from sandbox_operator.resources import plancommit as plancommit_handlers
    from sandbox_operator.resources.plancommit import PlanCommitLogic
    from sandbox_operator.settings import Settings

    from sandbox_core.errors import AtomicCommitError
    from sandbox_core.plan import commit as plan_commit

    class FailingCoordinator:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def run(self, *args: Any, **kwargs: Any) -> None:
            raise AtomicCommitError("injected: the attempt failed and was aborted")

    sagas: list[Any] = []

    class RecordingSaga:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            sagas.append(args)

        def run(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("a saga ran after a failed two-phase attempt")

    # The plan can use two phases; the one policy (commit_plan) decides what follows a failure.
    monkeypatch.setattr(plancommit_handlers, "TwoPhasePlanCommit", FailingCoordinator)
    monkeypatch.setattr(plan_commit, "two_phase_unavailable_reason", lambda h: None)
    monkeypatch.setattr(plan_commit, "PlanCommitSaga", RecordingSaga)
    settings = Settings(state_dir=tmp_path / "state", sandbox_root=tmp_path / "sb")
    logic = PlanCommitLogic(settings, LocalExecutor(settings), None, no_events)  # type: ignore[arg-type]
    last = JournalState(plan_id="p", phase=JournalPhase.FAILED)
    journal = SimpleNamespace(name="pc", status={}, generation=1, last_state=last)
    spec = PlanCommitSpec.model_validate({"planId": "p"})
    body = {"metadata": {"name": "pc", "namespace": "ns"}}
    out = logic._two_phase(spec, journal, [], body, 1, "m", None, lambda handle: None)  # type: ignore[arg-type]
    assert sagas == []
    assert out is last
