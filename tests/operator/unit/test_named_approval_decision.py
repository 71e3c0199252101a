"""The operator's judgement of named approvals, without a cluster (docs/approvals.md).

Which recorded decisions count for the reviewed digest (not the creator's, not a forbidden
identity's, only approver groups when the chart names some, one per user and digest), how many
distinct approvers are needed, a counted rejection ending the PlanCommit, the unnamed
``spec.approvedDigest`` only where nobody asked for named approvals, and the rows
``status.approvals`` shows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sandbox_operator.resources.approval import (
    ApprovalPolicy,
    ApprovalState,
    approval_decision,
    approvals_status,
    judge_approvals,
    needed_approvals,
    new_decisions,
)
from sandbox_operator.settings import Settings

from sandbox_api.models import ApprovalEntry, PlanCommitSpec

DIGEST = "sha256:" + "a" * 64
OLD = "sha256:" + "b" * 64
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENGINE = "system:serviceaccount:agents:engine"


def approve(user: str, digest: str = DIGEST, **more: Any) -> dict[str, Any]:
    return {"user": user, "digest": digest, "decision": "Approve", **more}


def reject(user: str, digest: str = DIGEST, **more: Any) -> dict[str, Any]:
    return {"user": user, "digest": digest, "decision": "Reject", **more}


def spec(*approvals: dict[str, Any], **values: Any) -> PlanCommitSpec:
    return PlanCommitSpec.model_validate(
        {"planId": "p", "approval": "Required", "approvals": list(approvals), **values}
    )


def decide(
    plan: PlanCommitSpec, policy: ApprovalPolicy | None = None, creator: str = "carol"
) -> Any:
    return approval_decision(plan, DIGEST, T0, T0, policy, creator)


def test_one_approval_of_the_reviewed_digest_commits() -> None:
    decision = decide(spec(approve("alice")))
    assert decision.state is ApprovalState.MATCHED
    assert (decision.approvers, decision.needed, decision.legacy) == (["alice"], 1, False)


def test_approvals_of_another_digest_do_not_count() -> None:
    decision = decide(spec(approve("alice", OLD)))
    assert decision.state is ApprovalState.WAITING
    assert [(j.counted, j.reason) for j in decision.judged] == [(False, "StaleDigest")]


def test_the_creator_cannot_approve_its_own_plancommit() -> None:
    decision = decide(spec(approve("carol")), creator="carol")
    assert decision.state is ApprovalState.WAITING
    assert decision.judged[0].reason == "Creator"


def test_forbidden_users_and_groups_never_count() -> None:
    policy = ApprovalPolicy(
        forbidden_users=frozenset({ENGINE}), forbidden_groups=frozenset({"system:serviceaccounts"})
    )
    plan = spec(
        approve(ENGINE),
        approve("system:serviceaccount:agents:other", groups=["system:serviceaccounts"]),
    )
    decision = decide(plan, policy)
    assert decision.state is ApprovalState.WAITING
    assert [j.reason for j in decision.judged] == ["ForbiddenApprover", "ForbiddenApprover"]


def test_approver_groups_restrict_who_counts() -> None:
    policy = ApprovalPolicy(approver_groups=frozenset({"release-managers"}))
    plan = spec(approve("alice"), approve("bob", groups=["release-managers"]))
    decision = decide(plan, policy)
    assert decision.state is ApprovalState.MATCHED
    assert [j.reason for j in decision.judged] == ["NotInApproverGroups", None]
    assert decision.approvers == ["bob"]


def test_required_approvals_need_distinct_users() -> None:
    plan = spec(approve("alice"), approve("alice"), requiredApprovals=2)
    decision = decide(plan)
    assert decision.state is ApprovalState.WAITING
    assert [j.reason for j in decision.judged] == [None, "Duplicate"]
    assert decide(spec(approve("alice"), approve("bob"), requiredApprovals=2)).state is (
        ApprovalState.MATCHED
    )


def test_the_administrators_minimum_is_a_floor() -> None:
    policy = ApprovalPolicy(min_approvals=3)
    assert needed_approvals(spec(requiredApprovals=2), policy) == 3
    assert needed_approvals(spec(requiredApprovals=4), policy) == 4
    two = decide(spec(approve("alice"), approve("bob")), policy)
    assert (two.state, two.needed) == (ApprovalState.WAITING, 3)


def test_a_counted_rejection_ends_it_and_wins_over_approvals() -> None:
    decision = decide(spec(approve("alice"), reject("bob", comment="not on a Friday")))
    assert decision.state is ApprovalState.REJECTED
    assert decision.rejected_by == ["bob"]
    # A rejection that does not count (the creator's, a stale digest's) ends nothing.
    assert decide(spec(reject("carol"), approve("alice"))).state is ApprovalState.MATCHED
    assert decide(spec(reject("bob", OLD), approve("alice"))).state is ApprovalState.MATCHED


def test_the_unnamed_digest_counts_only_where_nobody_asked_for_names() -> None:
    legacy = spec(approvedDigest=DIGEST)
    assert decide(legacy).state is ApprovalState.MATCHED and decide(legacy).legacy
    assert decide(spec(approvedDigest=OLD)).state is ApprovalState.MISMATCH
    required = ApprovalPolicy(required=True)
    assert decide(legacy, required).state is ApprovalState.WAITING
    assert decide(legacy, ApprovalPolicy(min_approvals=2)).state is ApprovalState.WAITING
    asked = spec(approvedDigest=DIGEST, requiredApprovals=1)
    assert decide(asked).state is ApprovalState.WAITING


def test_where_approval_is_required_an_unknown_creator_counts_nobody() -> None:
    plan = spec(approve("alice"))
    decision = decide(plan, ApprovalPolicy(required=True), creator="")
    assert decision.state is ApprovalState.WAITING
    assert decision.judged[0].reason == "CreatorUnknown"
    assert decide(plan, ApprovalPolicy(required=True)).state is ApprovalState.MATCHED


def test_the_timeout_wins_over_a_late_approval() -> None:
    plan = spec(approve("alice"), approvalTimeoutSeconds=5)
    late = approval_decision(plan, DIGEST, T0, T0 + timedelta(seconds=6), None, "carol")
    assert late.state is ApprovalState.EXPIRED


def test_status_rows_keep_when_a_decision_was_first_seen() -> None:
    plan = spec(approve("alice", groups=["dev"], uid="u-1"), approve("carol"))
    judged = judge_approvals(plan.approvals, DIGEST, "carol", ApprovalPolicy())
    first = approvals_status(judged, [], "2026-01-01T00:00:00Z")
    assert first == [
        {
            "user": "alice",
            "digest": DIGEST,
            "decision": "Approve",
            "observedAt": "2026-01-01T00:00:00Z",
            "counted": True,
            "uid": "u-1",
            "groups": ["dev"],
        },
        {
            "user": "carol",
            "digest": DIGEST,
            "decision": "Approve",
            "observedAt": "2026-01-01T00:00:00Z",
            "counted": False,
            "reason": "Creator",
        },
    ]
    more = spec(*[entry.model_dump(exclude_none=True) for entry in plan.approvals], approve("bob"))
    judged = judge_approvals(more.approvals, DIGEST, "carol", ApprovalPolicy())
    second = approvals_status(judged, first, "2026-01-01T00:05:00Z")
    assert [row["observedAt"] for row in second] == [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:05:00Z",
    ]
    assert [row["user"] for row in new_decisions(second, first)] == ["bob"]


def test_entries_round_trip_the_crd_shape() -> None:
    entry = ApprovalEntry.model_validate(reject("bob", groups=[], uid="u", comment="no"))
    assert entry.model_dump(by_alias=True, exclude_none=True, mode="json") == {
        "digest": DIGEST,
        "decision": "Reject",
        "user": "bob",
        "uid": "u",
        "groups": [],
        "comment": "no",
    }


def test_settings_read_the_charts_approval_values() -> None:
    settings = Settings.from_env(
        {
            "SANDBOX_OPERATOR_APPROVAL_REQUIRED": "true",
            "SANDBOX_OPERATOR_MIN_APPROVALS": "2",
            "SANDBOX_OPERATOR_FORBIDDEN_APPROVERS": f"{ENGINE}, system:serviceaccount:s:op",
            "SANDBOX_OPERATOR_FORBIDDEN_APPROVER_GROUPS": "system:serviceaccounts",
            "SANDBOX_OPERATOR_APPROVER_GROUPS": "",
        }
    )
    assert settings.approval_required and settings.min_approvals == 2
    assert settings.forbidden_approvers == {ENGINE, "system:serviceaccount:s:op"}
    assert settings.forbidden_approver_groups == {"system:serviceaccounts"}
    assert settings.approver_groups == frozenset()
