"""The operator's privileges proven by the real API server (tier 2): RBAC and admission.

The chart's ServiceAccount, roles and admission policy (``helm template`` of
``serviceaccount.yaml``, ``rbac.yaml``, ``leader-election-rbac.yaml`` and
``operator-policy.yaml``) are applied as rendered; then the API server is asked, as the
operator's ServiceAccount (``kubectl auth can-i --as`` and impersonated requests), what it may
do:

- RBAC: no Secret may be deleted, listed or read anywhere (but the agent key, by name), and the
  one update (patch) admitted is a renewed token in an agent-token Secret; with
  ``watchNamespaces`` nothing reaches a namespace outside them (no Pod created there);
- admission (the ValidatingAdmissionPolicy, evaluated for real by a server-side dry run): the
  workspace Pod, token Secret and scratch claim the operator's own builders make pass; a Pod of
  any other shape, any other Secret or claim, and a delete of what it did not make are refused;
  the same requests from another identity are not the policy's business;
- the agent key: the operator makes it with exactly these rights, and reads the same key back.
"""

from __future__ import annotations

import copy
import json
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.agent_keys import load_or_create
from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.executors.pod_manifests import (
    build_scratch_pvc,
    build_token_secret,
    build_workspace_pod,
    child_name,
)
from sandbox_operator.executors.warm_pool import (
    POOL_LABEL,
    bootstrap_secret,
    build_pool_pod,
    shape_of,
)
from sandbox_operator.kube.api import adopt
from sandbox_operator.settings import Settings

from sandbox_api.models import SandboxOptions, SandboxSource, WorkspaceSpec
from tests.support.apiserver.harness import LocalApiServer
from tests.support.chart import CHART_DIR
from tests.support.helm import run_helm
from tests.support.operator import install_crds, wait_for

TEMPLATES = (
    "templates/serviceaccount.yaml",
    "templates/rbac.yaml",
    "templates/leader-election-rbac.yaml",
    "templates/operator-policy.yaml",
)
VERSION = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())[
    "project"
]["version"]
IMAGE = f"cleveragents/sandbox-operator:{VERSION}"
# The Localhost seccomp profile of workspace Pods (chart workspace.seccompProfile).
PROFILE = "sandbox-operator/sandbox-workspace.json"


@dataclass
class Release:
    """The chart's privilege objects of one release, applied to the API server."""

    server: LocalApiServer
    name: str
    namespace: str
    watched: tuple[str, ...]
    other: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-sandbox-operator"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"

    def can(self, verb: str, resource: str, namespace: str | None, *extra: str) -> bool:
        scope = ["--all-namespaces"] if namespace is None else ["-n", namespace]
        answer = self.server.kubectl(
            "auth", "can-i", verb, resource, *extra, "--as", self.user, *scope
        )
        assert answer.stdout.strip() in ("yes", "no"), answer.stderr
        return answer.stdout.strip() == "yes"

    def dry_run(self, manifest: dict[str, Any], *, as_operator: bool = True) -> str:
        """A server-side dry-run create of ``manifest`` (as the operator): "" when admitted,
        else the API server's refusal."""
        who = ["--as", self.user] if as_operator else []
        result = self.server.kubectl(
            "create", "--dry-run=server", "-o", "name", "-f", "-", *who,
            "-n", manifest["metadata"]["namespace"], input=json.dumps(manifest),
        )  # fmt: skip
        return "" if result.returncode == 0 else result.stderr


