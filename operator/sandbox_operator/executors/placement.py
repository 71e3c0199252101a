"""Where a workspace Pod may run, so that its source claim can attach there (pure; unit-tested).

A ReadWriteOnce volume attaches to one node at a time: the attach-detach controller refuses a
second node ("Multi-Attach error ... Volume is already used by pod(s)") and that Pod never
starts. Several Sandboxes over one such claim therefore keep their workspace Pods on one node
(docs/operator-design.md, "Placement"):

* every workspace Pod carries the label :data:`SOURCE_CLAIM_LABEL` (the claim, as a label value);
* over a claim that is not ReadWriteMany / ReadOnlyMany, the Pod gets a required
  ``podAffinity`` to the Pods with the same label, topology ``kubernetes.io/hostname``. The
  kube-scheduler places Pods one at a time and counts those it already placed, so two Sandboxes
  made at the same moment still land together; the first Pod matches its own term, which the
  scheduler admits anywhere;
* Pods that are not ours and already use the claim (an application's Pod) pin it by node name
  (``nodeAffinity`` ``matchFields`` ``metadata.name``): they carry no label to be affine to.

ReadWriteMany and ReadOnlyMany claims get the label only: the Pods spread freely. A node
restriction of the volume itself (a PV's ``nodeAffinity``: local volumes, zonal disks, also the
scratch claim's) is the scheduler's VolumeBinding check and needs nothing here, also on resume.
A ReadWriteOncePod claim admits one Pod in the cluster: a second Sandbox's Pod is refused by the
scheduler (VolumeRestrictions) and the Sandbox says so (``WorkspacePodUnschedulable``).
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SOURCE_CLAIM_LABEL = "sandbox.cleveragents.io/source-claim"
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
# Access modes under which any number of nodes may mount the volume at once.
SHARED_MODES = frozenset({"ReadWriteMany", "ReadOnlyMany"})
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def claim_label_value(claim_name: str) -> str:
    """The label value naming claim ``claim_name``: the name itself when it is a valid label
    value (<= 63 characters), else ``c-`` and 40 hex digits of its SHA-256 (claim names may
    have 253)."""
    if _LABEL_VALUE.match(claim_name):
        return claim_name
    return "c-" + hashlib.sha256(claim_name.encode()).hexdigest()[:40]


def shared_across_nodes(access_modes: Iterable[str]) -> bool:
    """True when a volume with ``access_modes`` may be mounted on several nodes at once."""
    return any(mode in SHARED_MODES for mode in access_modes)


@dataclass(frozen=True)
class Placement:
    """What the workspace Pod's scheduling needs for its source claim.

    Attributes:
        claim_label: value of :data:`SOURCE_CLAIM_LABEL` ("" when the source is not a claim).
        together: the Pods over this claim must share a node (the claim is not shared across
            nodes).
        nodes: the nodes where Pods that are not workspace Pods use the claim now (sorted);
            empty when none do or ``together`` is false.
    """

    claim_label: str = ""
    together: bool = False
    nodes: tuple[str, ...] = ()


def _uses_claim(pod: Mapping[str, Any], claim_name: str) -> bool:
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        source = volume.get("persistentVolumeClaim") or {}
        if source.get("claimName") == claim_name:
            return True
    return False


def nodes_holding(pods: Iterable[Mapping[str, Any]], claim_name: str) -> tuple[str, ...]:
    """The nodes where a Pod in ``pods`` (API dicts of one namespace) that is not a workspace
    Pod holds ``claim_name``: bound to a node, not finished (Succeeded/Failed). Sorted, unique.
    Workspace Pods (label :data:`SOURCE_CLAIM_LABEL`) are left to the pod affinity."""
    nodes: set[str] = set()
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if SOURCE_CLAIM_LABEL in labels:
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node and phase not in ("Succeeded", "Failed") and _uses_claim(pod, claim_name):
            nodes.add(str(node))
    return tuple(sorted(nodes))


def plan_placement(
    claim_name: str, access_modes: Iterable[str], pods: Iterable[Mapping[str, Any]]
) -> Placement:
    """The :class:`Placement` of a workspace Pod over ``claim_name``, whose bound volume (or,
    unbound, request) has ``access_modes``; ``pods`` are the namespace's Pods now."""
    label = claim_label_value(claim_name)
    if shared_across_nodes(access_modes):
        return Placement(claim_label=label)
    return Placement(claim_label=label, together=True, nodes=nodes_holding(pods, claim_name))


def merged_affinity(
    affinity: Mapping[str, Any] | None, placement: Placement
) -> dict[str, Any] | None:
    """``affinity`` (``spec.workspace.affinity``, not modified) with ``placement``'s terms added:
    the required pod affinity to the claim's other workspace Pods, and the node names ANDed into
    every required node selector term (terms are ORed, so each gets it). None when there is
    nothing to say."""
    out: dict[str, Any] = copy.deepcopy(dict(affinity or {}))
    if placement.together and placement.claim_label:
        pod_affinity = out.setdefault("podAffinity", {})
        terms = pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
        terms.append(
            {
                "labelSelector": {"matchLabels": {SOURCE_CLAIM_LABEL: placement.claim_label}},
                "topologyKey": HOSTNAME_TOPOLOGY,
            }
        )
    if placement.together and placement.nodes:
        requirement = {"key": "metadata.name", "operator": "In", "values": list(placement.nodes)}
        node_affinity = out.setdefault("nodeAffinity", {})
        required = node_affinity.setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
        )
        terms = required.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({})
        for term in terms:
            term.setdefault("matchFields", []).append(dict(requirement))
    return out or None


def unschedulable_reason(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when ``pod`` (API dict) could not be placed: its ``PodScheduled``
    condition is ``False`` (reason ``Unschedulable`` or another); None when it is placed or not
    tried yet."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and str(condition.get("status")) == "False":
            reason = condition.get("reason") or "Unschedulable"
            message = condition.get("message") or "no node fits"
            return f"{reason}: {message}"
    return None
