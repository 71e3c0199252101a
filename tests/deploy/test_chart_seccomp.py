"""The workspace Pods' seccomp profile as the chart renders it (``helm template``): the value,
the operator's setting, the profile file shipped in a ConfigMap for the nodes, and the operator
policy admitting exactly that profile. Tier 2 (tests/operator/apiserver/
test_operator_privileges.py) has the API server admit and refuse real Pods with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.chart import CHART_DIR, _env, _one, _render
from tests.support.helm import run_helm

VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
PROFILE = "sandbox-operator/sandbox-workspace.json"
LOCALHOST = "workspace.seccompProfile.type=Localhost"


def _policy_expressions(helm: Path, *sets: str) -> str:
    objects = _render(helm, *sets, api_versions=(VAP,))
    policies = [
        o for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy" and "approval" not in o["metadata"]["name"]
    ]  # fmt: skip
    return "\n".join(v["expression"] for v in policies[0]["spec"]["validations"])


def test_runtime_default_by_default_and_the_localhost_profile_when_asked(helm: Path) -> None:
    assert _env(_render(helm))["SANDBOX_OPERATOR_WORKSPACE_SECCOMP_PROFILE"] == ""
    assert _env(_render(helm, LOCALHOST))["SANDBOX_OPERATOR_WORKSPACE_SECCOMP_PROFILE"] == PROFILE
    other = _render(helm, LOCALHOST, "workspace.seccompProfile.localhostProfile=ops/jail.json")
    assert _env(other)["SANDBOX_OPERATOR_WORKSPACE_SECCOMP_PROFILE"] == "ops/jail.json"


def test_the_profile_file_is_shipped_for_the_nodes(helm: Path) -> None:
    config = _one(_render(helm, LOCALHOST), "ConfigMap", "rel-sandbox-operator-seccomp")
    shipped = (CHART_DIR / "files/seccomp/sandbox-workspace.json").read_text()
    assert json.loads(config["data"]["sandbox-workspace.json"]) == json.loads(shipped)
    assert config["metadata"]["annotations"]["sandbox.cleveragents.io/install-as"] == PROFILE
    for sets in ((), ("executor=local", LOCALHOST)):  # RuntimeDefault, or no workspace Pods
        assert not [o for o in _render(helm, *sets) if o["metadata"]["name"].endswith("-seccomp")]


def test_the_policy_admits_exactly_the_configured_profile(helm: Path) -> None:
    default = _policy_expressions(helm)
    assert "'RuntimeDefault'" in default and "Localhost" not in default
    assert "!has(c.securityContext.seccompProfile)" in default  # no container overrides it
    localhost = _policy_expressions(helm, LOCALHOST)
    assert f"localhostProfile == '{PROFILE}'" in localhost
    assert "Unconfined" not in localhost


@pytest.mark.parametrize(
    "bad",
    [
        "workspace.seccompProfile.type=Unconfined",
        "workspace.seccompProfile.localhostProfile=/abs/profile.json",
        "workspace.seccompProfile.localhostProfile=../profile.json",
    ],
)
def test_the_values_schema_refuses_other_profiles(helm: Path, bad: str) -> None:
    result = run_helm(helm, "template", "rel", str(CHART_DIR), "--set", LOCALHOST, "--set", bad)
    assert result.returncode != 0
    assert "seccompProfile" in result.stderr


def test_localhost_needs_a_profile_path(helm: Path) -> None:
    result = run_helm(
        helm, "template", "rel", str(CHART_DIR),
        "--set", LOCALHOST, "--set", "workspace.seccompProfile.localhostProfile=",
    )  # fmt: skip
    assert result.returncode != 0
    assert "localhostProfile" in result.stderr