def _render(server: LocalApiServer, release: str, namespace: str, *sets: str) -> str:
    args = ["template", release, str(CHART_DIR), "--namespace", namespace]
    for template in TEMPLATES:
        args += ["--show-only", template]
    for item in ("operatorPolicy.enabled=true", *sets):
        args += ["--set", item]
    result = run_helm(server.bin_dir / "helm", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _install(server: LocalApiServer, watch: bool, *extra: str) -> Iterator[Release]:
    name = f"lp{uuid.uuid4().hex[:6]}"
    release = Release(
        server,
        name,
        f"{name}-system",
        (f"{name}-a", f"{name}-b") if watch else (),
        f"{name}-other",
    )
    install_crds(server)
    namespaces = [release.namespace, *release.watched, release.other]
    for namespace in namespaces:
        server.kubectl("create", "namespace", namespace, check=True)
    sets = [f"watchNamespaces={{{','.join(release.watched)}}}"] if watch else []
    manifest = _render(server, name, release.namespace, *sets, *extra)
    server.kubectl("apply", "-f", "-", input=manifest, check=True)
    # The policy is compiled asynchronously: wait until it refuses a bare Pod.
    bare = _bare_pod(release.watched[0] if watch else release.other)
    wait_for(lambda: release.dry_run(bare) != "", 60, "the operator policy in effect")
    try:
        yield release
    finally:
        server.kubectl("delete", "-f", "-", "--wait=false", input=manifest)
        for namespace in namespaces:
            server.kubectl("delete", "namespace", namespace, "--wait=false")


@pytest.fixture(scope="module")
def watched(local_apiserver: LocalApiServer) -> Iterator[Release]:
    """A release watching two namespaces (``watchNamespaces``)."""
    yield from _install(local_apiserver, watch=True)


@pytest.fixture(scope="module")
def everywhere(local_apiserver: LocalApiServer) -> Iterator[Release]:
    """A release watching every namespace (the default)."""
    yield from _install(local_apiserver, watch=False)


@pytest.fixture(scope="module")
def privileged(local_apiserver: LocalApiServer) -> Iterator[Release]:
    """A release with ``allowPrivilegedOverlay=true``."""
    yield from _install(local_apiserver, True, "allowPrivilegedOverlay=true")


@pytest.fixture(scope="module")
def jailed(local_apiserver: LocalApiServer) -> Iterator[Release]:
    """A release whose workspace Pods use the chart's Localhost seccomp profile."""
    yield from _install(local_apiserver, True, "workspace.seccompProfile.type=Localhost")


# --- RBAC -------------------------------------------------------------------------------------


def test_no_secret_can_be_deleted_listed_or_read_anywhere(
    watched: Release, everywhere: Release
) -> None:
    for release in (watched, everywhere):
        for namespace in (*release.watched, release.other, release.namespace, "default", None):
            for verb in ("delete", "deletecollection", "list", "watch", "get", "update"):
                assert not release.can(verb, "secrets", namespace), (verb, namespace)
        # patch (a token's renewal, bounded by the admission policy) only where it watches.
        for namespace in (release.other, release.namespace, "default"):
            assert release.can("patch", "secrets", namespace) == (not release.watched)
        # Only the agent key, by name, in the operator's own namespace.
        key = f"secrets/{release.fullname}-agent-key"
        assert release.can("get", key, release.namespace)
        assert not release.can("delete", key, release.namespace)
        assert not release.can("get", "secrets/other", release.namespace)


def test_watched_namespaces_bound_every_right_on_pods_claims_and_secrets(
    watched: Release,
) -> None:
    for namespace in watched.watched:
        assert watched.can("create", "pods", namespace)
        assert watched.can("delete", "pods", namespace)
        assert watched.can("create", "secrets", namespace)
        assert watched.can("create", "persistentvolumeclaims", namespace)
        assert watched.can("list", "sandboxes.sandbox.cleveragents.io", namespace)
    for namespace in (watched.other, "default", "kube-system"):
        for verb, resource in (
            ("create", "pods"),
            ("delete", "pods"),
            ("list", "pods"),
            ("create", "secrets"),
            ("create", "persistentvolumeclaims"),
            ("delete", "persistentvolumeclaims"),
            ("create", "networkpolicies.networking.k8s.io"),
            ("list", "sandboxes.sandbox.cleveragents.io"),
        ):
            assert not watched.can(verb, resource, namespace), (verb, resource, namespace)
    # Nothing on pods cluster-wide; its own namespace holds only the key and the Lease.
    assert not watched.can("create", "pods", None)
    assert not watched.can("list", "pods", None)
    assert not watched.can("create", "pods", watched.namespace)
    assert not watched.can("create", "pods", "default", "--subresource=exec")
    # kopf's discovery stays cluster-wide (read only).
    assert watched.can("list", "customresourcedefinitions.apiextensions.k8s.io", None)
    assert not watched.can("delete", "namespaces", None)


def test_the_default_release_may_create_pods_everywhere_but_delete_no_secret(
    everywhere: Release,
) -> None:
    assert everywhere.can("create", "pods", None)
    assert everywhere.can("create", "secrets", None)
    assert not everywhere.can("delete", "secrets", None)
    assert not everywhere.can("create", "pods", "default", "--subresource=exec")


# --- admission --------------------------------------------------------------------------------


def _target(namespace: str, name: str = "s1", uid: str | None = None) -> SandboxTarget:
    uid = uid or str(uuid.uuid4())
    return SandboxTarget(
        name=name,
        namespace=namespace,
        uid=uid,
        sandbox_id="01HZX0A7Q3J0F8K2M4N6P8R0T2",
        plan_id="plan-a",
        resource_id="r",
        strategy="git_worktree",
        original="/workspace/source/repo",
        source=SandboxSource.model_validate(
            {"persistentVolumeClaim": {"claimName": "data", "subPath": "repo"}}
        ),
        options=SandboxOptions(),
    )


def _owner(target: SandboxTarget) -> dict[str, Any]:
    return {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": target.name, "namespace": target.namespace, "uid": target.uid},
    }


def _adopted(manifest: dict[str, Any], target: SandboxTarget) -> dict[str, Any]:
    adopt(manifest, _owner(target))
    return manifest


def _workspace_pod(namespace: str, **settings: Any) -> dict[str, Any]:
    """The workspace Pod exactly as the operator builds it (pod_manifests)."""
    target = _target(namespace)
    built = build_workspace_pod(
        target, Settings(workspace_image=IMAGE, **settings), child_name(target, "scratch")
    )
    return _adopted(built, target)


def _bare_pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "another image": lambda p: p["spec"]["containers"][0].update(image="evil.example/sh:1"),
    "another command": lambda p: p["spec"]["containers"][0].update(command=["sh", "-c", "id"]),
    "arguments": lambda p: p["spec"]["containers"][0].update(args=["--debug"]),
    "a second container": lambda p: p["spec"]["containers"].append(
        {**copy.deepcopy(p["spec"]["containers"][0]), "name": "second"}
    ),
    "an init container": lambda p: p["spec"].update(
        initContainers=[{"name": "init", "image": IMAGE, "command": ["sh", "-c", "id"]}]
    ),
    "a service-account token": lambda p: p["spec"].update(automountServiceAccountToken=True),
    "another service account": lambda p: p["spec"].update(serviceAccountName="admin"),
    "a hostPath volume": lambda p: p["spec"]["volumes"].append(
        {"name": "host", "hostPath": {"path": "/"}}
    ),
    "another Secret": lambda p: p["spec"]["volumes"].append(
        {"name": "other", "secret": {"secretName": "db-credentials"}}
    ),
    # The default account named (the admission of a real cluster names it): only the volume
    # is wrong.
    "a projected token": lambda p: (
        p["spec"].update(serviceAccountName="default"),
        p["spec"]["volumes"].append(
            {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
        ),
    ),
    "the host network": lambda p: p["spec"].update(hostNetwork=True),
    "the host PID namespace": lambda p: p["spec"].update(hostPID=True),
    "a host port": lambda p: p["spec"]["containers"][0]["ports"][0].update(hostPort=8471),
    "privileged": lambda p: p["spec"]["containers"][0]["securityContext"].update(
        privileged=True, allowPrivilegeEscalation=True
    ),
    "root": lambda p: p["spec"]["securityContext"].update(runAsNonRoot=False, runAsUser=0),
    "an added capability": lambda p: p["spec"]["containers"][0]["securityContext"].update(
        capabilities={"drop": ["ALL"], "add": ["NET_ADMIN"]}
    ),
    "no seccomp profile": lambda p: p["spec"]["securityContext"].pop("seccompProfile"),
    "an Unconfined seccomp profile": lambda p: p["spec"]["securityContext"].update(
        seccompProfile={"type": "Unconfined"}
    ),
    "a Localhost profile the chart did not name": lambda p: p["spec"]["securityContext"].update(
        seccompProfile={"type": "Localhost", "localhostProfile": PROFILE}
    ),
    "a container's own seccomp profile": lambda p: p["spec"]["containers"][0][
        "securityContext"
    ].update(seccompProfile={"type": "Unconfined"}),
    "a writable root": lambda p: p["spec"]["containers"][0]["securityContext"].update(
        readOnlyRootFilesystem=False
    ),
    "no workspace label": lambda p: p["metadata"]["labels"].pop("app.kubernetes.io/component"),
    "no owner": lambda p: p["metadata"].pop("ownerReferences"),
    "another owner uid": lambda p: p["metadata"]["ownerReferences"][0].update(
        uid=str(uuid.uuid4())
    ),
}


def test_a_workspace_pod_as_the_operator_builds_it_is_admitted(watched: Release) -> None:
    namespace = watched.watched[0]
    assert watched.dry_run(_workspace_pod(namespace)) == ""
    # A transaction_rollback Pod reads its DSN through secretKeyRef: admitted too.
    target = replace(
        _target(namespace),
        strategy="transaction_rollback",
        source=SandboxSource.model_validate({"secretRef": {"name": "db", "key": "dsn"}}),
    )
    pod = _adopted(build_workspace_pod(target, Settings(workspace_image=IMAGE), None), target)
    assert watched.dry_run(pod) == ""


WORKSPACE = {
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [
                            {"key": "pool", "operator": "In", "values": ["sandboxes"]}
                        ]
                    },
                }
            ]
        }
    },
    "imagePullSecrets": [{"name": "regcred"}],
}


