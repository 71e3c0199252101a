"""Approvals that name a person, at admission on the real API server (docs/approvals.md).

The chart's ValidatingAdmissionPolicy and the CRD's write-once rule, with users impersonated
by the admin (``kubectl --as``): an entry of ``spec.approvals`` is admitted only when it names
the identity the API server authenticated for the request, never the PlanCommit's creator,
the operator, a named engine identity or a service account; a recorded entry cannot be edited,
removed or moved to another digest; where approval is required the engine can neither skip it
nor preset a digest. Rendered from the chart (``helm template``): what is tested is what the
chart installs. No operator runs: this is the API server's own judgement.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.approvals import (
    CREATED_BY,
    REQUIRED_LABEL,
    add_approval,
    as_user,
    create_as,
    created_by,
    entry,
    grant_plancommit_rights,
    install_approval_policy,
)
from tests.support.operator import Cluster, plancommit_manifest

pytestmark = pytest.mark.slow

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
ENGINE = "system:serviceaccount:agents:engine"
ENGINE_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:agents")
ROBOT = "robot-engine"  # a plain user named in approvals.forbiddenApprovers
OPERATOR = "system:serviceaccount:sandbox-system:nap-sandbox-operator"


@pytest.fixture(scope="module")
def policy(local_apiserver: Any) -> Iterator[Cluster]:
    """The policy (minimum 1 approver, ``robot-engine`` and the engine named) and a namespace
    where every authenticated user may create and patch PlanCommits."""
    cluster = Cluster.fresh(local_apiserver, prefix="nap")
    grant_plancommit_rights(cluster)
    manifest = install_approval_policy(
        local_apiserver,
        cluster,
        "nap",
        f"approvals.forbiddenApprovers={{{ROBOT},{ENGINE}}}",
        "approvals.minApprovals=2",
    )
    yield cluster
    local_apiserver.kubectl("delete", "-f", "-", input=manifest, check=False)


def _pending(cluster: Cluster, name: str, creator: str = "carol", **spec: Any) -> None:
    manifest = created_by(
        plancommit_manifest(name, "plan-" + name, approval="Required", **spec), creator
    )
    result = create_as(cluster, creator, manifest)
    assert result.returncode == 0, result.stderr


def _approvals(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return list(((cluster.get("plancommit", name) or {}).get("spec") or {}).get("approvals") or [])


def test_an_approval_is_recorded_with_the_identity_that_wrote_it(policy: Cluster) -> None:
    _pending(policy, "alice-approves")
    groups = ["approvers", "system:authenticated"]
    result = add_approval(
        policy,
        "alice-approves",
        "alice",
        entry("alice", DIGEST, groups=groups),
        groups=["approvers"],
    )
    assert result.returncode == 0, result.stderr
    assert _approvals(policy, "alice-approves") == [
        {"digest": DIGEST, "decision": "Approve", "user": "alice", "groups": groups}
    ]


def test_nobody_writes_an_approval_in_another_name(policy: Cluster) -> None:
    _pending(policy, "bob-forges")
    forged = add_approval(policy, "bob-forges", "bob", entry("alice", DIGEST))
    assert forged.returncode != 0
    assert "user must be bob" in forged.stderr
    # Groups and uid, when given, are the authenticated ones too.
    groups = add_approval(
        policy, "bob-forges", "bob", entry("bob", DIGEST, groups=["approvers"]), groups=[]
    )
    assert groups.returncode != 0 and "groups must be absent or exactly" in groups.stderr
    uid = add_approval(policy, "bob-forges", "bob", entry("bob", DIGEST, uid="alice-uid"))
    assert uid.returncode != 0 and "uid must be absent" in uid.stderr
    assert _approvals(policy, "bob-forges") == []


def test_the_creator_cannot_approve_its_plancommit(policy: Cluster) -> None:
    _pending(policy, "self-approval", creator="carol")
    result = add_approval(policy, "self-approval", "carol", entry("carol", DIGEST))
    assert result.returncode != 0
    assert "the creator of a PlanCommit cannot approve" in result.stderr
    # Nor can the creator's name on the object be changed or dropped afterwards.
    moved = as_user(
        policy,
        "carol",
        "annotate",
        "plancommit",
        "self-approval",
        f"{CREATED_BY}=dave",
        "--overwrite",
    )
    assert moved.returncode != 0 and "immutable" in moved.stderr
    dropped = as_user(policy, "carol", "annotate", "plancommit", "self-approval", f"{CREATED_BY}-")
    assert dropped.returncode != 0 and "immutable" in dropped.stderr
    assert _approvals(policy, "self-approval") == []


def test_a_creator_name_is_the_creator(policy: Cluster) -> None:
    manifest = created_by(plancommit_manifest("claims-alice", "p", approval="Required"), "alice")
    result = create_as(policy, "carol", manifest)
    assert result.returncode != 0
    assert f"{CREATED_BY} must name the creator, carol" in result.stderr
    # Outside a namespace that requires approval the name is optional (older clients), but
    # never another's.
    anonymous = plancommit_manifest("anonymous", "p", approval="Required")
    assert create_as(policy, "carol", anonymous).returncode == 0


@pytest.mark.parametrize(
    ("user", "groups"),
    [
        (ENGINE, ENGINE_GROUPS),  # the engine's service account, named in the chart
        (ROBOT, ()),  # a user named in approvals.forbiddenApprovers
        (OPERATOR, ENGINE_GROUPS[:1]),  # the operator itself
        ("system:serviceaccount:agents:other", ENGINE_GROUPS),  # any service account
    ],
)
def test_engine_and_agent_identities_cannot_approve(
    policy: Cluster, user: str, groups: tuple[str, ...]
) -> None:
    name = "forbidden-" + str(abs(hash(user)) % 10**6)
    _pending(policy, name)
    result = add_approval(policy, name, user, entry(user, DIGEST), groups=groups)
    assert result.returncode != 0
    assert "may not approve or reject PlanCommits" in result.stderr
    assert _approvals(policy, name) == []


def test_a_recorded_decision_is_written_once(policy: Cluster) -> None:
    _pending(policy, "write-once")
    assert add_approval(policy, "write-once", "alice", entry("alice", DIGEST)).returncode == 0
    assert add_approval(policy, "write-once", "bob", entry("bob", DIGEST)).returncode == 0
    edits = {
        "moved to another digest": [
            {"op": "replace", "path": "/spec/approvals/0/digest", "value": OTHER}
        ],
        "turned into a Reject": [
            {"op": "replace", "path": "/spec/approvals/0/decision", "value": "Reject"}
        ],
        "removed": [{"op": "remove", "path": "/spec/approvals/0"}],
        "all removed": [{"op": "remove", "path": "/spec/approvals"}],
    }
    for what, patch in edits.items():
        # By the approver herself: the CRD's rule holds whoever writes.
        result = as_user(
            policy, "alice", "patch", "plancommit", "write-once", "--type", "json", "-p",
            json.dumps(patch),
        )  # fmt: skip
        assert result.returncode != 0, what
        assert "written once" in result.stderr, what
    # A second decision of the same person on the same digest is refused, too.
    again = add_approval(policy, "write-once", "alice", entry("alice", DIGEST, decision="Reject"))
    assert again.returncode != 0 and "one decision per user and digest" in again.stderr
    assert [(e["user"], e["digest"], e["decision"]) for e in _approvals(policy, "write-once")] == [
        ("alice", DIGEST, "Approve"),
        ("bob", DIGEST, "Approve"),
    ]


def test_no_approval_at_creation(policy: Cluster) -> None:
    manifest = created_by(plancommit_manifest("preset", "p", approval="Required"), "alice")
    manifest["spec"]["approvals"] = [entry("alice", DIGEST)]
    result = create_as(policy, "alice", manifest)
    assert result.returncode != 0 and "created without approvals" in result.stderr


def test_required_approvals_below_the_minimum_are_refused(policy: Cluster) -> None:
    manifest = created_by(
        plancommit_manifest("too-few", "p", approval="Required", requiredApprovals=1), "carol"
    )
    result = create_as(policy, "carol", manifest)
    assert result.returncode != 0
    assert "below the administrator's minimum (approvals.minApprovals = 2)" in result.stderr
    _pending(policy, "enough", requiredApprovals=3)


def test_where_a_namespace_requires_approval_the_engine_cannot_skip_it(
    local_apiserver: Any, policy: Cluster
) -> None:
    guarded = Cluster.fresh(local_apiserver, prefix="napreq")
    grant_plancommit_rights(guarded)
    guarded.server.kubectl(
        "label", "namespace", guarded.namespace, f"{REQUIRED_LABEL}=true", check=True
    )
    skip = created_by(plancommit_manifest("skip", "p"), ENGINE)
    result = create_as(guarded, ENGINE, skip, groups=ENGINE_GROUPS)
    assert result.returncode != 0 and "set spec.approval to Required" in result.stderr
    preset = created_by(
        plancommit_manifest("preset", "p", approval="Required", approvedDigest=DIGEST), ENGINE
    )
    result = create_as(guarded, ENGINE, preset, groups=ENGINE_GROUPS)
    assert result.returncode != 0 and "spec.approvedDigest is refused" in result.stderr
    anonymous = plancommit_manifest("anonymous", "p", approval="Required")
    result = create_as(guarded, ENGINE, anonymous, groups=ENGINE_GROUPS)
    assert result.returncode != 0 and "names its creator" in result.stderr
    # A rollback needs no approval; an asked-for approval is admitted.
    rollback = plancommit_manifest("undo", "p", action="Rollback")
    assert create_as(guarded, ENGINE, rollback, groups=ENGINE_GROUPS).returncode == 0
    asked = created_by(plancommit_manifest("asked", "p", approval="Required"), ENGINE)
    result = create_as(guarded, ENGINE, asked, groups=ENGINE_GROUPS)
    assert result.returncode == 0, result.stderr
    # The digest cannot be preset later either.
    later = as_user(
        guarded, ENGINE, "patch", "plancommit", "asked", "--type", "merge", "-p",
        json.dumps({"spec": {"approvedDigest": DIGEST}}), groups=ENGINE_GROUPS,
    )  # fmt: skip
    assert later.returncode != 0 and "spec.approvedDigest is refused" in later.stderr
    # Elsewhere the old field keeps working (backward compatible).
    legacy = plancommit_manifest("legacy", "p", approval="Required", approvedDigest=DIGEST)
    assert create_as(policy, "carol", created_by(legacy, "carol")).returncode == 0
