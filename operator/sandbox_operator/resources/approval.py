"""Review and approval of a PlanCommit: pure functions, no API calls.

:func:`review_status` turns the core's :class:`~sandbox_core.plan.review.PlanReview` into
the bounded ``status.review`` (the first :data:`MAX_REVIEW_PATHS` paths per sandbox and the counts);
:func:`approval_decision` says what a PlanCommit with ``approval: Required`` does next, from its
spec, the reviewed digest, when it was reviewed, the clock, the administrator's
:class:`ApprovalPolicy` and the PlanCommit's creator. The handler
(:mod:`sandbox_operator.resources.plancommit`) writes conditions, Events and metrics from it.

Named approvals (docs/approvals.md). ``spec.approvals`` holds decisions whose identity the API
server authenticated (the chart's admission policy admits no other). :func:`judge_approvals`
says of each whether it counts for the reviewed digest, in the order they were recorded:

========================  ==================================================================
reason (not counted)      when
========================  ==================================================================
``StaleDigest``           it names another digest than the review's (an older review)
``CreatorUnknown``        the administrator requires approvals and the PlanCommit names no
                          creator (the policy was not installed when it was created)
``Creator``               its user created the PlanCommit (separation of duties)
``ForbiddenApprover``     its user, or one of its groups, is one the chart forbids (the
                          operator, the engine, service accounts)
``NotInApproverGroups``   the chart restricts approvers to groups and it records none of them
``Duplicate``             the same user decided on the same digest before (the first counts)
========================  ==================================================================

A counted ``Reject`` ends the PlanCommit (state ``REJECTED``); otherwise it commits once
``needed`` distinct users approved: ``max(policy.min_approvals, spec.requiredApprovals)``. The
older ``spec.approvedDigest`` counts only where nobody asked for named approvals: the
administrator did not require them nor set a minimum above one, and the PlanCommit sets no
``requiredApprovals``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sandbox_api.models import ApprovalDecisionKind, ApprovalEntry, PlanCommitSpec

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
        "checks": [
            {**check, "sandbox": check.get("sandbox") or names.get(str(check["sandboxId"]), "")}
            for check in raw.get("checks") or []
        ],
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

    WAITING = "Waiting"  # not enough approvals of the reviewed digest yet
    MISMATCH = "Mismatch"  # approvedDigest differs from the review's digest: refused
    MATCHED = "Matched"  # approved: commit
    EXPIRED = "Expired"  # approvalTimeoutSeconds elapsed without a matching approval
    REJECTED = "Rejected"  # an eligible person rejected the reviewed digest: nothing committed


@dataclass(frozen=True)
class ApprovalPolicy:
    """The administrator's rules for approvals (chart values ``approvals.*``).

    Attributes:
        required: named approvals are required here (``approvals.required`` or the namespace
            label ``sandbox.cleveragents.io/approval-required=true``): a Commit cannot skip the
            approval and ``spec.approvedDigest`` does not count.
        min_approvals: distinct approvers a PlanCommit needs at least (>= 1).
        forbidden_users: user names that never count (the operator, the engine).
        forbidden_groups: groups whose members never count (``system:serviceaccounts``).
        approver_groups: when not empty, an approval counts only when its recorded groups
            include one of these.
    """

    required: bool = False
    min_approvals: int = 1
    forbidden_users: frozenset[str] = frozenset()
    forbidden_groups: frozenset[str] = frozenset()
    approver_groups: frozenset[str] = frozenset()


@dataclass(frozen=True)
class JudgedApproval:
    """One recorded decision and whether it counts (``status.approvals[]``).

    ``reason`` says why it does not count (None when ``counted``).
    """

    entry: ApprovalEntry
    counted: bool
    reason: str | None = None

    def to_status(self, observed_at: str) -> dict[str, Any]:
        """The ``status.approvals[]`` row (camelCase, CRD-declared fields, no nulls)."""
        row: dict[str, Any] = {
            "user": self.entry.user,
            "digest": self.entry.digest,
            "decision": self.entry.decision.value,
            "observedAt": observed_at,
            "counted": self.counted,
        }
        if self.entry.uid:
            row["uid"] = self.entry.uid
        if self.entry.groups is not None:
            row["groups"] = list(self.entry.groups)
        if self.reason:
            row["reason"] = self.reason
        return row


def judge_approvals(
    entries: Iterable[ApprovalEntry], digest: str, creator: str, policy: ApprovalPolicy
) -> list[JudgedApproval]:
    """Whether each recorded decision counts for ``digest`` (module docstring's table), in
    the order recorded. ``creator`` is the PlanCommit's creator ("" when unknown)."""
    judged: list[JudgedApproval] = []
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        groups = set(entry.groups or [])
        key = (entry.user, entry.digest)
        reason: str | None = None
        if entry.digest != digest:
            reason = "StaleDigest"
        elif not creator and policy.required:
            reason = "CreatorUnknown"
        elif entry.user == creator:
            reason = "Creator"
        elif entry.user in policy.forbidden_users or groups & policy.forbidden_groups:
            reason = "ForbiddenApprover"
        elif policy.approver_groups and not groups & policy.approver_groups:
            reason = "NotInApproverGroups"
        elif key in seen:
            reason = "Duplicate"
        seen.add(key)
        judged.append(JudgedApproval(entry, reason is None, reason))
    return judged


@dataclass(frozen=True)
class ApprovalDecision:
    """The next step and, while waiting, the seconds until the timeout (None: no timeout).

    ``judged``: every recorded decision and whether it counts; ``needed``: distinct approvers
    the PlanCommit needs; ``approvers``: the users whose approvals count, in recorded order;
    ``rejected_by``: the users whose counted rejections ended it.
    """

    state: ApprovalState
    remaining_seconds: float | None = None
    judged: list[JudgedApproval] = field(default_factory=list)
    needed: int = 1
    approvers: list[str] = field(default_factory=list)
    rejected_by: list[str] = field(default_factory=list)
    legacy: bool = False  # approved through spec.approvedDigest (no name recorded)


def legacy_allowed(spec: PlanCommitSpec, policy: ApprovalPolicy) -> bool:
    """Whether the unnamed ``spec.approvedDigest`` may approve: only where nobody asked for
    named approvals (no administrator's requirement or minimum above one, no
    ``spec.requiredApprovals``)."""
    return not policy.required and policy.min_approvals <= 1 and spec.required_approvals is None


def needed_approvals(spec: PlanCommitSpec, policy: ApprovalPolicy) -> int:
    """Distinct approvers the PlanCommit needs: ``spec.requiredApprovals``, never fewer than
    the administrator's minimum."""
    return max(policy.min_approvals, spec.required_approvals or 1, 1)


def approval_decision(
    spec: PlanCommitSpec,
    reviewed_digest: str,
    reviewed_at: datetime,
    now: datetime,
    policy: ApprovalPolicy | None = None,
    creator: str = "",
) -> ApprovalDecision:
    """Decide from the spec, the reviewed digest, the clock, the policy and the creator.

    The timeout is strict: once ``approvalTimeoutSeconds`` after the review passed, the
    PlanCommit expires even if a matching approval is found now (it cannot be told whether it
    came in time). A counted rejection wins over approvals. Times are aware datetimes (UTC).
    """
    policy = policy or ApprovalPolicy()
    judged = judge_approvals(spec.approvals, reviewed_digest, creator, policy)
    needed = needed_approvals(spec, policy)
    approvers = _distinct(j.entry.user for j in judged if _counts(j, ApprovalDecisionKind.APPROVE))
    rejected = _distinct(j.entry.user for j in judged if _counts(j, ApprovalDecisionKind.REJECT))
    remaining = None
    if spec.approval_timeout_seconds is not None:
        deadline = reviewed_at + timedelta(seconds=spec.approval_timeout_seconds)
        remaining = (deadline - now).total_seconds()

    def decided(state: ApprovalState, legacy: bool = False) -> ApprovalDecision:
        left = 0.0 if state is ApprovalState.EXPIRED else remaining
        return ApprovalDecision(state, left, judged, needed, approvers, rejected, legacy)

    legacy_counts = spec.approved_digest is not None and legacy_allowed(spec, policy)
    if remaining is not None and remaining <= 0:
        return decided(ApprovalState.EXPIRED)
    if rejected:
        return decided(ApprovalState.REJECTED)
    if len(approvers) >= needed:
        return decided(ApprovalState.MATCHED)
    if legacy_counts and spec.approved_digest == reviewed_digest:
        return decided(ApprovalState.MATCHED, legacy=True)
    if legacy_counts:
        return decided(ApprovalState.MISMATCH)
    return decided(ApprovalState.WAITING)


def _counts(judged: JudgedApproval, kind: ApprovalDecisionKind) -> bool:
    return judged.counted and judged.entry.decision is kind


def _distinct(users: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(users))


def approvals_status(
    judged: Iterable[JudgedApproval], previous: Iterable[Mapping[str, Any]] | None, now: str
) -> list[dict[str, Any]]:
    """``status.approvals``: one row per recorded decision, keeping the ``observedAt`` of a row
    already shown (the same user, digest and decision); new rows are stamped ``now``.

    ``observedAt`` is display only: what counts is always judged again from ``spec.approvals``.
    """
    seen = {
        (str(row.get("user")), str(row.get("digest")), str(row.get("decision"))): str(
            row.get("observedAt") or now
        )
        for row in previous or []
    }
    return [
        item.to_status(
            seen.get((item.entry.user, item.entry.digest, item.entry.decision.value), now)
        )
        for item in judged
    ]


def new_decisions(
    rows: Iterable[Mapping[str, Any]], previous: Iterable[Mapping[str, Any]] | None
) -> list[Mapping[str, Any]]:
    """The rows of ``rows`` that ``previous`` did not show (same user, digest and decision)."""
    shown = {(row.get("user"), row.get("digest"), row.get("decision")) for row in previous or []}
    return [
        row
        for row in rows
        if (row.get("user"), row.get("digest"), row.get("decision")) not in shown
    ]


def decision_message(row: Mapping[str, Any], decision: ApprovalDecision) -> str:
    """One line for the ``ApprovalRecorded`` Event of a newly seen decision."""
    verb = "approved" if row.get("decision") == ApprovalDecisionKind.APPROVE.value else "rejected"
    counted = (
        f"counts ({len(decision.approvers)} of {decision.needed} approvals)"
        if row.get("counted")
        else f"does not count ({row.get('reason')})"
    )
    return f"{row.get('user')} {verb} plan digest {row.get('digest')}; it {counted}"


def waiting_message(decision: ApprovalDecision, digest: str, legacy_allowed: bool) -> str:
    """The ``Approved=False`` reason ``AwaitingApproval`` message: what is still needed."""
    have = ", ".join(decision.approvers) or "none"
    text = (
        f"reviewed plan digest {digest}; needs {decision.needed} distinct approval(s) of it in "
        f"spec.approvals (approved by: {have})"
    )
    if legacy_allowed:
        text += "; or set spec.approvedDigest to it to commit (unnamed, deprecated)"
    return text
