"""The Helm chart charts/sandbox-operator: lint, render checks, values schema, CRD copies, and
(marked ``apiserver`` by its fixture) a real ``helm install`` into the tier-2 API server.

helm comes from ``$SANDBOX_K8S_BIN`` or from ``hack/build-k8s-binaries.sh`` (which builds and
caches it with the other Kubernetes binaries).
"""

from __future__ import annotations

import json
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.apiserver.harness import LocalApiServer
from tests.support.chart import CHART_DIR, _container, _env, _one, _render
from tests.support.helm import run_helm as _run_helm

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "crds"
RUN_AS = 65532
# pyproject.toml is the one place the version is written (issue 11).
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def _release(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's own objects: without the CRDs and the pre-delete hook's objects."""
    return [
        o
        for o in objects
        if o["kind"] != "CustomResourceDefinition"
        and "helm.sh/hook" not in (o["metadata"].get("annotations") or {})
    ]


# --- static ---------------------------------------------------------------------------------


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "sandbox-operator"
    assert chart["appVersion"] == VERSION
    assert chart["version"] == VERSION


CHART_CRDS = CHART_DIR / "files" / "crds"


def test_chart_crds_equal_top_level_crds() -> None:
    """crds/ is the one source; the chart's copy (read by templates/crds.yaml) never drifts."""
    top = {p.name: p.read_bytes() for p in sorted(CRD_DIR.glob("*.yaml"))}
    chart = {p.name: p.read_bytes() for p in sorted(CHART_CRDS.glob("*.yaml"))}
    assert top, "no CRDs in crds/"
    assert chart == top, "charts/sandbox-operator/files/crds/ differs from crds/: copy them over"
    # Helm's crds/ directory would install once and never upgrade: it must not come back.
    assert not (CHART_DIR / "crds").exists()


def _schema_objects(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if schema.get("type") == "object":
        yield path or "(root)", schema
    for name, child in schema.get("properties", {}).items():
        yield from _schema_objects(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _schema_objects(schema["items"], f"{path}[]")


def test_values_schema_closes_every_object() -> None:
    """additionalProperties false everywhere, except string maps (labels, annotations, ...)."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    open_objects = [
        path
        for path, node in _schema_objects(schema)
        if node.get("additionalProperties") is not False
        and node.get("additionalProperties") != {"type": "string"}
    ]
    # A Pod affinity is passed to workspace Pods as is (the API server validates it).
    assert open_objects == [".workspace.affinity"]
    string_maps = {
        path
        for path, node in _schema_objects(schema)
        if node.get("additionalProperties") == {"type": "string"}
    }
    assert string_maps == {
        ".serviceAccount.annotations", ".metrics.service.annotations", ".podAnnotations",
        ".podLabels", ".nodeSelector", ".metrics.serviceMonitor.labels",
        ".metrics.prometheusRule.labels", ".workspace.nodeSelector",
        ".metrics.grafanaDashboard.labels", ".metrics.grafanaDashboard.annotations",
    }  # fmt: skip
    # Every key of values.yaml is declared.
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert set(values) == set(schema["properties"])


def test_chart_readme_explains_crd_upgrades() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    assert "crds.install" in readme and "helm.sh/resource-policy: keep" in readme
    assert "never upgrades" in readme
    assert "--take-ownership" in readme  # the one-time step when upgrading from the first chart


def test_dockerfile_matches_chart() -> None:
    """One image, non-root 65532, the kopf command the chart's probe expects (read, not built)."""
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in dockerfile
    assert f"USER {RUN_AS}:{RUN_AS}" in dockerfile
    assert 'pip install ".[operator]"' in dockerfile
    assert '"--liveness=http://0.0.0.0:8080/healthz"' in dockerfile
    assert '"--standalone", "--all-namespaces", "-m", "sandbox_operator.main"' in dockerfile
    assert "git rsync" in dockerfile
    assert ENTRYPOINT_TINI in dockerfile
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)
    assert not {"sandbox_core", "operator", "pyproject.toml", "README.md"} & set(ignored)


ENTRYPOINT_TINI = 'ENTRYPOINT ["/usr/bin/tini", "--"]'


# --- helm -----------------------------------------------------------------------------------


def test_helm_lint_strict(helm: Path) -> None:
    result = _run_helm(helm, "lint", "--strict", str(CHART_DIR))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_rendered_objects_and_labels(helm: Path) -> None:
    objects = _render(helm)
    kinds = sorted(o["kind"] for o in _release(objects))
    assert kinds == [
        "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment",
        "NetworkPolicy", "PodDisruptionBudget", "Role", "Role", "RoleBinding", "RoleBinding",
        "Service", "ServiceAccount",
    ]  # fmt: skip
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "sandbox-operator"
        assert labels["app.kubernetes.io/instance"] == "rel"
        assert labels["app.kubernetes.io/version"] == VERSION
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_deployment_is_hardened(helm: Path) -> None:
    objects = _render(helm)
    deployment = _one(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2  # one active through leader election: test_ha_chart.py
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "rel-sandbox-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == RUN_AS
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(objects)
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == RUN_AS
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security
    # Writable /tmp on a read-only root filesystem.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp"]] == {"name": mounts["/tmp"], "emptyDir": {}}


def test_deployment_runs_kopf_with_liveness_and_metrics(helm: Path) -> None:
    objects = _render(helm)
    container = _container(objects)
    assert "command" not in container, "the image's tini entrypoint must stay PID 1"
    assert container["args"] == [
        "kopf", "run", "--standalone", "--all-namespaces", "--module=sandbox_operator.main",
        "--liveness=http://0.0.0.0:8080/healthz",
    ]  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    probe = container["livenessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/healthz", "health")
    env = _env(objects)
    assert env["SANDBOX_OPERATOR_EXECUTOR"] == "pod"
    assert env["SANDBOX_OPERATOR_NAMESPACE"] == ""
    assert env["SANDBOX_OPERATOR_POD_NAMESPACE"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert env["SANDBOX_OPERATOR_WORKSPACE_IMAGE"] == f"cleveragents/sandbox-operator:{VERSION}"
    assert env["SANDBOX_OPERATOR_ALLOW_PRIVILEGED_OVERLAY"] == "false"
    assert env["SANDBOX_OPERATOR_METRICS_PORT"] == "9090"
    service = _one(objects, "Service")
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"
    assert service["spec"]["ports"][0]["port"] == 9090
    assert (
        service["spec"]["selector"]
        == _one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    )


def test_rbac_is_least_privilege(helm: Path) -> None:
    objects = _render(helm)
    rules = [
        rule
        for role in objects
        if role["kind"] in ("ClusterRole", "Role")
        for rule in role["rules"]
    ]
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"wildcard in {rule}"
        assert "resourceNames" not in rule or rule["resourceNames"]

    def verbs(group: str, resource: str) -> set[str]:
        return {
            verb
            for rule in rules
            if group in rule["apiGroups"] and resource in rule["resources"]
            for verb in rule["verbs"]
        }

    group = "sandbox.cleveragents.io"
    for plural in ("sandboxes", "checkpoints", "plancommits"):
        assert {"get", "list", "watch", "patch"} <= verbs(group, plural)
        assert "create" not in verbs(group, plural)
        assert {"get", "patch", "update"} == verbs(group, f"{plural}/status")
        assert verbs(group, f"{plural}/finalizers") == {"update"}
    assert {"create", "delete", "get", "list", "watch"} <= verbs("", "pods")
    # No exec into Pods, and no reading of Secrets (the kubelet hands the DSN to the workspace
    # Pod) but the operator's own agent key, by name; no deleting them (token Secrets are
    # garbage-collected with their Sandbox).
    assert not verbs("", "pods/exec")
    assert verbs("", "pods/log") == {"get"}
    assert {"create", "delete", "get"} <= verbs("", "persistentvolumeclaims")
    # patch: the renewed agent token only (the admission policy allows no other update).
    assert verbs("", "secrets") == {"create", "get", "patch"}
    (key_rule,) = [r for r in rules if "get" in r["verbs"] and "secrets" in r["resources"]]
    assert key_rule["resourceNames"] == ["rel-sandbox-operator-agent-key"]
    assert verbs("networking.k8s.io", "networkpolicies") == {"get", "create", "delete"}
    assert verbs("", "events") == {"create", "patch"}
    assert {"list", "watch"} <= verbs("apiextensions.k8s.io", "customresourcedefinitions")
    assert {"list", "watch"} <= verbs("", "namespaces")
    assert not verbs("", "configmaps")


def test_watch_namespace_restricts_binding_and_args(helm: Path) -> None:
    objects = _release(_render(helm, "watchNamespace=team-a"))
    binding = _one(objects, "RoleBinding", "rel-sandbox-operator")
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "rel-sandbox-operator",
    }
    assert _one(objects, "Role", "rel-sandbox-operator")["metadata"]["namespace"] == "team-a"
    assert binding["subjects"][0]["namespace"] == "sandbox-system"
    # Only the discovery rights (CRDs, namespaces) stay cluster-wide.
    cluster_binding = _one(objects, "ClusterRoleBinding", "rel-sandbox-operator-discovery")
    assert cluster_binding["roleRef"]["name"] == "rel-sandbox-operator-discovery"
    args = _container(objects)["args"]
    assert "--namespace=team-a" in args
    assert "--all-namespaces" not in args
    assert _env(objects)["SANDBOX_OPERATOR_NAMESPACE"] == "team-a"


def test_values_toggle_objects_and_env(helm: Path) -> None:
    objects = _render(
        helm,
        "rbac.create=false",
        "serviceAccount.create=false",
        "serviceAccount.name=existing-sa",
        "metrics.enabled=false",
        "allowPrivilegedOverlay=true",
        "workspace.image.repository=registry.local/workspace",
        "image.tag=1.2.3",
    )
    assert sorted(o["kind"] for o in _release(objects)) == [
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
    ]
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    # The hook then runs as the operator's ServiceAccount (no RBAC objects of its own).
    hook = _one(objects, "Job")["spec"]["template"]["spec"]
    assert hook["serviceAccountName"] == "existing-sa"
    assert pod["serviceAccountName"] == "existing-sa"
    env = _env(objects)
    assert env["SANDBOX_OPERATOR_METRICS_PORT"] == "0"
    assert env["SANDBOX_OPERATOR_ALLOW_PRIVILEGED_OVERLAY"] == "true"
    assert env["SANDBOX_OPERATOR_WORKSPACE_IMAGE"] == "registry.local/workspace:1.2.3"
    assert _container(objects)["image"] == "cleveragents/sandbox-operator:1.2.3"
    assert {p["name"] for p in _container(objects)["ports"]} == {"health"}


def test_the_warm_pool_is_off_by_default_and_sized_by_a_value(helm: Path) -> None:
    env = _env(_render(helm))
    assert env["SANDBOX_OPERATOR_WARM_POOL_SIZE"] == "0"
    assert env["SANDBOX_OPERATOR_WARM_POOL_NAMESPACES"] == ""
    assert env["SANDBOX_OPERATOR_WARM_POOL_SOURCE_CLAIMS"] == ""
    on = _env(
        _render(
            helm,
            "workspace.warmPool.size=3",
            "workspace.warmPool.namespaces={team-a,team-b}",
            "workspace.warmPool.sourceClaims={shared-repo}",
        )
    )
    assert on["SANDBOX_OPERATOR_WARM_POOL_SIZE"] == "3"
    assert on["SANDBOX_OPERATOR_WARM_POOL_NAMESPACES"] == "team-a,team-b"
    assert on["SANDBOX_OPERATOR_WARM_POOL_SOURCE_CLAIMS"] == "shared-repo"
    refused = _run_helm(
        helm, "template", "rel", str(CHART_DIR), "--set", "workspace.warmPool.size=-1"
    )
    assert refused.returncode != 0 and "/workspace/warmPool/size" in refused.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("foo=bar", "additional properties 'foo' not allowed"),
        ("image.foo=bar", "additional properties 'foo' not allowed"),
        ("metrics.service.foo=bar", "additional properties 'foo' not allowed"),
        ("executor=remote", "at '/executor': value must be one of 'pod', 'local'"),
        ("logFormat=xml", "at '/logFormat': value must be one of 'json', 'plain'"),
        ("metrics.port=70000", "at '/metrics/port': maximum: got 70,000, want 65,535"),
        ("admissionPolicy.enabled=maybe", "at '/admissionPolicy/enabled': value must be one of"),
    ],
)
def test_values_schema_rejects_bad_values(helm: Path, setting: str, message: str) -> None:
    result = _run_helm(helm, "template", "rel", str(CHART_DIR), "--set", setting)
    assert result.returncode != 0
    assert message in result.stderr
    assert "values don't meet the specifications of the schema" in result.stderr


MAP_V1 = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
MAP_V1BETA1 = "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"


@pytest.mark.parametrize(
    ("setting", "served", "expected"),
    [
        (None, (MAP_V1,), None),  # off by default: a server-side apply can drop what it sets
        ("auto", (), None),  # the cluster serves no MutatingAdmissionPolicy
        ("auto", (MAP_V1BETA1,), "admissionregistration.k8s.io/v1beta1"),
        ("auto", (MAP_V1, MAP_V1BETA1), "admissionregistration.k8s.io/v1"),
        ("true", (), "admissionregistration.k8s.io/v1beta1"),
        ("true", (MAP_V1,), "admissionregistration.k8s.io/v1"),
        ("false", (MAP_V1,), None),
    ],
)
def test_admission_policy_follows_the_value_and_the_served_api(
    helm: Path, setting: str | None, served: tuple[str, ...], expected: str | None
) -> None:
    """Issue 11, throughput: the operator's metadata at admission when asked and possible."""
    sets = () if setting is None else (f"admissionPolicy.enabled={setting}",)
    objects = _render(helm, *sets, api_versions=served)
    kinds = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    found = [o for o in objects if o["kind"] in kinds and "-metadata" in o["metadata"]["name"]]
    if expected is None:
        assert found == []
        return
    policy, binding = _one(found, kinds[0]), _one(found, kinds[1])
    assert {policy["apiVersion"], binding["apiVersion"]} == {expected}
    name = "rel-sandbox-operator-metadata"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == name
    assert "matchResources" not in binding["spec"]  # every namespace: the operator watches all
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE"]
    assert sorted(rule["resources"]) == ["checkpoints", "plancommits", "sandboxes"]
    assert policy["spec"]["failurePolicy"] == "Ignore"  # the operator still PATCHes what is missing


def test_admission_policy_is_bound_to_the_watched_namespace(helm: Path) -> None:
    objects = _render(helm, "admissionPolicy.enabled=true", "watchNamespace=team-a")
    binding = _one(objects, "MutatingAdmissionPolicyBinding")
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}
        ]
    }