@pytest.mark.parametrize("strategy", ["git_worktree", "copy_on_write", "overlay", "none"])
def test_workspace_pods_of_every_strategy_and_shape_are_admitted(
    watched: Release, strategy: str
) -> None:
    """Whatever a Sandbox's spec.workspace asks (resources, scheduling, pull secrets), the Pod
    the operator builds stays inside the policy."""
    target = replace(
        _target(watched.watched[1]),
        strategy=strategy,
        workspace=WorkspaceSpec.model_validate(WORKSPACE),
    )
    pod = build_workspace_pod(target, Settings(workspace_image=IMAGE), child_name(target, "s"))
    assert watched.dry_run(_adopted(pod, target)) == ""


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_any_other_pod_from_the_operator_is_refused(watched: Release, mutation: str) -> None:
    pod = _workspace_pod(watched.watched[0])
    MUTATIONS[mutation](pod)
    refusal = watched.dry_run(pod)
    assert "ValidatingAdmissionPolicy" in refusal and f"{watched.fullname}-operator" in refusal, (
        refusal or "admitted"
    )
    # The policy binds the operator's ServiceAccount only: the administrator may.
    assert watched.dry_run(pod, as_operator=False) == ""


def test_a_privileged_overlay_pod_is_refused_unless_the_chart_allows_it(
    watched: Release, privileged: Release
) -> None:
    target = _target(watched.watched[0])
    target = replace(target, strategy="overlay")
    settings = Settings(workspace_image=IMAGE, allow_privileged_overlay=True)
    pod = _adopted(build_workspace_pod(target, settings, "scratch"), target)
    assert pod["spec"]["containers"][0]["securityContext"]["privileged"] is True
    assert "restricted Pod Security profile" in watched.dry_run(pod)
    # Where the chart allows it, exactly that Pod passes; with another capability it does not.
    pod["metadata"]["namespace"] = privileged.watched[0]
    assert privileged.dry_run(pod) == ""
    pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"].append("NET_ADMIN")
    assert "restricted Pod Security profile" in privileged.dry_run(pod)


