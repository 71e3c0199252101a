"""PlanCommit logic: the plan's atomic commit (or rollback), two-phase or as a crash-safe saga.

The commit policy - mode, fallback from two phases to the saga, approved-digest check - is the
core's :func:`~sandbox_core.plan.commit.commit_plan`, the one the manager runs too (seed 002,
"Atomic Commit": rollbackable first, LIFO compensation; docs/two-phase-commit.md). This module
only feeds it the plan's Sandboxes and a journal kept on the PlanCommit's status
(:class:`~sandbox_operator.resources.journal.PlanCommitStatusJournal`), maps ``spec.mode``
(``TwoPhase`` -> ``"auto"``, ``Saga`` -> ``"saga"``) and says what happened in conditions,
Events and metrics. No second copy of the policy. What stays here: finding the plan's
Sandboxes, resuming an interrupted attempt (:mod:`sandbox_operator.resources.resume`; the
manager rolls back instead), the review and approval on the PlanCommit object.

Mode TwoPhase (the default) prepares every sandbox before any original is touched. Before it the
plan is reviewed (``status.review``, condition ``Reviewed``); with ``approval: Required`` the
PlanCommit waits in phase ``AwaitingApproval`` until ``spec.approvedDigest`` names the reviewed
digest (:mod:`sandbox_operator.resources.approval`), and ``commit_plan`` verifies the prepared
changes still hash to it (reason ``ChangedSinceApproval`` otherwise, nothing touched). A plan
that cannot run in two phases runs as the saga with condition ``TwoPhase=False`` reason
``FellBackToSaga``.

Policies (docs/operator-design.md):

- A terminal PlanCommit is never processed again: no writes, no Events (case 22).
- A journal found mid-way (operator killed) is finished by ``PlanCommitSaga.recover``: all
  committed, or all compensated; nothing is committed twice (case 20).
- A second PlanCommit of a plan waits while an older one is not terminal: condition
  ``Blocked=True`` reason ``PlanCommitInProgress`` and a TemporaryError retry.
- A plan with no CREATED/ACTIVE Sandbox fails with reason ``NoActiveSandboxes``.
- All or nothing across retries (case 38): a Sandbox of the plan not provisioned yet makes the
  PlanCommit wait (``Blocked=True``, reason ``SandboxesNotReady``); one RolledBack or Errored
  beside committable ones fails it up front with reason ``PlanRerunRequired`` (the core's
  ``refuse_partial_plan``), nothing touched.
- A compensation that failed (case 21) keeps the PlanCommit ``RollingBack`` with
  ``RollbackFailed=True``; the handler retries ``recover`` with exponential backoff
  (``retry_delay_seconds`` doubling, at most ``MAX_COMPENSATION_RETRY_DELAY_SECONDS``) until it
  succeeds and the PlanCommit ends as it would have without the fault.
- Never acts on a Sandbox whose deletion began (case 17, :mod:`sandbox_operator.kube.claims`):
  every Sandbox of the saga is claimed first, so its finalizer waits until the saga ends, and
  is re-read right before its commit; one being deleted fails its step (the plan is compensated,
  all or nothing). A PlanCommit whose own deletion began before its saga started does nothing.
- ``cleanupPolicy: Delete``: the plan's Sandboxes are deleted as soon as the action succeeded
  (phase Committed, or RolledBack for ``action: Rollback``); after a Failed action they are kept
  for inspection and deleted when the PlanCommit is deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandbox_api.models import (
    APPROVAL_REQUIRED_LABEL,
    CREATED_BY_ANNOTATION,
    GROUP,
    PLANCOMMIT_PLURAL,
    ROLLBACKABLE_STRATEGIES,
    SANDBOX_PLURAL,
    VERSION,
    PlanCommitAction,
    PlanCommitMode,
    PlanCommitPhase,
    PlanCommitSpec,
)
from sandbox_core import AtomicCommitError, SandboxError, SandboxStatus
from sandbox_core.errors import (
    CommitOutcomeUnknownError,
    PlanRerunRequiredError,
    PlanReviewError,
    TwoPhaseUnavailableError,
)
from sandbox_core.plan.commit import commit_plan
from sandbox_core.plan.journal import (
    JournalPhase,
    JournalReason,
    JournalState,
    JournalStep,
    StepState,
)
from sandbox_core.plan.review import review_plan
from sandbox_core.plan.saga import refuse_partial_plan, run_compensations
from sandbox_core.plan.two_phase import TwoPhasePlanCommit
from sandbox_core.plan.validation import Check, CheckResult, failed_checks, run_checks
from sandbox_core.protocol import utc_now
from sandbox_operator.errors import PermanentError, TemporaryError, is_not_found
from sandbox_operator.executors.base import (
    Executor,
    SandboxState,
    SandboxTarget,
    WorkspaceNotReady,
)
from sandbox_operator.kube import clock, lifecycle_metrics, metrics, tracing
from sandbox_operator.kube.api import Api
from sandbox_operator.kube.claims import CLAIMS, deletion_began
from sandbox_operator.kube.conditions import find_condition, set_condition, set_finished
from sandbox_operator.kube.events import EventSink
from sandbox_operator.resources.approval import (
    ApprovalPolicy,
    ApprovalState,
    approval_decision,
    approvals_status,
    decision_message,
    legacy_allowed,
    new_decisions,
    review_message,
    review_status,
    waiting_message,
)
from sandbox_operator.resources.journal import JournalWriteError, PlanCommitStatusJournal, rfc3339
from sandbox_operator.resources.plan_sources import source_root
from sandbox_operator.resources.resume import resume_attempt
from sandbox_operator.resources.sandbox import is_usable, mirror_to_object
from sandbox_operator.resources.target_identity import BoundHandle, target_identity
from sandbox_operator.resources.targets import target_from_body
from sandbox_operator.settings import Settings

logger = logging.getLogger("sandbox_operator.plancommit")

MAX_COMPENSATION_RETRY_DELAY_SECONDS = 300.0


class DeletionGuardedHandle:
    """A saga handle that re-checks its Sandbox object right before committing (case 17).

    ``check`` raises :class:`SandboxError` when the Sandbox's deletion began; the saga then
    records the step as failed and compensates what landed. Everything else is the wrapped
    handle's (``wrapped``).
    """

    def __init__(
        self, wrapped: Any, check: Callable[[], None], source_root: str | None = None
    ) -> None:
        """``source_root``: the original's identity across workspace Pods
        (:func:`~sandbox_operator.resources.plan_sources.source_root`), for the two-phase overlap
        check."""
        self.wrapped = wrapped
        self._check = check
        self.source_root = source_root

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def commit(self, message: str | None = None) -> Any:
        """Refuse a Sandbox being deleted; else the wrapped commit."""
        self._check()
        return self.wrapped.commit(message)

    def prepare(self, txid: str, message: str | None = None) -> Any:
        """Refuse a Sandbox being deleted (nothing is staged); else the wrapped prepare.

        ``apply_prepared`` is not guarded: after the decision the plan only rolls forward.
        """
        self._check()
        return self.wrapped.prepare(txid, message)


class FallbackGuardJournal:
    """The PlanCommit journal seen by the two-phase coordinator.

    When a participant refuses to prepare with ``TwoPhaseUnavailableError`` the coordinator
    aborts every step, ends its journal ``failed`` and raises; ``commit_plan`` (given a
    coordinator on this journal) then runs the saga. That terminal save is written as phase
    ``aborting`` instead, so the PlanCommit never shows ``Failed`` / ``Finished=True`` for an
    instant before its saga (a crash right there is recovered as an interrupted two-phase
    attempt: aborted again, nothing touched). It stays the operator's: the status is a journal
    users watch; the manager's journal file is read by nobody in between.
    """

    def __init__(self, journal: PlanCommitStatusJournal) -> None:
        self.journal = journal

    def load(self) -> JournalState | None:
        """The wrapped journal's state."""
        return self.journal.load()

    def save(self, state: JournalState) -> None:
        """Save through, holding back the terminal save of an unavailable two-phase attempt."""
        unavailable = any(
            (step.error or "").startswith(TwoPhaseUnavailableError.__name__) for step in state.steps
        )
        if state.phase.is_terminal and unavailable:
            state = state.model_copy(update={"phase": JournalPhase.ABORTING, "finished_at": None})
        self.journal.save(state)