def test_admission_policy_name_keeps_its_suffix_for_long_releases(helm: Path) -> None:
    release = "r" * 50
    result = _run_helm(
        helm, "template", release, str(CHART_DIR), "--set", "admissionPolicy.enabled=true"
    )
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    for kind in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"):
        name = _one(objects, kind)["metadata"]["name"]
        assert name.endswith("-metadata") and len(name) <= 63, name
        assert name != _one(objects, "Deployment")["metadata"]["name"]


def test_crds_are_templated_from_the_one_source_and_kept_on_uninstall(helm: Path) -> None:
    """crds.install renders every CRD of crds/ (same spec), labelled and annotated keep."""
    rendered = {
        o["metadata"]["name"]: o for o in _render(helm) if o["kind"] == "CustomResourceDefinition"
    }
    sources = [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]
    assert set(rendered) == {crd["metadata"]["name"] for crd in sources}
    for source in sources:
        crd = rendered[source["metadata"]["name"]]
        assert crd["spec"] == source["spec"]
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert source["metadata"]["labels"].items() <= crd["metadata"]["labels"].items()
    unkept = [
        o for o in _render(helm, "crds.keep=false") if o["kind"] == "CustomResourceDefinition"
    ]
    assert unkept and all("annotations" not in o["metadata"] for o in unkept)
    assert not [
        o for o in _render(helm, "crds.install=false") if o["kind"] == "CustomResourceDefinition"
    ]