def test_the_localhost_profile_the_chart_names_is_admitted_and_no_other(jailed: Release) -> None:
    """With workspace.seccompProfile Localhost, the Pods the operator builds (a Sandbox's and a
    pool's) carry exactly that profile and pass; Unconfined, another Localhost file, a
    container's own profile and the other mutations still do not."""
    namespace = jailed.watched[0]
    pod = _workspace_pod(namespace, workspace_seccomp_profile=PROFILE)
    assert pod["spec"]["securityContext"]["seccompProfile"]["localhostProfile"] == PROFILE
    assert jailed.dry_run(pod) == ""
    assert jailed.dry_run(_workspace_pod(namespace)) == ""  # RuntimeDefault stays admitted
    jailed_settings = Settings(workspace_image=IMAGE, workspace_seccomp_profile=PROFILE)
    boot = bootstrap_secret(POOL_KEY, namespace, shape_of(jailed_settings))["metadata"]["name"]
    pool = build_pool_pod(namespace, jailed_settings, bootstrap=boot)
    pool["metadata"].pop("generateName", None)
    pool["metadata"]["name"] = "sbx-pool-jailed"
    assert jailed.dry_run(pool) == ""
    refused = {
        "Unconfined": {"type": "Unconfined"},
        "another file": {"type": "Localhost", "localhostProfile": "sandbox-operator/other.json"},
        "a prefix of it": {"type": "Localhost", "localhostProfile": "sandbox-operator"},
    }
    for why, profile in refused.items():
        bad = _workspace_pod(namespace, workspace_seccomp_profile=PROFILE)
        bad["spec"]["securityContext"]["seccompProfile"] = profile
        assert "restricted Pod Security profile" in jailed.dry_run(bad), why
    for mutation in (
        "a container's own seccomp profile", "privileged", "an added capability", "root",
    ):  # fmt: skip
        bad = _workspace_pod(namespace, workspace_seccomp_profile=PROFILE)
        MUTATIONS[mutation](bad)
        assert "ValidatingAdmissionPolicy" in jailed.dry_run(bad), mutation


