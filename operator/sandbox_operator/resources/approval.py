"""Review and approval of a PlanCommit: pure functions, no API calls.

:func:`review_status` turns the core's :class:`~sandbox_core.plan.review.PlanReview` into
the bounded ``status.review`` (the first :data:`MAX_REVIEW_PATHS` paths per sandbox and the counts);
:func:`approval_decision` says what a PlanCommit with ``approval: Required`` does next, from its
spec, the reviewed digest, when it was reviewed and the clock. The handler
(:mod:`sandbox_operator.resources.plancommit`) writes conditions, Events and metrics from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sandbox_api.models import PlanCommitSpec

MAX_REVIEW_PATHS = 20


def review_status(
    review: Any, names: Mapping[str, str], reviewed_at: str, max_paths: int = MAX_REVIEW_PATHS
) -> dict[str, Any]:
    """``status.review`` of a ``PlanReview`` (camelCase, CRD-declared fields only).

    Args:
        review: the core's ``PlanReview`` (``to_dict(max_paths)`` gives the bounded rows).
        names: sandbox id -> Sandbox object name.
        reviewed_at: RFC 3339 time of the review.
        max_paths: paths (and conflicts) kept per sandbox.
    """
    raw = review.to_dict(max_paths=max_paths)
    rows = []
    for row in raw["sandboxes"]:
        rows.append(
            {
                "name": names.get(str(row["sandbox_id"]), ""),
                "sandboxId": str(row["sandbox_id"]),
                "resourceId": str(row.get("resource_id") or ""),
                "strategy": str(row.get("strategy") or ""),
                "digest": str(row["digest"]),
                "added": int(row.get("added") or 0),
                "changed": int(row.get("changed") or 0),
                "deleted": int(row.get("deleted") or 0),
                "paths": list(row.get("paths") or []),
                "linesAdded": int(row.get("lines_added") or 0),
                "linesRemoved": int(row.get("lines_removed") or 0),
                "bytes": int(row.get("bytes_changed") or 0),
                "statements": int(row.get("statements") or 0),
                "conflicts": list(row.get("conflicts") or []),
            }
        )
    return {
        "digest": str(raw["digest"]),
        "reviewedAt": reviewed_at,
        "truncated": bool(raw.get("truncated")),
        "hasConflicts": bool(raw.get("has_conflicts")),
        "sandboxes": rows,
    }


def review_message(review: Mapping[str, Any]) -> str:
    """One line for the ``Reviewed`` condition and Event: digest and per-sandbox counts."""
    parts = [
        f"{row.get('name') or row.get('sandboxId')}: +{row.get('added', 0)} "
        f"~{row.get('changed', 0)} -{row.get('deleted', 0)}"
        + (f", {len(row.get('conflicts') or [])} conflicts" if row.get("conflicts") else "")
        for row in review.get("sandboxes") or []
    ]
    return f"plan digest {review.get('digest')}; " + ("; ".join(parts) or "no sandbox")


class ApprovalState(StrEnum):
    """What an ``approval: Required`` PlanCommit does next."""

    WAITING = "Waiting"  # no approvedDigest yet
    MISMATCH = "Mismatch"  # approvedDigest differs from the review's digest: refused
    MATCHED = "Matched"  # approvedDigest is the review's digest: commit
    EXPIRED = "Expired"  # approvalTimeoutSeconds elapsed without a matching approval


@dataclass(frozen=True)
class ApprovalDecision:
    """The next step and, while waiting, the seconds until the timeout (None: no timeout)."""

    state: ApprovalState
    remaining_seconds: float | None = None


def approval_decision(
    spec: PlanCommitSpec, reviewed_digest: str, reviewed_at: datetime, now: datetime
) -> ApprovalDecision:
    """Decide from the spec, the reviewed digest and the clock.

    The timeout is strict: once ``approvalTimeoutSeconds`` after the review passed, the
    PlanCommit expires even if a matching digest is found now (it cannot be told whether it came
    in time). Times are aware datetimes (UTC).
    """
    remaining = None
    if spec.approval_timeout_seconds is not None:
        deadline = reviewed_at + timedelta(seconds=spec.approval_timeout_seconds)
        remaining = (deadline - now).total_seconds()
        if remaining <= 0:
            return ApprovalDecision(ApprovalState.EXPIRED, 0.0)
    if spec.approved_digest is not None and spec.approved_digest == reviewed_digest:
        return ApprovalDecision(ApprovalState.MATCHED, remaining)
    if spec.approved_digest is not None:
        return ApprovalDecision(ApprovalState.MISMATCH, remaining)
    return ApprovalDecision(ApprovalState.WAITING, remaining)
