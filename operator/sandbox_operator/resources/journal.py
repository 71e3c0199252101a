"""The core's ``CommitJournal`` protocol implemented on a PlanCommit's ``.status``.

DESIGN.md, "PlanCommit: atomic commit as a saga": the PlanCommit status *is* the journal. Every
``save`` is a synchronous status-subresource patch, so when the core's ``PlanCommitSaga`` records
a step before and after it happens, the API server holds it before the next side effect.
Only CRD-declared fields are written (case 15). Conditions follow :func:`plancommit_conditions`.

Two-phase attempts (``sandbox_core.plan.two_phase``) add ``status.mode`` and
``status.twoPhase`` (``txid``, ``attempt``, ``stage`` = the journal phase while not terminal,
``reason``, ``digest``, ``approvedDigest``, ``decidedAt``) and per step ``lastResource``,
``preparedDigest`` and ``conflicts``: enough for :meth:`TwoPhasePlanCommit.recover` to abort
(before the decision) or roll forward (after it) in a restarted operator. The journal phases
``preparing``, ``applying`` and ``aborting`` all show as phase ``Committing``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sandbox_api.models import PLANCOMMIT_PLURAL, PlanCommitAction, PlanCommitPhase
from sandbox_core import SandboxError
from sandbox_core.plan.journal import (
    JournalPhase,
    JournalReason,
    JournalState,
    JournalStep,
    StepState,
)
from sandbox_operator.kube.api import Api
from sandbox_operator.kube.conditions import set_condition, set_finished

PHASES = {
    JournalPhase.PENDING: PlanCommitPhase.PENDING,
    JournalPhase.PREPARING: PlanCommitPhase.COMMITTING,
    JournalPhase.APPLYING: PlanCommitPhase.COMMITTING,
    JournalPhase.ABORTING: PlanCommitPhase.COMMITTING,
    JournalPhase.COMMITTING: PlanCommitPhase.COMMITTING,
    JournalPhase.COMPENSATING: PlanCommitPhase.ROLLING_BACK,
    JournalPhase.COMMITTED: PlanCommitPhase.COMMITTED,
    JournalPhase.ROLLED_BACK: PlanCommitPhase.ROLLED_BACK,
    JournalPhase.FAILED: PlanCommitPhase.FAILED,
}
# status.phase -> journal phase; the two-phase stages all read "Committing" (see STAGES).
JOURNAL_PHASES = {
    value.value: key
    for key, value in PHASES.items()
    if key not in (JournalPhase.PREPARING, JournalPhase.APPLYING, JournalPhase.ABORTING)
}
# status.twoPhase.stage: the journal phase of a two-phase attempt that is not terminal.
STAGES = {
    JournalPhase.PENDING: "Pending",
    JournalPhase.PREPARING: "Preparing",
    JournalPhase.APPLYING: "Applying",
    JournalPhase.ABORTING: "Aborting",
}
JOURNAL_STAGES = {value: key for key, value in STAGES.items()}
MODES = {"two_phase": "TwoPhase", "saga": "Saga"}


def plancommit_phase(phase: JournalPhase, action: PlanCommitAction) -> PlanCommitPhase:
    """``PlanCommit.status.phase`` of a journal phase (docs/crd-reference.md).

    ``Failed`` means the action did not reach its goal: for ``Commit``, the plan's changes did
    not land (a commit failed or the attempt was interrupted; the ``RolledBack`` and
    ``RollbackFailed`` conditions say whether every original is back as it was). ``RolledBack``
    is only the success of ``action: Rollback``.
    """
    mapped = PHASES[phase]
    if action is PlanCommitAction.COMMIT and mapped is PlanCommitPhase.ROLLED_BACK:
        return PlanCommitPhase.FAILED
    return mapped


STEP_STATES = {
    StepState.PENDING: "Pending",
    StepState.COMMITTING: "Committing",
    StepState.COMMITTED: "Committed",
    StepState.COMPENSATING: "Compensating",
    StepState.COMPENSATED: "Compensated",
    StepState.COMPENSATION_FAILED: "CompensationFailed",
    StepState.FAILED: "Failed",
    StepState.PREPARING: "Preparing",
    StepState.PREPARED: "Prepared",
    StepState.ABORTED: "Aborted",
}
JOURNAL_STEP_STATES = {value: key for key, value in STEP_STATES.items()}
JOURNAL_STEP_STATES["Skipped"] = StepState.PENDING


class JournalWriteError(SandboxError):
    """The PlanCommit status could not be written (the saga stops; the retry recovers)."""


def rfc3339(value: datetime | None) -> str | None:
    """``value`` as RFC 3339 UTC with second precision, or None."""
    return None if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _step_label(step: JournalStep, names: Mapping[str, str]) -> str:
    name = names.get(step.sandbox_id, "")
    return f"{name} ({step.sandbox_id})" if name else step.sandbox_id


def plancommit_conditions(
    state: JournalState,
    action: PlanCommitAction,
    names: Mapping[str, str],
    conditions: list[dict[str, Any]] | None,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The ``Committed`` / ``RolledBack`` / ``RollbackFailed`` / ``Finished`` conditions.

    ``Finished`` is True once ``state`` is terminal, whatever the outcome.

    Messages name the failed sandbox and its error and the rolled-back / failed ids.
    ``lastTransitionTime`` moves only when a status changes (case 22: re-saving changes nothing).
    An attempt still owing a compensation (case 21: not terminal, ``failedRollbackIds`` set) says
    so: ``Committed=False``, ``RollbackFailed=True`` with "retrying".
    """
    out = _plancommit_conditions(state, action, names, conditions, generation)
    outcome = PHASES[state.phase].value
    return set_finished(
        out,
        state.phase.is_terminal,
        outcome,
        f"the PlanCommit ended: {outcome}" if state.phase.is_terminal else "the work is running",
        generation,
    )