def _created_key(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body["metadata"]
    return (str(metadata.get("creationTimestamp") or ""), str(metadata.get("name")))


def spec_action(body: Mapping[str, Any]) -> PlanCommitAction:
    """``spec.action`` of a PlanCommit body (default Commit)."""
    return PlanCommitAction((body.get("spec") or {}).get("action") or "Commit")


def blocking_plancommit(me: Mapping[str, Any], others: list[dict[str, Any]]) -> str | None:
    """Name of an older, not yet terminal PlanCommit of the same plan, or None.

    Older means created earlier (name breaks ties), so of two racing PlanCommits exactly one
    proceeds.
    """
    plan_id = (me.get("spec") or {}).get("planId")
    my_key = _created_key(me)
    for other in sorted(others, key=_created_key):
        if other["metadata"].get("uid") == me["metadata"].get("uid"):
            continue
        if (other.get("spec") or {}).get("planId") != plan_id:
            continue
        phase = (other.get("status") or {}).get("phase")
        if phase and PlanCommitPhase(phase).is_terminal:
            continue
        if _created_key(other) < my_key:
            return str(other["metadata"]["name"])
    return None


def older_plancommits(me: Mapping[str, Any], others: list[dict[str, Any]]) -> int:
    """How many PlanCommits of the same plan were created before ``me``.

    ``1 +`` this is the attempt number the two-phase transaction id derives from, so successive
    PlanCommits of one plan never prepare under the same txid.
    """
    plan_id = (me.get("spec") or {}).get("planId")
    my_key = _created_key(me)
    return sum(
        1
        for other in others
        if other["metadata"].get("uid") != me["metadata"].get("uid")
        and (other.get("spec") or {}).get("planId") == plan_id
        and _created_key(other) < my_key
    )


def two_phase_outcome(state: JournalState) -> str:
    """Label of :data:`metrics.TWO_PHASE_OUTCOMES` for a terminal two-phase journal."""
    if state.phase is JournalPhase.COMMITTED:
        return "committed"
    if state.reason is JournalReason.CHANGED_SINCE_APPROVAL:
        return "changed_since_approval"
    if state.reason is JournalReason.INTERRUPTED:
        return "interrupted"
    return "failed"


def _parse_rfc3339(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


class PlanCommitLogic:
    """The PlanCommit handlers' logic; one instance per operator process."""

    def __init__(self, settings: Settings, executor: Executor, api: Api, events: EventSink) -> None:
        self.settings = settings
        self.executor = executor
        self.api = api
        self.events = events
        self._compensation_retries: dict[str, int] = {}  # PlanCommit uid -> retries so far
        self.claims = CLAIMS
        # The create, approval and approval-timer handlers of one PlanCommit may run at once
        # (kopf runs timers beside change handlers): one reconcile per PlanCommit at a time.
        self._reconcile_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()

    # -- plan sandboxes -----------------------------------------------------------------------

    def plan_targets(
        self, namespace: str, plan_id: str, *, deleting: bool = False
    ) -> list[tuple[SandboxTarget, Any]]:
        """``(target, state)`` of every live Sandbox of ``plan_id``, oldest first.

        ``deleting`` also returns Sandboxes whose deletion began (recovery compensates them
        before their finalizer runs; nothing new is committed in recovery).
        """
        found = []
        items = [
            item
            for item in self.api.list(SANDBOX_PLURAL, namespace)
            if (item.get("spec") or {}).get("planId") == plan_id
            and (deleting or not item["metadata"].get("deletionTimestamp"))
        ]
        for item in sorted(items, key=_created_key):
            try:
                target = target_from_body(item, self.settings, self.api)
            except PermanentError as exc:
                logger.warning("sandbox %s skipped: %s", item["metadata"]["name"], exc)
                continue
            found.append((target, self._describe_resuming(item, target)))
        return found

    def _describe_resuming(self, item: Mapping[str, Any], target: SandboxTarget) -> Any:
        """The sandbox's state; a suspended Sandbox is resumed first and the
        PlanCommit waits (TemporaryError) until its workspace serves again."""
        name = item["metadata"]["name"]
        if (item.get("spec") or {}).get("suspend"):
            self.api.custom.patch_namespaced_custom_object(
                GROUP, VERSION, target.namespace, SANDBOX_PLURAL, name, {"spec": {"suspend": False}}
            )
            self.events(item, "Normal", "Resumed", "resumed for a PlanCommit of its plan")
            raise TemporaryError(
                f"resuming suspended sandbox {name}", delay=self.settings.retry_delay_seconds
            )
        try:
            return self.executor.describe(target)
        except WorkspaceNotReady as exc:
            raise TemporaryError(
                f"waiting for the workspace of sandbox {name}: {exc}",
                delay=self.settings.retry_delay_seconds,
            ) from exc

    # -- reconcile ----------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> None:
        """Run, resume or ignore (terminal) the PlanCommit ``namespace/name``.

        Called by the create handler, on a change of ``spec.approvedDigest`` and by the timer of
        PlanCommits awaiting approval; one call per PlanCommit runs at a time. Awaiting an
        approval returns normally (the next call decides again).

        Raises:
            TemporaryError: blocked by another PlanCommit, or the journal could not be
                written (the retry resumes from the journal).
        """
        with self._locks_guard:
            lock = self._reconcile_locks[f"{namespace}/{name}"]
        with lock:
            self._reconcile(namespace, name)

    def _reconcile(self, namespace: str, name: str) -> None:
        body = self.api.get(PLANCOMMIT_PLURAL, namespace, name)
        status = dict(body.get("status") or {})
        spec = PlanCommitSpec.model_validate(dict(body.get("spec") or {}))
        if status.get("phase") and PlanCommitPhase(status["phase"]).is_terminal:
            # case 22: never re-processed; only a Delete cleanup cut short by a crash finishes.
            self._cleanup_after_success(body, spec, PlanCommitPhase(status["phase"]))
            return
        if deletion_began(body) and not status.get("sandboxes"):
            logger.info("PlanCommit %s/%s deleted before it started: nothing done", namespace, name)
            return
        others = self.api.list(PLANCOMMIT_PLURAL, namespace)
        blocker = blocking_plancommit(body, others)
        if blocker is not None:
            self._block(body, blocker)
        started = time.monotonic()
        recovering = bool(status.get("sandboxes"))
        targets = self.plan_targets(namespace, spec.plan_id, deleting=recovering)
        attempt = 1 + older_plancommits(body, others)
        with self._claimed(targets, f"PlanCommit {namespace}/{name}") as targets:
            self._run(body, spec, status, targets, started, attempt)

    @contextmanager
    def _claimed(
        self, targets: list[tuple[SandboxTarget, Any]], holder: str
    ) -> Iterator[list[tuple[SandboxTarget, Any]]]:
        """Claim every target for the saga; those being finalized are left out (case 17)."""
        held = [(t, s) for t, s in targets if self.claims.acquire(t.uid, holder)]
        try:
            yield held
        finally:
            for target, _ in held:
                self.claims.release(target.uid, holder)

    def _run(
        self,
        body: Mapping[str, Any],
        spec: PlanCommitSpec,
        status: dict[str, Any],
        targets: list[tuple[SandboxTarget, Any]],
        started: float,
        attempt: int = 1,
    ) -> None:
        generation = body["metadata"].get("generation")
        by_id = {t.sandbox_id: t for t, _ in targets}
        names = {t.sandbox_id: t.name for t, _ in targets}
        for raw in status.get("sandboxes") or []:
            names.setdefault(str(raw.get("sandboxId")), str(raw.get("name") or ""))
        journal = PlanCommitStatusJournal(self.api, body, names, spec.action)
        if find_condition(status.get("conditions"), "Blocked"):
            journal.status["conditions"] = set_condition(
                status.get("conditions"),
                "Blocked",
                "False",
                "Unblocked",
                "no other PlanCommit of this plan is running",
                generation,
            )
        try:
            with (
                tracing.span(
                    f"plancommit.{spec.action.value.lower()}",
                    namespace=str(body["metadata"].get("namespace") or ""),
                    name=str(body["metadata"].get("name") or ""),
                    plan=spec.plan_id,
                ),
                metrics.reconcile_timer("PlanCommit", spec.action.value.lower()),
            ):
                if spec.action is PlanCommitAction.COMMIT:
                    state = self._commit(spec, journal, targets, by_id, body, attempt)
                else:
                    state = self._rollback(spec, journal, targets, by_id, body)
        except JournalWriteError as exc:
            raise TemporaryError(str(exc), delay=self.settings.retry_delay_seconds) from exc
        if state is not None and state.phase.is_terminal:
            metrics.PLAN_COMMIT_SECONDS.labels(spec.action.value).observe(
                time.monotonic() - started
            )
            metrics.COMMITS.labels(spec.action.value, state.phase.value).inc()
            lifecycle_metrics.observe_plan_phases(spec.action.value, body, journal.status)
            if spec.action is PlanCommitAction.COMMIT:
                metrics.COMPENSATIONS.inc(len(state.rolled_back_ids))
                metrics.FAILED_COMPENSATIONS.inc(len(state.failed_rollback_ids))
            if state.mode == "two_phase":
                metrics.TWO_PHASE_OUTCOMES.labels(two_phase_outcome(state)).inc()
            self._compensation_retries.pop(str(body["metadata"].get("uid")), None)
            self._announce(body, journal, state)
            self._cleanup_after_success(body, spec, PlanCommitPhase(journal.status["phase"]))
            self._discard_unselected(body, spec, journal)
        elif state is not None and state.failed_rollback_ids:
            self._retry_compensation(body, state)
        elif state is not None and state.mode == "two_phase" and state.steps:
            # An abort or an apply after the decision failed: recover again later.
            self._retry_compensation(body, state)
        elif state is not None and state.reason is JournalReason.OUTCOME_UNKNOWN:
            # A commit's reply was lost and the agent cannot be asked yet: ask again later.
            self._retry_compensation(body, state)

    def _retry_compensation(self, body: Mapping[str, Any], state: JournalState) -> None:
        """Case 21: a compensation failed; retry ``recover`` later, backing off exponentially.

        Raises:
            TemporaryError: always (the retry).
        """
        uid = str(body["metadata"].get("uid"))
        retries = self._compensation_retries.get(uid, 0)
        self._compensation_retries[uid] = retries + 1
        delay = min(
            self.settings.retry_delay_seconds * 2**retries, MAX_COMPENSATION_RETRY_DELAY_SECONDS
        )
        if state.reason is JournalReason.OUTCOME_UNKNOWN and not state.failed_rollback_ids:
            message = (
                f"{state.error or 'the outcome of a commit is unknown'}; asking again in "
                f"{delay:.0f}s"
            )
            self.events(body, "Warning", "CommitOutcomeUnknown", message)
            raise TemporaryError(message, delay=delay)
        if state.failed_rollback_ids:
            message = (
                f"rollback failed for sandboxes {', '.join(state.failed_rollback_ids)} of plan "
                f"{state.plan_id}; retrying in {delay:.0f}s"
            )
            metrics.FAILED_COMPENSATIONS.inc(len(state.failed_rollback_ids))
        else:
            message = (
                f"two-phase commit of plan {state.plan_id} is unfinished in phase "
                f"{state.phase.value}: {state.error or 'a participant failed'}; retrying in "
                f"{delay:.0f}s"
            )
        self.events(body, "Warning", "CompensationFailed", message)
        raise TemporaryError(message, delay=delay)

    def _block(
        self,
        body: Mapping[str, Any],
        blocker: str,
        reason: str = "PlanCommitInProgress",
        message: str | None = None,
    ) -> None:
        status = dict(body.get("status") or {})
        generation = body["metadata"].get("generation")
        message = message or f"waiting for PlanCommit {blocker} of the same plan to finish"
        blocked = find_condition(status.get("conditions"), "Blocked") or {}
        if blocked.get("status") != "True" or blocked.get("reason") != reason:
            conditions = set_condition(
                status.get("conditions"),
                "Blocked",
                "True",
                reason,
                message,
                generation,
            )
            self.api.patch_status(
                PLANCOMMIT_PLURAL,
                body["metadata"]["namespace"],
                body["metadata"]["name"],
                {"phase": PlanCommitPhase.PENDING.value, "conditions": conditions},
            )
            self.events(body, "Normal", "Blocked", message)
        raise TemporaryError(message, delay=self.settings.retry_delay_seconds)

    def _on_change(self, by_id: Mapping[str, SandboxTarget], plan_commit: str) -> Any:
        def changed(handle: Any) -> None:
            target = by_id.get(handle.sandbox_id)
            if target is None:
                return
            while isinstance(handle, DeletionGuardedHandle | BoundHandle):
                handle = handle.wrapped  # the executor's own handle under our wrappers
            state = self.executor.persist(target, handle)
            mirror_to_object(
                self.api, target.namespace, target.name, state, self.executor.kind, plan_commit
            )

        return changed

    def _resolver(self, by_id: Mapping[str, SandboxTarget], guarded: bool = False) -> Any:
        def resolve(step: JournalStep) -> Any:
            target = by_id.get(step.sandbox_id)
            if target is None:
                return None
            try:
                handle = self.executor.open(target)
            except SandboxError:
                return None
            # A resumed attempt commits too: a Sandbox being deleted is refused (case 17).
            return DeletionGuardedHandle(handle, self._guard(target)) if guarded else handle

        return resolve

    def _commit(
        self,
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        targets: list[tuple[SandboxTarget, SandboxState | None]],
        by_id: Mapping[str, SandboxTarget],
        body: Mapping[str, Any],
        attempt: int = 1,
    ) -> JournalState | None:
        on_change = self._on_change(by_id, journal.name)
        message = spec.message or f"Apply plan {spec.plan_id} (PlanCommit {journal.name})"
        recorded = journal.load()
        if recorded is not None:
            # An attempt a crash interrupted is finished (committed), not failed.
            resolve = self._resolver(by_id, guarded=True)
            resumed = resume_attempt(journal, resolve, on_change, message)
            if resumed is not None:
                return resumed
            attempt = max(attempt, recorded.attempt + 1)  # aborted untouched: a new attempt
        policy = self._approval_policy(journal.namespace)
        if policy.required and not spec.approval_required:
            return self._fail_up_front(
                journal,
                spec,
                "ApprovalRequired",
                "named approvals are required here (chart value approvals.required or the "
                f"namespace label {APPROVAL_REQUIRED_LABEL}=true); create the PlanCommit with "
                "spec.approval Required; nothing was committed",
            )
        waiting = [t.name for t, s in targets if s is None or s.status is SandboxStatus.PENDING]
        if waiting:
            text = f"waiting for Sandboxes {', '.join(waiting)} of the plan to be provisioned"
            self._block(body, "", "SandboxesNotReady", text)
        try:
            refuse_partial_plan(
                spec.plan_id, [(t.sandbox_id, t.name, s.status) for t, s in targets if s]
            )
        except PlanRerunRequiredError as exc:
            return self._fail_up_front(journal, spec, "PlanRerunRequired", str(exc))
        usable = [t for t, s in targets if s is not None and is_usable(s.status)]
        if spec.sandboxes is not None:
            unknown = sorted(set(spec.sandboxes) - {t.name for t, _ in targets})
            if unknown:
                return self._fail_up_front(
                    journal,
                    spec,
                    "UnknownSandboxes",
                    f"spec.sandboxes names {', '.join(unknown)}, not Sandboxes of plan "
                    f"{spec.plan_id} in this namespace; nothing was committed",
                )
            usable = [t for t in usable if t.name in set(spec.sandboxes)]
        if not usable:
            return self._nothing_to_do(journal, spec, targets)
        checks: list[CheckResult] = []
        if spec.checks:
            validated = self._validate(body, spec, journal, targets)
            if isinstance(validated, JournalState):
                return validated
            checks = validated
        handles = [
            DeletionGuardedHandle(
                BoundHandle(self.executor.open(t), self._identity(t)),
                self._guard(t),
                source_root(t),
            )
            for t in usable
        ]
        approved: str | None = None
        if spec.mode is PlanCommitMode.TWO_PHASE or spec.approval_required:
            digest = self._review(body, spec, journal, handles, checks)
            if spec.approval_required:
                if digest is None:
                    return self._fail_up_front(
                        journal,
                        spec,
                        "ReviewFailed",
                        "the plan could not be reviewed, so it cannot be approved: "
                        + str(
                            (
                                find_condition(journal.status.get("conditions"), "Reviewed") or {}
                            ).get("message")
                            or "unknown error"
                        ),
                    )
                approved = self._approval(body, spec, journal, digest, policy)
                if approved is None:
                    return None  # awaiting approval, or Expired (written and announced)
        if spec.mode is PlanCommitMode.TWO_PHASE:
            return self._two_phase(
                spec, journal, handles, body, attempt, message, approved, on_change, checks
            )
        return self._saga(
            spec, journal, handles, body, attempt, message, approved, on_change, checks
        )

    # -- pre-commit validation (docs/forks.md) ---------------------------------------------------

    def _validate(
        self,
        body: Mapping[str, Any],
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        targets: list[tuple[SandboxTarget, SandboxState | None]],
    ) -> list[CheckResult] | JournalState:
        """``spec.checks`` run once through the executor's door and recorded in
        ``status.validation`` (with an Event per check) before anything is reviewed or
        prepared; a later pass reads them back. A failed check ends the PlanCommit ``Failed``
        (condition reason ``ValidationFailed``) with every original untouched."""
        recorded = journal.status.get("validation")
        if recorded is None:
            by_name = {t.name: t for t, _ in targets}
            missing = sorted({check.sandbox for check in spec.checks} - set(by_name))
            if missing:
                return self._fail_up_front(
                    journal,
                    spec,
                    "ValidationFailed",
                    f"spec.checks name {', '.join(missing)}, not Sandboxes of plan "
                    f"{spec.plan_id}; nothing was committed",
                )
            by_id = {t.sandbox_id: t for t, _ in targets}
            try:
                wanted = [
                    Check(
                        check.name,
                        by_name[check.sandbox].sandbox_id,
                        tuple(check.command),
                        float(check.timeout_seconds),
                    )
                    for check in spec.checks
                ]
                results = run_checks(
                    wanted, lambda check: self.executor.run_check(by_id[check.sandbox_id], check)
                )
            except ValueError as exc:
                return self._fail_up_front(journal, spec, "ValidationFailed", str(exc))
            names = {t.sandbox_id: t.name for t, _ in targets}
            rows = [{**r.to_dict(), "sandbox": names.get(r.sandbox_id, "")} for r in results]
            journal.write({"validation": rows})
            for row in rows:
                verdict = (
                    "passed"
                    if row["passed"]
                    else ("timed out" if row["timedOut"] else f"exit code {row['exitCode']}")
                )
                tail = "\n".join(str(row["outputTail"]).splitlines()[-5:])
                self.events(
                    body,
                    "Normal" if row["passed"] else "Warning",
                    "CheckPassed" if row["passed"] else "CheckFailed",
                    f"check {row['name']} in Sandbox {row['sandbox']} ({' '.join(row['command'])})"
                    f": {verdict}"
                    + (f"; last lines:\n{tail}" if tail and not row["passed"] else ""),
                )
            recorded = rows
        results = [CheckResult.from_dict(dict(row)) for row in recorded]
        failed = failed_checks(results)
        if failed:
            named = "; ".join(
                f"{r.name} in Sandbox {r.extra.get('sandbox') or r.sandbox_id}: "
                + ("timed out" if r.timed_out else f"exit code {r.exit_code}")
                for r in failed
            )
            return self._fail_up_front(
                journal,
                spec,
                "ValidationFailed",
                f"validation failed ({named}); nothing was prepared or changed "
                "(status.validation has each command, exit code and its last lines)",
            )
        return results

    # -- review and approval --------------------------------------------------------------------

    def _review(
        self,
        body: Mapping[str, Any],
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        handles: list[Any],
        checks: list[CheckResult] | None = None,
    ) -> str | None:
        """The plan digest of ``status.review``, computing and recording it first when absent
        (condition ``Reviewed``, Event ``Reviewed``). None when the review failed (condition
        ``Reviewed=False`` reason ``ReviewFailed`` and a Warning Event)."""
        existing = journal.status.get("review") or {}
        if existing.get("digest"):
            return str(existing["digest"])
        try:
            review = review_plan(spec.plan_id, handles).with_checks(checks or [])
        except Exception as exc:  # a strategy without review, an unreadable sandbox
            metrics.PLAN_REVIEWS.labels("error").inc()
            text = f"review of plan {spec.plan_id} failed: {type(exc).__name__}: {exc}"
            conditions = set_condition(
                journal.status.get("conditions"),
                "Reviewed",
                "False",
                "ReviewFailed",
                text,
                journal.generation,
            )
            journal.write({"conditions": conditions})
            self.events(body, "Warning", "ReviewFailed", text)
            return None
        metrics.PLAN_REVIEWS.labels("ok").inc()
        recorded = review_status(review, journal.names, rfc3339(clock.now()) or "")
        text = review_message(recorded)
        conditions = set_condition(
            journal.status.get("conditions"),
            "Reviewed",
            "True",
            "Reviewed",
            text,
            journal.generation,
        )
        journal.write({"review": recorded, "conditions": conditions})
        self.events(body, "Normal", "Reviewed", text)
        return str(recorded["digest"])

    def _approval_policy(self, namespace: str) -> ApprovalPolicy:
        """The administrator's approval rules for ``namespace``: the chart's values, and named
        approvals required there when the namespace has the label
        ``sandbox.cleveragents.io/approval-required=true``."""
        settings = self.settings
        required = settings.approval_required or self._namespace_requires_approval(namespace)
        return ApprovalPolicy(
            required=required,
            min_approvals=settings.min_approvals,
            forbidden_users=settings.forbidden_approvers,
            forbidden_groups=settings.forbidden_approver_groups,
            approver_groups=settings.approver_groups,
        )

    def _namespace_requires_approval(self, namespace: str) -> bool:
        try:
            found = self.api.namespace(namespace) or {}
        except Exception as exc:  # no right to read it: admission still enforces the label
            logger.warning("namespace %s not readable for its approval label: %s", namespace, exc)
            return False
        labels = (found.get("metadata") or {}).get("labels") or {}
        return str(labels.get(APPROVAL_REQUIRED_LABEL, "")).lower() == "true"

    def _approval(
        self,
        body: Mapping[str, Any],
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        digest: str,
        policy: ApprovalPolicy,
    ) -> str | None:
        """The approved digest when the recorded approvals (or the older
        ``spec.approvedDigest``) approve the review; else record the wait (phase
        ``AwaitingApproval``, ``Approved=False`` reason ``AwaitingApproval`` or
        ``DigestMismatch``), the rejection (phase ``Failed``) or the expiry (phase ``Expired``)
        and return None. ``status.approvals`` and ``status.approvedBy`` show every recorded
        decision and who counts; each newly seen decision gets an ``ApprovalRecorded`` Event."""
        review = journal.status.get("review") or {}
        now = clock.now()  # the API server's, as reviewedAt: replicas' clocks may differ
        reviewed_at = _parse_rfc3339(review.get("reviewedAt")) or now
        creator = str(
            ((body.get("metadata") or {}).get("annotations") or {}).get(CREATED_BY_ANNOTATION, "")
        )
        decision = approval_decision(spec, digest, reviewed_at, now, policy, creator)
        previous = journal.status.get("approvals") or []
        rows = approvals_status(decision.judged, previous, rfc3339(now) or "")
        shown: dict[str, Any] = {}
        if rows != previous:
            shown["approvals"] = rows
        approved_by = ", ".join(decision.approvers)
        if approved_by != (journal.status.get("approvedBy") or ""):
            shown["approvedBy"] = approved_by
        if shown:
            journal.write(shown)
        for row in new_decisions(rows, previous):
            self.events(body, "Normal", "ApprovalRecorded", decision_message(row, decision))
        conditions = journal.status.get("conditions")
        current = find_condition(conditions, "Approved") or {}
        generation = journal.generation
        if decision.state is ApprovalState.MATCHED:
            if current.get("status") != "True":
                if decision.legacy:
                    reason = "DigestMatched"
                    text = f"spec.approvedDigest matches the reviewed plan digest {digest}"
                else:
                    reason = "Approved"
                    text = (
                        f"plan digest {digest} approved by {approved_by} "
                        f"({len(decision.approvers)} of {decision.needed} needed)"
                    )
                journal.write(
                    {
                        "conditions": set_condition(
                            conditions, "Approved", "True", reason, text, generation
                        )
                    }
                )
                metrics.PLAN_APPROVALS.labels("matched").inc()
                self.events(body, "Normal", "Approved", text)
            return digest
        if decision.state is ApprovalState.EXPIRED:
            self._expire(body, spec, journal, digest)
            return None
        if decision.state is ApprovalState.REJECTED:
            self._reject(body, spec, journal, digest, decision.rejected_by)
            return None
        if decision.state is ApprovalState.MISMATCH:
            reason = "DigestMismatch"
            text = (
                f"spec.approvedDigest {spec.approved_digest} is not the reviewed plan digest "
                f"{digest}; nothing is committed until it names the reviewed digest"
            )
        else:
            reason = "AwaitingApproval"
            waiting = waiting_message(decision, digest, legacy_allowed(spec, policy))
            text = waiting + (
                f" (expires in {decision.remaining_seconds:.0f}s)"
                if decision.remaining_seconds is not None
                else ""
            )
        new_reason = current.get("reason") != reason
        changed = new_reason or (
            reason == "DigestMismatch"
            and str(spec.approved_digest) not in str(current.get("message"))
        )
        if reason == "AwaitingApproval" and not str(current.get("message")).startswith(waiting):
            changed = True  # another approval was recorded: the message names who approved
        if changed or journal.status.get("phase") != PlanCommitPhase.AWAITING_APPROVAL.value:
            conditions = set_condition(conditions, "Approved", "False", reason, text, generation)
            conditions = set_finished(
                conditions, False, "", "awaiting the approval of the reviewed plan", generation
            )
            journal.write(
                {
                    "phase": PlanCommitPhase.AWAITING_APPROVAL.value,
                    "conditions": conditions,
                    "observedGeneration": generation,
                }
            )
            if reason == "DigestMismatch":
                metrics.PLAN_APPROVALS.labels("mismatched").inc()
                self.events(body, "Warning", "DigestMismatch", text)
            elif new_reason:
                self.events(body, "Normal", "AwaitingApproval", text)
        return None

    def _reject(
        self,
        body: Mapping[str, Any],
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        digest: str,
        rejected_by: list[str],
    ) -> None:
        """End the PlanCommit ``Failed`` with reason ``Rejected``: an eligible person rejected
        the reviewed digest; nothing was committed."""
        comments = [
            f"{entry.user}: {entry.comment}"
            for entry in spec.approvals
            if entry.user in rejected_by and entry.digest == digest and entry.comment
        ]
        text = f"plan digest {digest} rejected by {', '.join(rejected_by)}; nothing was committed"
        if comments:
            text += " (" + "; ".join(comments) + ")"
        generation = journal.generation
        conditions = set_condition(
            journal.status.get("conditions"), "Approved", "False", "Rejected", text, generation
        )
        conditions = set_condition(conditions, "Committed", "False", "Rejected", text, generation)
        conditions = set_finished(conditions, True, "Rejected", text, generation)
        journal.write(
            {
                "phase": PlanCommitPhase.FAILED.value,
                "conditions": conditions,
                "completedAt": rfc3339(datetime.now(UTC)),
                "observedGeneration": generation,
            }
        )
        metrics.PLAN_APPROVALS.labels("rejected").inc()
        metrics.COMMITS.labels(spec.action.value, PlanCommitPhase.FAILED.value).inc()
        self.events(body, "Warning", "Rejected", text)

    def _expire(
        self,
        body: Mapping[str, Any],
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        digest: str,
    ) -> None:
        """End the PlanCommit ``Expired``: approvalTimeoutSeconds passed, nothing committed."""
        text = (
            f"no approval of plan digest {digest} within {spec.approval_timeout_seconds}s of "
            "the review; nothing was committed"
        )
        generation = journal.generation
        conditions = set_condition(
            journal.status.get("conditions"), "Approved", "False", "Expired", text, generation
        )
        conditions = set_condition(conditions, "Committed", "False", "Expired", text, generation)
        conditions = set_finished(conditions, True, "Expired", text, generation)
        journal.write(
            {
                "phase": PlanCommitPhase.EXPIRED.value,
                "conditions": conditions,
                "completedAt": rfc3339(datetime.now(UTC)),
                "observedGeneration": generation,
            }
        )
        metrics.PLAN_EXPIRIES.inc()
        metrics.COMMITS.labels(spec.action.value, PlanCommitPhase.EXPIRED.value).inc()
        self.events(body, "Warning", "Expired", text)

    # -- the commit itself --------------------------------------------------------------------

    def _two_phase(
        self,
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        handles: list[Any],
        body: Mapping[str, Any],
        attempt: int,
        message: str,
        approved: str | None,
        on_change: Callable[[Any], None],
        checks: list[CheckResult] | None = None,
    ) -> JournalState | None:
        """Mode ``TwoPhase``: the core's mode ``auto`` (two phases; a plan that cannot use them
        runs the saga instead, condition ``TwoPhase=False`` reason ``FellBackToSaga``)."""
        # The attempt refused for want of two phases is held back from the status (the saga
        # follows); the policy that decides it is commit_plan's.
        coordinator = TwoPhasePlanCommit(FallbackGuardJournal(journal), on_change=on_change)
        return self._commit_plan(
            spec,
            journal,
            handles,
            body,
            "auto",
            attempt,
            message,
            approved,
            on_change,
            coordinator,
            checks,
        )

    def _saga(
        self,
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        handles: list[Any],
        body: Mapping[str, Any],
        attempt: int,
        message: str,
        approved: str | None,
        on_change: Callable[[Any], None],
        checks: list[CheckResult] | None = None,
    ) -> JournalState | None:
        """Mode ``Saga``: the core's mode ``saga`` (seed 002)."""
        return self._commit_plan(
            spec,
            journal,
            handles,
            body,
            "saga",
            attempt,
            message,
            approved,
            on_change,
            None,
            checks,
        )

    def _commit_plan(
        self,
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        handles: list[Any],
        body: Mapping[str, Any],
        mode: str,
        attempt: int,
        message: str,
        approved: str | None,
        on_change: Callable[[Any], None],
        coordinator: TwoPhasePlanCommit | None = None,
        checks: list[CheckResult] | None = None,
    ) -> JournalState | None:
        """Run :func:`~sandbox_core.plan.commit.commit_plan` (mode, fallback, approval check)
        on the plan's handles; the outcome is what it recorded on the PlanCommit's status.

        With an approval the saga reviews the plan again right before it: changes since the
        approval refuse it (``ChangedSinceApproval``, nothing touched); a review that fails
        ends the PlanCommit ``Failed`` with condition reason ``ReviewFailed``.
        """
        try:
            commit_plan(
                spec.plan_id,
                handles,
                journal,
                mode=mode,
                attempt=attempt,
                message=message,
                approved_digest=approved,
                on_change=on_change,
                on_fallback=lambda reason: self._fell_back(body, journal, reason),
                coordinator=coordinator,
                checks=checks or (),
            )
        except PlanReviewError as exc:
            return self._fail_up_front(journal, spec, "ReviewFailed", str(exc))
        except AtomicCommitError as exc:
            # Recorded in the journal (commit_plan never runs a saga after a two-phase attempt
            # that failed: it would commit what that attempt aborted).
            logger.warning("PlanCommit %s: %s", journal.name, exc)
        except CommitOutcomeUnknownError as exc:
            # A lost reply that the agent could not yet be asked about: the attempt stays
            # open with nothing compensated; the handler retries and recovery asks again.
            logger.warning("PlanCommit %s: %s", journal.name, exc)
        self._count_steps(journal)
        return journal.last_state

    def _fell_back(
        self, body: Mapping[str, Any], journal: PlanCommitStatusJournal, reason: str
    ) -> None:
        """Announce the fallback to the saga: metric, condition ``TwoPhase=False`` reason
        ``FellBackToSaga``, Warning Event."""
        metrics.TWO_PHASE_FALLBACKS.inc()
        text = f"the plan cannot be committed in two phases, so it runs as a saga: {reason}"
        conditions = set_condition(
            journal.status.get("conditions"),
            "TwoPhase",
            "False",
            "FellBackToSaga",
            text,
            journal.generation,
        )
        journal.write({"conditions": conditions})
        self.events(body, "Warning", "FellBackToSaga", text)

    def _count_steps(self, journal: PlanCommitStatusJournal) -> None:
        for step in journal.last_state.steps if journal.last_state else []:
            outcome = (
                "ok"
                if step.state
                in (StepState.COMMITTED, StepState.COMPENSATED, StepState.COMPENSATION_FAILED)
                else None
            )
            if step.state is StepState.FAILED:
                outcome = "error"
            if outcome:
                metrics.SANDBOX_COMMITS.labels(step.strategy, outcome).inc()

    def _identity(self, target: SandboxTarget) -> Callable[[], str]:
        """Reads ``target``'s identity now (docs/approvals.md): its claim's uid from the API
        server, its node path's device and inode."""

        def identity() -> str:
            claim_uid = None
            pvc = target.source.persistent_volume_claim
            if pvc is not None:
                try:
                    claim = self.api.core.read_namespaced_persistent_volume_claim(
                        pvc.claim_name, target.namespace
                    )
                    claim_uid = str(getattr(claim.metadata, "uid", "") or "")
                except Exception as exc:
                    if not is_not_found(exc):
                        raise
            node_stat = None
            if target.source.node_path:
                try:
                    node_stat = Path(target.source.node_path).resolve().stat()
                except OSError:
                    node_stat = None
            return target_identity(target, claim_uid, node_stat)

        return identity

    def _guard(self, target: SandboxTarget) -> Callable[[], None]:
        """Raises SandboxError when ``target``'s object is gone, replaced or being deleted."""

        def check() -> None:
            try:
                body: Mapping[str, Any] | None = self.api.get(
                    SANDBOX_PLURAL, target.namespace, target.name
                )
            except Exception as exc:
                if not is_not_found(exc):
                    raise
                body = None
            if deletion_began(body) or (body or {}).get("metadata", {}).get("uid") != target.uid:
                raise SandboxError(
                    f"Sandbox {target.name} is being deleted; its changes were not committed"
                )

        return check

    def _nothing_to_do(
        self,
        journal: PlanCommitStatusJournal,
        spec: PlanCommitSpec,
        targets: list[tuple[SandboxTarget, SandboxState | None]],
    ) -> JournalState:
        seen = (
            ", ".join(f"{t.name}={s.status.value if s else 'not provisioned'}" for t, s in targets)
            or "none"
        )
        return self._fail_up_front(
            journal,
            spec,
            "NoActiveSandboxes",
            f"plan {spec.plan_id} has no Created or Active Sandbox (found: {seen})",
        )

    def _fail_up_front(
        self,
        journal: PlanCommitStatusJournal,
        spec: PlanCommitSpec,
        reason: str,
        message: str,
    ) -> JournalState:
        """End the PlanCommit ``Failed`` before any sandbox was touched (condition ``reason``)."""
        state = JournalState(
            plan_id=spec.plan_id,
            phase=JournalPhase.FAILED,
            reason=JournalReason.COMMIT_FAILED,
            error=message,
            finished_at=utc_now(),
        )
        journal.save(state)
        conditions = set_condition(
            journal.status.get("conditions"),
            "Committed",
            "False",
            reason,
            message,
            journal.generation,
        )
        journal.write({"conditions": conditions})
        return state

    def _rollback(
        self,
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        targets: list[tuple[SandboxTarget, SandboxState | None]],
        by_id: Mapping[str, SandboxTarget],
        body: Mapping[str, Any],
    ) -> JournalState:
        """``action: Rollback``: discard every CREATED/ACTIVE sandbox of the plan (seed 002,
        ``rollback_all``), journaled the same way; re-running skips finished steps."""
        state = journal.load()
        if state is None:
            usable = [t for t, s in targets if s is not None and is_usable(s.status)]
            state = JournalState(
                plan_id=spec.plan_id,
                phase=JournalPhase.COMPENSATING,
                steps=[
                    JournalStep(
                        sandbox_id=t.sandbox_id,
                        resource_id=t.resource_id,
                        strategy=t.strategy,
                        rollbackable=t.strategy in ROLLBACKABLE_STRATEGIES,
                    )
                    for t in usable
                ],
            )
            journal.save(state)
        # The core's one compensation loop (no second copy here).
        run_compensations(
            state,
            [
                (step, by_id.get(step.sandbox_id))
                for step in state.steps
                if step.state not in (StepState.COMPENSATED, StepState.COMPENSATION_FAILED)
            ],
            lambda step, target: self._discard(step, target, by_id, journal.name),
            journal.save,
            on_done=lambda _step, _target, exc: (
                metrics.COMPENSATIONS if exc is None else metrics.FAILED_COMPENSATIONS
            ).inc(),
        )
        state.phase = JournalPhase.FAILED if state.failed_rollback_ids else JournalPhase.ROLLED_BACK
        state.reason = (
            JournalReason.COMPENSATION_FAILED
            if state.failed_rollback_ids
            else JournalReason.COMMITTED
        )
        state.finished_at = utc_now()
        journal.save(state)
        return state

    def _discard(
        self,
        step: JournalStep,
        target: SandboxTarget | None,
        by_id: Mapping[str, SandboxTarget],
        plan_commit: str,
    ) -> None:
        """Roll back one sandbox unless a previous attempt already did (resume-safe)."""
        if target is None:
            raise SandboxError(f"sandbox {step.sandbox_id} no longer exists")
        current = self.executor.describe(target)
        if current is not None and current.status is SandboxStatus.ROLLED_BACK:
            return
        handle: Any = self.executor.open(target)
        if handle.status is SandboxStatus.CREATED:
            handle.activate()
        handle.rollback()
        self._on_change(by_id, plan_commit)(handle)

    def _announce(
        self, body: Mapping[str, Any], journal: PlanCommitStatusJournal, state: JournalState
    ) -> None:
        committed = find_condition(journal.status.get("conditions"), "Committed") or {}
        message = str(committed.get("message") or state.error or state.phase.value)
        if state.phase is JournalPhase.COMMITTED:
            self.events(body, "Normal", "Committed", message)
            return
        rolled = ", ".join(state.rolled_back_ids) or "none"
        failed = ", ".join(state.failed_rollback_ids) or "none"
        # A Commit that did not land is a Warning even when fully compensated (phase Failed).
        rolled_back_on_request = spec_action(body) is PlanCommitAction.ROLLBACK
        kind = (
            "Normal"
            if state.phase is JournalPhase.ROLLED_BACK and rolled_back_on_request
            else "Warning"
        )
        reason = str(committed.get("reason") or "CommitFailed")
        self.events(
            body, kind, reason, f"{message}; rolled back: {rolled}; failed rollbacks: {failed}"
        )

    # -- deletion -----------------------------------------------------------------------------

    def _cleanup_after_success(
        self, body: Mapping[str, Any], spec: PlanCommitSpec, phase: PlanCommitPhase
    ) -> None:
        """``cleanupPolicy: Delete`` once the action succeeded (Committed, or RolledBack for
        ``action: Rollback``): delete the plan's Sandboxes. Idempotent (a crash between the
        terminal journal write and the deletion is finished by the next run)."""
        succeeded = phase is PlanCommitPhase.COMMITTED or (
            phase is PlanCommitPhase.ROLLED_BACK and spec.action is PlanCommitAction.ROLLBACK
        )
        if spec.cleanup_policy == "Delete" and succeeded:
            self._delete_plan_sandboxes(body, spec)

    def _discard_unselected(
        self, body: Mapping[str, Any], spec: PlanCommitSpec, journal: PlanCommitStatusJournal
    ) -> None:
        """After a commit of the Sandboxes ``spec.sandboxes`` names, in the same step: delete
        every other Sandbox of the plan (their finalizers clean up their artefacts), record
        them in ``status.discardedSandboxes`` and post one Event. Nothing after a failure.
        Idempotent."""
        if spec.sandboxes is None or journal.status.get("phase") != PlanCommitPhase.COMMITTED:
            return
        namespace = str(body["metadata"]["namespace"])
        keep = set(spec.sandboxes)
        discarded = set(journal.status.get("discardedSandboxes") or [])
        for item in self.api.list(SANDBOX_PLURAL, namespace):
            name = str(item["metadata"]["name"])
            if (item.get("spec") or {}).get("planId") != spec.plan_id or name in keep:
                continue
            if not deletion_began(item):
                self.api.delete(SANDBOX_PLURAL, namespace, name)
            discarded.add(name)
        if not discarded or sorted(discarded) == journal.status.get("discardedSandboxes"):
            return
        journal.write({"discardedSandboxes": sorted(discarded)})
        self.events(
            body,
            "Normal",
            "Discarded",
            f"committed {', '.join(sorted(keep))}; discarded the other Sandboxes of plan "
            f"{spec.plan_id}: {', '.join(sorted(discarded))}",
        )

    def finalize(self, body: Mapping[str, Any]) -> None:
        """Deletion of a PlanCommit: with ``cleanupPolicy: Delete`` delete the plan's Sandboxes
        that are still there (after a Failed action they were kept for inspection); with
        ``Retain`` do nothing.

        A PlanCommit deleted mid-saga is finalized only after its handler finished the saga
        (kopf runs one object's handlers one at a time), so the journal is never cut short.
        """
        spec = PlanCommitSpec.model_validate(dict(body.get("spec") or {}))
        if spec.cleanup_policy == "Delete":
            self._delete_plan_sandboxes(body, spec)

    def _delete_plan_sandboxes(self, body: Mapping[str, Any], spec: PlanCommitSpec) -> None:
        """Delete every Sandbox of the plan not already being deleted; one Event if any was
        (their own finalizers clean up the artefacts)."""
        namespace = str(body["metadata"]["namespace"])
        deleted = []
        for item in self.api.list(SANDBOX_PLURAL, namespace):
            same_plan = (item.get("spec") or {}).get("planId") == spec.plan_id
            if not same_plan or deletion_began(item):
                continue
            if self.api.delete(SANDBOX_PLURAL, namespace, item["metadata"]["name"]):
                deleted.append(item["metadata"]["name"])
        if not deleted:
            return
        self.events(
            body,
            "Normal",
            "PlanCleanedUp",
            f"deleted Sandboxes of plan {spec.plan_id}: {', '.join(deleted) or 'none'}",
        )
