"""Two-phase plan commit: every conflict is found before any original is touched.

The saga (:mod:`sandbox_core.plan.saga`) commits sandboxes one after another and compensates the
ones that landed when a later one fails, so a conflict in the last of ten sandboxes changes nine
originals and undoes them. :class:`TwoPhasePlanCommit` splits the commit instead:

1. **Prepare** (journal phase ``preparing``): every participant does all the work that can
   fail without touching its original (``BaseSandbox.prepare(txid)``: merge objects, staged
   files beside their targets, ``PREPARE TRANSACTION``), each named after the attempt's
   ``txid`` (:func:`plan_txid`). Participants whose originals are independent
   (:func:`independent_chains`) are prepared at once in threads, the others in commit order;
   the directory participants share one chain in the calling thread.
   Each step is recorded ``prepared`` with its ``PreparedCommit``, written with the decision
   record (until the decision recovery aborts every step anyway). Staged files become durable
   by one ``syncfs`` per filesystem before the decision (``deferred_syncfs``). Any failure
   aborts every step (also the failed one) and ends the attempt ``failed`` / ``CommitFailed``
   (the first failed step in commit order is named): no original touched, sandboxes keep their
   status.
2. **Verify**: :func:`~sandbox_core.plan.review.plan_digest` over the prepared digests must equal
   the approved digest when one is given, else every step is aborted and the attempt ends
   ``failed`` / ``ChangedSinceApproval``.
3. **Decide**: with a participant that cannot prepare durably (SQLite holds its writes in an
   open connection; ``prepares_durably`` False) that participant is the *last resource*: it is
   prepared after every durable one, its step is marked ``committing`` and its
   ``apply_prepared(txid)`` **is** the decision. Then the decision record (phase ``applying``,
   ``decided_at``) is saved: from here recovery rolls forward.
4. **Apply**: ``apply_prepared(txid)`` of every other participant (renames, compare-and-swap ref
   updates, ``COMMIT PREPARED``; independent ones at once), then phase ``committed``.

Recovery (:meth:`TwoPhasePlanCommit.recover`), from the journal alone in a fresh process:

- phase ``preparing`` / ``aborting``: abort every step not recorded ``aborted`` (idempotent,
  and safe when nothing was staged; a step's start of prepare is not journaled) and end
  ``rolled_back`` / ``Interrupted`` (or the reason recorded before the crash); nothing was
  touched. Exception: a last resource recorded ``committing`` is asked ``commit_landed()``: True
  means the decision was taken, so recovery records it and rolls forward; False or unknown
  aborts (unknown is logged: only SQLite is a last resource and it answers from its commit
  marker).
- phase ``applying``: ``apply_prepared(txid)`` of every step not yet ``committed``
  (idempotent), then ``committed``. An apply that still fails keeps the phase ``applying``
  with the error recorded (call again once the cause is gone; never rolled back: the decision
  was taken).
- A terminal journal is returned unchanged; a saga journal is handed to the saga's recovery.

When two phases cannot be used (:func:`two_phase_unavailable_reason`: more than one
participant cannot prepare durably, or a participant has no prepare; or a prepare raised
:class:`~sandbox_core.errors.TwoPhaseUnavailableError`, e.g. PostgreSQL with
``max_prepared_transactions = 0``) :meth:`TwoPhasePlanCommit.run` raises
``TwoPhaseUnavailableError`` with nothing touched; :func:`~sandbox_core.plan.commit.commit_plan`
(``mode="auto"``) then falls back to the saga and reports ``fallback_reason`` (see
``docs/two-phase-commit.md``).

Fault injection (tests only), through :func:`sandbox_core.plan.saga.env_fault_hook`
(``SANDBOX_CORE_FAULT=<point>:<index>`` SIGKILLs, ``SANDBOX_CORE_FAULT_RAISE`` raises): points
``before_prepare``, ``after_prepare`` (prepared, not yet recorded), ``before_abort`` (each
step's abort, also in recovery), ``before_apply``,
``after_apply`` (applied, not yet recorded) with the 1-based step index in commit order, each
reached in the thread of its own step (other independent steps may be anywhere then), and
``after_decision`` with index ``0`` (the decision record is durable, nothing applied yet except
a last resource).
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sandbox_core.durable import deferred_syncfs
from sandbox_core.errors import SandboxCommitError, SandboxError, TwoPhaseUnavailableError
from sandbox_core.plan.journal import (
    CommitJournal,
    JournalPhase,
    JournalReason,
    JournalState,
    JournalStep,
    StepState,
)
from sandbox_core.plan.original_lock import hold_prepared, release_prepared
from sandbox_core.plan.participants import Participant, commit_order, in_process
from sandbox_core.plan.review import plan_digest
from sandbox_core.plan.saga import (
    FaultHook,
    JournaledPlanCommit,
    PlanCommitSaga,
    SandboxResolver,
    adopt_landed_commit,
    probe_commit_landed,
)
from sandbox_core.plan.validation import CheckResult
from sandbox_core.protocol import CommitResult, PreparedCommit, utc_now

__all__ = [
    "DECISION_FAULT_INDEX",
    "DEFAULT_MAX_WORKERS",
    "TWO_PHASE_FAULT_POINTS",
    "TXID_MAX_LENGTH",
    "TwoPhasePlanCommit",
    "failure_result",
    "independent_chains",
    "overlapping_writes",
    "participant_order",
    "plan_txid",
    "two_phase_results",
    "two_phase_unavailable_reason",
]

logger = logging.getLogger("sandbox_core.plan.two_phase")

P = TypeVar("P")

TWO_PHASE_FAULT_POINTS = (
    "before_prepare",
    "after_prepare",
    "after_decision",
    "before_apply",
    "after_apply",
)
DECISION_FAULT_INDEX = 0
"""The index ``after_decision`` is reported with (it belongs to no step)."""
TXID_MAX_LENGTH = 64
DEFAULT_MAX_WORKERS = 8
"""Threads preparing (and applying) independent chains at once (git and database chains mostly
wait on child processes and servers, so more than the CPUs)."""

# Steps that may hold something staged under the txid: recovery and failures abort them.
_ABORTABLE = frozenset(
    {StepState.PREPARING, StepState.PREPARED, StepState.FAILED, StepState.COMMITTING}
)


def plan_txid(plan_id: str, attempt: int) -> str:
    """The transaction id of attempt ``attempt`` of ``plan_id`` (step 1 of the module docstring).

    Deterministic (a fresh process finds the same staged state from the journal), different per
    attempt, only ``[A-Za-z0-9._-]`` and at most 64 characters, so participants can name files,
    refs and PostgreSQL global ids after it (``txid + "." + sandbox_id`` stays under 200).

    Returns:
        ``"tpc.<readable part of plan_id, <= 32>.<10 hex of sha256(plan_id)>.<attempt>"``.

    Raises:
        ValueError: ``attempt`` is below 1.
    """
    if attempt < 1:
        raise ValueError("attempt must be 1 or more")
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", plan_id).strip("-")[:32] or "plan"
    digest = hashlib.sha256(plan_id.encode("utf-8")).hexdigest()[:10]
    return f"tpc.{readable}.{digest}.{attempt}"[:TXID_MAX_LENGTH]


def two_phase_unavailable_reason(sandboxes: Iterable[Participant]) -> str | None:
    """Why these sandboxes cannot be committed in two phases, or ``None`` when they can.

    Step 3 of the module docstring: at most one participant may prepare non-durably (the last
    resource); every participant must offer ``prepare``/``apply_prepared``/``abort_prepared``.
    """
    items = list(sandboxes)
    lacking = [
        str(sb.sandbox_id)
        for sb in items
        if not all(
            callable(getattr(sb, name, None))
            for name in ("prepare", "apply_prepared", "abort_prepared")
        )
    ]
    if lacking:
        return f"sandboxes {', '.join(lacking)} cannot prepare a commit"
    volatile = [sb for sb in items if not bool(getattr(sb, "prepares_durably", True))]
    if len(volatile) > 1:
        named = ", ".join(f"{sb.sandbox_id} ({getattr(sb, 'strategy', '?')})" for sb in volatile)
        return (
            f"{len(volatile)} sandboxes cannot prepare durably ({named}); at most one can be "
            "the last resource of a two-phase commit"
        )
    return None


def participant_order(sandboxes: Iterable[P]) -> list[P]:
    """Commit order (seed 002: rollbackable first), with the last resource moved to the end."""
    ordered = commit_order(sandboxes)
    durable = [sb for sb in ordered if bool(getattr(sb, "prepares_durably", True))]
    return durable + [sb for sb in ordered if not bool(getattr(sb, "prepares_durably", True))]


def _original_key(sandbox: Any) -> str | None:
    """What a participant's prepare and apply write to: the real path of its original, or its
    database address; None when unknown (then it is independent of nothing).

    Only an in-process sandbox (:func:`~sandbox_core.plan.participants.in_process`) can run
    beside others: an executor's handle or a wrapper around one (the operator's deletion guard,
    which checks its Sandbox object right before each prepare, in commit order; an agent's HTTP
    handle) keeps the plan in order."""
    if not in_process(sandbox):
        return None
    original = getattr(sandbox, "original_path", None)
    if not isinstance(original, str) or not original:
        return None
    if original.startswith("/"):
        return os.path.realpath(original)
    # A database address without its options: sandboxes of one database (whatever their
    # search_path) share a chain.
    return urlsplit(original)._replace(query="", fragment="").geturl()


# Strategies whose prepare and apply are file-system calls made by this interpreter: in threads
# they only contend for the GIL (benchmarks/bench_two_phase.py, 10 copy_on_write sandboxes on a
# quiet machine: 1.75x the saga with 8 threads, 1.22x with one), so they share one chain that
# runs beside the chains of git (child processes) and databases (server round trips).
_IN_INTERPRETER = frozenset({"copy_on_write", "overlay", "none"})
_INTERPRETER_CHAIN = "interpreter:"


def _chain_key(sandbox: Any) -> str | None:
    """The key :func:`independent_chains` groups ``sandbox`` by (see ``_IN_INTERPRETER``)."""
    if in_process(sandbox) and getattr(sandbox, "strategy", None) in _IN_INTERPRETER:
        return _INTERPRETER_CHAIN
    return _original_key(sandbox)


def _overlap(a: str | None, b: str | None) -> bool:
    if a is None or b is None or a == b:
        return True
    if a.startswith("/") and b.startswith("/"):
        return a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")
    return False


def independent_chains(indices: list[int], pairs: list[tuple[JournalStep, Any]]) -> list[list[int]]:
    """Step ``indices`` (1-based, commit order) grouped into chains that may run at once.

    Participants whose originals may overlap (the same original, e.g. two git sandboxes of one
    repository or two sandboxes of one database; one original inside another; an original
    that cannot be told, or a participant that is not an in-process sandbox) share a chain, in
    commit order; different chains never touch the same files, refs or database. The directory
    sandboxes (``_IN_INTERPRETER``) share one chain whatever their originals.
    """
    chains: list[tuple[list[int], list[str | None]]] = []
    for index in indices:
        key = _chain_key(pairs[index - 1][1])
        joined = [c for c in chains if any(_overlap(key, k) for k in c[1])]
        merged: tuple[list[int], list[str | None]] = ([index], [key])
        for chain in joined:
            chains.remove(chain)
            merged = (chain[0] + merged[0], chain[1] + merged[1])
        chains.append((sorted(merged[0]), merged[1]))
    return sorted((chain for chain, _ in chains), key=lambda chain: chain[0])


class TwoPhasePlanCommit(JournaledPlanCommit):
    """Runs and recovers one plan's two-phase commit against one journal.

    Args:
        journal: where the attempt is recorded (``mode="two_phase"``).
        on_change: called with a sandbox after each change of its status (the manager persists
            it to its store).
        fault_hook: test-only fault injection; defaults to
            :func:`~sandbox_core.plan.saga.env_fault_hook`.
        max_workers: participants whose originals are independent (:func:`independent_chains`)
            are prepared and applied by up to this many threads at once; ``1`` runs every step
            one after another in commit order.
    """

    def __init__(
        self,
        journal: CommitJournal,
        on_change: Callable[[Any], None] | None = None,
        fault_hook: FaultHook | None = None,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        super().__init__(journal, on_change=on_change, fault_hook=fault_hook)
        self._max_workers = max(1, max_workers)
        self._pool: ThreadPoolExecutor | None = None  # shared by the phases of one run

    # -- run ---------------------------------------------------------------------------------

    def run(
        self,
        plan_id: str,
        sandboxes: Sequence[Participant],
        attempt: int = 1,
        message: str | None = None,
        approved_digest: str | None = None,
        checks: Sequence[CheckResult] = (),
    ) -> list[CommitResult]:
        """Commit ``sandboxes`` all or nothing in two phases (see the module docstring).

        Args:
            plan_id: the plan.
            sandboxes: its CREATED/ACTIVE sandboxes (in-process, or an executor's handle);
                each needs what :class:`~sandbox_core.plan.participants.TwoPhaseParticipant`
                has.
            attempt: the attempt number (1-based); the txid derives from it.
            message: commit message for every participant.
            approved_digest: when given, the plan digest the prepared changes must hash to.
            checks: the plan's validation results, taken into that digest
                (:func:`~sandbox_core.plan.review.plan_digest`).

        Returns:
            One successful :class:`CommitResult` per sandbox in commit order (metadata ``txid``);
            or one ``CommitResult(success=False)`` whose ``error`` starts with
            ``"Atomic commit failed"`` and whose metadata holds ``failed_sandbox_id``,
            ``conflicts``, ``rolled_back_ids`` (always empty), ``failed_rollback_ids`` (empty),
            ``reason`` (``"CommitFailed"`` | ``"ChangedSinceApproval"``), ``touched_originals``
            (0 before the decision), ``failed_abort_ids``, ``mode``, ``txid``, ``digest``,
            ``approved_digest``, ``phase`` and ``attempt``. After the decision an apply that
            failed keeps the journal ``applying`` (``recover`` finishes it) and the failed
            result says so.

        Raises:
            TwoPhaseUnavailableError: the plan cannot use two phases; raised before anything is
                prepared (too many non-durable participants) or after every prepared step was
                aborted (a participant refused to prepare). Nothing was touched.
            SandboxError: the journal could not be written.
            Exception: a non-sandbox error from a participant, after every step was aborted.
        """
        reason = two_phase_unavailable_reason(sandboxes)
        if reason is not None:
            raise TwoPhaseUnavailableError(reason)
        workers = min(self._max_workers, len(sandboxes))
        if workers <= 1:
            return self._run(plan_id, sandboxes, attempt, message, approved_digest, checks)
        # One pool for prepare and apply: its threads start once per plan, not once per phase.
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="two-phase") as pool:
            self._pool = pool
            try:
                return self._run(plan_id, sandboxes, attempt, message, approved_digest, checks)
            finally:
                self._pool = None

    def _run(
        self,
        plan_id: str,
        sandboxes: Sequence[Participant],
        attempt: int,
        message: str | None,
        approved_digest: str | None,
        checks: Sequence[CheckResult] = (),
    ) -> list[CommitResult]:
        ordered = participant_order(sandboxes)
        state = JournalState(
            plan_id=plan_id,
            attempt=attempt,
            phase=JournalPhase.PREPARING,
            mode="two_phase",
            txid=plan_txid(plan_id, attempt),
            approved_digest=approved_digest,
            steps=[_step_for(sb) for sb in ordered],
        )
        self._save(state)
        pairs = list(zip(state.steps, ordered, strict=True))
        # Staged files are made durable by one syncfs per filesystem before the decision
        # record instead of one per participant: until the decision, recovery only aborts, and
        # an abort removes whatever of a staging area reached the disk.
        with deferred_syncfs() as flush_staged:
            outcome = self._prepare_all(state, pairs, message)
        if isinstance(outcome, CommitResult):
            return [outcome]
        prepared = outcome
        state.digest = plan_digest(prepared, checks)
        if approved_digest is not None and state.digest != approved_digest:
            state.error = (
                f"Atomic commit failed: plan {plan_id} changed since approval: its changes hash "
                f"to {state.digest}, the approval named {approved_digest}; nothing was changed"
            )
            self._abort(state, pairs, JournalReason.CHANGED_SINCE_APPROVAL)
            return [failure_result(state)]
        overlap = overlapping_writes([sb for _, sb in pairs], prepared)
        if overlap is not None:
            index, paths, other = overlap
            step = pairs[other - 1][0]
            clash = SandboxCommitError(
                f"conflict with sandbox {step.sandbox_id} (resource {step.resource_id}) of the "
                f"plan: both write {', '.join(paths[:10])} of the same or a nested directory",
                paths,
            )
            self._fail_step(state, pairs[index - 1][0], clash, "conflicts within the plan")
            self._abort(state, pairs, JournalReason.COMMIT_FAILED)
            return [failure_result(state)]
        try:
            flush_staged()
        except OSError as exc:
            state.error = (
                f"Atomic commit failed: plan {plan_id}: the staged changes could not be made "
                f"durable: {exc}; every participant was aborted, nothing was changed"
            )
            self._abort(state, pairs, JournalReason.COMMIT_FAILED)
            return [failure_result(state)]
        decided = self._decide(state, pairs)
        if decided is not None:
            return [decided]
        return self._apply(state, pairs)

    def _prepare_all(
        self, state: JournalState, pairs: list[tuple[JournalStep, Any]], message: str | None
    ) -> list[PreparedCommit] | CommitResult:
        """Prepare every step: the durable ones in independent chains at once, then the last
        resource. On a failure abort all and return the failed result of the first failed
        step in commit order (or raise, see :meth:`run`)."""
        txid = _txid(state)
        outcomes: dict[int, PreparedCommit | Exception] = {}

        def prepare(index: int) -> bool:
            step, sandbox = pairs[index - 1]
            step.state = StepState.PREPARING
            step.started_at = utc_now()
            try:
                self._fault("before_prepare", index, step.sandbox_id)
                self._hold(state, step, sandbox)
                outcomes[index] = sandbox.prepare(txid, message)
            except Exception as exc:  # judged in commit order below, once every chain ended
                outcomes[index] = exc
                return False
            self._fault("after_prepare", index, step.sandbox_id)
            return True

        durable = [i for i, (step, _) in enumerate(pairs, start=1) if not step.last_resource]
        self._in_chains(independent_chains(durable, pairs), prepare)
        if all(isinstance(outcomes.get(i), PreparedCommit) for i in durable):
            for index, (step, _) in enumerate(pairs, start=1):
                if step.last_resource:  # after every durable one (step 3, Decide)
                    self._in_chains([[index]], prepare)
        failures = [(i, o) for i, o in sorted(outcomes.items()) if isinstance(o, Exception)]
        for index, outcome in sorted(outcomes.items()):
            step, sandbox = pairs[index - 1]
            if isinstance(outcome, PreparedCommit):
                # Saved with the decision record (or the abort): until the decision, recovery
                # aborts every step whatever was recorded, so a write per participant buys
                # nothing.
                step.state = StepState.PREPARED
                step.prepared = outcome.to_dict()
                step.updated_at = utc_now()
                self._changed(sandbox)
            elif failures and index != failures[0][0]:
                step.state = StepState.FAILED
                step.error = f"{type(outcome).__name__}: {outcome}"
                step.updated_at = utc_now()
        if not failures:
            return [o for _, o in sorted(outcomes.items()) if isinstance(o, PreparedCommit)]
        index, exc = failures[0]
        step = pairs[index - 1][0]
        if isinstance(exc, TwoPhaseUnavailableError):
            self._fail_step(state, step, exc, "cannot prepare in two phases")
        else:
            self._fail_step(state, step, exc, "could not be prepared")
        self._abort(state, pairs, JournalReason.COMMIT_FAILED)
        if isinstance(exc, TwoPhaseUnavailableError) or not isinstance(exc, SandboxError):
            raise exc
        return failure_result(state)

    def _in_chains(self, chains: list[list[int]], work: Callable[[int], bool]) -> None:
        """Run ``work(index)`` over every step index of ``chains``: in commit order within a
        chain, which stops when ``work`` returns False; the chains at once, in threads (one
        after another with ``max_workers=1``, where a False stops everything, as a loop would).

        Fault points stay defined per step: each is reached in the thread of its own step,
        right around that step's call (other chains may be anywhere then; before the decision
        recovery aborts every step, after it rolls every step forward).

        Raises:
            BaseException: the first (in commit order) raised by ``work`` that is not an
                ``Exception`` (``work`` turns those into outcomes), once every chain ended.
        """

        def run_chain(chain: list[int]) -> tuple[int, BaseException] | None:
            for index in chain:
                try:
                    if not work(index):
                        return None
                except BaseException as exc:  # a simulated crash: re-raised after the join
                    return index, exc
            return None

        if self._max_workers == 1 or len(chains) <= 1:
            ended = [run_chain(sorted(i for chain in chains for i in chain))]
        else:
            pool = self._pool or ThreadPoolExecutor(
                max_workers=min(self._max_workers, len(chains)),
                thread_name_prefix="two-phase",
            )
            try:
                # Each thread runs in a copy of this context (the deferred syncfs set in it).
                futures = [
                    pool.submit(contextvars.copy_context().run, run_chain, chain)
                    for chain in chains
                ]
                ended = [future.result() for future in futures]
            finally:
                if pool is not self._pool:
                    pool.shutdown()
        crashed = sorted((c for c in ended if c is not None), key=lambda c: c[0])
        if crashed:
            raise crashed[0][1]

    def _decide(
        self, state: JournalState, pairs: list[tuple[JournalStep, Any]]
    ) -> CommitResult | None:
        """Take the decision: the last resource's commit, then the decision record.

        Returns:
            ``None`` once decided to commit; the failed result when the last resource's commit
            failed (then every step was aborted).
        """
        txid = _txid(state)
        for index, (step, sandbox) in enumerate(pairs, start=1):
            if not step.last_resource:
                continue
            step.state = StepState.COMMITTING
            self._save(state)
            try:
                self._fault("before_apply", index, step.sandbox_id)
                result: CommitResult = sandbox.apply_prepared(txid)
            except SandboxError as exc:
                self._fail_step(state, step, exc, "(the last resource) could not commit")
                self._abort(state, pairs, JournalReason.COMMIT_FAILED)
                return failure_result(state)
            except Exception as exc:
                self._fail_step(state, step, exc, "(the last resource) could not commit")
                self._abort(state, pairs, JournalReason.COMMIT_FAILED)
                raise
            self._fault("after_apply", index, step.sandbox_id)
            self._changed(sandbox)
            step.state = StepState.COMMITTED
            step.result = result.to_dict()
            step.updated_at = utc_now()
            self._let_go(state, step, sandbox)
        state.phase = JournalPhase.APPLYING
        state.decided_at = utc_now()
        self._save(state)
        self._fault("after_decision", DECISION_FAULT_INDEX, "")
        return None

    def _apply(
        self, state: JournalState, pairs: list[tuple[JournalStep, Any]]
    ) -> list[CommitResult]:
        """Apply every step not yet committed (the decision was taken: only forward)."""
        txid = _txid(state)
        outcomes: dict[int, CommitResult | Exception] = {}

        def apply(index: int) -> bool:
            step, sandbox = pairs[index - 1]
            try:
                self._fault("before_apply", index, step.sandbox_id)
                outcomes[index] = _found(step, sandbox, "apply").apply_prepared(txid)
            except Exception as exc:  # the decision stands: record, go on, recover retries
                outcomes[index] = exc
                return True
            self._fault("after_apply", index, step.sandbox_id)
            return True

        todo = [
            i for i, (step, _) in enumerate(pairs, start=1) if step.state is not StepState.COMMITTED
        ]
        try:
            self._in_chains(independent_chains(todo, pairs), apply)
        finally:
            failed = self._record_applied(state, pairs, outcomes)
        if failed:
            state.failed_sandbox_id = failed[0]
            why = "; ".join(
                f"{step.sandbox_id}: {step.error}"
                for step in state.steps
                if step.sandbox_id in failed
            )
            state.error = (
                f"Atomic commit failed: plan {state.plan_id} was decided (txid {txid}) but the "
                f"apply of {', '.join(failed)} failed ({why}); run recover to finish it (the "
                "decision stands: it rolls forward)"
            )
            self._save(state)
            return [failure_result(state)]
        self._finish(state, JournalPhase.COMMITTED, JournalReason.COMMITTED)
        return [CommitResult.from_dict(step.result) for step in state.steps if step.result]

    def _record_applied(
        self,
        state: JournalState,
        pairs: list[tuple[JournalStep, Any]],
        outcomes: dict[int, CommitResult | Exception],
    ) -> list[str]:
        """Record the apply outcomes in commit order; returns the sandbox ids that failed.

        Recorded with the next save only: recovery re-applies every step not recorded
        committed, and apply_prepared is idempotent per txid (one write per apply saved)."""
        failed: list[str] = []
        for index, outcome in sorted(outcomes.items()):
            step, sandbox = pairs[index - 1]
            step.updated_at = utc_now()
            if isinstance(outcome, Exception):
                step.error = f"{type(outcome).__name__}: {outcome}"
                failed.append(step.sandbox_id)
                logger.error(
                    "plan %s: apply of sandbox %s failed: %s",
                    state.plan_id,
                    step.sandbox_id,
                    step.error,
                )
                continue
            self._changed(sandbox)
            step.state = StepState.COMMITTED
            step.result = outcome.to_dict()
            step.error = None
            self._let_go(state, step, sandbox)
        return failed

    # -- recover -----------------------------------------------------------------------------

    def recover(self, resolve: SandboxResolver) -> JournalState | None:
        """Finish an interrupted attempt (see the module docstring for the policy).

        Args:
            resolve: finds the sandbox of a step (live, or reopened from the store).

        Returns:
            The journal state after recovery, or ``None`` when there is no journal. It is
            terminal unless an abort or an apply failed again (phase ``aborting`` or
            ``applying``: call again later). A terminal journal is returned unchanged; a saga
            journal is recovered by :class:`~sandbox_core.plan.saga.PlanCommitSaga`.

        Raises:
            SandboxError: the journal could not be read or written.
        """
        state = self.journal.load()
        if state is None or state.phase.is_terminal:
            return state
        if state.mode != "two_phase":
            saga = PlanCommitSaga(
                self.journal, on_change=self._on_change, fault_hook=self._fault_hook
            )
            return saga.recover(resolve)
        logger.warning(
            "recovering interrupted two-phase commit of plan %s (attempt %d, phase %s)",
            state.plan_id,
            state.attempt,
            state.phase.value,
        )
        pairs = [(step, resolve(step)) for step in state.steps]
        if state.phase in (JournalPhase.PREPARING, JournalPhase.ABORTING, JournalPhase.PENDING):
            if not self._last_resource_landed(state, pairs):
                reason = state.reason
                if reason is JournalReason.IN_PROGRESS:
                    reason = JournalReason.INTERRUPTED
                    state.error = (
                        f"two-phase commit attempt {state.attempt} was interrupted before its "
                        "decision; every participant was aborted, nothing was changed"
                    )
                self._abort(state, pairs, reason, every_step=True)
                return state
            state.phase = JournalPhase.APPLYING
            state.decided_at = state.decided_at or utc_now()
            self._save(state)
        self._apply(state, pairs)
        return state

    def _last_resource_landed(
        self, state: JournalState, pairs: list[tuple[JournalStep, Any]]
    ) -> bool:
        """Whether a last resource recorded ``committing`` did commit (the decision was taken).

        When it did, its step is recorded ``committed`` (the sandbox adopts the landed commit).
        """
        for step, sandbox in pairs:
            if not (step.last_resource and step.state is StepState.COMMITTING):
                continue
            landed = probe_commit_landed(sandbox)
            if landed is not True:
                if landed is None:
                    logger.error(
                        "plan %s: cannot tell whether the last resource %s committed; aborting",
                        state.plan_id,
                        step.sandbox_id,
                    )
                    step.error = "interrupted; outcome of the last resource unknown, aborted"
                return False
            adopt_landed_commit(sandbox)
            self._changed(sandbox)
            last = getattr(sandbox, "last_commit", None)
            step.result = (
                last.to_dict()
                if isinstance(last, CommitResult)
                else CommitResult(sandbox_id=step.sandbox_id, success=True).to_dict()
            )
            step.state = StepState.COMMITTED
            step.updated_at = utc_now()
            self._save(state)
            self._let_go(state, step, sandbox)
            return True
        return False

    # -- helpers -----------------------------------------------------------------------------

    def _abort(
        self,
        state: JournalState,
        pairs: list[tuple[JournalStep, Any]],
        reason: JournalReason,
        *,
        every_step: bool = False,
    ) -> None:
        """Abort every step that may hold something staged, in reverse order; end the attempt.

        ``every_step`` (recovery) aborts the steps recorded ``pending`` too: a step's start of
        prepare is not journaled, so any of them may have staged something before the crash.

        The attempt ends ``failed`` (a step failed, or the digest changed) or ``rolled_back``
        (interrupted) with ``reason``; when an abort fails it stays ``aborting`` (recover
        retries it) and the sandbox is named in the error.
        """
        txid = _txid(state)
        state.phase = JournalPhase.ABORTING
        state.reason = reason
        self._save(state)
        failed: list[str] = []
        positions = {step.sandbox_id: index for index, step in enumerate(state.steps, start=1)}
        for step, sandbox in reversed(pairs):
            if step.state in (StepState.ABORTED, StepState.COMMITTED):
                continue
            if not (every_step or step.state in _ABORTABLE):
                continue
            self._fault("before_abort", positions[step.sandbox_id], step.sandbox_id)
            try:
                _found(step, sandbox, "abort").abort_prepared(txid)
            except Exception as exc:  # every step is attempted; failures are named
                failed.append(step.sandbox_id)
                step.error = f"abort failed: {type(exc).__name__}: {exc}"
                logger.exception(
                    "plan %s: abort of sandbox %s failed", state.plan_id, step.sandbox_id
                )
            else:
                if step.state is not StepState.FAILED:
                    step.state = StepState.ABORTED
                self._let_go(state, step, sandbox)  # nothing staged any more
            step.updated_at = utc_now()
        # One save after every abort, not one per step: until it, recovery (phase aborting)
        # aborts every step again, and an abort is idempotent.
        if failed:
            state.error = (
                f"{state.error or 'two-phase commit aborted'}; the abort of {', '.join(failed)} "
                "failed: run recover to finish it (no original was changed)"
            )
            self._save(state)
            return
        phase = (
            JournalPhase.ROLLED_BACK if reason is JournalReason.INTERRUPTED else JournalPhase.FAILED
        )
        self._finish(state, phase, reason)

    def _hold(self, state: JournalState, step: JournalStep, sandbox: Any) -> None:
        """Take the lock of the participant's original for this attempt, right before its
        prepare (:mod:`sandbox_core.plan.original_lock`: held until its apply or abort; a
        handle's own process takes it).

        Raises:
            OriginalLockedError: another plan holds that original (the step fails, every
                step is aborted, nothing changed).
        """
        hold_prepared(sandbox, _txid(state))

    def _let_go(self, state: JournalState, step: JournalStep, sandbox: Any) -> None:
        """Release this attempt's hold of the participant's original (applied or aborted)."""
        if sandbox is not None and state.txid:
            release_prepared(sandbox, state.txid)

    def _fail_step(
        self, state: JournalState, step: JournalStep, exc: BaseException, what: str
    ) -> None:
        step.state = StepState.FAILED
        step.error = f"{type(exc).__name__}: {exc}"
        step.conflicts = [str(path) for path in getattr(exc, "conflicts", None) or []]
        step.updated_at = utc_now()
        state.failed_sandbox_id = step.sandbox_id
        state.error = (
            f"Atomic commit failed: sandbox {step.sandbox_id} (resource {step.resource_id}) "
            f"{what}: {exc}; every participant was aborted, nothing was changed"
        )
        logger.error("%s", state.error)


def _written_paths(sandbox: Any, prepared: PreparedCommit) -> tuple[str, set[str]] | None:
    """``(top, absolute paths)`` a directory participant's apply writes, else None.

    An in-process sandbox's original is a path of this machine. An executor's handle names a
    path inside its own workspace Pod (the same mount path in every Pod), so two of them never
    share a directory by their paths alone: such a handle takes part only when it carries a
    ``source_root``, the identity of its original across Pods that the operator gives it
    (``pvc:<namespace>/<claim>/<sub-path>``, ``node:<path>``)."""
    summary = prepared.summary
    if summary is None:
        return None
    root = getattr(sandbox, "source_root", None)
    if in_process(sandbox):
        top = os.path.realpath(str(sandbox.original_path))
    elif isinstance(root, str) and root:
        top = root
    else:
        return None
    if getattr(sandbox, "strategy", None) not in ("copy_on_write", "overlay"):
        return None
    rels = [*summary.added, *summary.changed, *summary.deleted]
    return top, {f"{top.rstrip('/')}/{rel}" for rel in rels}


def _ancestors_of(path: str, stop: str) -> Iterable[str]:
    while len(path) > len(stop):
        path = path.rsplit("/", 1)[0]
        yield path


def overlapping_writes(
    sandboxes: list[Any], prepared: list[PreparedCommit]
) -> tuple[int, list[str], int] | None:
    """The first participant (1-based commit order) whose prepared writes meet another's: two
    directory sandboxes of the same or nested originals writing one path, or one replacing a
    directory below which the other writes. Their applies would collide after the decision
    (the second refused forever, half the plan landed), so this is a conflict found before it.

    Returns:
        ``(index, paths relative to its original, index of the earlier participant it meets)``,
        or None when the writes are disjoint.
    """
    seen: list[tuple[int, str, set[str], set[str]]] = []  # index, top, paths, their ancestors
    for index, (sandbox, done) in enumerate(zip(sandboxes, prepared, strict=True), start=1):
        written = _written_paths(sandbox, done)
        if written is None:
            continue
        top, paths = written
        for other, other_top, other_paths, other_ancestors in seen:
            if not (top == other_top or top.startswith(other_top + "/")
                    or other_top.startswith(top + "/")):  # fmt: skip
                continue
            clash = {
                os.path.relpath(path, top)
                for path in paths
                if path in other_paths
                or path in other_ancestors
                or any(anc in other_paths for anc in _ancestors_of(path, top))
            }
            if clash:
                return index, sorted(clash), other
        ancestors = {anc for path in paths for anc in _ancestors_of(path, top)}
        seen.append((index, top, paths, ancestors))
    return None


def failure_result(state: JournalState) -> CommitResult:
    """The failed ``CommitResult`` a two-phase journal stands for (shape: see ``run``)."""
    failed = None
    if state.failed_sandbox_id:
        try:
            failed = state.step(state.failed_sandbox_id)
        except KeyError:
            failed = None
    touched = sum(1 for step in state.steps if step.state is StepState.COMMITTED)
    failed_aborts = [
        step.sandbox_id for step in state.steps if (step.error or "").startswith("abort failed")
    ]
    return CommitResult(
        sandbox_id=state.failed_sandbox_id or "",
        success=False,
        error=state.error or f"Atomic commit failed: {state.reason.value}",
        metadata={
            "failed_sandbox_id": state.failed_sandbox_id,
            "conflicts": list(failed.conflicts) if failed else [],
            "rolled_back_ids": [],
            "failed_rollback_ids": [],
            "failed_abort_ids": failed_aborts,
            "reason": (
                state.reason.value
                if state.reason is not JournalReason.IN_PROGRESS
                else JournalReason.COMMIT_FAILED.value
            ),
            "touched_originals": touched,
            "mode": "two_phase",
            "txid": state.txid,
            "digest": state.digest,
            "approved_digest": state.approved_digest,
            "phase": state.phase.value,
            "attempt": state.attempt,
        },
    )


def two_phase_results(state: JournalState) -> list[CommitResult]:
    """The ``commit_plan`` return value a two-phase journal stands for.

    ``committed``: the recorded successful results in commit order; otherwise one failed result
    (:func:`failure_result`).
    """
    if state.phase is JournalPhase.COMMITTED:
        return [CommitResult.from_dict(step.result) for step in state.steps if step.result]
    return [failure_result(state)]


def _found(step: JournalStep, sandbox: Any, action: str) -> Any:
    """``sandbox``, or SandboxError when the step's sandbox could not be resolved."""
    if sandbox is None:
        raise SandboxError(f"sandbox {step.sandbox_id} cannot be found to {action}")
    return sandbox


def _txid(state: JournalState) -> str:
    if not state.txid:
        raise SandboxError(f"two-phase journal of plan {state.plan_id} has no txid")
    return state.txid


def _step_for(sandbox: Participant) -> JournalStep:
    context = getattr(sandbox, "context", None)
    resource_id = getattr(sandbox, "resource_id", None) or getattr(context, "resource_id", "")
    return JournalStep(
        sandbox_id=str(sandbox.sandbox_id),
        resource_id=str(resource_id or ""),
        strategy=str(getattr(sandbox, "strategy", "") or ""),
        rollbackable=bool(getattr(sandbox, "rollbackable", True)),
        last_resource=not bool(getattr(sandbox, "prepares_durably", True)),
    )
