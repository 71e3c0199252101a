"""Fixtures of the end-to-end suite (tier 3): the Helm release, a namespace per test, and a
PersistentVolume holding the originals (a real git repository and two directories).

Driven by ``KUBECONFIG`` only. Settings (environment):

- ``E2E_IMAGE``: the project image (default ``localhost/sandbox-operator:e2e``, what
  ``e2e/cluster up`` and ``e2e/kind.sh`` load);
- ``E2E_IMAGE_PULL_POLICY``: default ``IfNotPresent`` (the image is already on the node);
- ``E2E_OPERATOR_NAMESPACE``: where the chart goes (default ``sandbox-e2e-system``).

Run: ``eval "$(e2e/cluster env)" && .venv/bin/python -m pytest e2e -p no:cacheprovider``.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.kube import CHART, Kube, wait_until

TEST_LABEL = "sandbox-e2e/test"
RELEASE = "sbx-e2e"
WORKSPACE_UID = 1000  # the workspace Pods' UID (sandbox_operator.executors.pod_manifests)
GIT_IDENTITY = "-c user.name=e2e -c user.email=e2e@sandbox.test"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here needs a real cluster: mark them all ``e2e``. The README quick start runs
    last: it removes this suite's release and the CRDs to install them as a new user would."""
    for item in items:
        item.add_marker(pytest.mark.e2e)
    items.sort(key=lambda item: item.path.name == "test_quickstart.py")


@pytest.fixture(scope="session")
def kube() -> Kube:
    """The cluster behind KUBECONFIG."""
    return Kube()


@dataclass(frozen=True)
class Release:
    """The installed chart."""

    namespace: str
    name: str
    selector: str

    def pod_names(self, kube: Kube) -> list[str]:
        """Names of the operator's Pods (any phase)."""
        return kube.names("pods", self.namespace, self.selector)


@pytest.fixture(scope="session")
def operator_release(kube: Kube) -> Iterator[Release]:
    """``helm install`` of charts/sandbox-operator, waited for; uninstalled at the end.

    Teardown order matters: test namespaces go first, while the operator still runs, so that
    its finalizers clean up; then the release and the CRDs (Helm never deletes CRDs).
    """
    namespace = os.environ.get("E2E_OPERATOR_NAMESPACE", "sandbox-e2e-system")
    image = os.environ.get("E2E_IMAGE", "localhost/sandbox-operator:e2e")
    repository, _, tag = image.rpartition(":")
    kube.helm(
        "upgrade", "--install", RELEASE, str(CHART),
        "--namespace", namespace, "--create-namespace",
        "--set", f"image.repository={repository}",
        "--set", f"image.tag={tag}",
        "--set", f"image.pullPolicy={os.environ.get('E2E_IMAGE_PULL_POLICY', 'IfNotPresent')}",
        "--set", "retryDelaySeconds=2",
        # One replica: these tests kill and read "the" operator Pod. Two replicas with leader
        # election are tested on tier 2 (tests/operator/apiserver/test_ha_failover.py) and by
        # the quick start.
        "--set", "replicaCount=1",
        # e2e/cluster installs the chart's profile on the node: actors' commands get a jail.
        "--set", "workspace.seccompProfile.type=Localhost",
        "--wait", "--timeout", "240s",
    )  # fmt: skip
    release = Release(namespace, RELEASE, f"app.kubernetes.io/instance={RELEASE}")
    try:
        yield release
    finally:
        for item in kube.json("get", "namespaces", "-l", TEST_LABEL).get("items") or []:
            delete_namespace(kube, item["metadata"]["name"])
        kube.run(
            [kube.helm_path, "uninstall", RELEASE, "--namespace", namespace, "--wait"], check=False
        )
        kube.kubectl(
            "delete",
            "-f",
            str(CHART / "files" / "crds"),
            "--ignore-not-found",
            "--wait=true",
            check=False,
        )
        kube.kubectl(
            "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", check=False
        )