def test_in_every_namespace_mode_the_policy_still_refuses_other_pods(everywhere: Release) -> None:
    for namespace in (everywhere.other, "default"):
        assert everywhere.dry_run(_workspace_pod(namespace)) == ""
        refusal = everywhere.dry_run(_bare_pod(namespace))
        assert "a Pod of the sandbox operator must be a workspace Pod" in refusal, refusal


def test_only_token_secrets_and_the_agent_key_may_be_created(watched: Release) -> None:
    namespace = watched.watched[0]
    target = _target(namespace)
    token = _adopted(build_token_secret(target, "t" * 64), target)
    assert watched.dry_run(token) == ""
    unowned = build_token_secret(target, "t" * 64)
    assert "may create only agent-token Secrets" in watched.dry_run(unowned)
    extra_key = copy.deepcopy(token)
    extra_key["stringData"]["tls.key"] = "x"
    assert "may create only agent-token Secrets" in watched.dry_run(extra_key)
    sa_token = copy.deepcopy(token)
    sa_token["type"] = "kubernetes.io/service-account-token"
    sa_token["metadata"]["annotations"] = {"kubernetes.io/service-account.name": "default"}
    sa_token.pop("stringData")
    assert "may create only agent-token Secrets" in watched.dry_run(sa_token)
    key = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{watched.fullname}-agent-key", "namespace": watched.namespace},
        "stringData": {"key": "k"},
    }
    assert watched.dry_run(key) == ""
    key["metadata"]["name"] = "something-else"
    assert "may create only agent-token Secrets" in watched.dry_run(key)
    # A warm pool's bootstrap-token Secret: its pool's label and name, no owner, key token.
    boot = bootstrap_secret(POOL_KEY, namespace, "0123456789abcdef")
    assert watched.dry_run(boot) == ""
    misnamed = copy.deepcopy(boot)
    misnamed["metadata"]["name"] = "sbx-pool-fedcba9876543210-x-boot"
    more = copy.deepcopy(boot)
    more["stringData"]["ca.crt"] = "x"
    for refused in (misnamed, more):
        assert "may create only agent-token Secrets" in watched.dry_run(refused)


def _patch_secret(release: Release, namespace: str, name: str, patch: dict[str, Any]) -> str:
    """A server-side dry-run merge patch of Secret ``name`` as the operator (impersonated; a
    patch is all it sends, no get): "" when admitted, else the API server's refusal."""
    core = _core_as(release.server, release.user)
    try:
        core.patch_namespaced_secret(name, namespace, patch, dry_run="All")
    except ApiException as exc:
        return str(exc.body)
    return ""