def test_pre_delete_hook_job_and_its_least_privilege_rbac(helm: Path) -> None:
    """Case 19: a pre-delete Job (operator image, own ServiceAccount) deletes the custom objects
    and waits for their finalizers; its role may list and delete those three kinds, nothing else."""
    objects = _render(helm, "uninstall.timeoutSeconds=120")
    hooks = [o for o in objects if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")]
    assert {o["kind"] for o in hooks} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "NetworkPolicy",
        "Job",
    }
    for hook in hooks:
        annotations = hook["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    job = _one(hooks, "Job")
    assert int(job["metadata"]["annotations"]["helm.sh/hook-weight"]) > max(
        int(h["metadata"]["annotations"]["helm.sh/hook-weight"]) for h in hooks if h is not job
    )  # RBAC first, then the Job
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == _container(objects)["image"]  # the operator image
    assert container["args"] == [
        "python", "-m", "sandbox_operator.uninstall", "--namespace=", "--timeout-seconds=120",
    ]  # fmt: skip
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == _one(hooks, "ServiceAccount")["metadata"]["name"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (rule,) = _one(hooks, "ClusterRole")["rules"]
    assert rule == {
        "apiGroups": ["sandbox.cleveragents.io"],
        "resources": ["sandboxes", "checkpoints", "plancommits"],
        "verbs": ["get", "list", "delete"],
    }
    scoped = _render(helm, "watchNamespace=team-a")
    job = _one(scoped, "Job")
    assert "--namespace=team-a" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    binding = [
        o for o in scoped if o["kind"] == "RoleBinding" and "pre-delete" in o["metadata"]["name"]
    ]
    assert binding and binding[0]["metadata"]["namespace"] == "team-a"
    assert binding[0]["roleRef"]["kind"] == "Role"
    assert not [
        o for o in _render(helm, "uninstall.deleteCustomResources=false") if o["kind"] == "Job"
    ]


# --- real API server ------------------------------------------------------------------------


def test_helm_install_into_real_apiserver(
    helm: Path,
    local_apiserver: LocalApiServer,
) -> None:
    release = f"sbxop-{uuid.uuid4().hex[:6]}"
    namespace = f"{release}-system"
    # Other tests of the session applied crds/ by hand: --take-ownership adopts them (the
    # documented step for CRDs that Helm did not create).
    result = _run_helm(
        helm, "install", release, str(CHART_DIR), "--namespace", namespace, "--create-namespace",
        "--take-ownership", "--kubeconfig", str(local_apiserver.kubeconfig_path),
        "--set", "admissionPolicy.enabled=auto",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    try:
        _check_installed(local_apiserver, release, namespace, result.stdout)
    finally:
        # No kubelet on this tier: the pre-delete hook Job cannot run, so it is skipped here
        # (its logic runs against this server in tests/operator/apiserver/test_deletion.py).
        # Always uninstalled: the release's admission policy binds every namespace of the
        # server the other tests share.
        uninstall = _run_helm(
            helm, "uninstall", release, "--namespace", namespace, "--no-hooks",
            "--kubeconfig", str(local_apiserver.kubeconfig_path),
        )  # fmt: skip
    assert uninstall.returncode == 0, uninstall.stderr
    policy = f"{release}-sandbox-operator-metadata"
    gone = local_apiserver.kubectl("get", "mutatingadmissionpolicy", policy)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    # helm.sh/resource-policy: keep: the CRDs (and so every object) stay (chart README).
    crd = local_apiserver.kubectl_json("get", "crd", "sandboxes.sandbox.cleveragents.io")
    assert isinstance(crd, dict)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def _check_installed(server: LocalApiServer, release: str, namespace: str, notes: str) -> None:
    assert "STATUS: deployed" in notes
    assert "kubectl wait --for=condition=Finished" in notes  # NOTES.txt
    fullname = f"{release}-sandbox-operator"
    for args in (
        ("get", "deployment", fullname, "-n", namespace),
        ("get", "serviceaccount", fullname, "-n", namespace),
        ("get", "service", f"{fullname}-metrics", "-n", namespace),
        ("get", "clusterrole", fullname),
        ("get", "clusterrole", f"{fullname}-discovery"),
        ("get", "clusterrolebinding", fullname),
        ("get", "clusterrolebinding", f"{fullname}-discovery"),
        # admissionPolicy.enabled=auto and this server serves the API: the policy is installed
        # and the API server accepted it as rendered.
        ("get", "mutatingadmissionpolicy", f"{fullname}-metadata"),
        ("get", "mutatingadmissionpolicybinding", f"{fullname}-metadata"),
    ):
        got = server.kubectl(*args)
        assert got.returncode == 0, got.stderr
    for plural in ("sandboxes", "checkpoints", "plancommits"):
        crd = server.kubectl("get", "crd", f"{plural}.sandbox.cleveragents.io")
        assert crd.returncode == 0, crd.stderr
    # The API server accepted the hardened pod template as rendered.
    deployment = server.kubectl_json("get", "deployment", fullname, "-n", namespace)
    assert isinstance(deployment, dict)
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    # The operator's ServiceAccount may do what it needs, and no more (RBAC evaluated for real).
    subject = f"system:serviceaccount:{namespace}:{fullname}"
    for verb_resource, expected in (
        (("patch", "sandboxes.sandbox.cleveragents.io/status"), "yes"),
        # kubectl reads "pods/exec" as pod "exec": the subresource needs --subresource.
        (("create", "pods", "--subresource=exec"), "no"),
        (("get", "secrets"), "no"),
        (("list", "secrets"), "no"),
        (("watch", "secrets"), "no"),
        (("create", "secrets"), "yes"),
        (("create", "networkpolicies.networking.k8s.io"), "yes"),
        (("delete", "namespaces"), "no"),
        (("create", "sandboxes.sandbox.cleveragents.io"), "no"),
    ):
        verb, resource, *extra = verb_resource
        answer = server.kubectl(
            "auth", "can-i", verb, resource, *extra, "--as", subject, "-n", "default"
        )
        listing = server.kubectl("auth", "can-i", "--list", "--as", subject).stdout
        assert answer.stdout.strip() == expected, f"can-i {verb} {resource}: {listing}"