@pytest.fixture
def namespace(
    kube: Kube, operator_release: Release, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace per test, deleted (and waited for) afterwards."""
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower().removeprefix("test_"))[:40].strip(
        "-"
    )
    name = f"e2e-{base}-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", name)
    kube.kubectl("label", "namespace", name, f"{TEST_LABEL}=true")
    try:
        yield name
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            _dump(kube, operator_release, name)
        delete_namespace(kube, name)


def delete_namespace(kube: Kube, name: str) -> None:
    """Delete the sandbox objects first, while their workspace Pods still exist, then the
    namespace. (Deleting the namespace alone removes the Pods and claims in parallel with the
    Sandboxes, and the Sandbox finalizer cannot clean up without its workspace Pod.)"""
    for kind in ("plancommits", "checkpoints", "sandboxes"):
        kube.kubectl(
            "delete", kind, "--all", "-n", name, "--wait=true", "--timeout=120s", check=False
        )
    kube.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False)


def _dump(kube: Kube, release: Release, namespace: str) -> None:
    """What a failed test leaves to look at (pytest shows it under "Captured stdout teardown")."""
    print(
        kube.kubectl(
            "get",
            "sandbox,checkpoint,plancommit,pod,pvc",
            "-n",
            namespace,
            "-o",
            "wide",
            check=False,
        )
    )
    print(
        kube.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)[
            -4000:
        ]
    )
    for pod in release.pod_names(kube):
        logs = kube.kubectl("logs", "-n", release.namespace, pod, "--tail=60", check=False)
        print(f"--- operator pod {pod} ---\n{logs}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item so fixtures can tell a failed test."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@dataclass
class Originals:
    """A PersistentVolumeClaim holding the originals, seen through a toolbox Pod mounting it.

    Layout on the volume: ``repos/app`` (a git repository, branch main, ``f.txt``), ``data``
    (``g.txt``) and ``layer`` (``h.txt``). Files belong to the workspace UID so the
    workspace Pods can commit into them.
    """

    kube: Kube
    namespace: str
    claim: str = "originals"
    pod: str = "toolbox"
    mount: str = "/data"

    def sh(self, script: str) -> str:
        """stdout of ``sh -c SCRIPT`` in the toolbox Pod (cwd: the volume)."""
        return self.kube.exec(self.namespace, self.pod, f"cd {self.mount} && {script}")

    def git(self, *args: str) -> str:
        """stdout of git in the repository, stripped."""
        quoted = " ".join(f"'{a}'" for a in args)
        return self.sh(f"git {GIT_IDENTITY} -C repos/app {quoted}").strip()

    def read(self, path: str) -> str:
        """Content of a file on the volume."""
        return self.sh(f"cat '{path}'")


def _toolbox(claim: str, image: str, pull_policy: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "toolbox"},
        "spec": {
            "securityContext": {
                "runAsUser": WORKSPACE_UID,
                "runAsGroup": WORKSPACE_UID,
                "fsGroup": WORKSPACE_UID,
            },
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "toolbox",
                    "image": image,
                    "imagePullPolicy": pull_policy,
                    "command": ["sleep", "infinity"],
                    "env": [{"name": "HOME", "value": "/tmp"}],  # noqa: S108 - in the Pod
                    "volumeMounts": [{"name": "originals", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "originals", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


@pytest.fixture
def originals(kube: Kube, namespace: str) -> Originals:
    """The originals on a PersistentVolume (the cluster's default StorageClass), seeded."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "originals"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    image = os.environ.get("E2E_IMAGE", "localhost/sandbox-operator:e2e")
    policy = os.environ.get("E2E_IMAGE_PULL_POLICY", "IfNotPresent")
    kube.apply(namespace, claim, _toolbox("originals", image, policy))
    kube.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/toolbox", "--timeout=120s")
    result = Originals(kube, namespace)
    result.sh(
        "mkdir -p repos/app data layer"
        " && printf 'line1\\n' > repos/app/f.txt"
        " && printf 'd0\\n' > data/g.txt"
        " && printf 'o0\\n' > layer/h.txt"
        f" && git -C repos/app init -q -b main && git -C repos/app add -A"
        f" && git {GIT_IDENTITY} -C repos/app commit -qm initial"
    )
    return result


# --- manifests and small flows ----------------------------------------------------------------


def sandbox_manifest(
    name: str, plan: str, strategy: str, sub_path: str, options: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Sandbox over ``sub_path`` of the originals claim (pod executor)."""
    spec: dict[str, Any] = {
        "planId": plan,
        "resourceId": name,
        "strategy": strategy,
        "source": {"persistentVolumeClaim": {"claimName": "originals", "subPath": sub_path}},
    }
    if options:
        spec["options"] = options
    return {
        "apiVersion": "sandbox.cleveragents.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": spec,
    }


def plancommit_manifest(
    name: str,
    plan: str,
    *,
    cleanup: str = "Retain",
    action: str = "Commit",
    mode: str | None = None,
) -> dict[str, Any]:
    """A PlanCommit of every Sandbox of ``plan`` (``mode`` unset: the CRD's default, TwoPhase)."""
    manifest: dict[str, Any] = {
        "apiVersion": "sandbox.cleveragents.io/v1beta1",
        "kind": "PlanCommit",
        "metadata": {"name": name},
        "spec": {
            "planId": plan,
            "action": action,
            "message": f"e2e: {name}",
            "cleanupPolicy": cleanup,
        },
    }
    if mode is not None:
        manifest["spec"]["mode"] = mode
    return manifest


def active(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """Wait for Sandbox ``name`` to be Active with a Running workspace Pod; its status."""
    status = kube.wait_phase("sandbox", namespace, name, {"Active", "Failed"}, timeout=240)
    assert status["phase"] == "Active", status
    pod = status["workspacePod"]
    wait_until(
        f"workspace pod {pod} Running",
        lambda: kube.json("get", "pod", pod, "-n", namespace)["status"].get("phase") == "Running",
        60,
    )
    return status


def write_in_sandbox(
    kube: Kube, namespace: str, status: dict[str, Any], path: str, text: str
) -> None:
    """Write ``text`` to ``path`` in the sandbox: ``kubectl exec`` into its workspace Pod."""
    target = f"{status['sandboxPath']}/{path}"
    kube.exec(
        namespace,
        status["workspacePod"],
        f"printf '%s' '{text}' > '{target}'",
        container="workspace",
    )


def core_cli(kube: Kube, namespace: str, status: dict[str, Any], *args: str) -> str:
    """stdout of ``sandbox-core --json ...`` in the Sandbox's workspace Pod (the operator's own
    state and sandbox directories, as the pod executor passes them)."""
    from sandbox_operator.executors.pod_manifests import CONTAINER, SANDBOX_ROOT, STATE_DIR

    argv = [
        "sandbox-core",
        "--json",
        "--state-dir",
        STATE_DIR,
        "--sandbox-root",
        SANDBOX_ROOT,
        *args,
    ]
    return kube.kubectl(
        "exec", "-n", namespace, status["workspacePod"], "-c", CONTAINER, "--", *argv
    )
