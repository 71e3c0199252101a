"""Objects the multi-node tier's tests make (tests/operator/multinode): an attachable source
claim, a Sandbox over it, and the nodes a volume is attached to."""

from __future__ import annotations

from typing import Any

from tests.support.apiserver.multinode import MultiNodeCluster, attachable_volume, claim
from tests.support.operator import API, Cluster

WORKSPACE = "app.kubernetes.io/component=workspace"


def source_claim(nodes: MultiNodeCluster, cluster: Cluster, name: str, mode: str) -> None:
    """An attachable CSI volume with access ``mode`` and claim ``name`` bound to it."""
    volume = f"{cluster.namespace}-{name}"
    nodes.apply(attachable_volume(volume, volume, mode, (cluster.namespace, name)))
    nodes.apply([claim(name, volume, mode)], cluster.namespace)
    nodes.wait(
        lambda: (cluster.get("pvc", name) or {}).get("status", {}).get("phase") == "Bound",
        30,
        f"claim {name} bound",
    )


def sandbox(name: str, claim_name: str, **workspace: Any) -> dict[str, Any]:
    """A Sandbox over claim ``claim_name`` (strategy none: the smallest workspace Pod)."""
    spec: dict[str, Any] = {
        "planId": "placement",
        "resourceId": name,
        "strategy": "none",
        "source": {"persistentVolumeClaim": {"claimName": claim_name}},
    }
    if workspace:
        spec["workspace"] = workspace
    return {"apiVersion": API, "kind": "Sandbox", "metadata": {"name": name}, "spec": spec}


def attachments(nodes: MultiNodeCluster, volume: str) -> list[str]:
    """The nodes the attach-detach controller attached ``volume`` to."""
    return sorted(
        a["spec"]["nodeName"]
        for a in nodes.volume_attachments()
        if a["spec"]["source"].get("persistentVolumeName") == volume
    )
