"""The pod executor on the real API server (tier 2) with a real workspace agent on 127.0.0.1.

Tier 2 has no kubelet, so the test plays the kubelet's two parts for the workspace Pod the
operator creates: it runs the Pod's main process (``sandbox-core serve-workspace``) with the
Pod's environment (the Secret's DSN, as ``secretKeyRef`` would) and token file (as the Secret
mount would), and it reports the Pod's status (Running, Ready, podIP 127.0.0.1) through the
status subresource. Everything else is real: the operator (pod executor) as a subprocess, the
API server, the agent process, a SQLite database (strategy transaction_rollback).

Issue 8: a starting Pod is a normal wait (Pending, no Warning), provisioning wakes on the Pod's
readiness, the token is the HMAC of the Sandbox uid, a deleted Pod is made again and the sandbox
re-opened, suspend/resume, ``Finished`` on the PlanCommit, and no token or DSN in any status,
Event or log line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver.fixtures import local_apiserver  # noqa: F401 - pytest fixture
from tests.apiserver.harness import free_port
from tests.operator.support import Cluster, OperatorProcess, plancommit_manifest, wait_for
from tests.test_operator_apiserver import cluster  # noqa: F401 - pytest fixture
from tests.test_operator_issue8 import db_sandbox, secret_manifest

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

KEY = "agent-key-" + "x" * 40
POD = "sbx-s-db-ws"


class Kubelet:
    """The kubelet's part for one workspace Pod: its main process and its status."""

    def __init__(self, namespace: Cluster, work: Path, port: int, dsn: str) -> None:
        self.cluster = namespace
        self.work = work
        self.port = port
        self.dsn = dsn
        self.agent: subprocess.Popen[bytes] | None = None

    def start_container(self) -> None:
        """Run the Pod's command with the Pod's token file and environment."""
        secret = self.cluster.get("secret", "sbx-s-db-agent")
        assert secret is not None
        token_file = self.work / "token"
        token_file.write_bytes(base64.b64decode(secret["data"]["token"]))
        pod = self.cluster.get("pod", POD)
        assert pod is not None
        command = pod["spec"]["containers"][0]["command"]
        assert command == ["sandbox-core", "serve-workspace"]
        env = {**os.environ, "SANDBOX_SOURCE_DSN": self.dsn}
        scratch = self.scratch_dir(pod)
        with open(self.work / "agent.log", "ab") as log:
            self.agent = subprocess.Popen(
                [
                    sys.executable, "-m", "sandbox_core.cli",
                    "--state-dir", str(scratch / "state"),
                    "--sandbox-root", str(scratch / "sandboxes"),
                    "serve-workspace", "--host", "127.0.0.1", "--port", str(self.port),
                    "--token-file", str(token_file),
                ],
                env=env, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip

    def scratch_dir(self, pod: dict[str, Any]) -> Path:
        """The Pod's ``/workspace/scratch`` as the kubelet would give it: the claim's directory
        (the same for every Pod mounting the claim), or a new directory per Pod for an
        emptyDir (lost with the Pod)."""
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "scratch")
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            return self.work / "claims" / claim
        return self.work / "pods" / pod["metadata"]["uid"] / "scratch"

    def _serving(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                return bool(r.read() == b"ok")
        except OSError:
            return False

    def report_ready(self) -> None:
        """Once the readiness probe passes (``GET /healthz``), patch the current Pod's status:
        Running, Ready, podIP 127.0.0.1."""
        wait_for(self._serving, 60, "the agent's readiness probe")
        wait_for(lambda: self.cluster.get("pod", POD), 60, "the workspace Pod")
        status = {
            "status": {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }
        self.cluster.kubectl(
            "patch", "pod", POD, "--subresource=status", "--type=merge", "-p", json.dumps(status)
        )

    def stop(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(timeout=10)


@pytest.fixture
def pod_operator(
    local_apiserver: Any,  # noqa: F811 - the fixture
    cluster: Cluster,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> Iterator[tuple[OperatorProcess, Kubelet]]:
    key = tmp_path / "agent-key"
    key.write_text(KEY)
    port = free_port()
    database = tmp_path / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    dsn = f"sqlite:///{database}"
    cluster.create(secret_manifest("db", dsn))
    # The ServiceAccount admission needs the namespace's default account (no controller here).
    cluster.kubectl("create", "serviceaccount", "default", check=False)
    work = tmp_path / "operator"
    work.mkdir()
    operator = OperatorProcess(
        local_apiserver,
        cluster.namespace,
        work,
        {
            "SANDBOX_OPERATOR_EXECUTOR": "pod",
            "SANDBOX_OPERATOR_AGENT_KEY_FILE": str(key),
            "SANDBOX_OPERATOR_AGENT_PORT": str(port),
            "SANDBOX_OPERATOR_POD_NAMESPACE": cluster.namespace,
            "SANDBOX_OPERATOR_POD_LABELS": "app.kubernetes.io/name=sandbox-operator",
            "SANDBOX_OPERATOR_EXEC_TIMEOUT_SECONDS": "30",
        },
    )
    cluster.operator = operator
    kubelet = Kubelet(cluster, tmp_path, port, dsn)
    operator.start()
    yield operator, kubelet
    cluster.kubectl("delete", "plancommits,sandboxes", "--all", "--timeout=60s", check=False)
    operator.stop()
    kubelet.stop()
    print(operator.logs()[-6000:])
    assert "Patching failed with inconsistencies" not in operator.logs()


def warnings_of(namespace: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for e in namespace.events(name) if e["type"] == "Warning"]


def test_the_pod_executor_wakes_on_pod_readiness_and_calls_the_agent(
    cluster: Cluster,  # noqa: F811 - the fixture
    pod_operator: tuple[OperatorProcess, Kubelet],
) -> None:
    operator, kubelet = pod_operator
    cluster.create(db_sandbox("s-db", "plan-p", "db"))
    # The Pod is starting: Pending, Ready=False WorkspacePodStarting, no Warning, no Degraded.
    wait_for(lambda: cluster.get("pod", POD), 60, "the workspace Pod")
    starting = wait_for(
        lambda: (
            (cluster.condition("sandbox", "s-db", "Ready") or {}).get("reason")
            == "WorkspacePodStarting"
        ),
        60,
        "Ready=False WorkspacePodStarting",
    )
    assert starting
    assert cluster.status("sandbox", "s-db")["phase"] == "Pending"
    assert cluster.condition("sandbox", "s-db", "Degraded") is None
    body = cluster.get("sandbox", "s-db")
    assert body is not None
    token = hmac.new(KEY.encode(), body["metadata"]["uid"].encode(), hashlib.sha256).hexdigest()
    secret = cluster.get("secret", "sbx-s-db-agent")
    assert secret is not None and base64.b64decode(secret["data"]["token"]).decode() == token
    pod = cluster.get("pod", POD)
    assert pod is not None
    assert pod["metadata"]["ownerReferences"][0]["name"] == "s-db"
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["SANDBOX_SOURCE_DSN"]["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "dsn"}
    policy = cluster.get("networkpolicy", POD)
    assert policy is not None and policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    # The kubelet starts the container and reports it Ready: provisioning wakes up.
    kubelet.start_container()
    kubelet.report_ready()
    status = cluster.wait_phase("sandbox", "s-db", {"Active", "Errored"}, timeout=60)
    assert status["phase"] == "Active", status
    assert status["executor"] == "pod"
    assert status["coreRecord"]["original_path"] == "env:SANDBOX_SOURCE_DSN"
    sandbox_id = status["sandboxId"]
    # Deleted: made again (a new uid), Ready=False meanwhile, then re-opened, same sandbox.
    old_uid = pod["metadata"]["uid"]
    cluster.kubectl("delete", "pod", POD, "--wait=true")
    wait_for(
        lambda: (
            (cluster.get("pod", POD) or {}).get("metadata", {}).get("uid") not in (None, old_uid)
        ),
        60,
        "a new workspace Pod",
    )
    recreated = wait_for(
        lambda: (cluster.condition("sandbox", "s-db", "Ready") or {}).get("status") == "False",
        60,
        "Ready=False after the Pod was deleted",
    )
    assert recreated
    kubelet.report_ready()
    wait_for(
        lambda: (cluster.condition("sandbox", "s-db", "Ready") or {}).get("status") == "True",
        60,
        "Ready=True again",
    )
    assert cluster.status("sandbox", "s-db")["sandboxId"] == sandbox_id
    # Suspend: the Pod goes, the phase says so; resume: a new Pod, Active again.
    patch = '{"spec":{"suspend":true}}'
    cluster.kubectl("patch", "sandbox", "s-db", "--type=merge", "-p", patch)
    cluster.wait_phase("sandbox", "s-db", {"Suspended"}, timeout=60)
    wait_for(lambda: cluster.get("pod", POD) is None, 60, "the Pod deleted")
    cluster.kubectl("patch", "sandbox", "s-db", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    kubelet.report_ready()
    assert cluster.wait_phase("sandbox", "s-db", {"Active"}, timeout=60)["sandboxId"] == sandbox_id
    # A PlanCommit through the agent; one kubectl wait on Finished.
    cluster.create(plancommit_manifest("pc-p", "plan-p"))
    waited = cluster.kubectl(
        "wait", "--for=condition=Finished", "pcommit/pc-p", "--timeout=90s", check=False
    )
    assert waited.returncode == 0, cluster.status("pcommit", "pc-p")
    assert cluster.status("pcommit", "pc-p")["phase"] == "Committed"
    assert [(w["reason"], w["message"]) for w in warnings_of(cluster, "s-db")] == []
    everything = (
        cluster.kubectl("get", "sandboxes,plancommits", "-o", "json").stdout
        + cluster.kubectl("get", "events", "-o", "json").stdout
        + operator.logs()
    )
    assert token not in everything
    assert kubelet.dsn not in everything
