"""The pod executor on the real API server (tier 2) with a real workspace agent on 127.0.0.1.

Tier 2 has no kubelet, so the test plays the kubelet's two parts for the workspace Pod the
operator creates: it runs the Pod's main process (``sandbox-core serve-workspace``) with the
Pod's environment (the Secret's DSN, as ``secretKeyRef`` would) and token file (as the Secret
mount would), and it reports the Pod's status (Running, Ready, podIP 127.0.0.1) through the
status subresource. Everything else is real: the operator (pod executor) as a subprocess, the
API server, the agent process, a SQLite database (strategy transaction_rollback).

Issue 8: a starting Pod is a normal wait (Pending, no Warning), provisioning wakes on the Pod's
readiness, the token is an HMAC over the Sandbox uid and its renewal window, a deleted Pod is
made again and the sandbox re-opened, suspend/resume, ``Finished`` on the PlanCommit, and no
token or DSN in any status, Event or log line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import pytest

from tests.support.kubelet import KEY, POD, SECRET, Kubelet
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    db_sandbox,
    plancommit_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


def warnings_of(namespace: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for e in namespace.events(name) if e["type"] == "Warning"]


def test_the_pod_executor_wakes_on_pod_readiness_and_calls_the_agent(
    cluster: Cluster,
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
    secret = cluster.get("secret", SECRET)
    assert secret is not None
    token = base64.b64decode(secret["data"]["token"]).decode()
    # v2.<window>.<lifetime>.<HMAC of uid|window|lifetime>: a token that expires.
    _, serial, lifetime, mac = token.split(".")
    signed = f"{body['metadata']['uid']}|{serial}|{lifetime}".encode()
    assert mac == hmac.new(KEY.encode(), signed, hashlib.sha256).hexdigest()
    assert lifetime == "86400"
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
