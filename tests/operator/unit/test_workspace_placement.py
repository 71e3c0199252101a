"""Where a workspace Pod may run for its source claim (pure functions of
``sandbox_operator.executors.placement``, and the Pod the builder makes with them). The
scheduler's side is tested on several nodes in tests/operator/multinode/."""

from __future__ import annotations

from typing import Any

from sandbox_operator.executors.placement import (
    SOURCE_CLAIM_LABEL,
    Placement,
    claim_label_value,
    merged_affinity,
    nodes_holding,
    plan_placement,
    unschedulable_reason,
)


def pod(node: str | None, claim: str, *, phase: str = "Running", ours: bool = False) -> dict:
    labels = {SOURCE_CLAIM_LABEL: claim} if ours else {}
    spec: dict[str, Any] = {
        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"labels": labels}, "spec": spec, "status": {"phase": phase}}


def test_a_read_write_once_claim_keeps_its_pods_together_and_pins_to_the_holders_node() -> None:
    pods = [
        pod("n2", "repo"),
        pod("n1", "repo", ours=True),  # ours: left to the pod affinity
        pod("n3", "other"),
        pod("n4", "repo", phase="Succeeded"),  # finished: holds nothing
        pod(None, "repo"),  # not placed yet
    ]
    placement = plan_placement("repo", ["ReadWriteOnce"], pods)
    assert placement == Placement(claim_label="repo", together=True, nodes=("n2",))
    affinity = merged_affinity(None, placement)
    assert affinity == {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {SOURCE_CLAIM_LABEL: "repo"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
                ]
            }
        },
    }


def test_shared_claims_spread_freely_and_an_unknown_one_counts_as_one_node() -> None:
    for modes in (["ReadWriteMany"], ["ReadOnlyMany"], ["ReadWriteOnce", "ReadWriteMany"]):
        placement = plan_placement("data", modes, [pod("n1", "data")])
        assert placement == Placement(claim_label="data")
        assert merged_affinity(None, placement) is None
    assert plan_placement("data", [], []).together
    assert plan_placement("data", ["ReadWriteOncePod"], []).together


def test_the_users_affinity_is_kept_and_every_node_term_gets_the_node_names() -> None:
    user = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
                    {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                ]
            }
        },
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "z"}]},
    }
    before = repr(user)
    out = merged_affinity(user, Placement(claim_label="repo", together=True, nodes=("a", "b")))
    assert repr(user) == before  # the Sandbox's spec is not modified
    assert out is not None
    terms = out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [t["matchExpressions"][0]["key"] for t in terms] == ["disk", "gpu"]
    assert all(
        t["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]
        for t in terms
    )
    pod_terms = out["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pod_terms[0] == {"topologyKey": "z"} and len(pod_terms) == 2


def test_long_claim_names_become_valid_label_values() -> None:
    assert claim_label_value("repo.v2") == "repo.v2"
    long_name = "a" * 64
    value = claim_label_value(long_name)
    assert value.startswith("c-") and len(value) == 42
    assert value != claim_label_value("a" * 65)


def test_nodes_holding_ignores_pods_of_other_claims_and_our_own() -> None:
    assert nodes_holding([pod("n1", "x"), pod("n2", "y", ours=True)], "y") == ()
    assert nodes_holding([pod("n2", "y"), pod("n1", "y")], "y") == ("n1", "n2")


def test_the_schedulers_reason_is_read_from_pod_scheduled_false() -> None:
    message = "0/3 nodes are available: 3 node(s) didn't match pod affinity rules."
    unplaced = {
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": message},
            ],
        }
    }  # fmt: skip
    assert unschedulable_reason(unplaced) == f"Unschedulable: {message}"
    placed = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert unschedulable_reason(placed) is None
    assert unschedulable_reason({"status": {}}) is None


def test_the_workspace_pod_carries_its_claim_label_and_the_placement_affinity() -> None:
    from sandbox_operator.executors.base import SandboxTarget, sandbox_id_for_uid
    from sandbox_operator.executors.pod_manifests import build_workspace_pod
    from sandbox_operator.settings import Settings

    from sandbox_api.models import SandboxOptions, SandboxSource

    uid = "0f0e0d0c-0000-4000-8000-000000000001"
    target = SandboxTarget(
        name="s",
        namespace="ns",
        uid=uid,
        sandbox_id=sandbox_id_for_uid(uid),
        plan_id="p",
        resource_id="r",
        strategy="none",
        original="/workspace/source",
        source=SandboxSource.model_validate({"persistentVolumeClaim": {"claimName": "repo"}}),
        options=SandboxOptions.model_validate({}),
    )
    plain = build_workspace_pod(target, Settings(), None)
    assert SOURCE_CLAIM_LABEL not in plain["metadata"]["labels"]
    assert "affinity" not in plain["spec"]
    placed = build_workspace_pod(
        target, Settings(), None, placement=plan_placement("repo", ["ReadWriteOnce"], [])
    )
    assert placed["metadata"]["labels"][SOURCE_CLAIM_LABEL] == "repo"
    term = placed["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ][0]
    assert term["labelSelector"]["matchLabels"] == {SOURCE_CLAIM_LABEL: "repo"}
    assert "nodeAffinity" not in placed["spec"]["affinity"]
