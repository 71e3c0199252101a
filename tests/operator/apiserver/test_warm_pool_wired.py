"""The warm pool wired into the operator (pod executor) on the real API server (tier 2): the
operator keeps a pool Pod over a ReadWriteMany source claim, a new Sandbox over that claim
claims it and hands its agent the Sandbox's token, the pool refills, the bootstrap token no
longer opens the claimed Pod (so a second Sandbox can never be handed the first one's Pod), a
Sandbox on a pool Pod refuses to suspend, and a Secret source keeps a Pod of its own.

Tier 2 has no kubelet: the test runs the pool Pod's main process (``sandbox-core
serve-workspace``) with the Pod's environment and bootstrap-token file, and reports the Pod
Running and Ready (podIP 127.0.0.1) through the status subresource, as tests/support/kubelet.py
does for a Sandbox's own Pod. The source claim is never bound (no volume controller here); the
Sandbox's strategy is ``none``, which copies nothing from its original.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_operator.executors.pod import POOL_POD_ANNOTATION
from sandbox_operator.executors.warm_pool import POOL_LABEL, POOLED_LABEL

from sandbox_core.agent import wire
from tests.support.apiserver.harness import free_port
from tests.support.kubelet import KEY
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    pod_executor_env,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow

CLAIM = "shared-repo"
UID_LABEL = "sandbox.cleveragents.io/sandbox-uid"


class PoolKubelet:
    """The kubelet's part for warm-pool Pods: one agent process (the Pod it plays) on the
    operator's agent port, and the status of any Pod."""

    def __init__(self, cluster: Cluster, work: Path, port: int) -> None:
        self.cluster = cluster
        self.work = work
        self.port = port
        self.agent: subprocess.Popen[bytes] | None = None
        self.state = work / "pod-state"

    def start_container(self, pod: dict[str, Any]) -> None:
        """Run ``pod``'s command with its environment and its bootstrap-token file."""
        container = pod["spec"]["containers"][0]
        assert container["command"] == ["sandbox-core", "serve-workspace"]
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "bootstrap")
        secret = self.cluster.get("secret", volume["secret"]["secretName"])
        assert secret is not None
        boot = self.work / "bootstrap-token"
        boot.write_bytes(base64.b64decode(secret["data"]["token"]))
        env_of = {e["name"]: e.get("value", "") for e in container["env"]}
        env = {
            **os.environ,
            wire.BOOTSTRAP_TOKEN_FILE_ENV: str(boot),
            wire.ALLOWED_ROOTS_ENV: env_of[wire.ALLOWED_ROOTS_ENV],
        }
        assert env_of[wire.BOOTSTRAP_TOKEN_FILE_ENV] == wire.BOOTSTRAP_TOKEN_FILE
        with open(self.work / "pool-agent.log", "ab") as log:
            self.agent = subprocess.Popen(
                [
                    sys.executable, "-m", "sandbox_core.cli",
                    "--state-dir", str(self.state / "state"),
                    "--sandbox-root", str(self.state / "sandboxes"),
                    "serve-workspace", "--host", "127.0.0.1", "--port", str(self.port),
                    "--token-file", str(self.work / "no-token-file"),
                ],
                env=env, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip

    def serving(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.port}/healthz"
            with urllib.request.urlopen(url, timeout=1) as reply:
                return bool(reply.read() == b"ok")
        except OSError:
            return False

    def report_ready(self, name: str) -> None:
        status = {
            "status": {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}],
                "startTime": "2026-01-01T00:00:00Z",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }
        self.cluster.kubectl(
            "patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
        )

    def call(self, token: str) -> int:
        """``GET`` of a sandbox's status with ``token``: the HTTP status (401: refused)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}" + wire.STATUS.path(sid="01HZX0A7Q3J0F8K2M4N6P8R0T2"),
            headers={wire.AUTHORIZATION_HEADER: f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310
                return int(reply.status)
        except urllib.error.HTTPError as refused:
            return int(refused.code)

    def stop(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(timeout=10)


@pytest.fixture
def pooled(
    local_apiserver: Any, cluster: Cluster, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, PoolKubelet]]:
    key = tmp_path / "agent-key"
    key.write_text(KEY)
    port = free_port()
    cluster.kubectl("create", "serviceaccount", "default", check=False)
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )
    work = tmp_path / "operator"
    work.mkdir()
    operator = OperatorProcess(
        local_apiserver,
        cluster.namespace,
        work,
        pod_executor_env(
            cluster.namespace,
            key,
            port,
            EXEC_TIMEOUT_SECONDS="30",
            WARM_POOL_SIZE="1",
            WARM_POOL_NAMESPACES=cluster.namespace,
            WARM_POOL_SOURCE_CLAIMS=CLAIM,
            WARM_POOL_INTERVAL_SECONDS="1",
            # Windows of 15 s: a renewal comes within the test.
            AGENT_TOKEN_LIFETIME_SECONDS="30",
            AGENT_TOKEN_RENEW_INTERVAL_SECONDS="1",
        ),
    )
    cluster.operator = operator
    kubelet = PoolKubelet(cluster, tmp_path, port)
    operator.start()
    yield operator, kubelet
    cluster.kubectl("delete", "sandboxes", "--all", "--timeout=60s", check=False)
    operator.stop()
    kubelet.stop()
    print(operator.logs()[-6000:])


def _free_pool_pods(cluster: Cluster, claim: bool) -> list[dict[str, Any]]:
    listed = json.loads(cluster.kubectl("get", "pods", "-l", POOL_LABEL, "-o", "json").stdout)
    return [
        p
        for p in listed["items"]
        if any(v.get("persistentVolumeClaim") for v in p["spec"]["volumes"]) == claim
    ]


def _sandbox(name: str, source: dict[str, Any], strategy: str = "none") -> dict[str, Any]:
    return {
        "apiVersion": "sandbox.cleveragents.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"planId": "plan-w", "resourceId": name, "strategy": strategy, "source": source},
    }


def test_a_sandbox_claims_a_pool_pod_which_is_handed_over_once_and_refilled(
    cluster: Cluster, pooled: tuple[OperatorProcess, PoolKubelet]
) -> None:
    operator, kubelet = pooled
    # The operator keeps one free Pod over the shared claim, and none without a claim (no
    # Sandbox could take it: a Secret source never does).
    over_claim = wait_for(lambda: _free_pool_pods(cluster, True), 60, "a pool Pod over the claim")
    assert _free_pool_pods(cluster, False) == []
    (pod,) = over_claim
    name = pod["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["source"]["persistentVolumeClaim"] == {"claimName": CLAIM}
    assert volumes["scratch"] == {"name": "scratch", "emptyDir": {}}
    assert not pod["metadata"].get("ownerReferences")
    kubelet.start_container(pod)
    wait_for(kubelet.serving, 60, "the pool agent's readiness probe")
    boot = (kubelet.work / "bootstrap-token").read_text()
    assert kubelet.call(boot) == wire.UNAUTHORIZED  # the bootstrap token opens no sandbox
    kubelet.report_ready(name)
    # A Sandbox over the shared claim: Active on the pool Pod, no Pod or scratch claim of its own.
    cluster.create(_sandbox("s-warm", {"persistentVolumeClaim": {"claimName": CLAIM}}))
    status = cluster.wait_phase("sandbox", "s-warm", {"Active", "Errored"}, timeout=60)
    assert status["phase"] == "Active", status
    assert status["workspacePod"] == name
    body = cluster.get("sandbox", "s-warm")
    assert body is not None
    uid = body["metadata"]["uid"]
    assert body["metadata"]["annotations"][POOL_POD_ANNOTATION] == name
    claimed = cluster.get("pod", name)
    assert claimed is not None
    labels = claimed["metadata"]["labels"]
    assert POOL_LABEL not in labels and labels[UID_LABEL] == uid and POOLED_LABEL in labels
    (ref,) = claimed["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("Sandbox", uid, True)
    pvcs = json.loads(cluster.kubectl("get", "pvc", "-o", "json").stdout)["items"]
    assert [p["metadata"]["name"] for p in pvcs] == [CLAIM]
    # The hand-over: the agent holds the Sandbox's token (not the bootstrap one), narrowed
    # to the claim's mount; the bootstrap token no longer opens anything.
    handed = json.loads((kubelet.state / "state" / wire.HANDED_TOKEN_FILE).read_text())
    assert handed["allowed_root"] == "/workspace/source"
    assert handed["token"] != boot and handed["token"].startswith("v2.")
    assert kubelet.call(handed["token"]) == wire.NOT_FOUND  # past the token check
    assert kubelet.call(boot) == wire.UNAUTHORIZED
    # The pool refills: a new free Pod over the claim.
    refill = wait_for(
        lambda: [p for p in _free_pool_pods(cluster, True) if p["metadata"]["name"] != name],
        60,
        "the pool to refill",
    )
    (fresh,) = refill
    # Never reused: that Pod "is" the claimed agent here (one agent on the port), so its
    # hand-over with the bootstrap token is refused: the operator deletes it and never gives
    # the second Sandbox the first one's agent.
    kubelet.report_ready(fresh["metadata"]["name"])
    cluster.create(_sandbox("s-second", {"persistentVolumeClaim": {"claimName": CLAIM}}))

    def refused_pod_gone() -> bool:
        found = cluster.get("pod", fresh["metadata"]["name"])
        return found is None or bool(found["metadata"].get("deletionTimestamp"))

    wait_for(refused_pod_gone, 60, "the Pod whose hand-over was refused to be deleted")
    assert "refused the hand-over" in operator.logs()
    second = cluster.get("sandbox", "s-second")
    assert second is not None
    assert cluster.status("sandbox", "s-second").get("phase") != "Active"
    kept_root = json.loads((kubelet.state / "state" / wire.HANDED_TOKEN_FILE).read_text())
    assert kept_root["allowed_root"] == handed["allowed_root"]
    still = cluster.get("pod", name)
    assert still is not None and still["metadata"]["labels"][UID_LABEL] == uid
    # A Sandbox on a pool Pod is not suspended: its changes live on the Pod's emptyDir.
    cluster.kubectl(
        "patch", "sandbox", "s-warm", "--type=merge", "-p", '{"spec": {"suspend": true}}'
    )
    wait_for(
        lambda: any("warm-pool pod" in e.get("message", "") for e in cluster.events("s-warm")),
        60,
        "the refusal to suspend",
    )
    kept = cluster.get("pod", name)
    assert kept is not None and not kept["metadata"].get("deletionTimestamp")
    assert cluster.status("sandbox", "s-warm")["phase"] == "Active"

    # The token is renewed by a hand-over authenticated with the one it replaces (the Pod
    # mounts no token Secret); the old one is refused from then on.
    def renewed() -> dict[str, str] | None:
        now = json.loads((kubelet.state / "state" / wire.HANDED_TOKEN_FILE).read_text())
        return now if now["token"] != handed["token"] else None

    new = wait_for(renewed, 40, "the renewal of the handed-over token")
    assert kubelet.call(new["token"]) == wire.NOT_FOUND
    assert kubelet.call(handed["token"]) == wire.UNAUTHORIZED
    assert new["allowed_root"] == handed["allowed_root"]
    # Its Pod lost (a node failure): its changes went with the emptyDir, so the Sandbox says
    # so instead of starting again empty on another Pod.
    cluster.kubectl(
        "patch", "sandbox", "s-warm", "--type=merge", "-p", '{"spec": {"suspend": false}}'
    )
    cluster.kubectl("delete", "pod", name, "--wait=false")
    errored = cluster.wait_phase("sandbox", "s-warm", {"Errored"}, timeout=60)
    assert errored["phase"] == "Errored"
    lost = [c for c in errored["conditions"] if c.get("reason") == "PoolPodLost"]
    assert lost and name in lost[0]["message"], errored["conditions"]
    # No token in any Event or log line.
    logs = operator.logs()
    for secret in (boot, handed["token"], new["token"]):
        assert secret not in logs
        assert not any(secret in json.dumps(e) for e in cluster.events("s-warm"))


def test_a_secret_source_keeps_a_pod_of_its_own(
    cluster: Cluster, pooled: tuple[OperatorProcess, PoolKubelet]
) -> None:
    _, kubelet = pooled
    (pod,) = wait_for(lambda: _free_pool_pods(cluster, True), 60, "a pool Pod")
    kubelet.report_ready(pod["metadata"]["name"])
    cluster.create(secret_manifest("db", "sqlite:////nonexistent/app.db"))
    cluster.create(_sandbox("s-cold", {"secretRef": {"name": "db"}}, "transaction_rollback"))
    own = wait_for(
        lambda: [
            p
            for p in json.loads(cluster.kubectl("get", "pods", "-o", "json").stdout)["items"]
            if p["metadata"].get("labels", {}).get("sandbox.cleveragents.io/sandbox") == "s-cold"
        ],
        60,
        "the Sandbox's own Pod",
    )
    assert [p["metadata"]["name"].startswith("sbx-pool-") for p in own] == [False]
    free = cluster.get("pod", pod["metadata"]["name"])
    assert free is not None and POOL_LABEL in free["metadata"]["labels"]
