"""The chart's named-approval values (docs/approvals.md): the ValidatingAdmissionPolicy and its
binding where the cluster serves them, and the operator's environment judging approvals by the
same lists as the policy (the operator's own service account always forbidden)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chart import _env, _one, _render
from tests.support.helm import run_helm
from tests.support.operator import CHART_DIR

VAP_V1 = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
OPERATOR = "system:serviceaccount:sandbox-system:rel-sandbox-operator"
ENGINE = "system:serviceaccount:agents:engine"
KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@pytest.mark.parametrize(
    ("mode", "api_versions", "rendered"),
    [
        ("auto", (), False),  # the cluster serves no ValidatingAdmissionPolicy v1
        ("auto", (VAP_V1,), True),
        ("true", (), True),
        ("false", (VAP_V1,), False),
    ],
)
def test_the_policy_is_rendered_where_it_is_served(
    helm: Path, mode: str, api_versions: tuple[str, ...], rendered: bool
) -> None:
    objects = _render(helm, f"approvals.policy.enabled={mode}", api_versions=api_versions)
    # The operator's own Pod policy (operator-policy.yaml) renders where VAP is served too.
    found = sorted(
        o["kind"] for o in objects if o["kind"] in KINDS and "approval" in o["metadata"]["name"]
    )
    assert found == (sorted(KINDS) if rendered else [])


def test_policy_and_operator_forbid_the_same_identities(helm: Path) -> None:
    objects = _render(
        helm,
        "approvals.policy.enabled=true",
        f"approvals.forbiddenApprovers={{{ENGINE}}}",
        "approvals.required=true",
        "approvals.minApprovals=2",
        "approvals.approverGroups={release-managers}",
    )
    policy = _one(objects, "ValidatingAdmissionPolicy")
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["forbiddenUsers"]) == [OPERATOR, ENGINE]
    assert json.loads(variables["forbiddenGroups"]) == ["system:serviceaccounts"]
    assert variables["required"].startswith("true ||")
    binding = _one(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    env = _env(objects)
    assert env["SANDBOX_OPERATOR_FORBIDDEN_APPROVERS"] == f"{OPERATOR},{ENGINE}"
    assert env["SANDBOX_OPERATOR_FORBIDDEN_APPROVER_GROUPS"] == "system:serviceaccounts"
    assert env["SANDBOX_OPERATOR_APPROVER_GROUPS"] == "release-managers"
    assert env["SANDBOX_OPERATOR_APPROVAL_REQUIRED"] == "true"
    assert env["SANDBOX_OPERATOR_MIN_APPROVALS"] == "2"


def test_a_minimum_below_one_is_refused_by_the_values_schema(helm: Path) -> None:
    result = run_helm(helm, "template", "rel", str(CHART_DIR), "--set", "approvals.minApprovals=0")
    assert result.returncode != 0
    assert "minApprovals" in result.stderr


MAP_V1BETA1 = "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"


@pytest.mark.parametrize(
    ("mode", "api_versions", "expected"),
    [
        ("auto", (), None),
        ("auto", (MAP_V1BETA1,), "admissionregistration.k8s.io/v1beta1"),
        ("true", (), "admissionregistration.k8s.io/v1beta1"),
        ("false", (MAP_V1BETA1,), None),
    ],
)
def test_the_creator_is_stamped_where_mutating_policies_are_served(
    helm: Path, mode: str, api_versions: tuple[str, ...], expected: str | None
) -> None:
    objects = _render(helm, f"approvals.stampCreator={mode}", api_versions=api_versions)
    found = [o for o in objects if o["metadata"]["name"] == "rel-sandbox-operator-creator"]
    if expected is None:
        assert found == []
        return
    assert sorted(o["kind"] for o in found) == [
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    ]
    policy = _one(found, "MutatingAdmissionPolicy")
    assert policy["apiVersion"] == expected
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    expression = policy["spec"]["mutations"][0]["applyConfiguration"]["expression"]
    assert '"sandbox.cleveragents.io/created-by": request.userInfo.username' in expression