_CAUSE_CHARS = 300
_CAUSES_SHOWN = 3


def _compensation_errors(state: JournalState, names: Mapping[str, str]) -> str:
    """Why each failed compensation failed, bounded: the reader must see the cause, not only
    the ids (a condition message stays short; the journal keeps the whole text)."""
    failed = set(state.failed_rollback_ids)
    causes = [
        f"{_step_label(step, names)}: {(step.error or 'unknown error')[:_CAUSE_CHARS]}"
        for step in state.steps
        if step.sandbox_id in failed
    ]
    shown = causes[:_CAUSES_SHOWN]
    more = f"; and {len(causes) - len(shown)} more" if len(causes) > len(shown) else ""
    return f" ({'; '.join(shown)}{more})" if shown else ""


def _plancommit_conditions(
    state: JournalState,
    action: PlanCommitAction,
    names: Mapping[str, str],
    conditions: list[dict[str, Any]] | None,
    generation: int | None,
) -> list[dict[str, Any]]:
    out = list(conditions or [])
    owed = not state.phase.is_terminal and bool(state.failed_rollback_ids)
    if not state.phase.is_terminal and not owed:
        verb = "committing" if action is PlanCommitAction.COMMIT else "rolling back"
        return set_condition(
            out,
            "Committed",
            "Unknown",
            "InProgress",
            f"{verb} {len(state.steps)} sandboxes of plan {state.plan_id}",
            generation,
        )
    rolled = ", ".join(state.rolled_back_ids) or "none"
    failed_ids = ", ".join(state.failed_rollback_ids)
    if state.phase is JournalPhase.COMMITTED:
        ids = ", ".join(_step_label(s, names) for s in state.steps)
        return set_condition(
            out,
            "Committed",
            "True",
            "Committed",
            f"committed {len(state.steps)} sandboxes of plan {state.plan_id}: {ids}",
            generation,
        )
    failed_step = next((s for s in state.steps if s.sandbox_id == state.failed_sandbox_id), None)
    if action is PlanCommitAction.ROLLBACK:
        reason, message = "RolledBack", f"plan {state.plan_id} was rolled back on request"
    elif state.reason is JournalReason.CHANGED_SINCE_APPROVAL:
        reason = state.reason.value
        message = state.error or f"plan {state.plan_id} changed since it was approved"
    elif failed_step is not None:
        error = failed_step.error or state.error or "unknown error"
        reason = "Conflict" if "conflict" in error.lower() else "SandboxCommitFailed"
        message = (
            f"sandbox {_step_label(failed_step, names)} (resource "
            f"{failed_step.resource_id}) failed to commit: {error}"
        )
    else:
        reason = state.reason.value if state.reason is not JournalReason.IN_PROGRESS else "Failed"
        message = state.error or f"commit of plan {state.plan_id} did not complete"
    out = set_condition(out, "Committed", "False", reason, message, generation)
    if state.rolled_back_ids:
        out = set_condition(
            out, "RolledBack", "True", "Compensated", f"rolled back sandboxes: {rolled}", generation
        )
    elif state.failed_rollback_ids:
        out = set_condition(
            out,
            "RolledBack",
            "False",
            "CompensationFailed",
            "no sandbox could be rolled back",
            generation,
        )
    elif state.mode == "two_phase":
        out = set_condition(
            out,
            "RolledBack",
            "True",
            "Aborted",
            "every prepared sandbox was aborted before the decision; no original was changed",
            generation,
        )
    else:
        out = set_condition(
            out,
            "RolledBack",
            "True",
            "NothingToRollBack",
            "no sandbox had committed; nothing was rolled back",
            generation,
        )
    if state.failed_rollback_ids:
        retrying = "; retrying until it succeeds" if owed else ""
        out = set_condition(
            out,
            "RollbackFailed",
            "True",
            "CompensationFailed",
            f"rollback failed for sandboxes: {failed_ids}{retrying}"
            f"{_compensation_errors(state, names)}",
            generation,
        )
    else:
        out = set_condition(
            out,
            "RollbackFailed",
            "False",
            "NoFailedRollbacks",
            "every rollback succeeded",
            generation,
        )
    return out


