"""A sandbox's history, newest first: commits, rollbacks, checkpoints and restores.

Assembled from three sources the API server keeps (for ``kubectl sandbox log``):
the PlanCommit journals that name the sandbox (``status.sandboxes[]``), the Checkpoint objects
of the sandbox, and the Events the operator posted about it (``RolledBack``, ``Restored`` and
their failures, ``Provisioned``). Pure functions over raw objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sandbox_client.models import CheckpointInfo, HistoryEntry, PlanCommitResult

# Sandbox Event reason -> (kind, outcome).
_EVENT_KINDS = {
    "Provisioned": ("provision", "ok"),
    "ProvisionFailed": ("provision", "failed"),
    "RolledBack": ("rollback", "ok"),
    "RollbackFailed": ("rollback", "failed"),
    "Restored": ("restore", "ok"),
    "RestoreFailed": ("restore", "failed"),
}


def _event_time(event: dict[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def sandbox_history(
    sandbox_name: str,
    plancommits: Iterable[PlanCommitResult],
    checkpoints: Iterable[CheckpointInfo],
    events: Iterable[dict[str, Any]],
) -> list[HistoryEntry]:
    """Entries for ``sandbox_name``, newest first (RFC 3339 times sort as text).

    ``events`` are raw ``v1 Event`` dicts (camelCase) about the sandbox; others are ignored.
    """
    entries: list[HistoryEntry] = []
    for commit in plancommits:
        step = next((s for s in commit.steps if s.name == sandbox_name), None)
        if step is None:
            continue
        verb = "commit" if commit.action.value == "Commit" else "rollback"
        when = (
            step.finished_at
            or step.started_at
            or str((commit.raw.get("status") or {}).get("startedAt") or "")
        )
        detail = f"plan {commit.plan_id}: {step.state.value}"
        if step.error:
            detail += f": {step.error}"
        entries.append(
            HistoryEntry(
                time=when,
                kind=verb,
                source=f"PlanCommit/{commit.name}",
                outcome=step.state.value,
                message=detail,
            )
        )
    for checkpoint in checkpoints:
        if checkpoint.spec.sandbox_name != sandbox_name:
            continue
        entries.append(
            HistoryEntry(
                time=checkpoint.created_at,
                kind="checkpoint",
                source=f"Checkpoint/{checkpoint.name}",
                outcome=checkpoint.phase or "Pending",
                message=f"phase {checkpoint.spec.phase}"
                + (f", {checkpoint.kind}" if checkpoint.kind else ""),
            )
        )
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("name") != sandbox_name or involved.get("kind", "Sandbox") != "Sandbox":
            continue
        kind_outcome = _EVENT_KINDS.get(str(event.get("reason") or ""))
        if kind_outcome is None:
            continue
        entries.append(
            HistoryEntry(
                time=_event_time(event),
                kind=kind_outcome[0],
                source=f"Event/{(event.get('metadata') or {}).get('name', '')}",
                outcome=kind_outcome[1],
                message=str(event.get("message") or ""),
            )
        )
    return sorted(entries, key=lambda e: e.time, reverse=True)
