"""The operator's privileges as the chart renders them (``helm template``, per value): no right to
delete or read Secrets beyond its own key, Roles per watched namespace instead of a ClusterRole,
the admission policy bounding what its ServiceAccount writes, NetworkPolicies of its own Pods and
the pre-delete hook's Pod, an agent key the chart never generates, and docs/operations.md's
"Privileges" table equal to the rules rendered.

The same objects are loaded into the real API server in
``tests/operator/apiserver/test_operator_privileges.py``.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.agent import wire
from tests.support.apiserver.harness import LocalApiServer
from tests.support.chart import CHART_DIR, _container, _env, _one, _render
from tests.support.helm import run_helm
from tests.support.operator import files_at

REPO_ROOT = Path(__file__).resolve().parents[2]
VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
SA_USER = "system:serviceaccount:sandbox-system:rel-sandbox-operator"


def _hooks(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")]


def _operator_roles(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's ClusterRoles and Roles (not the hook's)."""
    hooks = {id(o) for o in _hooks(objects)}
    return [o for o in objects if o["kind"] in ("ClusterRole", "Role") and id(o) not in hooks]


def _verbs(roles: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {
        verb
        for role in roles
        for rule in role["rules"]
        if group in rule["apiGroups"] and resource in rule["resources"]
        for verb in rule["verbs"]
    }


# --- Secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize("executor", ["pod", "local"])
def test_no_role_may_delete_list_or_watch_secrets(helm: Path, executor: str) -> None:
    for sets in ((), ("watchNamespaces={team-a,team-b}",)):
        objects = _render(helm, f"executor={executor}", *sets)
        roles = [o for o in objects if o["kind"] in ("ClusterRole", "Role")]
        secret_verbs = _verbs(roles, "", "secrets")
        assert not secret_verbs & {"delete", "deletecollection", "list", "watch", "update"}
        assert "*" not in secret_verbs
        cluster_wide = _verbs([r for r in roles if r["kind"] == "ClusterRole"], "", "secrets")
        # get only for the local executor, which reads spec.source.secretRef itself; patch only
        # for the pod executor's token renewal (the admission policy allows no other update).
        expected = {"create", "patch"} if executor == "pod" else {"create", "get"}
        assert cluster_wide == expected or (sets and cluster_wide == set())


def test_the_agent_key_is_read_by_name_and_never_rendered_with_randomness(helm: Path) -> None:
    objects = _render(helm)
    # No Secret at all: `helm template` renders the same objects each time (GitOps).
    assert not [o for o in objects if o["kind"] == "Secret"]
    assert _render(helm) == objects
    role = _one(objects, "Role", "rel-sandbox-operator-agent-key")
    assert role["metadata"]["namespace"] == "sandbox-system"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["rel-sandbox-operator-agent-key"],
            "verbs": ["get"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    env = _env(objects)
    assert env["SANDBOX_OPERATOR_AGENT_KEY_SECRET"] == "rel-sandbox-operator-agent-key"
    assert "SANDBOX_OPERATOR_AGENT_KEY_FILE" not in env
    assert not [m for m in _container(objects).get("volumeMounts", []) if "agent" in m["name"]]
    # The local executor has no workspace agents: no key, no role for it.
    local = _render(helm, "executor=local")
    assert not [o for o in local if o["metadata"]["name"].endswith("agent-key")]


# --- several watched namespaces -------------------------------------------------------------


def test_watched_namespaces_get_roles_and_kopf_watches_exactly_them(helm: Path) -> None:
    objects = _render(helm, "watchNamespaces={team-a,team-b}", "watchNamespace=team-c")
    watched = ["team-a", "team-b", "team-c"]
    operator_roles = _operator_roles(objects)
    # Only the discovery rights (CRDs, namespaces) stay cluster-wide.
    (cluster_role,) = [r for r in operator_roles if r["kind"] == "ClusterRole"]
    assert cluster_role["metadata"]["name"] == "rel-sandbox-operator-discovery"
    assert {(r["resources"][0], tuple(r["verbs"])) for r in cluster_role["rules"]} == {
        ("customresourcedefinitions", ("get", "list", "watch")),
        ("namespaces", ("get", "list", "watch")),
    }
    roles = {r["metadata"]["namespace"]: r for r in operator_roles if r["kind"] == "Role"}
    assert set(roles) == {*watched, "sandbox-system"}
    for namespace in watched:
        assert _verbs([roles[namespace]], "", "pods") >= {"create", "delete"}
        binding = next(
            o
            for o in objects
            if o["kind"] == "RoleBinding"
            and o["metadata"]["namespace"] == namespace
            and o["metadata"]["name"] == "rel-sandbox-operator"
        )
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "rel-sandbox-operator",
        }
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": "rel-sandbox-operator",
                "namespace": "sandbox-system",
            }
        ]
    # The operator's own namespace holds only the agent key's and the Lease's roles.
    assert _verbs([roles["sandbox-system"]], "", "pods") == set()
    assert not [o for o in objects if o["kind"] == "ClusterRoleBinding" and "discovery" not in
                o["metadata"]["name"]]  # fmt: skip
    args = _container(objects)["args"]
    assert [a for a in args if a.startswith("--namespace") or a == "--all-namespaces"] == [
        f"--namespace={n}" for n in watched
    ]
    assert _env(objects)["SANDBOX_OPERATOR_NAMESPACE"] == ",".join(watched)
    # The pre-delete hook: a Role per watched namespace too, and all of them in its argument.
    hooks = _hooks(objects)
    assert {o["metadata"]["namespace"] for o in hooks if o["kind"] == "Role"} == set(watched)
    assert not [o for o in hooks if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    job_args = _one(objects, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a,team-b,team-c" in job_args
    # The metadata admission policy is bound to exactly those namespaces.
    binding = _one(
        _render(helm, "watchNamespaces={team-a,team-b}", "admissionPolicy.enabled=true"),
        "MutatingAdmissionPolicyBinding",
    )
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]


def test_one_watch_namespace_alone_still_works_and_repeats_collapse(helm: Path) -> None:
    objects = _render(helm, "watchNamespace=team-a", "watchNamespaces={team-a}")
    args = _container(objects)["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a"]
    assert "--all-namespaces" not in args
    roles = [r for r in _operator_roles(objects) if r["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles).count("team-a") == 1


@pytest.mark.parametrize("bad", ["watchNamespaces={Team}", "watchNamespaces={a,a}"])
def test_values_schema_refuses_bad_namespace_lists(helm: Path, bad: str) -> None:
    result = run_helm(helm, "template", "rel", str(CHART_DIR), "--set", bad)
    assert result.returncode != 0
    assert "watchNamespaces" in result.stderr


# --- the admission policy -------------------------------------------------------------------


def _operators(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's objects without the named-approval policy (docs/approvals.md), which
    renders where ValidatingAdmissionPolicy is served too."""
    return [o for o in objects if "approval" not in o["metadata"]["name"]]


def _policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(_operators(objects), "ValidatingAdmissionPolicy")


def test_operator_policy_follows_the_served_api_and_the_value(helm: Path) -> None:
    assert not [o for o in _render(helm) if o["kind"] == "ValidatingAdmissionPolicy"]
    served = _render(helm, api_versions=(VAP,))
    policy = _policy(served)
    binding = _one(_operators(served), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert _operators(_render(helm, "operatorPolicy.enabled=true")) == _operators(served)
    assert not [
        o
        for o in _operators(_render(helm, "operatorPolicy.enabled=false", api_versions=(VAP,)))
        if o["kind"] == "ValidatingAdmissionPolicy"
    ]
    assert not [
        o
        for o in _operators(_render(helm, "executor=local", api_versions=(VAP,)))
        if o["kind"] == "ValidatingAdmissionPolicy"
    ]


def test_operator_policy_binds_only_the_operators_service_account(helm: Path) -> None:
    spec = _policy(_render(helm, api_versions=(VAP,)))["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConditions"] == [
        {
            "name": "operator-service-account",
            "expression": f"request.userInfo.username == '{SA_USER}'",
        }
    ]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"pods", "persistentvolumeclaims", "secrets"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    other = _policy(_render(helm, "serviceAccount.name=ops", api_versions=(VAP,), namespace="x"))
    assert other["spec"]["matchConditions"][0]["expression"].endswith(
        "'system:serviceaccount:x:ops'"
    )


def test_operator_policy_names_the_chart_workspace_image(helm: Path) -> None:
    text = str(_policy(_render(helm, "workspace.image.repository=reg.local/ws",
                                "image.tag=9.9.9", api_versions=(VAP,))))  # fmt: skip
    assert "c.image == 'reg.local/ws:9.9.9'" in text
    # The privileged overlay form is admitted only when the chart allows it.
    assert "SYS_ADMIN" not in str(_policy(_render(helm, api_versions=(VAP,))))
    allowed = _render(helm, "allowPrivilegedOverlay=true", api_versions=(VAP,))
    assert "SYS_ADMIN" in str(_policy(allowed))


# --- NetworkPolicies and the hook's labels --------------------------------------------------


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("nameOverride=ops",),
        ("fullnameOverride=ops",),
        ("podLabels.app\\.kubernetes\\.io/component=uninstall-hook",),
        ("executor=local", "watchNamespaces={team-a,team-b}"),
    ],
)
def test_hook_pod_is_not_an_operator_pod(helm: Path, sets: tuple[str, ...]) -> None:
    """``helm template``: the pre-delete Job's Pod never matches the Deployment's selector, the
    Service's, or the workspace Pods' ingress peers, whatever the names and extra Pod labels."""
    objects = _render(helm, *sets)
    deployment = _one(objects, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    operator_labels = deployment["spec"]["template"]["metadata"]["labels"]
    hook_labels = _one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    assert _matches(selector, operator_labels)
    assert not _matches(selector, hook_labels)
    assert not _matches(_one(objects, "Service")["spec"]["selector"], hook_labels)
    # The workspace Pods admit ingress from Pods with these labels: the operator's, not the hook's.
    peers = dict(p.split("=") for p in _env(objects)["SANDBOX_OPERATOR_POD_LABELS"].split(","))
    assert _matches(peers, operator_labels) and not _matches(peers, hook_labels)


def test_network_policies_of_the_operator_and_the_hook(helm: Path) -> None:
    objects = _render(helm, "watchNamespaces={team-a}")
    policies = {p["metadata"]["name"]: p["spec"] for p in objects if p["kind"] == "NetworkPolicy"}
    operator = policies["rel-sandbox-operator"]
    hook = policies["rel-sandbox-operator-pre-delete"]
    deployment = _one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    job = _one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    assert _matches(operator["podSelector"]["matchLabels"], deployment)
    assert not _matches(operator["podSelector"]["matchLabels"], job)
    assert _matches(hook["podSelector"]["matchLabels"], job)
    assert not _matches(hook["podSelector"]["matchLabels"], deployment)
    for spec in (operator, hook):
        assert spec["policyTypes"] == ["Ingress", "Egress"]
    # Ingress: the health and metrics ports only, and nothing at all to the hook.
    (ingress,) = operator["ingress"]
    assert [p["port"] for p in ingress["ports"]] == [8080, 9090]
    assert hook["ingress"] == []
    # Egress: DNS, the API server, and the agents' port on workspace Pods of team-a only.
    dns, api, agents = operator["egress"]
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert "to" not in dns
    assert [p["port"] for p in api["ports"]] == [443, 6443]
    assert [p["port"] for p in agents["ports"]] == [wire.DEFAULT_PORT]
    assert agents["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}},
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/component": "workspace",
                    "app.kubernetes.io/managed-by": "sandbox-operator",
                }
            },
        }
    ]
    assert hook["egress"] == [dns, api]
    # Narrowed API server and extra egress from values; off by value.
    narrowed = _render(
        helm,
        "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
        "networkPolicy.apiServer.ports={6443}",
        "networkPolicy.extraEgress[0].cidr=10.9.0.0/16",
        "networkPolicy.extraEgress[0].ports[0].port=5432",
    )
    spec = _one(narrowed, "NetworkPolicy", "rel-sandbox-operator")["spec"]
    assert spec["egress"][1] == {
        "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
        "ports": [{"port": 6443, "protocol": "TCP"}],
    }
    assert spec["egress"][-1] == {
        "to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}],
        "ports": [{"port": 5432, "protocol": "TCP"}],
    }
    assert not [o for o in _render(helm, "networkPolicy.enabled=false") if o["kind"] ==
                "NetworkPolicy"]  # fmt: skip


# --- the documentation ----------------------------------------------------------------------


def _doc_rows() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) rows of docs/operations.md's "Privileges" table."""
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Privileges", 1)[1].split("\n## ", 1)[0]
    rows: set[tuple[str, str, str]] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[2].startswith("`"):
            continue
        for group in re.findall(r"`([^`]+)`", cells[0]):
            for resource in re.findall(r"`([^`]+)`", cells[1]):
                for verb in re.findall(r"`([^`]+)`", cells[2]):
                    rows.add(("" if group == "core" else group, resource, verb))
    return rows


def _rendered_rows(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for role in _operator_roles(objects)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_privileges_table_in_the_docs_matches_the_rendered_roles(helm: Path) -> None:
    """Every right of the default rendering (pod executor, all namespaces, leader election) is a
    row of the table, and every row is a right of some rendering (local executor: get)."""
    default = _rendered_rows(_render(helm))
    local = _rendered_rows(_render(helm, "executor=local"))
    rows = _doc_rows()
    assert default <= rows, sorted(default - rows)
    assert rows <= default | local, sorted(rows - default - local)


# --- the agent key across an upgrade (real API server) -------------------------------------

CHART_WITH_A_HELM_MADE_KEY = "a73c93a"
"""The last commit whose chart generated the agent key itself (randAlphaNum, kept by lookup)."""


def test_an_upgrade_keeps_the_key_an_older_chart_made(
    helm: Path, local_apiserver: LocalApiServer, tmp_path: Path
) -> None:
    """A release installed by a chart that generated the key keeps that very key through
    upgrades, so live Sandboxes keep their tokens."""
    old = files_at(CHART_WITH_A_HELM_MADE_KEY, ["charts/sandbox-operator"], tmp_path)
    old = old / "charts" / "sandbox-operator"
    release = f"key{uuid.uuid4().hex[:6]}"
    namespace = f"{release}-system"
    common = ["-n", namespace, "--kubeconfig", str(local_apiserver.kubeconfig_path),
              "--set", "crds.install=false"]  # fmt: skip
    installed = run_helm(
        helm, "install", release, str(old),
        "--create-namespace", *common,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    name = f"{release}-sandbox-operator-agent-key"
    try:
        before = local_apiserver.kubectl_json("get", "secret", name, "-n", namespace)
        assert isinstance(before, dict) and before["data"]["key"]
        for _ in range(2):  # the upgrade, and one more: the key is rendered as it is, each time
            upgraded = run_helm(helm, "upgrade", release, str(CHART_DIR), *common)
            assert upgraded.returncode == 0, upgraded.stderr
            after = local_apiserver.kubectl_json("get", "secret", name, "-n", namespace)
            assert isinstance(after, dict)
            assert after["data"] == before["data"]
            assert after["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    finally:
        removed = run_helm(helm, "uninstall", release, "--no-hooks", *common[:-2])
    assert removed.returncode == 0, removed.stderr
