"""``commit_plan()``: the one plan-commit policy (mode, fallback, approval), for every caller.

Seed 002, "Atomic Commit" (all or nothing; rollbackable participants first; LIFO compensation) and
docs/two-phase-commit.md (two phases; review and approval). ``SandboxManager.commit_plan`` and the
operator's PlanCommit both call :func:`commit_plan`; what differs between them is a parameter: the
participants (in-process sandboxes or executor handles), the journal (a file, memory, or the
PlanCommit's status), the attempt number, what to do after each status change of a participant and
how to announce a fallback.

Policy:

1. **Mode.** ``"two_phase"`` (the default) and ``"auto"`` commit in two phases
   (:class:`~sandbox_core.plan.two_phase.TwoPhasePlanCommit`: every conflict is found before
   any original is touched); ``"saga"`` commits one by one and compensates
   (:class:`~sandbox_core.plan.saga.PlanCommitSaga`).
2. **Fallback.** When two phases cannot be used - more than one participant cannot prepare
   durably, a participant has no prepare, or a prepare raised
   :class:`~sandbox_core.errors.TwoPhaseUnavailableError` (PostgreSQL with
   ``max_prepared_transactions = 0``) - ``"two_phase"`` raises that error and ``"auto"`` runs
   the saga instead. Nothing is touched before the fallback (a refused prepare aborted every
   prepared participant first). A two-phase attempt that the coordinator recorded takes the
   attempt number, so the saga runs as the next attempt. The fallback is logged, passed to
   ``on_fallback``, recorded in the journal (``fallback_reason``) and in every result's
   metadata (``mode: "saga"``, ``fallback_reason``). A two-phase attempt that *failed* (a
   conflict, a refused prepare for any other reason) is never followed by a saga: the saga
   would commit what it aborted.
3. **Approval.** With ``approved_digest`` (a plan digest, :func:`~sandbox_core.plan.review.
   plan_digest`, that a person approved) the commit refuses a plan whose changes no longer
   hash to it, before any original is touched: two phases compare it with the digest of what
   they prepared; the saga reviews the plan again right before it starts. A refusal is
   recorded in the journal (phase ``failed``, reason ``ChangedSinceApproval``) and returned as
   one failed result (metadata ``reason: "ChangedSinceApproval"``, ``digest``,
   ``approved_digest``, ``touched_originals`` 0); callers that raise turn it into
   :class:`~sandbox_core.errors.ChangedSinceApprovalError`.

4. **Validation.** With ``checks`` (the plan's pre-commit validation results,
   :mod:`sandbox_core.plan.validation`) a plan with a failed check is refused before anything
   is prepared: recorded in the journal (phase ``failed``, reason ``ValidationFailed``) and
   returned as one failed result (metadata ``reason: "ValidationFailed"``, ``failed_checks``,
   ``touched_originals`` 0). Passed checks are part of the digest an approval names.

5. **One plan per original.** Both modes hold the lock of every participant's original
   (:mod:`sandbox_core.plan.original_lock`): the two-phase coordinator from each prepare to
   its apply or abort, the saga for its whole run. A plan whose original another plan holds
   fails (two phases: a failed result naming the holder, nothing changed) or raises
   :class:`~sandbox_core.plan.original_lock.OriginalLockedError` (the saga, before anything
   is committed).

Before calling it, a caller finishes (or recovers) an unfinished attempt of its journal and
refuses a plan that could only land in part (:func:`~sandbox_core.plan.saga.
refuse_partial_plan`, :class:`~sandbox_core.errors.PlanRerunRequiredError`, case 38): the
manager rolls an interrupted attempt back, the operator resumes it, so that stays theirs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal

from sandbox_core.errors import PlanReviewError, TwoPhaseUnavailableError
from sandbox_core.plan.journal import CommitJournal, JournalPhase, JournalReason, JournalState
from sandbox_core.plan.original_lock import held_by_process, local_original
from sandbox_core.plan.participants import ReviewedParticipant
from sandbox_core.plan.review import review_plan
from sandbox_core.plan.saga import FaultHook, PlanCommitSaga, results_from_journal
from sandbox_core.plan.two_phase import (
    TwoPhasePlanCommit,
    two_phase_results,
    two_phase_unavailable_reason,
)
from sandbox_core.plan.validation import CheckResult, failed_checks
from sandbox_core.protocol import CommitResult, utc_now

__all__ = [
    "PLAN_COMMIT_MODES",
    "PlanCommitMode",
    "check_mode",
    "commit_plan",
    "journal_results",
]

logger = logging.getLogger(__name__)

PlanCommitMode = Literal["two_phase", "saga", "auto"]
PLAN_COMMIT_MODES: tuple[str, ...] = ("two_phase", "saga", "auto")


def check_mode(mode: str) -> None:
    """Refuse a plan commit mode that is not one of :data:`PLAN_COMMIT_MODES`.

    Raises:
        ValueError: ``"mode must be one of two_phase, saga, auto, not '<mode>'"``.
    """
    if mode not in PLAN_COMMIT_MODES:
        raise ValueError(f"mode must be one of {', '.join(PLAN_COMMIT_MODES)}, not {mode!r}")


def commit_plan(
    plan_id: str,
    participants: Sequence[ReviewedParticipant],
    journal: CommitJournal,
    *,
    mode: str = "two_phase",
    attempt: int = 1,
    message: str | None = None,
    approved_digest: str | None = None,
    on_change: Callable[[Any], None] | None = None,
    on_fallback: Callable[[str], None] | None = None,
    fault_hook: FaultHook | None = None,
    coordinator: TwoPhasePlanCommit | None = None,
    checks: Sequence[CheckResult] = (),
) -> list[CommitResult]:
    """Commit ``participants`` all or nothing under the policy of the module docstring.

    Seed 002, "Atomic Commit"; docs/two-phase-commit.md (two phases, fallback, approval).

    Args:
        plan_id: the plan.
        participants: its CREATED/ACTIVE sandboxes, at least one (in-process sandboxes or
            executor handles; two phases need :class:`~sandbox_core.plan.participants.
            TwoPhaseParticipant`, the saga :class:`~sandbox_core.plan.participants.Participant`).
        journal: where the attempt is recorded; it holds no unfinished attempt.
        mode: ``"two_phase"`` (default), ``"saga"`` or ``"auto"``.
        attempt: the attempt number (1-based; the previous attempt's plus one); the two-phase
            transaction id derives from it.
        message: commit message for every participant.
        approved_digest: the plan digest (``"sha256:<hex>"``) that was approved, if one was.
        on_change: called with a participant after each change of its status (persist it).
        on_fallback: called with the reason when ``"auto"`` falls back to the saga, before the
            saga starts (announce it).
        fault_hook: test-only fault injection (see :mod:`sandbox_core.plan.saga`).
        coordinator: the two-phase coordinator to run (default: a
            :class:`~sandbox_core.plan.two_phase.TwoPhasePlanCommit` on ``journal`` with
            ``on_change`` and ``fault_hook``). A caller passes its own to record the two-phase
            attempt through a view of ``journal``: the operator's PlanCommit status holds back
            the terminal save of an attempt refused for want of two phases, so the PlanCommit
            never shows ``Failed`` before its saga. The refusal of a changed plan and the saga
            always write ``journal`` itself.
        checks: the plan's validation results (policy 4); taken into the approval digest.

    Returns:
        One successful :class:`CommitResult` per participant in commit order; or one
        ``CommitResult(success=False)`` whose ``error`` starts with ``"Atomic commit failed"``
        (shape: :meth:`TwoPhasePlanCommit.run <sandbox_core.plan.two_phase.TwoPhasePlanCommit.
        run>`, :meth:`PlanCommitSaga.run <sandbox_core.plan.saga.PlanCommitSaga.run>`), the
        refusal of a changed plan among them (metadata ``reason: "ChangedSinceApproval"``).

    Raises:
        ValueError: an unknown ``mode``.
        TwoPhaseUnavailableError: ``mode="two_phase"`` and the plan cannot use two phases;
            nothing was touched.
        PlanReviewError: the saga's review before the approval check failed (``__cause__``);
            nothing was touched.
        AtomicCommitError: a non-sandbox exception interrupted the saga (after compensation).
        OriginalLockedError: the saga's original is held by another plan; nothing touched.
        SandboxError: the journal could not be written.
    """
    check_mode(mode)
    failed = failed_checks(checks)
    if failed:
        return [_validation_failed(plan_id, journal, attempt, failed, approved_digest)]
    fallback: str | None = None
    if mode != "saga":
        fallback = two_phase_unavailable_reason(participants)
        if fallback is not None and mode == "two_phase":
            raise TwoPhaseUnavailableError(fallback)
        if fallback is None:
            if coordinator is None:
                coordinator = TwoPhasePlanCommit(
                    journal, on_change=on_change, fault_hook=fault_hook
                )
            try:
                return coordinator.run(
                    plan_id,
                    participants,
                    attempt=attempt,
                    message=message,
                    approved_digest=approved_digest,
                    checks=checks,
                )
            except TwoPhaseUnavailableError as exc:
                if mode == "two_phase":
                    raise
                fallback = str(exc)
                attempt += 1  # the coordinator recorded its attempt (aborted, nothing touched)
        logger.warning("plan %s: falling back to the saga: %s", plan_id, fallback)
        if on_fallback is not None:
            on_fallback(fallback)
    if approved_digest is not None:
        refused = _changed_since_approval(
            plan_id, participants, journal, attempt, approved_digest, fallback, checks
        )
        if refused is not None:
            return [refused]
    saga = PlanCommitSaga(journal, on_change=on_change, fault_hook=fault_hook)
    # The saga holds the originals' locks for its whole run (commits and compensations): a
    # process hold, freed by a crash (sandbox_core.plan.original_lock).
    originals = [o for o in (local_original(p) for p in participants) if o is not None]
    with held_by_process(originals, plan_id, f"saga:{plan_id}:{attempt}"):
        results = saga.run(
            plan_id, participants, attempt=attempt, message=message, fallback_reason=fallback
        )
    if fallback is None:
        return results
    return [
        dataclasses.replace(r, metadata={**r.metadata, "mode": "saga", "fallback_reason": fallback})
        for r in results
    ]


def journal_results(state: JournalState) -> list[CommitResult]:
    """What a finished attempt of either mode stands for (saga or two-phase journal)."""
    if state.mode == "two_phase":
        return two_phase_results(state)
    return results_from_journal(state)


def _changed_since_approval(
    plan_id: str,
    participants: Sequence[ReviewedParticipant],
    journal: CommitJournal,
    attempt: int,
    approved_digest: str,
    fallback: str | None,
    checks: Sequence[CheckResult] = (),
) -> CommitResult | None:
    """The saga's approval check: a review just before it starts.

    Returns:
        ``None`` when the plan still hashes to ``approved_digest``; else the failed result
        (metadata ``reason: "ChangedSinceApproval"``, ``touched_originals`` 0), recorded in
        ``journal`` as a failed attempt first.

    Raises:
        PlanReviewError: the review failed.
    """
    try:
        actual = review_plan(plan_id, participants).with_checks(checks).digest
    except Exception as exc:  # an unreadable sandbox, a handle that cannot review
        raise PlanReviewError(f"the plan could not be reviewed again: {exc}") from exc
    if actual == approved_digest:
        return None
    refusal = (
        f"plan {plan_id} changed since approval: its changes hash to {actual}, the approval "
        f"named {approved_digest}; nothing was changed"
    )
    return _refused(
        JournalState(
            plan_id=plan_id,
            attempt=attempt,
            phase=JournalPhase.FAILED,
            reason=JournalReason.CHANGED_SINCE_APPROVAL,
            error=refusal,
            digest=actual,
            approved_digest=approved_digest,
            fallback_reason=fallback,
            finished_at=utc_now(),
        ),
        journal,
        failed_sandbox_id=None,
        mode="saga",
        fallback_reason=fallback,
        digest=actual,
        approved_digest=approved_digest,
    )


def _refused(state: JournalState, journal: CommitJournal, **metadata: Any) -> CommitResult:
    """A plan refused before anything was prepared or changed: ``state`` (a terminal failed
    attempt) is recorded in ``journal`` first, then returned as one failed result whose
    metadata adds ``metadata`` to what every refusal says (reason, nothing touched)."""
    journal.save(state)
    return CommitResult(
        sandbox_id="",
        success=False,
        error=f"Atomic commit failed: {state.error}",
        metadata={
            "conflicts": [],
            "rolled_back_ids": [],
            "failed_rollback_ids": [],
            "reason": state.reason.value,
            "touched_originals": 0,
            **metadata,
        },
    )


def _validation_failed(
    plan_id: str,
    journal: CommitJournal,
    attempt: int,
    failed: Sequence[CheckResult],
    approved_digest: str | None,
) -> CommitResult:
    """The refusal of a plan with a failed check (policy 4), recorded in ``journal`` first."""
    named = "; ".join(
        f"{check.name} in sandbox {check.sandbox_id}: "
        + ("timed out" if check.timed_out else f"exit code {check.exit_code}")
        for check in failed
    )
    refusal = f"plan {plan_id}: validation failed ({named}); nothing was prepared or changed"
    return _refused(
        JournalState(
            plan_id=plan_id,
            attempt=attempt,
            phase=JournalPhase.FAILED,
            reason=JournalReason.VALIDATION_FAILED,
            error=refusal,
            approved_digest=approved_digest,
            finished_at=utc_now(),
        ),
        journal,
        failed_sandbox_id=failed[0].sandbox_id,
        failed_checks=[check.to_dict() for check in failed],
    )
