"""The warm pool on several nodes, placed by the real kube-scheduler, with the real attach-detach
controller attaching the pool's ReadWriteMany source claim to every node that runs one of its
Pods (docs/operator-design.md, "Warm pool"; docs/testing-tiers.md, "Multi-node tier").

Every workspace Pod here runs the real workspace agent (`FakeKubelet.agents`: one loopback IP
per Pod, the claim's directory at the source mount), so a Sandbox reaches ``Active`` through
the agent's hand-over (``POST /v1/handover``) on the pool Pod the operator claimed for it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_operator.executors.pod import POOL_POD_ANNOTATION
from sandbox_operator.executors.pod_manifests import SANDBOX_UID_LABEL, SOURCE_MOUNT
from sandbox_operator.executors.warm_pool import POOL_LABEL, POOLED_LABEL

from sandbox_core.agent import wire
from tests.support.apiserver.harness import free_port
from tests.support.apiserver.multinode import AgentSettings, MultiNodeCluster
from tests.support.kubelet import KEY
from tests.support.multinode_objects import WORKSPACE, attachments, sandbox, source_claim
from tests.support.operator import Cluster, OperatorProcess, pod_executor_env

CLAIM = "shared"
SIZE = 3
# Generous: a loaded 2-core machine starts three agents and the operator at once.
WAIT = 180


@pytest.fixture
def pool_operator(
    nodes: MultiNodeCluster, cluster: Cluster, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator with the pod executor and a warm pool of :data:`SIZE` Pods over the
    ReadWriteMany claim :data:`CLAIM` (made first), every workspace Pod's agent running."""
    source_claim(nodes, cluster, CLAIM, "ReadWriteMany")
    key = tmp_path / "agent-key"
    key.write_text(KEY)
    work = tmp_path / "operator"
    work.mkdir()
    port = free_port()
    operator = OperatorProcess(
        nodes.server,
        cluster.namespace,
        work,
        pod_executor_env(
            cluster.namespace,
            key,
            port,
            EXEC_TIMEOUT_SECONDS="30",
            WARM_POOL_SIZE=str(SIZE),
            WARM_POOL_NAMESPACES=cluster.namespace,
            WARM_POOL_SOURCE_CLAIMS=CLAIM,
            WARM_POOL_INTERVAL_SECONDS="1",
        ),
    )
    cluster.operator = operator
    assert nodes.kubelet is not None
    with nodes.kubelet.agents(AgentSettings(port, tmp_path / "kubelet")):
        operator.start()
        try:
            yield operator
            cluster.kubectl("delete", "sandboxes", "--all", "--timeout=60s", check=False)
        finally:
            operator.stop()
            # Nothing of this namespace stays on the nodes for the next test's scheduling.
            cluster.kubectl("delete", "pods", "--all", "--wait=false", check=False)
    print(operator.logs()[-6000:])
    print("fake kubelet errors:", nodes.kubelet.errors[-20:])


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def free_pool(nodes: MultiNodeCluster, cluster: Cluster) -> list[dict[str, Any]]:
    """The free pool Pods (pool label, not being deleted) that are Ready, by name."""
    pods = nodes.pods(cluster.namespace, POOL_LABEL)
    found = [p for p in pods if not p["metadata"].get("deletionTimestamp") and _ready(p)]
    return sorted(found, key=lambda p: str(p["metadata"]["name"]))


def full_pool(
    nodes: MultiNodeCluster, cluster: Cluster, without: Collection[str] = ()
) -> list[dict[str, Any]]:
    """Wait until :data:`SIZE` free pool Pods are Ready, none of them named in ``without``,
    and no other free pool Pod is left (a bad one replaced is gone); return them."""

    def probe() -> list[dict[str, Any]] | None:
        listed = [
            p
            for p in nodes.pods(cluster.namespace, POOL_LABEL)
            if not p["metadata"].get("deletionTimestamp")
        ]
        ready = [p for p in listed if _ready(p) and p["metadata"]["name"] not in without]
        return ready if len(ready) == SIZE == len(listed) else None

    found = nodes.wait(probe, WAIT, f"{SIZE} Ready free pool Pods (not {sorted(without)})")
    return sorted(found, key=lambda p: str(p["metadata"]["name"]))