def test_only_the_token_of_a_token_secret_may_be_renewed(watched: Release) -> None:
    namespace = watched.watched[0]
    target = _target(namespace, name=f"renew-{uuid.uuid4().hex[:6]}")
    token = _adopted(build_token_secret(target, "t" * 64), target)
    watched.server.kubectl("create", "-f", "-", input=json.dumps(token), check=True)
    name = token["metadata"]["name"]
    other = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": f"db-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "stringData": {"token": "the application's"},
    }  # fmt: skip
    watched.server.kubectl("create", "-f", "-", input=json.dumps(other), check=True)
    # RBAC gives patch (the renewal) and nothing else that changes a Secret.
    assert watched.can("patch", "secrets", namespace)
    assert not watched.can("update", "secrets", namespace)
    assert not watched.can("delete", "secrets", namespace)
    # A new token is admitted.
    assert _patch_secret(watched, namespace, name, {"stringData": {"token": "u" * 64}}) == ""
    # Anything else in that Secret, and any other Secret, is refused by the policy.
    refusals = [
        _patch_secret(watched, namespace, name, {"stringData": {"tls.key": "x"}}),
        _patch_secret(watched, namespace, name, {"metadata": {"labels": {"extra": "x"}}}),
        _patch_secret(watched, namespace, name, {"metadata": {"ownerReferences": None}}),
        _patch_secret(watched, namespace, other["metadata"]["name"], {"stringData": {"t": "x"}}),
    ]
    for refusal in refusals:
        assert "updates only the token of a Sandbox's agent-token Secret" in refusal, refusal
    # The administrator is not the policy's business.
    admin = watched.server.kubectl(
        "patch", "secret", other["metadata"]["name"], "-n", namespace, "--type=merge",
        "--dry-run=server", "-p", json.dumps({"stringData": {"token": "x"}}),
    )  # fmt: skip
    assert admin.returncode == 0, admin.stderr
    # Outside the watched namespaces RBAC refuses before any policy.
    assert "forbidden" in _patch_secret(watched, watched.other, name, {"stringData": {}}).lower()


def test_only_scratch_claims_may_be_created(watched: Release) -> None:
    target = _target(watched.watched[0])
    claim = _adopted(build_scratch_pvc(target, "1Gi"), target)
    assert watched.dry_run(claim) == ""
    stolen = copy.deepcopy(claim)
    stolen["spec"]["volumeName"] = "pv-of-another-team"
    assert "may create only scratch claims" in watched.dry_run(stolen)
    unlabelled = copy.deepcopy(claim)
    unlabelled["metadata"]["labels"] = {}
    assert "may create only scratch claims" in watched.dry_run(unlabelled)


def test_only_what_the_operator_made_may_be_deleted_or_changed(watched: Release) -> None:
    namespace = watched.watched[0]
    server = watched.server
    bystander = _bare_pod(namespace)
    bystander["metadata"]["name"] = "bystander"
    workspace = _workspace_pod(namespace)
    for pod in (bystander, workspace):
        server.kubectl("create", "-f", "-", input=json.dumps(pod), check=True)
    try:
        refused = server.kubectl(
            "delete", "pod", "bystander", "--dry-run=server", "-n", namespace,
            "--as", watched.user,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "may delete only pods it made" in refused.stderr
        allowed = server.kubectl(
            "delete", "pod", workspace["metadata"]["name"], "--dry-run=server", "-n", namespace,
            "--as", watched.user,
        )  # fmt: skip
        assert allowed.returncode == 0, allowed.stderr
        # Updates: a label on its workspace Pod passes; another image does not.
        ws = workspace["metadata"]["name"]
        labelled = server.kubectl(
            "label", "pod", ws, "seen=yes", "--dry-run=server", "-n", namespace,
            "--as", watched.user,
        )  # fmt: skip
        assert labelled.returncode == 0, labelled.stderr
        swapped = server.kubectl(
            "set", "image", f"pod/{ws}", "workspace=evil.example/sh:1", "--dry-run=server",
            "-n", namespace, "--as", watched.user,
        )  # fmt: skip
        assert "workspace agent of the chart's workspace image" in swapped.stderr
        # Nor may it label a Pod it did not make.
        other = server.kubectl(
            "label", "pod", "bystander", "seen=yes", "--dry-run=server", "-n", namespace,
            "--as", watched.user,
        )  # fmt: skip
        assert "must be a workspace Pod" in other.stderr
    finally:
        server.kubectl("delete", "pod", "--all", "-n", namespace, "--wait=false")


POOL_KEY = b"k" * 64


def _pool_pod(namespace: str, name: str = "pool-a", claim: str = "") -> dict[str, Any]:
    """A free warm-pool Pod exactly as the operator builds it (warm_pool), with a name."""
    settings = Settings(workspace_image=IMAGE)
    shape = shape_of(settings, WORKSPACE, claim)
    boot = bootstrap_secret(POOL_KEY, namespace, shape)["metadata"]["name"]
    pod = build_pool_pod(namespace, settings, WORKSPACE, bootstrap=boot, claim=claim)
    pod["metadata"].pop("generateName")
    pod["metadata"]["name"] = name
    return pod


def test_a_free_pool_pod_is_admitted_and_stays_workspace_shaped(watched: Release) -> None:
    namespace = watched.watched[0]
    assert watched.dry_run(_pool_pod(namespace)) == ""
    # A pool of a ReadWriteMany source claim mounts that claim up front.
    assert watched.dry_run(_pool_pod(namespace, claim="shared-repo")) == ""
    claim = _pool_pod(namespace, claim="shared-repo")
    claim["spec"]["volumes"].append(
        {"name": "other", "persistentVolumeClaim": {"claimName": "someone-elses"}}
    )
    other_secret = _pool_pod(namespace)
    other_secret["spec"]["volumes"].append(
        {"name": "creds", "secret": {"secretName": "db-credentials"}}
    )
    other_pool = _pool_pod(namespace)
    other_pool["spec"]["volumes"][2]["secret"]["secretName"] = "sbx-pool-0000000000000000-x-boot"
    image = _pool_pod(namespace)
    image["spec"]["containers"][0]["image"] = "evil.example/sh:1"
    owned = _pool_pod(namespace)
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": str(uuid.uuid4())}
    ]
    unlabelled = _pool_pod(namespace)
    unlabelled["metadata"]["labels"].pop(POOL_LABEL)
    for refused in (claim, other_secret, other_pool, image, owned, unlabelled):
        assert "ValidatingAdmissionPolicy" in watched.dry_run(refused)


