"""The agent key on the real API server (tier 2): made by the operator when absent (so the chart
renders no randomness and ``helm template`` never changes it), and rotated without breaking a
live Sandbox.

The operator (pod executor) runs as the chart runs it: ``SANDBOX_OPERATOR_AGENT_KEY_SECRET``
names the key Secret in its namespace, and no key file exists. The test plays the kubelet
(``tests.support.kubelet``: the workspace agent as a real process, with the token the operator
wrote into the Sandbox's Secret). After a rotation (``key`` moved to ``previous``, a new
``key``, the operator restarted) the Sandbox made before is still served: its deletion runs the
agent's cleanup with the previous key's token, and the finalizer lets it go.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import pytest

from sandbox_api.naming import child_object_name
from tests.support.kubelet import POD, Kubelet
from tests.support.operator import Cluster, OperatorProcess, db_sandbox, wait_for

pytestmark = pytest.mark.slow

KEY_SECRET = "op-agent-key"
NEW_KEY = "f" * 64


def _token(key: bytes, uid: str, serial: str, lifetime: str) -> str:
    mac = hmac.new(key, f"{uid}|{serial}|{lifetime}".encode(), hashlib.sha256).hexdigest()
    return f"v2.{serial}.{lifetime}.{mac}"


def _secret_value(cluster: Cluster, name: str, key: str) -> bytes:
    secret = cluster.get("secret", name)
    assert secret is not None, f"no Secret {name}"
    return base64.b64decode(secret["data"][key])


def _restart(operator: OperatorProcess) -> None:
    operator.stop()
    operator.start({"SANDBOX_OPERATOR_AGENT_KEY_SECRET": KEY_SECRET})


def _warnings(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(name) if e["type"] == "Warning"]


def test_the_operator_makes_the_key_and_a_rotation_keeps_the_sandbox_served(
    cluster: Cluster, pod_operator: tuple[OperatorProcess, Kubelet]
) -> None:
    operator, kubelet = pod_operator
    assert cluster.get("secret", KEY_SECRET) is None
    _restart(operator)
    cluster.create(db_sandbox("s-db", "plan-k", "db"))
    wait_for(lambda: cluster.get("pod", POD), 60, "the workspace Pod")
    # The operator made its key, and the Sandbox's token is derived from it.
    old_key = _secret_value(cluster, KEY_SECRET, "key")
    assert len(old_key) == 64
    body = cluster.get("sandbox", "s-db")
    assert body is not None
    uid = body["metadata"]["uid"]
    token = _secret_value(cluster, child_object_name("s-db", "agent"), "token")
    _, serial, lifetime, _ = token.decode().split(".")
    assert token.decode() == _token(old_key, uid, serial, lifetime)
    kubelet.start_container()
    kubelet.report_ready()
    status = cluster.wait_phase("sandbox", "s-db", {"Active", "Errored"}, timeout=60)
    assert status["phase"] == "Active", status

    # Rotation: the new key current, the old one previous; the operator restarted.
    new = base64.b64encode(NEW_KEY.encode()).decode()
    cluster.kubectl(
        "patch", "secret", KEY_SECRET, "--type=merge", "-p",
        f'{{"data": {{"key": "{new}", "previous": "{base64.b64encode(old_key).decode()}"}}}}',
    )  # fmt: skip
    _restart(operator)
    # The Sandbox made before is still served: its cleanup reaches the agent with the previous
    # key's token, so the finalizer lets it go, with no CleanupFailed on the way.
    cluster.kubectl("delete", "sandbox", "s-db", "--wait=false")
    wait_for(lambda: cluster.get("sandbox", "s-db") is None, 90, "the Sandbox deleted")
    assert not [w for w in _warnings(cluster, "s-db") if w["reason"] == "CleanupFailed"]
    assert "refused (token)" not in operator.logs()
    # The key was not made again.
    assert _secret_value(cluster, KEY_SECRET, "key") == NEW_KEY.encode()