def names(pods: list[dict[str, Any]]) -> set[str]:
    return {str(p["metadata"]["name"]) for p in pods}


def handed_over(nodes: MultiNodeCluster, cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """What ``pod``'s agent keeps from its hand-over (token and allowed root)."""
    assert nodes.kubelet is not None
    agent = nodes.kubelet.agent(cluster.namespace, pod["metadata"]["name"])
    assert agent is not None, f"no agent runs for {pod['metadata']['name']}"
    state = agent.scratch_dir(pod) / "state" / wire.HANDED_TOKEN_FILE
    return dict(json.loads(state.read_text()))


def test_a_pool_spreads_over_the_nodes_serves_a_sandbox_once_and_refills(
    nodes: MultiNodeCluster, cluster: Cluster, pool_operator: OperatorProcess
) -> None:
    """Three pool Pods over an RWX claim: the scheduler spreads them over at least two nodes
    and the claim's volume is attached to each of those. A Sandbox over the claim becomes
    Active on one of them (its agent took the hand-over); that Pod is the Sandbox's from then
    on, the pool refills with a new Pod the scheduler places, the next Sandbox gets another
    pool Pod, and the first refuses to suspend (its changes live on the Pod's emptyDir)."""
    pool = full_pool(nodes, cluster)
    used = {p["spec"]["nodeName"] for p in pool}
    assert len(used) >= 2, [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in pool]
    volume = f"{cluster.namespace}-{CLAIM}"
    assert attachments(nodes, volume) == sorted(used)
    for pod in pool:
        (source,) = [v for v in pod["spec"]["volumes"] if v["name"] == "source"]
        assert source["persistentVolumeClaim"] == {"claimName": CLAIM}

    cluster.create(sandbox("warm", CLAIM))
    status = cluster.wait_phase("sandbox", "warm", {"Active", "Errored"}, timeout=WAIT)
    assert status["phase"] == "Active", status
    taken = status["workspacePod"]
    assert taken in names(pool)
    body = cluster.get("sandbox", "warm")
    assert body is not None
    uid = body["metadata"]["uid"]
    assert body["metadata"]["annotations"][POOL_POD_ANNOTATION] == taken
    claimed = cluster.get("pod", taken)
    assert claimed is not None
    labels = claimed["metadata"]["labels"]
    assert POOL_LABEL not in labels and POOLED_LABEL in labels
    assert labels[SANDBOX_UID_LABEL] == uid
    (owner,) = claimed["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Sandbox", uid, True)
    handed = handed_over(nodes, cluster, claimed)
    assert handed["allowed_root"] == SOURCE_MOUNT
    assert handed["token"].startswith("v2.")
    # No Pod of its own: the only workspace Pods are the pool's (free or claimed).
    kinds = [
        (POOL_LABEL in p["metadata"]["labels"], POOLED_LABEL in p["metadata"]["labels"])
        for p in nodes.pods(cluster.namespace, WORKSPACE)
    ]
    assert (False, False) not in kinds, kinds

    refilled = full_pool(nodes, cluster, without={taken})
    (fresh,) = names(refilled) - names(pool)
    new_pod = next(p for p in refilled if p["metadata"]["name"] == fresh)
    assert new_pod["spec"]["nodeName"] in nodes.nodes
    running = {p["spec"]["nodeName"] for p in [*refilled, claimed]}
    assert attachments(nodes, volume) == sorted(running)

    cluster.create(sandbox("warm-2", CLAIM))
    second = cluster.wait_phase("sandbox", "warm-2", {"Active", "Errored"}, timeout=WAIT)
    assert second["phase"] == "Active", second
    assert second["workspacePod"] in names(refilled)
    assert second["workspacePod"] != taken
    still = cluster.get("pod", taken)
    assert still is not None and still["metadata"]["labels"][SANDBOX_UID_LABEL] == uid
    assert POOL_LABEL not in still["metadata"]["labels"]
    assert handed_over(nodes, cluster, still)["token"] == handed["token"]

    cluster.kubectl("patch", "sandbox", "warm", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    refusal = nodes.wait(
        lambda: [e for e in cluster.events("warm") if "warm-pool pod" in e.get("message", "")],
        WAIT,
        "the refusal to suspend a Sandbox on a pool Pod",
    )
    assert refusal[0]["type"] == "Warning" and refusal[0]["reason"] == "SuspendFailed", refusal
    kept = cluster.get("pod", taken)
    assert kept is not None and not kept["metadata"].get("deletionTimestamp")
    assert cluster.status("sandbox", "warm")["phase"] == "Active"


def test_a_pool_pod_that_is_deleted_or_fails_is_replaced(
    nodes: MultiNodeCluster, cluster: Cluster, pool_operator: OperatorProcess
) -> None:
    """One free pool Pod deleted, another failed (phase Failed, as when its container ends):
    the pool deletes the failed one and the scheduler places two new Pods; the bad Pods'
    agents are stopped."""
    pool = full_pool(nodes, cluster)
    deleted, failed = sorted(names(pool))[:2]
    cluster.kubectl("delete", "pod", deleted, "--wait=false")
    failure = {"status": {"phase": "Failed", "reason": "Error", "message": "the agent exited"}}
    cluster.kubectl(
        "patch", "pod", failed, "--subresource=status", "--type=merge", "-p", json.dumps(failure)
    )
    refilled = full_pool(nodes, cluster, without={deleted, failed})
    assert len(names(refilled) - names(pool)) == 2
    assert all(p["spec"]["nodeName"] in nodes.nodes for p in refilled)
    nodes.wait(lambda: cluster.gone("pod", failed), WAIT, "the failed pool Pod deleted")
    assert cluster.gone("pod", deleted)
    assert nodes.kubelet is not None
    assert nodes.kubelet.agent(cluster.namespace, deleted) is None
    assert nodes.kubelet.agent(cluster.namespace, failed) is None


def test_a_sandbox_of_another_shape_over_the_claim_suspends_and_resumes_on_a_node(
    nodes: MultiNodeCluster, cluster: Cluster, pool_operator: OperatorProcess
) -> None:
    """A Sandbox over the pool's claim whose workspace has a shape of its own (a CPU request)
    takes no pool Pod: it gets a Pod of its own, placed by the scheduler; suspended, the Pod
    goes; resumed, a new Pod is placed on a node the claim's volume is attached to, and the
    Sandbox is Active again."""
    full_pool(nodes, cluster)
    shaped = sandbox("cold", CLAIM, resources={"requests": {"cpu": "100m"}})
    cluster.create(shaped)
    first = cluster.wait_phase("sandbox", "cold", {"Active", "Errored"}, timeout=WAIT)
    assert first["phase"] == "Active", first
    pod = cluster.get("pod", first["workspacePod"])
    assert pod is not None
    labels = pod["metadata"]["labels"]
    assert POOL_LABEL not in labels and POOLED_LABEL not in labels
    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "100m"}}
    volume = f"{cluster.namespace}-{CLAIM}"
    assert pod["spec"]["nodeName"] in attachments(nodes, volume)

    cluster.kubectl("patch", "sandbox", "cold", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    nodes.wait(lambda: cluster.gone("pod", pod["metadata"]["name"]), WAIT, "the cold Pod gone")
    cluster.wait_phase("sandbox", "cold", {"Suspended"}, timeout=WAIT)
    cluster.kubectl("patch", "sandbox", "cold", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    again = cluster.wait_phase("sandbox", "cold", {"Active", "Errored"}, timeout=WAIT)
    assert again["phase"] == "Active", again
    resumed = cluster.get("pod", again["workspacePod"])
    assert resumed is not None
    assert resumed["metadata"]["uid"] != pod["metadata"]["uid"]
    assert POOLED_LABEL not in resumed["metadata"]["labels"]
    assert resumed["spec"]["nodeName"] in attachments(nodes, volume)