def status_of_journal(
    state: JournalState,
    action: PlanCommitAction,
    names: Mapping[str, str],
    conditions: list[dict[str, Any]] | None,
    generation: int | None,
) -> dict[str, Any]:
    """The PlanCommit ``.status`` standing for ``state`` (CRD-declared fields only)."""
    terminal = state.phase.is_terminal
    steps: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for step in state.steps:
        label = STEP_STATES[step.state]
        if terminal and step.state is StepState.PENDING:
            label = "Skipped"
        entry: dict[str, Any] = {
            "name": names.get(step.sandbox_id, ""),
            "sandboxId": step.sandbox_id,
            "resourceId": step.resource_id,
            "strategy": step.strategy,
            "rollbackable": step.rollbackable,
            "state": label,
        }
        if step.started_at is not None:
            entry["startedAt"] = rfc3339(step.started_at)
        if step.state not in (
            StepState.PENDING,
            StepState.COMMITTING,
            StepState.COMPENSATING,
            StepState.PREPARING,
        ):
            entry["finishedAt"] = rfc3339(step.updated_at)
        if step.error:
            entry["error"] = step.error
        if step.conflicts:
            entry["conflicts"] = list(step.conflicts[:MAX_STEP_CONFLICTS])
        if state.mode == "two_phase":
            entry["lastResource"] = step.last_resource
            if step.prepared and step.prepared.get("digest"):
                entry["preparedDigest"] = str(step.prepared["digest"])
        steps.append(entry)
        if step.result or step.state is StepState.FAILED:
            results.append(_result_entry(step, names))
    status: dict[str, Any] = {
        "phase": plancommit_phase(state.phase, action).value,
        "sandboxes": steps,
        "results": results,
        "rolledBackIds": list(state.rolled_back_ids),
        "failedRollbackIds": list(state.failed_rollback_ids),
        "startedAt": rfc3339(state.started_at),
        "conditions": plancommit_conditions(state, action, names, conditions, generation),
    }
    if state.failed_sandbox_id:
        status["failedSandboxId"] = state.failed_sandbox_id
    if state.steps:  # an up-front failure ran no mode at all
        status["mode"] = MODES[state.mode]
    if state.mode == "two_phase":
        status["twoPhase"] = two_phase_status(state)
    if terminal:
        status["completedAt"] = rfc3339(state.finished_at or state.updated_at)
    if generation is not None:
        status["observedGeneration"] = generation
    return status


MAX_STEP_CONFLICTS = 20


def two_phase_status(state: JournalState) -> dict[str, Any]:
    """``status.twoPhase`` of a two-phase attempt (the resume point of a restarted operator)."""
    out: dict[str, Any] = {"attempt": state.attempt, "reason": state.reason.value}
    if not state.phase.is_terminal:
        out["stage"] = STAGES.get(state.phase, "Preparing")
    for key, value in (
        ("txid", state.txid),
        ("digest", state.digest),
        ("approvedDigest", state.approved_digest),
        ("decidedAt", rfc3339(state.decided_at)),
    ):
        if value:
            out[key] = value
    return out


def _result_entry(step: JournalStep, names: Mapping[str, str]) -> dict[str, Any]:
    result = step.result or {}
    entry: dict[str, Any] = {
        "name": names.get(step.sandbox_id, ""),
        "sandboxId": step.sandbox_id,
        "resourceId": step.resource_id,
        "success": bool(result.get("success")) and step.state is not StepState.FAILED,
        "changedFiles": list(result.get("changed_files") or []),
        "addedFiles": list(result.get("added_files") or []),
        "deletedFiles": list(result.get("deleted_files") or []),
    }
    if result.get("commit_ref"):
        entry["commitRef"] = str(result["commit_ref"])
    error = step.error if step.state is StepState.FAILED else result.get("error")
    if error:
        entry["error"] = str(error)
    return entry


