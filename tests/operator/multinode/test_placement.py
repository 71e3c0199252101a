"""Workspace Pods on several nodes, placed by the real kube-scheduler, with the real
attach-detach controller refusing a ReadWriteOnce volume on a second node
(docs/operator-design.md, "Placement"; docs/testing-tiers.md, "Multi-node tier").
"""

from __future__ import annotations

import time
from typing import Any

import yaml
from sandbox_operator.executors.placement import SOURCE_CLAIM_LABEL, unschedulable_reason

from tests.support.apiserver.multinode import HOSTNAME_LABEL, MultiNodeCluster
from tests.support.multinode_objects import WORKSPACE, attachments, sandbox, source_claim
from tests.support.operator import CHART_DIR, Cluster, OperatorProcess, run_helm


def app_pod(name: str, claim_name: str, node: str) -> dict[str, Any]:
    """A Pod that is not the operator's, using ``claim_name`` on ``node``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {HOSTNAME_LABEL: node},
            "containers": [{"name": "app", "image": "app"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
        },
    }


def running_pods(nodes: MultiNodeCluster, cluster: Cluster, count: int) -> list[dict[str, Any]]:
    """Wait until ``count`` workspace Pods run (scheduled, volumes attached); return them."""

    def probe() -> list[dict[str, Any]] | None:
        pods = nodes.pods(cluster.namespace, WORKSPACE)
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(running) == count else None

    return list(nodes.wait(probe, 90, f"{count} workspace Pods running"))


def test_the_attach_detach_controller_refuses_a_read_write_once_volume_on_a_second_node(
    nodes: MultiNodeCluster, cluster: Cluster
) -> None:
    """What the tier relies on: two Pods over one RWO claim pinned to two nodes; the second
    never runs, the controller says Multi-Attach, and the volume is attached to one node."""
    source_claim(nodes, cluster, "solo", "ReadWriteOnce")
    nodes.apply([app_pod("first", "solo", nodes.nodes[0])], cluster.namespace)
    nodes.wait(
        lambda: (cluster.get("pod", "first") or {}).get("status", {}).get("phase") == "Running",
        60,
        "the first Pod running",
    )
    nodes.apply([app_pod("second", "solo", nodes.nodes[1])], cluster.namespace)
    event = nodes.wait(
        lambda: [e for e in cluster.events("second") if e["reason"] == "FailedAttachVolume"],
        60,
        "FailedAttachVolume on the second Pod",
    )
    assert "Multi-Attach error" in event[0]["message"], event
    assert (cluster.get("pod", "second") or {})["status"]["phase"] == "Pending"
    assert attachments(nodes, f"{cluster.namespace}-solo") == [nodes.nodes[0]]


def test_sandboxes_over_one_read_write_once_claim_share_the_node_it_is_attached_to(
    nodes: MultiNodeCluster, cluster: Cluster, pod_operator: OperatorProcess
) -> None:
    """Three Sandboxes made at once over one RWO claim that an application's Pod holds on the
    last node: every workspace Pod runs there, and the volume is attached to that node only."""
    source_claim(nodes, cluster, "repo", "ReadWriteOnce")
    holder = nodes.nodes[-1]
    nodes.apply([app_pod("app", "repo", holder)], cluster.namespace)
    nodes.wait(
        lambda: (cluster.get("pod", "app") or {}).get("status", {}).get("phase") == "Running",
        60,
        "the application Pod running",
    )
    nodes.apply([sandbox(f"rwo-{i}", "repo") for i in range(3)], cluster.namespace)
    pods = running_pods(nodes, cluster, 3)
    assert {p["spec"]["nodeName"] for p in pods} == {holder}
    assert attachments(nodes, f"{cluster.namespace}-repo") == [holder]
    assert all(p["metadata"]["labels"][SOURCE_CLAIM_LABEL] == "repo" for p in pods)


def test_sandboxes_made_together_over_a_fresh_read_write_once_claim_land_on_one_node(
    nodes: MultiNodeCluster, cluster: Cluster, pod_operator: OperatorProcess
) -> None:
    """No Pod uses the claim yet and three Sandboxes are made at once: the scheduler puts the
    first workspace Pod anywhere and the others beside it (pod affinity), so all run; then one
    is suspended and resumed, and its new Pod goes back beside the others."""
    source_claim(nodes, cluster, "fresh", "ReadWriteOnce")
    nodes.apply([sandbox(f"new-{i}", "fresh") for i in range(3)], cluster.namespace)
    pods = running_pods(nodes, cluster, 3)
    (node,) = {p["spec"]["nodeName"] for p in pods}
    assert attachments(nodes, f"{cluster.namespace}-fresh") == [node]

    cluster.kubectl("patch", "sandbox", "new-0", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    nodes.wait(lambda: len(nodes.pods(cluster.namespace, WORKSPACE)) == 2, 60, "one Pod gone")
    cluster.kubectl("patch", "sandbox", "new-0", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    pods = running_pods(nodes, cluster, 3)
    assert {p["spec"]["nodeName"] for p in pods} == {node}


def test_sandboxes_over_a_read_write_many_claim_spread(
    nodes: MultiNodeCluster, cluster: Cluster, pod_operator: OperatorProcess
) -> None:
    """Over an RWX claim the workspace Pods carry no affinity to each other: the scheduler
    spreads them, and the volume is attached to every node that runs one."""
    source_claim(nodes, cluster, "shared", "ReadWriteMany")
    nodes.apply([sandbox(f"rwx-{i}", "shared") for i in range(3)], cluster.namespace)
    pods = running_pods(nodes, cluster, 3)
    used = {p["spec"]["nodeName"] for p in pods}
    assert len(used) >= 2, used
    assert all("podAffinity" not in (p["spec"].get("affinity") or {}) for p in pods)
    assert attachments(nodes, f"{cluster.namespace}-shared") == sorted(used)


def test_a_workspace_pod_that_cannot_be_placed_says_why_within_seconds(
    nodes: MultiNodeCluster, cluster: Cluster, pod_operator: OperatorProcess
) -> None:
    """The claim is held on the first node and the Sandbox asks for the second one: no node
    fits, and the Sandbox's Ready condition carries the scheduler's reason within seconds of
    the scheduler's refusal (not after a time-out)."""
    source_claim(nodes, cluster, "held", "ReadWriteOnce")
    nodes.apply([app_pod("holder", "held", nodes.nodes[0])], cluster.namespace)
    nodes.wait(
        lambda: (cluster.get("pod", "holder") or {}).get("status", {}).get("phase") == "Running",
        60,
        "the holding Pod running",
    )
    began = time.monotonic()
    wanted = sandbox("elsewhere", "held", nodeSelector={HOSTNAME_LABEL: nodes.nodes[1]})
    nodes.apply([wanted], cluster.namespace)

    def refused() -> bool:
        pods = nodes.pods(cluster.namespace, WORKSPACE)
        return bool(pods) and unschedulable_reason(pods[0]) is not None

    nodes.wait(refused, 60, "the workspace Pod refused by the scheduler")
    refused_at = time.monotonic()

    def reason() -> dict[str, Any] | None:
        ready = cluster.condition("sandbox", "elsewhere", "Ready") or {}
        unplaced = ready.get("reason") == "WorkspacePodUnschedulable"
        # The first attempt may be refused for the scratch claim not bound yet; the Sandbox
        # follows the scheduler's current reason.
        return ready if unplaced and "didn't match" in ready.get("message", "") else None

    ready = nodes.wait(reason, 30, "Ready=False reason WorkspacePodUnschedulable")
    now = time.monotonic()
    print(
        f"the scheduler's reason on the Sandbox {now - refused_at:.1f}s after the scheduler "
        f"refused the Pod ({now - began:.1f}s after the apply, operator start included)"
    )
    assert now - refused_at < 10
    assert ready["status"] == "False"
    assert "0/3 nodes are available" in ready["message"], ready
    assert "node(s) didn't match Pod's node affinity/selector" in ready["message"], ready
    assert cluster.status("sandbox", "elsewhere")["phase"] == "Pending"


