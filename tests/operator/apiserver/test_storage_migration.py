"""Storage migration from ``v1alpha1`` to ``v1beta1`` on the real API server (tier 2).

On its own API server, so that the CRDs are made by the previous chart exactly as on a user's
cluster: the chart at :data:`PREVIOUS_CHART_COMMIT` (read from git) is installed; a Sandbox, a
Checkpoint and a PlanCommit with every kind of spec and status field are created as
``v1alpha1``; the chart is upgraded to this tree's (CRDs storing ``v1beta1``,
``v1alpha1`` served and deprecated); ``hack/migrate-storage.sh`` rewrites every object. etcd is
read directly before and after: each object is stored as ``v1alpha1`` until the migration and
as ``v1beta1`` after it; ``status.storedVersions`` goes from ``[v1alpha1]`` over ``[v1alpha1,
v1beta1]`` to ``[v1beta1]``; every field reads back equal, in both versions
(docs/api-evolution.md, "Storage migration").

A second test asks ``kubectl explain`` about both versions on the shared server.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apiserver.harness import LocalApiServer
from tests.support.chart import CHART_DIR
from tests.support.helm import run_helm
from tests.support.operator import REPO_ROOT, Cluster, files_at, wait_for

pytestmark = pytest.mark.slow

PREVIOUS_CHART_COMMIT = "ea69d88"
"""The last commit whose chart serves and stores ``v1alpha1`` only."""
GROUP = "sandbox.cleveragents.io"
OLD, NEW = f"{GROUP}/v1alpha1", f"{GROUP}/v1beta1"
PLURALS = {"Sandbox": "sandboxes", "Checkpoint": "checkpoints", "PlanCommit": "plancommits"}
DIGEST = "sha256:" + "ab" * 32
WHEN = "2026-12-01T10:00:00Z"
REVIEWER = "alice"  # impersonated by the harness's admin


def _condition(kind: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind, "status": "True", "reason": reason, "message": f"{kind} since {WHEN}",
        "lastTransitionTime": WHEN, "observedGeneration": 1,
    }  # fmt: skip


SANDBOX = {
    "spec": {
        "planId": "plan-mig", "resourceId": "repo", "strategy": "overlay",
        "source": {"nodePath": "/srv/repos/app"},
        "options": {"overlayMode": "fallback"},
        "ttlSecondsAfterFinished": 600,
        "rollbackRequest": {"id": "rb-1"},
        "restoreRequest": {"id": "rs-1", "checkpointName": "ck"},
        "suspend": True,
        "workspace": {
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
            "runtimeClassName": "gvisor", "priorityClassName": "low",
            "imagePullSecrets": [{"name": "pull"}],
            "scratch": {"storageClassName": "fast", "size": "2Gi"},
            "egress": [{"cidr": "10.0.0.0/8", "ports": [{"port": 443, "protocol": "TCP"}]}],
        },
    },
    "status": {
        "phase": "Suspended", "sandboxId": "01JABCDEF0123456789ABCDEFG",
        "sandboxPath": "/var/lib/sandboxes/s", "workspacePod": "sandbox-s-0",
        "effectiveStrategy": "overlay", "strategyMode": "fallback", "executor": "pod",
        "lastRollbackRequestId": "rb-1", "lastRestoreRequestId": "rs-1",
        "coreRecord": {"schemaVersion": 1, "strategy": "overlay", "context": {"mode": "fallback"}},
        "observedGeneration": 1, "lastHandledConfiguration": '{"spec": {}}',
        "conditions": [_condition("Ready", "Suspended")],
    },
}  # fmt: skip
CHECKPOINT = {
    "spec": {"sandboxName": "s", "phase": "pre_execute", "metadata": {"step": "3"}},
    "status": {
        "phase": "Ready", "checkpointId": "01JCKPT0123456789ABCDEFGHJ", "sandboxId": "01JABC",
        "snapshotLocation": "/var/lib/ckpt/1", "kind": "upper-snapshot", "createdAt": WHEN,
        "observedGeneration": 1, "conditions": [_condition("Ready", "SnapshotTaken")],
    },
}  # fmt: skip
PLANCOMMIT = {
    "spec": {
        "planId": "plan-mig", "action": "Commit", "message": "land it", "mode": "TwoPhase",
        "approval": "Required", "approvedDigest": DIGEST, "approvalTimeoutSeconds": 3600,
        "requiredApprovals": 1, "cleanupPolicy": "Delete",
        "approvals": [{
            # The previous chart's approval policy admits the writer's own identity only.
            "digest": DIGEST, "decision": "Approve", "user": REVIEWER,
            "groups": ["system:masters", "system:authenticated"], "comment": "looks right",
        }],
    },
    "status": {
        "phase": "AwaitingApproval", "startedAt": WHEN, "observedGeneration": 1,
        "mode": "TwoPhase", "approvedBy": REVIEWER,
        "sandboxes": [{
            "name": "s", "sandboxId": "01JABC", "resourceId": "repo", "strategy": "overlay",
            "rollbackable": True, "state": "Prepared", "startedAt": WHEN,
        }],
        "results": [{"name": "s", "success": True, "changedFiles": ["a.txt"]}],
        "twoPhase": {"txid": "tx-1", "attempt": 1, "stage": "Pending", "digest": DIGEST},
        "review": {
            "digest": DIGEST, "reviewedAt": WHEN, "truncated": False, "hasConflicts": False,
            "sandboxes": [{"name": "s", "digest": DIGEST, "added": 1, "changed": 2}],
        },
        "conditions": [_condition("Reviewed", "Reviewed")],
    },
}  # fmt: skip
OBJECTS = {("Sandbox", "s"): SANDBOX, ("Checkpoint", "ck"): CHECKPOINT,
           ("PlanCommit", "pc"): PLANCOMMIT}  # fmt: skip
METADATA = {
    "labels": {"team": "platform"}, "annotations": {"example.com/note": "kept"},
    "finalizers": ["example.com/keep"],
}  # fmt: skip
# What a rewrite may change: the version it is read in, its resourceVersion and who wrote it.
VOLATILE_METADATA = ("resourceVersion", "managedFields")


@pytest.fixture(scope="module")
def own_server() -> Iterator[LocalApiServer]:
    with LocalApiServer() as server:
        yield server


def _helm(server: LocalApiServer, *args: str) -> None:
    result = run_helm(server.bin_dir / "helm", *args, "--kubeconfig", str(server.kubeconfig_path))
    assert result.returncode == 0, result.stderr


def _wait_served(server: LocalApiServer, version: str) -> None:
    """Until every kind answers in ``version`` (the API server adds CRD handlers
    asynchronously)."""
    for plural in PLURALS.values():
        resource = f"{plural}.{version}.{GROUP}"
        wait_for(
            lambda resource=resource: server.kubectl("get", resource, "-A").returncode == 0,
            60,
            f"{resource} served",
        )


def _create(
    server: LocalApiServer, namespace: str, body: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """``kubectl create``, again while the API server's handler of a new CRD is not ready
    (``ServiceUnavailable ... not found``: it is added asynchronously after Established)."""

    def attempt() -> subprocess.CompletedProcess[str] | None:
        result = server.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
        return None if "ServiceUnavailable" in result.stderr else result

    return wait_for(attempt, 60, f"create {body['kind']}")


def _stored_api_version(server: LocalApiServer, kind: str, namespace: str, name: str) -> str:
    """The apiVersion of the object as etcd holds it (CRs are stored as JSON)."""
    key = f"/registry/{GROUP}/{PLURALS[kind]}/{namespace}/{name}"
    result = subprocess.run(
        [str(server.bin_dir / "etcdctl"), f"--endpoints={server.etcd_url}", "get", key,
         "--print-value-only"],
        capture_output=True, text=True, check=True, env={**os.environ, "ETCDCTL_API": "3"},
    )  # fmt: skip
    return str(json.loads(result.stdout)["apiVersion"])


def _stored_versions(server: LocalApiServer, kind: str) -> list[str]:
    crd = server.kubectl_json("get", "crd", f"{PLURALS[kind]}.{GROUP}")
    assert isinstance(crd, dict)
    return list(crd["status"]["storedVersions"])


def _read(server: LocalApiServer, kind: str, version: str, namespace: str, name: str) -> Any:
    plural = f"{PLURALS[kind]}.{version.split('/')[1]}.{GROUP}"
    return server.kubectl_json("get", plural, "-n", namespace, name)


def _migrate(server: LocalApiServer) -> subprocess.CompletedProcess[str]:
    """Run ``hack/migrate-storage.sh`` against ``server`` (its kubectl and kubeconfig)."""
    env = {**os.environ, "KUBECTL": str(server.kubectl_path),
           "KUBECONFIG": str(server.kubeconfig_path)}  # fmt: skip
    return subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "migrate-storage.sh")],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip


def _comparable(body: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in body["metadata"].items() if k not in VOLATILE_METADATA}
    return {**{k: v for k, v in body.items() if k != "apiVersion"}, "metadata": metadata}


def test_objects_stored_as_v1alpha1_are_migrated_to_v1beta1_losing_nothing(
    own_server: LocalApiServer, tmp_path: Path
) -> None:
    release = f"mig-{uuid.uuid4().hex[:6]}"
    old_chart = files_at(PREVIOUS_CHART_COMMIT, ["charts/sandbox-operator"], tmp_path / "old")
    _helm(own_server, "install", release, str(old_chart / "charts" / "sandbox-operator"),
          "-n", f"{release}-system", "--create-namespace")  # fmt: skip
    _wait_served(own_server, "v1alpha1")
    for kind in PLURALS:
        assert _stored_versions(own_server, kind) == ["v1alpha1"]
    namespace = f"{release}-work"
    own_server.kubectl("create", "namespace", namespace, check=True)

    before: dict[tuple[str, str], dict[str, Any]] = {}
    for (kind, name), content in OBJECTS.items():
        # Approvals are added after creation by another user (the approval policy).
        spec = {k: v for k, v in content["spec"].items() if k != "approvals"}
        body = {"apiVersion": OLD, "kind": kind, "metadata": {**METADATA, "name": name},
                "spec": spec}  # fmt: skip
        created = _create(own_server, namespace, body)
        assert created.returncode == 0, created.stderr
        if "approvals" in content["spec"]:
            approved = own_server.kubectl(
                "--as", REVIEWER, "--as-group", "system:masters", "patch",
                f"{PLURALS[kind]}.v1alpha1.{GROUP}", name, "-n", namespace, "--type=merge",
                "-p", json.dumps({"spec": content["spec"]}),
            )  # fmt: skip
            assert approved.returncode == 0, approved.stderr
        patched = own_server.kubectl(
            "patch", f"{PLURALS[kind]}.v1alpha1.{GROUP}", name, "-n", namespace,
            "--subresource=status", "--type=merge", "-p", json.dumps({"status": content["status"]}),
        )  # fmt: skip
        assert patched.returncode == 0, patched.stderr
        read = _read(own_server, kind, OLD, namespace, name)
        # Every field was declared by the old CRD: nothing sent was pruned.
        assert (read["spec"], read["status"]) == (content["spec"], content["status"]), kind
        # (The previous chart stamps a PlanCommit's creator in one more annotation.)
        assert read["metadata"]["annotations"].items() >= METADATA["annotations"].items()
        assert (read["metadata"]["labels"], read["metadata"]["finalizers"]) == (
            METADATA["labels"], METADATA["finalizers"])  # fmt: skip
        assert _stored_api_version(own_server, kind, namespace, name) == OLD
        before[kind, name] = read

    _helm(own_server, "upgrade", release, str(CHART_DIR), "-n", f"{release}-system")
    _wait_served(own_server, "v1beta1")
    for kind in PLURALS:
        assert _stored_versions(own_server, kind) == ["v1alpha1", "v1beta1"]
    for kind, name in OBJECTS:  # served as v1beta1, still stored as v1alpha1
        assert _stored_api_version(own_server, kind, namespace, name) == OLD

    migrated = _migrate(own_server)
    assert migrated.returncode == 0, migrated.stderr
    for kind, plural in PLURALS.items():
        assert f"{plural}.{GROUP}: 1 object(s) rewritten in v1beta1" in migrated.stderr
        assert _stored_versions(own_server, kind) == ["v1beta1"]

    for (kind, name), old in before.items():
        assert _stored_api_version(own_server, kind, namespace, name) == NEW
        new = _read(own_server, kind, NEW, namespace, name)
        assert new["apiVersion"] == NEW
        assert _comparable(new) == _comparable(old), kind
        again = _read(own_server, kind, OLD, namespace, name)  # the deprecated version still
        assert again["apiVersion"] == OLD
        assert _comparable(again) == _comparable(old), kind
    warned = own_server.kubectl("get", f"sandboxes.v1alpha1.{GROUP}", "-n", namespace)
    assert f"{OLD} Sandbox is deprecated; use {NEW} Sandbox" in warned.stderr

    # Run again: idempotent (every object rewritten once more, nothing else changes).
    rerun = _migrate(own_server)
    assert rerun.returncode == 0, rerun.stderr
    for kind in PLURALS:
        assert _stored_versions(own_server, kind) == ["v1beta1"]


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha1"])
def test_kubectl_explain_is_useful_in_both_versions(local_apiserver: Any, version: str) -> None:
    Cluster.fresh(local_apiserver, prefix="explain")  # the CRDs of this tree

    def explain(field: str) -> str:
        result = local_apiserver.kubectl(
            "explain", field, f"--api-version={GROUP}/{version}", check=True
        )
        return " ".join(result.stdout.split())

    # The API server republishes OpenAPI asynchronously after a CRD change.
    spec = wait_for(
        lambda: (text := explain("sandbox.spec")) and f"VERSION: {version}" in text and text,
        60,
        f"explain in {version}",
    )
    assert "FIELD: spec <Object>" in spec
    assert "planId <string> -required-" in spec
    assert "Identifier of the plan execution this sandbox belongs to." in spec
    assert "How writes are isolated." in spec
    port = explain("sandbox.spec.workspace.egress.ports.port")
    assert f"VERSION: {version}" in port and "DESCRIPTION:" in port
    digest = explain("plancommit.spec.approvedDigest")
    assert "Deprecated: an unnamed approval" in digest
    ready = explain("checkpoint.status.conditions.reason")
    assert "CamelCase reason" in ready
