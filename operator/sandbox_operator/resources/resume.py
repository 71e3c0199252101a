"""Resume a PlanCommit that an operator crash interrupted: it commits, it does not fail.

The PlanCommit is the user's standing request to commit its plan,
and its status journal is the resume point, so a restarted (or the other, peered) operator
finishes the interrupted attempt instead of ending it ``Failed``:

- **Saga**: :class:`~sandbox_core.plan.saga.PlanCommitSaga` with ``resume=True`` commits the steps
  still pending when no commit failed and every step's outcome is known. A step whose commit
  may or may not have landed (a strategy without ``commit_landed()``, killed inside the commit)
  keeps the core's policy: the attempt is compensated (all or nothing, never half a plan).
- **TwoPhase**: an attempt interrupted before its decision is aborted (nothing was touched, the
  sandboxes keep their status) and a new attempt runs at once; its terminal save is held back
  (:class:`RetryAfterAbortJournal`) so the PlanCommit never shows ``Failed`` in between.
  After the decision the core rolls forward anyway.

A commit that fails while resuming (a conflict) is compensated or aborted as in a first attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sandbox_core.plan.journal import JournalPhase, JournalReason, JournalState, StepState
from sandbox_core.plan.saga import PlanCommitSaga, SandboxResolver
from sandbox_core.plan.two_phase import TwoPhasePlanCommit
from sandbox_operator.resources.journal import PlanCommitStatusJournal

logger = logging.getLogger("sandbox_operator.resume")


def aborted_untouched(state: JournalState) -> bool:
    """Whether ``state`` is a two-phase attempt that only a crash ended, aborted with nothing
    changed (reason ``Interrupted``, no step committed): a new attempt may run."""
    return (
        state.mode == "two_phase"
        and state.phase.is_terminal
        and state.reason is JournalReason.INTERRUPTED
        and state.failed_sandbox_id is None
        and not any(step.state is StepState.COMMITTED for step in state.steps)
    )


class RetryAfterAbortJournal:
    """The PlanCommit journal seen by a two-phase recovery that will be followed by a new
    attempt: the terminal save of an interrupted, untouched attempt is written as phase
    ``aborting`` (a crash right there is recovered the same way again) and :attr:`held_back`
    is set; every other save goes through."""

    def __init__(self, journal: PlanCommitStatusJournal) -> None:
        self.journal = journal
        self.held_back = False

    def load(self) -> JournalState | None:
        """The wrapped journal's state."""
        return self.journal.load()

    def save(self, state: JournalState) -> None:
        """Save through, holding back the end of an interrupted, untouched attempt."""
        if aborted_untouched(state):
            self.held_back = True
            state = state.model_copy(update={"phase": JournalPhase.ABORTING, "finished_at": None})
        self.journal.save(state)


def resume_attempt(
    journal: PlanCommitStatusJournal,
    resolve: SandboxResolver,
    on_change: Callable[[Any], None],
    message: str | None,
) -> JournalState | None:
    """Finish the attempt recorded in ``journal`` (see the module docstring).

    Args:
        journal: the PlanCommit's status journal; it holds an attempt.
        resolve: the sandbox handle of a step (None when gone).
        on_change: called with a sandbox after each change of its status.
        message: the commit message of the steps committed while resuming.

    Returns:
        The journal state after recovery (terminal unless an abort, an apply or a compensation
        must be retried), or None when a two-phase attempt was aborted with nothing touched
        and the caller must start a new attempt.

    Raises:
        SandboxError: the journal could not be read or written.
    """
    state = journal.load()
    if state is None or state.phase.is_terminal:
        return state
    if state.mode != "two_phase":
        saga = PlanCommitSaga(journal, on_change=on_change, resume=True, resume_message=message)
        return saga.recover(resolve)
    guard = RetryAfterAbortJournal(journal)
    recovered = TwoPhasePlanCommit(guard, on_change=on_change).recover(resolve)
    if guard.held_back:
        logger.warning(
            "plan %s: two-phase attempt %d was interrupted before its decision and aborted "
            "(nothing changed); starting a new attempt",
            state.plan_id,
            state.attempt,
        )
        return None
    return recovered