def journal_of_status(plan_id: str, status: Mapping[str, Any]) -> JournalState | None:
    """Rebuild the core's JournalState from a PlanCommit ``.status`` (None: nothing recorded)."""
    phase = status.get("phase")
    steps_raw = status.get("sandboxes")
    if phase not in JOURNAL_PHASES or phase == "Pending" or steps_raw is None:
        return None
    results = {r.get("sandboxId"): r for r in status.get("results") or []}
    steps = []
    for raw in steps_raw:
        result = results.get(raw.get("sandboxId"))
        step = JournalStep(
            sandbox_id=str(raw.get("sandboxId") or ""),
            resource_id=str(raw.get("resourceId") or ""),
            strategy=str(raw.get("strategy") or ""),
            rollbackable=bool(raw.get("rollbackable", True)),
            state=JOURNAL_STEP_STATES.get(str(raw.get("state")), StepState.PENDING),
            error=raw.get("error"),
            started_at=_parse_time(raw.get("startedAt")),
            updated_at=_parse_time(raw.get("finishedAt")) or datetime.now(UTC),
            conflicts=[str(c) for c in raw.get("conflicts") or []],
            last_resource=bool(raw.get("lastResource", False)),
        )
        if result is not None and result.get("success"):
            step.result = {
                "sandbox_id": step.sandbox_id,
                "success": True,
                "commit_ref": result.get("commitRef"),
                "changed_files": list(result.get("changedFiles") or []),
                "added_files": list(result.get("addedFiles") or []),
                "deleted_files": list(result.get("deletedFiles") or []),
                "error": None,
                "timestamp": (step.updated_at or datetime.now(UTC)).isoformat(),
                "metadata": {},
            }
        steps.append(step)
    journal_phase: JournalPhase = JOURNAL_PHASES[str(phase)]
    two_phase = status.get("twoPhase")
    extra: dict[str, Any] = {}
    reason = JournalReason.IN_PROGRESS
    if status.get("mode") == "TwoPhase" and isinstance(two_phase, Mapping):
        if not journal_phase.is_terminal:
            journal_phase = JOURNAL_STAGES.get(str(two_phase.get("stage")), JournalPhase.PREPARING)
        reason = JournalReason(str(two_phase.get("reason") or JournalReason.IN_PROGRESS.value))
        txid = two_phase.get("txid")
        extra = {
            "mode": "two_phase",
            "attempt": int(two_phase.get("attempt") or 1),
            "txid": txid,
            "digest": two_phase.get("digest"),
            "approved_digest": two_phase.get("approvedDigest"),
            "decided_at": _parse_time(two_phase.get("decidedAt")),
        }
        for raw, step in zip(steps_raw, steps, strict=True):
            if raw.get("preparedDigest") and txid:
                step.prepared = {
                    "sandbox_id": step.sandbox_id,
                    "txid": txid,
                    "digest": raw["preparedDigest"],
                    "summary": None,
                    "details": {},
                }
    return JournalState(
        plan_id=plan_id,
        phase=journal_phase,
        reason=reason,
        steps=steps,
        **extra,
        failed_sandbox_id=status.get("failedSandboxId"),
        rolled_back_ids=list(status.get("rolledBackIds") or []),
        failed_rollback_ids=list(status.get("failedRollbackIds") or []),
        started_at=_parse_time(status.get("startedAt")) or datetime.now(UTC),
        finished_at=_parse_time(status.get("completedAt")),
    )


class PlanCommitStatusJournal:
    """``CommitJournal`` on one PlanCommit object's status subresource.

    Args:
        api: API access.
        body: the PlanCommit as read fresh at the start of the handler.
        names: sandbox id -> Sandbox object name (for status entries and messages).
        extra_status: fields merged into every save (e.g. clearing ``Blocked``).
    """

    def __init__(
        self,
        api: Api,
        body: Mapping[str, Any],
        names: Mapping[str, str],
        action: PlanCommitAction,
    ) -> None:
        self.api = api
        self.namespace = str(body["metadata"]["namespace"])
        self.name = str(body["metadata"]["name"])
        self.generation: int | None = body["metadata"].get("generation")
        self.plan_id = str((body.get("spec") or {}).get("planId"))
        self.names = dict(names)
        self.action = action
        self.status: dict[str, Any] = dict(body.get("status") or {})
        self.last_state: JournalState | None = journal_of_status(self.plan_id, self.status)

    def load(self) -> JournalState | None:
        """The journal as last saved (read from the object given at construction)."""
        return None if self.last_state is None else self.last_state.model_copy(deep=True)

    def save(self, state: JournalState) -> None:
        """Patch the status standing for ``state``; durable on the API server when it returns.

        Raises:
            JournalWriteError: the patch failed (404 when the object is gone, 5xx, ...).
        """
        status = status_of_journal(
            state, self.action, self.names, self.status.get("conditions"), self.generation
        )
        self.write(status)
        self.last_state = state.model_copy(deep=True)

    def write(self, status: dict[str, Any]) -> None:
        """Patch raw status fields (conditions are kept for the next save).

        Raises:
            JournalWriteError: the patch failed.
        """
        try:
            self.api.patch_status(PLANCOMMIT_PLURAL, self.namespace, self.name, status)
        except Exception as exc:
            raise JournalWriteError(
                f"cannot write the journal of PlanCommit {self.namespace}/{self.name}: {exc}"
            ) from exc
        self.status.update(status)