def test_the_operator_replicas_run_on_different_nodes(
    nodes: MultiNodeCluster, cluster: Cluster
) -> None:
    """The chart's Deployment (two replicas) on three nodes: the replicas land on two nodes.
    When the rendered chart carries no affinity of its own, the test adds the required pod
    anti-affinity by hostname that the chart is to carry (its own rendering, said so here)."""
    rendered = run_helm(
        nodes.server.bin_dir / "helm", "template", "sbx", str(CHART_DIR),
        "--namespace", cluster.namespace, "--show-only", "templates/deployment.yaml",
        "--set", "replicaCount=2",
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    deployment = _first_document(rendered.stdout)
    template = deployment["spec"]["template"]
    if not template["spec"].get("affinity"):
        selector = deployment["spec"]["selector"]["matchLabels"]
        template["spec"]["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": selector}, "topologyKey": HOSTNAME_LABEL}
                ]
            }
        }
    nodes.apply([deployment], cluster.namespace)
    selector = ",".join(
        f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items()
    )

    def placed() -> list[str] | None:
        pods = nodes.pods(cluster.namespace, selector)
        found = [p["spec"].get("nodeName") for p in pods]
        return found if len(found) == 2 and all(found) else None

    placement = nodes.wait(placed, 60, "two operator Pods placed")
    assert len(set(placement)) == 2, placement
    cluster.kubectl("delete", "deployment", "--all", check=False)


def _first_document(text: str) -> dict[str, Any]:
    """The Deployment from ``helm template`` output (YAML, one document)."""
    for document in yaml.safe_load_all(text):
        if document and document.get("kind") == "Deployment":
            return dict(document)
    raise AssertionError(f"no Deployment in {text[:500]!r}")
