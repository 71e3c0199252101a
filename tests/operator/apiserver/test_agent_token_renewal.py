"""Workspace-agent tokens expire and are renewed on the real API server (tier 2).

The operator (pod executor) runs with a 6 s token lifetime and a 1 s renewal timer; the test
plays the kubelet (``tests.support.kubelet``: the workspace agent as a real process, with the
token file the Sandbox's Secret gives it). The operator writes a new token into the Secret every
half lifetime, and the Sandbox stays served while the kubelet brings each one to the Pod, late
or not; a token the kubelet stops bringing is refused by the agent with 401 ``TokenExpired``
once it has held it for a lifetime; renewed again, the Sandbox is served and its deletion runs
the agent's cleanup with no ``CleanupFailed``.
"""

from __future__ import annotations

import base64
import time

import pytest
from sandbox_operator.executors.agent_client import AgentClient, AgentNotFound, AgentUnauthorized

from sandbox_core.agent import wire
from tests.support.kubelet import POD, SECRET, Kubelet
from tests.support.operator import Cluster, OperatorProcess, db_sandbox, wait_for

pytestmark = pytest.mark.slow

LIFETIME = 6
STATUS = wire.STATUS.path(sid="01HZX0A7Q3J0F8K2M4N6P8R0T2")


def _secret_token(cluster: Cluster) -> bytes:
    secret = cluster.get("secret", SECRET)
    assert secret is not None
    return base64.b64decode(secret["data"]["token"])


def _agent(kubelet: Kubelet, token: bytes) -> AgentClient:
    return AgentClient(f"http://127.0.0.1:{kubelet.port}", token.decode(), timeout_seconds=10)


def test_tokens_are_renewed_before_they_expire_and_an_unrenewed_one_is_refused(
    cluster: Cluster, pod_operator: tuple[OperatorProcess, Kubelet]
) -> None:
    operator, kubelet = pod_operator
    operator.stop()
    operator.start({
        "SANDBOX_OPERATOR_AGENT_TOKEN_LIFETIME_SECONDS": str(LIFETIME),
        "SANDBOX_OPERATOR_AGENT_TOKEN_RENEW_INTERVAL_SECONDS": "1",
    })  # fmt: skip
    cluster.create(db_sandbox("s-db", "plan-t", "db"))
    wait_for(lambda: cluster.get("pod", POD), 60, "the workspace Pod")
    kubelet.start_container()
    kubelet.report_ready()

    def provisioned() -> str | None:
        # A kubelet brings the Secret's updates to the Pod all along: on a slow machine the
        # first renewal comes before the operator's first call to the agent.
        kubelet.sync_token()
        phase = cluster.status("sandbox", "s-db").get("phase")
        return phase if phase in {"Active", "Errored"} else None

    assert wait_for(provisioned, 60, "the Sandbox Active or Errored") == "Active"

    # Renewed every half lifetime; the kubelet brings each token late (1 s after it is
    # written, or not for a while), and the agent serves the current one throughout.
    seen = {kubelet.sync_token()}
    deadline = time.monotonic() + 2.5 * LIFETIME
    while time.monotonic() < deadline:
        token = kubelet.sync_token()
        seen.add(token)
        with pytest.raises(AgentNotFound):  # past the token check: no such sandbox
            _agent(kubelet, token).call("GET", STATUS)
        time.sleep(1)
    assert len(seen) >= 3, f"{len(seen)} tokens in {2.5 * LIFETIME} s"
    assert all(t.startswith(b"v2.") and t.split(b".")[2] == b"6" for t in seen)

    # The kubelet stops bringing new tokens: the agent refuses the one it holds once it has
    # held it for a lifetime, named as expired, while the Secret moves on.
    held = kubelet.sync_token()
    with pytest.raises(AgentNotFound):  # the agent's clock for it starts at its first use
        _agent(kubelet, held).call("GET", STATUS)
    time.sleep(LIFETIME + 1)
    with pytest.raises(AgentUnauthorized, match=r"refused \(token expired\)") as refused:
        _agent(kubelet, held).call("GET", STATUS)
    assert refused.value.expired
    assert _secret_token(cluster) != held

    # Renewed again: served, and the deletion's cleanup reaches the agent.
    kubelet.sync_token()
    cluster.kubectl("delete", "sandbox", "s-db", "--wait=false")
    wait_for(lambda: cluster.get("sandbox", "s-db") is None, 90, "the Sandbox deleted")
    warnings = [e for e in cluster.events("s-db") if e["type"] == "Warning"]
    assert not [w for w in warnings if w["reason"] == "CleanupFailed"], warnings
    assert "agent token renewed" in operator.logs()