def test_a_claimed_pool_pod_is_never_made_free_again(watched: Release) -> None:
    namespace = watched.watched[1]
    server = watched.server
    pod = _pool_pod(namespace, "pool-claimed")
    made = server.kubectl(
        "create", "-f", "-", "-n", namespace, "--as", watched.user, input=json.dumps(pod)
    )
    assert made.returncode == 0, made.stderr
    try:
        uid = str(uuid.uuid4())
        claim = {
            "metadata": {
                "labels": {POOL_LABEL: None, "sandbox.cleveragents.io/sandbox-uid": uid},
                "ownerReferences": [
                    {"apiVersion": "sandbox.cleveragents.io/v1alpha1", "kind": "Sandbox",
                     "name": "s1", "uid": uid, "controller": True, "blockOwnerDeletion": True}
                ],
            }
        }  # fmt: skip
        claimed = server.kubectl(
            "patch", "pod", "pool-claimed", "--type=merge", "-p", json.dumps(claim),
            "-n", namespace, "--as", watched.user,
        )  # fmt: skip
        assert claimed.returncode == 0, claimed.stderr
        release = {
            "metadata": {
                "labels": {POOL_LABEL: "any", "sandbox.cleveragents.io/sandbox-uid": None},
                "ownerReferences": None,
            }
        }
        freed = server.kubectl(
            "patch", "pod", "pool-claimed", "--type=merge", "-p", json.dumps(release),
            "--dry-run=server", "-n", namespace, "--as", watched.user,
        )  # fmt: skip
        assert "must be a workspace Pod" in freed.stderr
    finally:
        server.kubectl("delete", "pod", "--all", "-n", namespace, "--wait=false")


# --- the agent key ----------------------------------------------------------------------------


def _core_as(server: LocalApiServer, user: str) -> Any:
    api_client = k8s_config.new_client_from_config(config_file=str(server.kubeconfig_path))
    api_client.set_default_header("Impersonate-User", user)
    return k8s_client.CoreV1Api(api_client)


def test_the_operator_makes_its_agent_key_with_its_own_rights(watched: Release) -> None:
    core = _core_as(watched.server, watched.user)
    name = f"{watched.fullname}-agent-key"
    labels = {"app.kubernetes.io/name": "sandbox-operator"}
    first = load_or_create(core, watched.namespace, name, labels)
    assert len(first.current) == 64 and first.previous is None
    # Made once: a second replica (or a restart) reads the same key back.
    assert load_or_create(core, watched.namespace, name, labels) == first
    # Another name is neither readable nor makeable with these rights.
    with pytest.raises(ExecutorError) as refused:
        load_or_create(core, watched.namespace, "other-key")
    assert "403" in str(refused.value) and not refused.value.retryable
    with pytest.raises(ApiException) as forbidden:
        core.delete_namespaced_secret(name, watched.namespace)
    assert forbidden.value.status == 403
