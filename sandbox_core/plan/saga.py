"""The plan commit saga: seed 002's atomic commit, journaled so that it survives a crash.

Seed 002, "Atomic Commit": rollbackable sandboxes commit first, non-rollbackable last; when a
commit fails, the already-committed ones are compensated (rolled back) in LIFO order. DESIGN.md
adds crash safety: every step is recorded in a :class:`~sandbox_core.plan.journal.CommitJournal`
before and after it happens, and :meth:`PlanCommitSaga.recover` finishes an interrupted attempt.

Recovery policy (cases 20 and 22):

- A step recorded ``committing`` when the process died is resolved by asking the sandbox: a
  reopened sandbox already COMMITTED, or one whose ``commit_landed()`` returns True, counts as
  committed; ``commit_landed()`` returning False means nothing landed. A sandbox with no
  ``commit_landed()`` (or one that cannot tell) is *unknown* and is treated as committed, so it
  is compensated with its rollback-from-committed (which strategies keep safe when nothing
  landed); if that rollback fails the sandbox is named in ``failed_rollback_ids``.
- A commit whose reply was lost (:class:`~sandbox_core.errors.CommitOutcomeUnknownError`: a
  timeout or a broken connection to a workspace agent) is **asked about** before anything is
  compensated (:func:`ask_commit_outcome`: the participant's ``commit_outcome()``, which asks
  the agent again under the same request id, else ``commit_landed()``): landed, the step is
  committed and the plan goes on; not landed, the step failed as any refusal; no answer yet,
  nothing is compensated and the attempt stays open (phase ``committing``, reason
  ``OutcomeUnknown``, the error raised), and :meth:`PlanCommitSaga.recover` asks again. The
  same holds in recovery: a probe that raises ``CommitOutcomeUnknownError`` (the agent cannot
  be reached) leaves the attempt open, untouched.
- Interrupted attempts are rolled **back**, not forward: the user approved one commit of the
  whole plan at one moment; finishing it later, after the originals may have moved on, would
  apply changes nobody reviewed against the new state. Two exceptions roll forward: every step
  is known to have landed (nothing left to do but record it); or a step that cannot be undone
  (``transaction_rollback``, ``none``: committed last) has landed, the point of no return, so
  rolling back would leave it beside undone steps (half a plan, case 38): recovery commits the
  remaining steps (those too cannot be undone, since they come last). A caller that holds a
  standing request to commit (the operator's PlanCommit) opts in to roll forward
  every interrupted attempt whose steps' outcomes are all known (``resume=True``).
- The journal decides what a step is: a step it records committed is compensated as committed
  even when the sandbox's own record still says ACTIVE (a process that found the commit landed
  died before it saved the record); the commit is adopted first, so the compensation undoes it
  instead of only discarding the sandbox's copy.
- A terminal journal is never touched again: running recovery twice changes nothing.
- A step failing with nothing committed before it ends ``failed`` with zero compensations; the
  sandboxes stay as they were and a later ``commit_all`` starts a new attempt.

Failed compensations (case 21), best effort then retry:

- Every compensation is attempted, in LIFO order, even after one of them failed; the failed ones
  are named in ``failed_rollback_ids`` (their step ``compensation_failed``, with the error).
- A compensation that failed for a cause that may go away (an I/O error, a refused rollback, a
  locked file, an injected fault) is *owed*: the attempt stays open, phase ``compensating``
  with reason ``CompensationFailed`` (not terminal, never reported as committed or rolled
  back), and the sandbox stays COMMITTED (``BaseSandbox.rollback`` keeps it so), holding what
  its undo needs. :meth:`PlanCommitSaga.recover` retries every owed compensation; once they all
  succeed the attempt ends as it would have without the fault (``failed`` / ``CommitFailed``
  after a failed commit, ``rolled_back`` / ``Interrupted`` after a crash), with
  ``failed_rollback_ids`` empty and the ids in ``rolled_back_ids``. A further recovery changes
  nothing. ``commit_all`` on a plan with an open attempt recovers it instead of starting anew.
- A compensation that can never succeed (the step's strategy cannot undo a commit, the sandbox
  is gone or in a status that cannot roll back) ends the attempt ``failed`` with reason
  ``CompensationFailed``, naming it: only a person can repair that original.

All or nothing across retries (case 38): a compensated sandbox is ROLLED_BACK with its changes
discarded, and a sandbox whose commit failed may be ERRORED. Committing the plan's other
sandboxes then would land half the plan, so :func:`refuse_partial_plan` refuses a new attempt
(:class:`~sandbox_core.errors.PlanRerunRequiredError`, nothing touched) while any sandbox of the
plan is in a status that :attr:`~sandbox_core.status.SandboxStatus.blocks_plan_commit`. The plan
must be re-run: re-activate those sandboxes (``get_path``/``activate``) and redo their work, or
clean them up to drop them from the plan. The manager and the operator both ask this function.

Fault injection (tests only): ``fault_hook(point, index, sandbox_id)`` is called at the points
``before_commit``, ``after_commit`` (the commit returned, nothing recorded yet),
``after_persist`` (the sandbox's store record says COMMITTED, the journal does not yet),
``after_record`` (the journal says committed), ``before_compensate`` and ``after_compensate``
(the rollback returned, nothing recorded yet), with the 1-based step index in commit order.
The environment variable ``SANDBOX_CORE_FAULT=<point>:<index>`` makes the process SIGKILL
itself at that point; ``SANDBOX_CORE_FAULT_RAISE=<point>:<index>[,<point>:<index>...]`` raises
:class:`InjectedFaultError` there instead (meaningful at ``before_commit``: that commit fails,
and ``before_compensate``: that compensation fails).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sandbox_core.errors import (
    AtomicCommitError,
    CommitOutcomeUnknownError,
    PlanRerunRequiredError,
    SandboxError,
    SandboxStateError,
)
from sandbox_core.plan.journal import (
    CommitJournal,
    JournalPhase,
    JournalReason,
    JournalState,
    JournalStep,
    StepState,
)
from sandbox_core.plan.participants import Participant, commit_order
from sandbox_core.protocol import CommitResult, utc_now
from sandbox_core.status import SandboxStatus

__all__ = [
    "FAULT_ENV",
    "FAULT_POINTS",
    "FAULT_RAISE_ENV",
    "CompensationUndo",
    "FaultHook",
    "InjectedFaultError",
    "JournaledPlanCommit",
    "PlanCommitSaga",
    "SandboxResolver",
    "adopt_landed_commit",
    "ask_commit_outcome",
    "commit_order",
    "env_fault_hook",
    "probe_commit_landed",
    "refuse_partial_plan",
    "results_from_journal",
    "run_compensations",
]

logger = logging.getLogger("sandbox_core.plan.saga")

FAULT_ENV = "SANDBOX_CORE_FAULT"
FAULT_RAISE_ENV = "SANDBOX_CORE_FAULT_RAISE"
FAULT_POINTS = (
    "before_commit",
    "after_commit",
    "after_persist",
    "after_record",
    "before_compensate",
    "after_compensate",
)


class InjectedFaultError(SandboxError):
    """Raised by the ``$SANDBOX_CORE_FAULT_RAISE`` fault hook (tests only)."""


FaultHook = Callable[[str, int, str], None]
"""``(point, step_index, sandbox_id) -> None``; see the module docstring."""

SandboxResolver = Callable[[JournalStep], Any]
"""Finds the live (or reopened) sandbox of a journal step; returns ``None`` when it cannot."""


def _fault_specs(spec: str) -> set[tuple[str, int]]:
    found = set()
    for item in spec.split(","):
        point, _, index_text = item.strip().partition(":")
        if point and index_text.isdigit():
            found.add((point, int(index_text)))
    return found


def env_fault_hook() -> FaultHook | None:
    """The fault hook described by ``$SANDBOX_CORE_FAULT`` (SIGKILL) and
    ``$SANDBOX_CORE_FAULT_RAISE`` (raise :class:`InjectedFaultError`), or ``None`` when both
    are unset. See the module docstring."""
    kills = _fault_specs(os.environ.get(FAULT_ENV, ""))
    raises = _fault_specs(os.environ.get(FAULT_RAISE_ENV, ""))
    if not kills and not raises:
        return None

    def inject(name: str, index: int, sandbox_id: str) -> None:
        if (name, index) in kills:
            logger.error("fault injection: SIGKILL at %s of step %d (%s)", name, index, sandbox_id)
            os.kill(os.getpid(), signal.SIGKILL)
        if (name, index) in raises:
            raise InjectedFaultError(f"injected fault at {name} of step {index} ({sandbox_id})")

    return inject


def refuse_partial_plan(plan_id: str, members: Iterable[tuple[str, str, SandboxStatus]]) -> None:
    """Refuse a plan commit that could only land part of the plan (case 38).

    Args:
        plan_id: the plan.
        members: ``(sandbox_id, label, status)`` of every live sandbox of the plan (the label
            names it for people: a resource id or an object name).

    Raises:
        PlanRerunRequiredError: a sandbox of the plan is ROLLED_BACK or ERRORED
            (:attr:`SandboxStatus.blocks_plan_commit`) while another one could be committed.
            Nothing has been touched.
    """
    items = list(members)
    blocking = [(sid, label, st) for sid, label, st in items if st.blocks_plan_commit]
    if not blocking or not any(st.can_commit for _, _, st in items):
        return
    named = ", ".join(f"{label} ({sid}, {st.value})" for sid, label, st in blocking)
    raise PlanRerunRequiredError(
        f"plan {plan_id} must be re-run before it can be committed all or nothing: the changes "
        f"of {named} were discarded by a rollback or are in doubt after a failure, so "
        "committing the other sandboxes would land half the plan; nothing was committed. "
        "Redo their work (a rolled-back sandbox is re-activated by get_path) or clean them up "
        "to drop them from the plan, then commit again",
        plan_id=plan_id,
        sandbox_ids=[sid for sid, _, _ in blocking],
    )


def probe_commit_landed(sandbox: Any) -> bool | None:
    """Did an interrupted commit of ``sandbox`` reach the original? True, False or None (unknown).

    A sandbox already COMMITTED answers True; otherwise its optional ``commit_landed()`` method
    is asked (git_worktree: is the sandbox branch merged; transaction: was the transaction
    committed). Errors from the probe count as unknown, except
    :class:`~sandbox_core.errors.CommitOutcomeUnknownError` (the participant cannot be asked
    now: a workspace agent out of reach), which is raised.
    """
    if sandbox is None:
        return None
    if getattr(sandbox, "status", None) is SandboxStatus.COMMITTED:
        return True
    probe = getattr(sandbox, "commit_landed", None)
    if not callable(probe):
        return None
    try:
        answer = probe()
    except CommitOutcomeUnknownError:
        raise  # cannot be asked now: the caller must not compensate on a guess
    except Exception:  # an unknown answer, never a reason to stop recovery
        logger.exception("commit_landed() of %s failed", getattr(sandbox, "sandbox_id", "?"))
        return None
    return answer if isinstance(answer, bool) else None


def ask_commit_outcome(sandbox: Any, message: str | None) -> CommitResult | None:
    """Did the commit of ``sandbox`` whose reply was lost land? Its result, or None (it did not).

    Asks the participant's ``commit_outcome(message)`` when it has one (a workspace agent's
    handle sends the same request again: the agent answers from its request journal, or
    finishes the request first); else :func:`probe_commit_landed`, adopting a landed commit
    (:func:`adopt_landed_commit`) so that it can be compensated like any other.

    Raises:
        CommitOutcomeUnknownError: no answer can be had now (ask again later).
        SandboxError: the participant answered that the commit failed (a refusal: it did not
            land).
    """
    ask = getattr(sandbox, "commit_outcome", None)
    if callable(ask):
        answer = ask(message)
        return answer if isinstance(answer, CommitResult) else None
    landed = probe_commit_landed(sandbox)
    if landed is None:
        raise CommitOutcomeUnknownError(
            f"the outcome of the commit of sandbox {getattr(sandbox, 'sandbox_id', '?')} is "
            "unknown and it cannot tell whether it landed"
        )
    if not landed:
        return None
    adopt_landed_commit(sandbox)
    last = getattr(sandbox, "last_commit", None)
    if isinstance(last, CommitResult):
        return last
    return CommitResult(sandbox_id=str(sandbox.sandbox_id), success=True)


def adopt_landed_commit(sandbox: Any) -> None:
    """Put a sandbox whose commit landed (or may have) into COMMITTED so it can be rolled back.

    Uses the sandbox's ``adopt_landed_commit()`` (every
    :class:`~sandbox_core.strategies.base.BaseSandbox` has one): the commit happened, only the
    record of it was lost.
    """
    if sandbox is None or getattr(sandbox, "status", None) is SandboxStatus.COMMITTED:
        return
    adopt = getattr(sandbox, "adopt_landed_commit", None)
    if callable(adopt):
        adopt()


CompensationUndo = Callable[[JournalStep, Any], None]
"""``(step, target) -> None``: undo one step (roll the sandbox back); raises when it cannot."""


def run_compensations(
    state: JournalState,
    items: Iterable[tuple[JournalStep, Any]],
    undo: CompensationUndo,
    save: Callable[[JournalState], None],
    *,
    after_undo: Callable[[JournalStep], None] | None = None,
    on_done: Callable[[JournalStep, Any, Exception | None], None] | None = None,
) -> list[tuple[JournalStep, Any, Exception]]:
    """The one compensation loop of the code base (seed 002; case 21).

    For each ``(step, target)`` in the order given (the saga passes LIFO order, the operator's
    ``action: Rollback`` its steps in order): the step is recorded ``compensating`` and saved,
    ``undo(step, target)`` runs, then the step is recorded ``compensated`` (its id moves from
    ``state.failed_rollback_ids`` to ``state.rolled_back_ids``) or ``compensation_failed``
    (error recorded, id in ``failed_rollback_ids``) and saved again. Every step is attempted,
    even after one failed.

    Args:
        state: the attempt; changed in place.
        items: the steps to compensate with whatever ``undo`` needs (a sandbox or a handle).
        undo: undoes one step; any exception counts as a failed compensation.
        save: makes ``state`` durable (a journal's ``save``).
        after_undo: called after a successful undo, before it is recorded (the saga's
            ``after_compensate`` fault point); its exceptions propagate.
        on_done: called with ``(step, target, error or None)`` after each step, before the
            step is saved (persist the sandbox, count metrics).

    Returns:
        ``(step, target, exception)`` of every failed compensation, in the order attempted.
    """
    failures: list[tuple[JournalStep, Any, Exception]] = []
    for step, target in items:
        step.state = StepState.COMPENSATING
        step.started_at = step.started_at or utc_now()
        save(state)
        error: Exception | None = None
        try:
            undo(step, target)
        except Exception as exc:  # every compensation is attempted; failures are named
            error = exc
            step.state = StepState.COMPENSATION_FAILED
            step.error = f"{type(exc).__name__}: {exc}"
            if step.sandbox_id not in state.failed_rollback_ids:
                state.failed_rollback_ids.append(step.sandbox_id)
            failures.append((step, target, exc))
            logger.exception("compensation of sandbox %s failed", step.sandbox_id)
        else:
            if after_undo is not None:
                after_undo(step)
            step.state = StepState.COMPENSATED
            step.error = None
            if step.sandbox_id in state.failed_rollback_ids:
                state.failed_rollback_ids.remove(step.sandbox_id)
            if step.sandbox_id not in state.rolled_back_ids:
                state.rolled_back_ids.append(step.sandbox_id)
        if on_done is not None:
            on_done(step, target, error)
        step.updated_at = utc_now()
        save(state)
    return failures


class JournaledPlanCommit:
    """What both plan commit protocols share: the journal, the change callback, the fault hook.

    Args:
        journal: where the attempt is recorded.
        on_change: called with a sandbox after each change of its status (the manager persists
            it to its store).
        fault_hook: test-only fault injection; defaults to :func:`env_fault_hook`.
    """

    def __init__(
        self,
        journal: CommitJournal,
        on_change: Callable[[Any], None] | None = None,
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.journal = journal
        self._on_change = on_change
        self._fault_hook = fault_hook if fault_hook is not None else env_fault_hook()

    def _finish(self, state: JournalState, phase: JournalPhase, reason: JournalReason) -> None:
        state.phase = phase
        state.reason = reason
        state.finished_at = utc_now()
        self._save(state)

    def _save(self, state: JournalState) -> None:
        state.updated_at = utc_now()
        self.journal.save(state)

    def _changed(self, sandbox: Any) -> None:
        if self._on_change is not None and sandbox is not None:
            self._on_change(sandbox)

    def _fault(self, point: str, index: int, sandbox_id: str) -> None:
        if self._fault_hook is not None:
            self._fault_hook(point, index, sandbox_id)


class PlanCommitSaga(JournaledPlanCommit):
    """Runs and recovers one plan's atomic commit against one journal.

    Args:
        journal: where the attempt is recorded.
        on_change: called with a sandbox after each change of its status (the manager persists
            it to its store).
        fault_hook: test-only fault injection; defaults to :func:`env_fault_hook`.
        resume: when True, :meth:`recover` finishes an attempt that a crash interrupted (no
            commit failed, every step's outcome known) by committing its pending steps, instead
            of compensating it; ``resume_message`` is their commit message. The operator resumes
            (its PlanCommit is the standing request to commit, so a crash does not undo it);
            the default keeps the roll-back policy of the module docstring.
    """

    def __init__(
        self,
        journal: CommitJournal,
        on_change: Callable[[Any], None] | None = None,
        fault_hook: FaultHook | None = None,
        *,
        resume: bool = False,
        resume_message: str | None = None,
    ) -> None:
        super().__init__(journal, on_change=on_change, fault_hook=fault_hook)
        self._resume = resume
        self._resume_message = resume_message

    # -- run ---------------------------------------------------------------------------------

    def run(
        self,
        plan_id: str,
        sandboxes: Sequence[Participant],
        attempt: int = 1,
        message: str | None = None,
        fallback_reason: str | None = None,
    ) -> list[CommitResult]:
        """Commit ``sandboxes`` all or nothing (seed 002, "Atomic Commit").

        ``fallback_reason`` is recorded in the journal when a two-phase plan commit
        fell back to this saga (:func:`~sandbox_core.plan.commit.commit_plan`, ``mode="auto"``).

        Returns:
            One successful :class:`CommitResult` per sandbox, in commit order; or, when a commit
            raised :class:`SandboxError`, a single ``CommitResult(success=False)`` whose ``error``
            starts with ``"Atomic commit failed"`` and whose ``metadata`` holds
            ``failed_sandbox_id``, ``rolled_back_ids`` and ``failed_rollback_ids``.

        Raises:
            AtomicCommitError: a commit raised anything else; compensation ran first and the
                original exception is ``__cause__``.
            CommitOutcomeUnknownError: a commit's reply was lost and asking could not tell
                whether it landed; nothing was compensated, the attempt stays open (reason
                ``OutcomeUnknown``): :meth:`recover` asks again.
            SandboxError: the journal could not be written.
        """
        ordered = commit_order(sandboxes)
        state = JournalState(
            plan_id=plan_id,
            attempt=attempt,
            phase=JournalPhase.COMMITTING,
            steps=[_step_for(sb) for sb in ordered],
            fallback_reason=fallback_reason,
        )
        self._save(state)
        return self._commit_steps(state, list(zip(state.steps, ordered, strict=True)), [], message)

    def _commit_steps(
        self,
        state: JournalState,
        pending: list[tuple[JournalStep, Any]],
        committed: list[tuple[JournalStep, Any]],
        message: str | None,
    ) -> list[CommitResult]:
        """Commit ``pending`` in order after ``committed``; see :meth:`run` for the outcome."""
        positions = {step.sandbox_id: index for index, step in enumerate(state.steps, start=1)}
        results = [CommitResult.from_dict(step.result) for step, _ in committed if step.result]
        committed = list(committed)
        for step, sandbox in pending:
            index = positions[step.sandbox_id]
            step.state = StepState.COMMITTING
            step.started_at = utc_now()
            self._save(state)
            try:
                self._fault("before_commit", index, step.sandbox_id)
                result = self._commit_or_ask(state, step, sandbox, message)
            except CommitOutcomeUnknownError:
                raise  # asked, no answer: recorded open by _ask, nothing compensated
            except SandboxError as exc:
                self._fail(state, step, sandbox, exc, committed)
                return [self._failure_result(state)]
            except Exception as exc:
                self._fail(state, step, sandbox, exc, committed)
                raise AtomicCommitError(
                    state.error or str(exc),
                    rolled_back_ids=state.rolled_back_ids,
                    failed_rollback_ids=state.failed_rollback_ids,
                ) from exc
            self._fault("after_commit", index, step.sandbox_id)
            self._changed(sandbox)
            self._fault("after_persist", index, step.sandbox_id)
            step.state = StepState.COMMITTED
            step.result = result.to_dict()
            self._save(state)
            self._fault("after_record", index, step.sandbox_id)
            committed.append((step, sandbox))
            results.append(result)
        self._finish(state, JournalPhase.COMMITTED, JournalReason.COMMITTED)
        return results

    def _commit_or_ask(
        self, state: JournalState, step: JournalStep, sandbox: Any, message: str | None
    ) -> CommitResult:
        """Commit ``sandbox``; when its reply is lost, ask whether it landed (:meth:`_ask`).

        Raises:
            CommitOutcomeUnknownError: lost, and still no answer (recorded open).
            SandboxError: the commit failed, or (asked) did not land.
        """
        try:
            return _commit_one(sandbox, message)
        except CommitOutcomeUnknownError as lost:
            answer = self._ask(state, step, sandbox, message, lost)
            if answer is None:
                raise SandboxError(f"{lost}; asked since: it did not land") from lost
            return answer

    def _ask(
        self,
        state: JournalState,
        step: JournalStep,
        sandbox: Any,
        message: str | None,
        lost: CommitOutcomeUnknownError,
    ) -> CommitResult | None:
        """After a lost reply: the commit's result when it landed, None when it did not (the
        caller then fails the step with ``lost``).

        Raises:
            CommitOutcomeUnknownError: still no answer; the attempt is recorded open (step
                ``committing``, reason ``OutcomeUnknown``) and nothing is compensated.
            SandboxError: the participant answered with the commit's refusal (it did not land).
        """
        logger.warning("plan %s: the reply of %s was lost; asking", state.plan_id, step.sandbox_id)
        try:
            return ask_commit_outcome(sandbox, message)
        except CommitOutcomeUnknownError as unknown:
            self._in_doubt(state, step, unknown)
            raise unknown from lost

    def _in_doubt(self, state: JournalState, step: JournalStep, exc: Exception) -> None:
        """Record that ``step``'s outcome cannot be learnt now: the attempt stays open."""
        step.error = f"outcome unknown: {exc}"
        step.updated_at = utc_now()
        state.reason = JournalReason.OUTCOME_UNKNOWN
        state.error = (
            f"the outcome of the commit of sandbox {step.sandbox_id} (resource "
            f"{step.resource_id}) is unknown: {exc}; nothing was compensated; recovery asks "
            "again"
        )
        self._save(state)
        logger.error("plan %s: %s", state.plan_id, state.error)

    # -- recover -----------------------------------------------------------------------------

    def recover(self, resolve: SandboxResolver) -> JournalState | None:
        """Finish an interrupted attempt (see the module docstring for the policy).

        Args:
            resolve: finds the sandbox of a step (live, or reopened from the store).

        Returns:
            The journal state after recovery, or ``None`` when there is no journal. It is
            terminal unless a compensation failed again for a cause that may go away (phase
            ``compensating``, reason ``CompensationFailed``: call again later). A terminal
            journal is returned as loaded, without writing.

        Raises:
            SandboxError: the journal could not be read or written.
        """
        state = self.journal.load()
        if state is None or state.phase.is_terminal:
            return state
        logger.warning(
            "recovering interrupted commit of plan %s (attempt %d, phase %s)",
            state.plan_id,
            state.attempt,
            state.phase.value,
        )
        sandboxes: dict[str, Any] = {}
        uncertain = False
        for step in state.steps:
            if step.state not in _LIVE_STEP_STATES:
                continue
            sandbox = sandboxes[step.sandbox_id] = resolve(step)
            if step.state is not StepState.COMMITTING:
                continue
            try:
                landed = probe_commit_landed(sandbox)
            except CommitOutcomeUnknownError as exc:
                self._in_doubt(state, step, exc)  # ask again later; compensate nothing now
                return state
            if landed is False:
                step.state = StepState.PENDING
                step.error = "interrupted before the commit reached the original"
            else:
                uncertain = uncertain or landed is None
                adopt_landed_commit(sandbox)
                step.state = StepState.COMMITTED
                if landed is None:
                    step.error = "interrupted; outcome unknown, compensating as committed"
            step.updated_at = utc_now()
            self._save(state)
        all_landed = all(step.state is StepState.COMMITTED for step in state.steps)
        if all_landed and not uncertain and state.phase is JournalPhase.COMMITTING:
            self._finish(state, JournalPhase.COMMITTED, JournalReason.COMMITTED)
            return state
        if state.phase is JournalPhase.COMMITTING and _past_point_of_no_return(state):
            self._roll_forward(state, sandboxes, resolve)
            return state
        if (
            self._resume
            and state.phase is JournalPhase.COMMITTING
            and state.failed_sandbox_id is None
            and not uncertain
        ):
            # Nothing failed and every step's outcome is known: the attempt was only cut short.
            self._roll_forward(state, sandboxes, resolve, self._resume_message)
            return state
        to_compensate = [
            (step, sandboxes.get(step.sandbox_id))
            for step in state.steps
            if step.state in _OWED_STEP_STATES
        ]
        owed = self._compensate(state, to_compensate, recovering=True)
        if state.failed_sandbox_id is not None:
            phase, reason = JournalPhase.FAILED, JournalReason.COMMIT_FAILED
        else:
            phase, reason = JournalPhase.ROLLED_BACK, JournalReason.INTERRUPTED
            if not state.error:
                state.error = f"commit attempt {state.attempt} was interrupted and compensated"
        self._conclude(state, phase, reason, owed)
        return state

    def _roll_forward(
        self,
        state: JournalState,
        sandboxes: dict[str, Any],
        resolve: SandboxResolver,
        message: str | None = None,
    ) -> None:
        """Commit the steps still pending (after a step that cannot be undone has landed, or
        when resuming); a commit that fails then is compensated as in :meth:`run`."""
        logger.warning("plan %s: finishing the interrupted attempt", state.plan_id)
        committed = [
            (step, sandboxes.get(step.sandbox_id))
            for step in state.steps
            if step.state is StepState.COMMITTED
        ]
        pending = [(step, resolve(step)) for step in state.steps if step.state is StepState.PENDING]
        try:
            self._commit_steps(state, pending, committed, message)
        except AtomicCommitError:
            logger.exception("plan %s: finishing the attempt failed", state.plan_id)
        except CommitOutcomeUnknownError:
            logger.warning("plan %s: an outcome is unknown; recover asks again", state.plan_id)

    # -- helpers -----------------------------------------------------------------------------

    def _fail(
        self,
        state: JournalState,
        step: JournalStep,
        sandbox: Any,
        exc: BaseException,
        committed: list[tuple[JournalStep, Any]],
    ) -> None:
        step.state = StepState.FAILED
        step.error = f"{type(exc).__name__}: {exc}"
        step.conflicts = [str(path) for path in getattr(exc, "conflicts", None) or []]
        step.updated_at = utc_now()
        state.failed_sandbox_id = step.sandbox_id
        self._changed(sandbox)
        owed = self._compensate(state, committed, recovering=False)
        state.error = (
            f"Atomic commit failed: sandbox {step.sandbox_id} (resource {step.resource_id}) "
            f"failed to commit: {exc}; rolled back {state.rolled_back_ids}, "
            f"failed rollbacks {state.failed_rollback_ids}"
        )
        self._conclude(state, JournalPhase.FAILED, JournalReason.COMMIT_FAILED, owed)
        logger.error("%s", state.error)

    def _compensate(
        self, state: JournalState, committed: list[tuple[JournalStep, Any]], *, recovering: bool
    ) -> list[str]:
        """Compensate ``committed`` in LIFO order, every one even after a failure (case 21).

        A step whose compensation failed before (``compensation_failed``) is retried; when it
        succeeds now it moves from ``failed_rollback_ids`` to ``rolled_back_ids``.

        Returns:
            Ids whose compensation failed for a cause that may go away (owed: retry later).
        """
        owed: list[str] = []
        if not committed:
            return owed
        state.phase = JournalPhase.COMPENSATING
        self._save(state)
        positions = {step.sandbox_id: index for index, step in enumerate(state.steps, start=1)}

        def undo(step: JournalStep, sandbox: Any) -> None:
            self._fault("before_compensate", positions[step.sandbox_id], step.sandbox_id)
            _roll_back_one(step, sandbox, recovering=recovering)

        def done(step: JournalStep, sandbox: Any, exc: Exception | None) -> None:
            if exc is not None and _may_succeed_later(step, sandbox, exc):
                owed.append(step.sandbox_id)
            if sandbox is not None:
                self._changed(sandbox)

        run_compensations(
            state,
            reversed(committed),
            undo,
            self._save,
            after_undo=lambda step: self._fault(
                "after_compensate", positions[step.sandbox_id], step.sandbox_id
            ),
            on_done=done,
        )
        return owed

    def _conclude(
        self,
        state: JournalState,
        phase: JournalPhase,
        reason: JournalReason,
        owed: list[str],
    ) -> None:
        """End the attempt in ``phase``/``reason``, unless compensations are owed or failed.

        Owed compensations keep the attempt open (``compensating``, ``CompensationFailed``):
        ``recover`` retries them. Compensations that can never succeed end it ``failed`` with
        ``CompensationFailed``.
        """
        if owed:
            state.phase = JournalPhase.COMPENSATING
            state.reason = JournalReason.COMPENSATION_FAILED
            state.finished_at = None
            self._save(state)
            logger.error(
                "plan %s: compensation of %s failed; the attempt stays open and `recover` "
                "retries it",
                state.plan_id,
                ", ".join(owed),
            )
            return
        if state.failed_rollback_ids:
            phase, reason = JournalPhase.FAILED, JournalReason.COMPENSATION_FAILED
        self._finish(state, phase, reason)

    def _failure_result(self, state: JournalState) -> CommitResult:
        failed = state.step(state.failed_sandbox_id) if state.failed_sandbox_id else None
        return CommitResult(
            sandbox_id=state.failed_sandbox_id or "",
            success=False,
            error=state.error,
            metadata={
                "failed_sandbox_id": state.failed_sandbox_id,
                "conflicts": list(failed.conflicts) if failed else [],
                "rolled_back_ids": list(state.rolled_back_ids),
                "failed_rollback_ids": list(state.failed_rollback_ids),
                "attempt": state.attempt,
            },
        )


def results_from_journal(state: JournalState) -> list[CommitResult]:
    """The ``commit_all`` return value a terminal journal stands for.

    ``committed``: the recorded successful results in commit order. Otherwise one failed result
    whose metadata names the failed sandbox, the compensated and the uncompensated ones.
    """
    if state.phase is JournalPhase.COMMITTED:
        return [CommitResult.from_dict(step.result) for step in state.steps if step.result]
    return [
        CommitResult(
            sandbox_id=state.failed_sandbox_id or "",
            success=False,
            error=f"Atomic commit failed: {state.error or state.reason.value}",
            metadata={
                "failed_sandbox_id": state.failed_sandbox_id,
                "rolled_back_ids": list(state.rolled_back_ids),
                "failed_rollback_ids": list(state.failed_rollback_ids),
                "attempt": state.attempt,
                "phase": state.phase.value,
            },
        )
    ]


_OWED_STEP_STATES = frozenset(
    {StepState.COMMITTED, StepState.COMPENSATING, StepState.COMPENSATION_FAILED}
)
_LIVE_STEP_STATES = _OWED_STEP_STATES | {StepState.COMMITTING}


def _past_point_of_no_return(state: JournalState) -> bool:
    """Whether a step that cannot be undone (not ``rollbackable``) has committed.

    Seed 002 commits those last, so that they run only when nothing before them can fail any
    more; once one has landed, rolling the attempt back would leave it committed beside undone
    steps (half a plan, case 38), so recovery rolls forward instead.
    """
    return any(not step.rollbackable and step.state is StepState.COMMITTED for step in state.steps)


def _may_succeed_later(step: JournalStep, sandbox: Any, exc: Exception) -> bool:
    """Whether a failed compensation is worth retrying (its cause may go away).

    Not when the sandbox is gone, its strategy cannot undo a commit, or its status cannot roll
    back (a :class:`SandboxStateError` other than a refusal): retrying cannot help.
    """
    if sandbox is None or not step.rollbackable:
        return False
    if not bool(getattr(sandbox, "rollbackable", True)):
        return False
    return not isinstance(exc, SandboxStateError)


def _commit_one(sandbox: Participant, message: str | None) -> CommitResult:
    """``sandbox.commit(message)``; a result with ``success=False`` raises SandboxError."""
    result: CommitResult = sandbox.commit(message)
    if not result.success:
        raise SandboxError(result.error or "commit reported failure")
    return result


def _roll_back_one(step: JournalStep, sandbox: Any, *, recovering: bool) -> None:
    """Compensate one step; in recovery a sandbox already ROLLED_BACK counts as done."""
    if sandbox is None:
        raise SandboxError(f"sandbox {step.sandbox_id} cannot be found to roll back")
    status = getattr(sandbox, "status", None)
    if recovering and status is SandboxStatus.ROLLED_BACK:
        return
    if status in (SandboxStatus.CREATED, SandboxStatus.ACTIVE):
        # The journal says this step committed, but the sandbox's record lags: the process
        # that found the commit landed (or made it) died before saving the record. A rollback
        # of an ACTIVE sandbox would only discard its copy and leave the original committed
        # while the plan reports it rolled back; adopt the commit so the rollback undoes it.
        logger.warning(
            "sandbox %s: the journal says committed, its record %s; adopting the commit",
            step.sandbox_id,
            status.value,
        )
        adopt_landed_commit(sandbox)
    sandbox.rollback()


def _step_for(sandbox: Participant) -> JournalStep:
    context = getattr(sandbox, "context", None)
    resource_id = getattr(sandbox, "resource_id", None) or getattr(context, "resource_id", "")
    return JournalStep(
        sandbox_id=str(sandbox.sandbox_id),
        resource_id=str(resource_id or ""),
        strategy=str(getattr(sandbox, "strategy", "") or ""),
        rollbackable=bool(getattr(sandbox, "rollbackable", True)),
    )
