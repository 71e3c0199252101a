"""PlanCommit logic: the plan's atomic commit (or rollback) as a crash-safe saga.

The algorithm is the core's :class:`~sandbox_core.saga.PlanCommitSaga` (seed 002, "Atomic Commit":
rollbackable first, LIFO compensation; cases 20 and 22 recovery policy); this module only feeds it
the plan's Sandboxes and a journal kept on the PlanCommit's status
(:class:`~sandbox_operator.journal.PlanCommitStatusJournal`). No second copy of the algorithm.

Policies (docs/operator-design.md):

- A terminal PlanCommit is never processed again: no writes, no Events (case 22).
- A journal found mid-way (operator killed) is finished by ``PlanCommitSaga.recover``: all
  committed, or all compensated; nothing is committed twice (case 20).
- A second PlanCommit of a plan waits while an older one is not terminal: condition
  ``Blocked=True`` reason ``PlanCommitInProgress`` and a TemporaryError retry.
- A plan with no CREATED/ACTIVE Sandbox fails with reason ``NoActiveSandboxes``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from sandbox_core import AtomicCommitError, SandboxError, SandboxStatus
from sandbox_core.journal import JournalPhase, JournalReason, JournalState, JournalStep, StepState
from sandbox_core.protocol import utc_now
from sandbox_core.saga import PlanCommitSaga
from sandbox_operator import metrics
from sandbox_operator.conditions import find_condition, set_condition
from sandbox_operator.events import EventSink
from sandbox_operator.executors.base import (
    Executor,
    SandboxState,
    SandboxTarget,
    WorkspaceNotReady,
)
from sandbox_operator.journal import JournalWriteError, PlanCommitStatusJournal
from sandbox_operator.k8s import Api
from sandbox_operator.models import (
    GROUP,
    PLANCOMMIT_PLURAL,
    SANDBOX_PLURAL,
    VERSION,
    PlanCommitAction,
    PlanCommitPhase,
    PlanCommitSpec,
)
from sandbox_operator.sandbox_handlers import is_usable, mirror_to_object, target_from_body
from sandbox_operator.settings import Settings

logger = logging.getLogger("sandbox_operator.plancommit")


def _created_key(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body["metadata"]
    return (str(metadata.get("creationTimestamp") or ""), str(metadata.get("name")))


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


class PlanCommitLogic:
    """The PlanCommit handlers' logic; one instance per operator process."""

    def __init__(self, settings: Settings, executor: Executor, api: Api, events: EventSink) -> None:
        self.settings = settings
        self.executor = executor
        self.api = api
        self.events = events

    # -- plan sandboxes -----------------------------------------------------------------------

    def plan_targets(self, namespace: str, plan_id: str) -> list[tuple[SandboxTarget, Any]]:
        """``(target, state)`` of every live Sandbox of ``plan_id``, oldest first."""
        found = []
        items = [
            item
            for item in self.api.list(SANDBOX_PLURAL, namespace)
            if (item.get("spec") or {}).get("planId") == plan_id
            and not item["metadata"].get("deletionTimestamp")
        ]
        for item in sorted(items, key=_created_key):
            try:
                target = target_from_body(item, self.settings, self.api)
            except kopf.PermanentError as exc:
                logger.warning("sandbox %s skipped: %s", item["metadata"]["name"], exc)
                continue
            found.append((target, self._describe_resuming(item, target)))
        return found

    def _describe_resuming(self, item: Mapping[str, Any], target: SandboxTarget) -> Any:
        """The sandbox's state; a suspended Sandbox is resumed first (issue 8) and the
        PlanCommit waits (TemporaryError) until its workspace serves again."""
        name = item["metadata"]["name"]
        if (item.get("spec") or {}).get("suspend"):
            self.api.custom.patch_namespaced_custom_object(
                GROUP, VERSION, target.namespace, SANDBOX_PLURAL, name, {"spec": {"suspend": False}}
            )
            self.events(item, "Normal", "Resumed", "resumed for a PlanCommit of its plan")
            raise kopf.TemporaryError(
                f"resuming suspended sandbox {name}", delay=self.settings.retry_delay_seconds
            )
        try:
            return self.executor.describe(target)
        except WorkspaceNotReady as exc:
            raise kopf.TemporaryError(
                f"waiting for the workspace of sandbox {name}: {exc}",
                delay=self.settings.retry_delay_seconds,
            ) from exc

    # -- reconcile ----------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> None:
        """Run, resume or ignore (terminal) the PlanCommit ``namespace/name``.

        Raises:
            kopf.TemporaryError: blocked by another PlanCommit, or the journal could not be
                written (the retry resumes from the journal).
        """
        body = self.api.get(PLANCOMMIT_PLURAL, namespace, name)
        status = dict(body.get("status") or {})
        if status.get("phase") and PlanCommitPhase(status["phase"]).is_terminal:
            return  # case 22: never re-processed
        spec = PlanCommitSpec.model_validate(dict(body.get("spec") or {}))
        generation = body["metadata"].get("generation")
        blocker = blocking_plancommit(body, self.api.list(PLANCOMMIT_PLURAL, namespace))
        if blocker is not None:
            self._block(body, blocker)
        started = time.monotonic()
        targets = self.plan_targets(namespace, spec.plan_id)
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
            with metrics.reconcile_timer("PlanCommit", spec.action.value.lower()):
                if spec.action is PlanCommitAction.COMMIT:
                    state = self._commit(spec, journal, targets, by_id, body)
                else:
                    state = self._rollback(spec, journal, targets, by_id, body)
        except JournalWriteError as exc:
            raise kopf.TemporaryError(str(exc), delay=self.settings.retry_delay_seconds) from exc
        if state is not None and state.phase.is_terminal:
            metrics.PLAN_COMMIT_SECONDS.labels(spec.action.value).observe(
                time.monotonic() - started
            )
            metrics.COMMITS.labels(spec.action.value, state.phase.value).inc()
            if spec.action is PlanCommitAction.COMMIT:
                metrics.COMPENSATIONS.inc(len(state.rolled_back_ids))
                metrics.FAILED_COMPENSATIONS.inc(len(state.failed_rollback_ids))
            self._announce(body, journal, state)

    def _block(self, body: Mapping[str, Any], blocker: str) -> None:
        status = dict(body.get("status") or {})
        generation = body["metadata"].get("generation")
        message = f"waiting for PlanCommit {blocker} of the same plan to finish"
        if (find_condition(status.get("conditions"), "Blocked") or {}).get("status") != "True":
            conditions = set_condition(
                status.get("conditions"),
                "Blocked",
                "True",
                "PlanCommitInProgress",
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
        raise kopf.TemporaryError(message, delay=self.settings.retry_delay_seconds)

    def _on_change(self, by_id: Mapping[str, SandboxTarget], plan_commit: str) -> Any:
        def changed(handle: Any) -> None:
            target = by_id.get(handle.sandbox_id)
            if target is None:
                return
            state = self.executor.persist(target, handle)
            mirror_to_object(
                self.api, target.namespace, target.name, state, self.executor.kind, plan_commit
            )

        return changed

    def _resolver(self, by_id: Mapping[str, SandboxTarget]) -> Any:
        def resolve(step: JournalStep) -> Any:
            target = by_id.get(step.sandbox_id)
            if target is None:
                return None
            try:
                return self.executor.open(target)
            except SandboxError:
                return None

        return resolve

    def _commit(
        self,
        spec: PlanCommitSpec,
        journal: PlanCommitStatusJournal,
        targets: list[tuple[SandboxTarget, SandboxState | None]],
        by_id: Mapping[str, SandboxTarget],
        body: Mapping[str, Any],
    ) -> JournalState | None:
        saga = PlanCommitSaga(journal, on_change=self._on_change(by_id, journal.name))
        if journal.load() is not None:
            return saga.recover(self._resolver(by_id))
        usable = [t for t, s in targets if s is not None and is_usable(s.status)]
        if not usable:
            return self._nothing_to_do(journal, spec, targets)
        handles = [self.executor.open(t) for t in usable]
        message = spec.message or f"Apply plan {spec.plan_id} (PlanCommit {journal.name})"
        try:
            saga.run(spec.plan_id, handles, message=message)
        except AtomicCommitError as exc:
            logger.warning("PlanCommit %s: %s", journal.name, exc)  # recorded in the journal
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
        return journal.last_state

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
        state = JournalState(
            plan_id=spec.plan_id,
            phase=JournalPhase.FAILED,
            reason=JournalReason.COMMIT_FAILED,
            error=f"plan {spec.plan_id} has no Created or Active Sandbox (found: {seen})",
            finished_at=utc_now(),
        )
        journal.save(state)
        conditions = set_condition(
            journal.status.get("conditions"),
            "Committed",
            "False",
            "NoActiveSandboxes",
            state.error or "",
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
                        rollbackable=t.strategy in ("git_worktree", "copy_on_write", "overlay"),
                    )
                    for t in usable
                ],
            )
            journal.save(state)
        for step in state.steps:
            if step.state in (StepState.COMPENSATED, StepState.COMPENSATION_FAILED):
                continue
            step.state = StepState.COMPENSATING
            step.started_at = step.started_at or utc_now()
            journal.save(state)
            try:
                self._discard(step, by_id.get(step.sandbox_id), by_id, journal.name)
            except Exception as exc:  # every sandbox is attempted; failures are named
                step.state = StepState.COMPENSATION_FAILED
                step.error = f"{type(exc).__name__}: {exc}"
                state.failed_rollback_ids.append(step.sandbox_id)
                metrics.FAILED_COMPENSATIONS.inc()
            else:
                step.state = StepState.COMPENSATED
                state.rolled_back_ids.append(step.sandbox_id)
                metrics.COMPENSATIONS.inc()
            step.updated_at = utc_now()
            journal.save(state)
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
        kind = "Normal" if state.phase is JournalPhase.ROLLED_BACK else "Warning"
        reason = str(committed.get("reason") or "CommitFailed")
        self.events(
            body, kind, reason, f"{message}; rolled back: {rolled}; failed rollbacks: {failed}"
        )

    # -- deletion -----------------------------------------------------------------------------

    def finalize(self, body: Mapping[str, Any]) -> None:
        """Deletion of a PlanCommit: with ``cleanupPolicy: Delete`` delete the plan's Sandboxes
        (their own finalizers clean up the artefacts); with ``Retain`` do nothing.

        A PlanCommit deleted mid-saga is finalized only after its handler finished the saga
        (kopf runs one object's handlers one at a time), so the journal is never cut short.
        """
        spec = PlanCommitSpec.model_validate(dict(body.get("spec") or {}))
        if spec.cleanup_policy != "Delete":
            return
        namespace = str(body["metadata"]["namespace"])
        deleted = []
        for item in self.api.list(SANDBOX_PLURAL, namespace):
            same_plan = (item.get("spec") or {}).get("planId") == spec.plan_id
            if same_plan and self.api.delete(SANDBOX_PLURAL, namespace, item["metadata"]["name"]):
                deleted.append(item["metadata"]["name"])
        self.events(
            body,
            "Normal",
            "PlanCleanedUp",
            f"deleted Sandboxes of plan {spec.plan_id}: {', '.join(deleted) or 'none'}",
        )
