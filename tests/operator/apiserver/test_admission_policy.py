"""The chart's MutatingAdmissionPolicy on the real API server (tier 2; issue 11, throughput).

With the policy, a new object already holds kopf's finalizer, kopf's marker annotation and (on
a Sandbox whose ``spec.planId`` can be a label value) the plan-id label when the operator first
sees it: the operator's own metadata PATCH, and the reconcile cycle of its echo, are gone. A
new Sandbox then costs two writes (the ``/status`` PATCH and the ``Provisioned`` Event) instead
of three, and everything else behaves as without the policy: deletion through the finalizer,
objects outside the watched namespace untouched. Rendered from the chart (``helm template``),
so what is tested is what the chart installs. The policy is opt-in (``admissionPolicy.enabled``,
off by default: what admission adds has no field manager, docs/operations.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.api_writes import writes_per_new_sandbox
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    install_admission_policy,
    plancommit_manifest,
    run_operator,
    sandbox_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow

FINALIZER = "sandbox.cleveragents.io/cleanup"
PLAN_LABEL = "sandbox.cleveragents.io/plan-id"
MARKER = "sandbox.cleveragents.io/kopf-managed"


@pytest.fixture
def cluster(local_apiserver: Any) -> Iterator[Cluster]:
    cluster = Cluster.fresh(local_apiserver, prefix="map")
    manifest = install_admission_policy(local_apiserver, cluster.namespace, cluster)
    yield cluster
    local_apiserver.kubectl("delete", "-f", "-", input=manifest, check=False)


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path)


def admitted(cluster: Cluster, manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server would store for ``manifest`` (a server-side dry-run create)."""
    result = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(manifest)
    )
    return dict(json.loads(result.stdout)["metadata"])


def test_a_new_sandbox_costs_two_writes_with_the_policy(
    local_apiserver: Any,
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    per_sandbox, names = writes_per_new_sandbox(local_apiserver, cluster, operator, tmp_path, "map")
    assert per_sandbox == {
        "PATCH sandboxes": 0.0,  # the policy set the finalizer, the label and kopf's marker
        "PATCH sandboxes/status": 1.0,  # the outcome and kopf's diff-base
        "POST events": 1.0,  # Provisioned
    }
    for name in names:
        body = cluster.get("sandbox", name) or {}
        assert body["metadata"]["labels"][PLAN_LABEL] == "map-plan"
        assert body["metadata"]["finalizers"] == [FINALIZER]
        assert body["metadata"]["annotations"][MARKER] == "yes"
        assert body["status"]["lastHandledConfiguration"]
    # Deletion goes through the operator's finalizer as without the policy.
    cluster.kubectl("delete", "sandbox", names[0], "--wait=false")
    wait_for(lambda: cluster.gone("sandbox", names[0]), 60, "the Sandbox gone")


def test_the_policy_sets_what_the_operator_would_and_keeps_the_rest(
    local_apiserver: Any,
    cluster: Cluster,
) -> None:
    """The label only where the operator would set it; the user's own finalizers, labels and
    annotations stay; every kind of the operator gets the finalizer and the marker."""
    manifest = sandbox_manifest("mine", "plan-x", "none", Path("/nonexistent"))
    manifest["metadata"].update(
        finalizers=["example.com/keep"], labels={"team": "a"}, annotations={"note": "n"}
    )
    meta = admitted(cluster, manifest)
    assert meta["finalizers"] == ["example.com/keep", FINALIZER]
    assert meta["labels"] == {"team": "a", PLAN_LABEL: "plan-x"}
    assert meta["annotations"] == {"note": "n", MARKER: "yes"}
    # kopf's marker is only added: a value of the user's own stays, as with the operator's PATCH.
    manifest["metadata"]["annotations"] = {MARKER: "no"}
    assert admitted(cluster, manifest)["annotations"] == {MARKER: "no"}
    # A plan id that cannot be a label value: admitted, no label (the operator's rule).
    for plan_id in ("plan/with/slash", "p" * 64, "-dash-first"):
        meta = admitted(cluster, sandbox_manifest("odd", plan_id, "none", Path("/nonexistent")))
        assert PLAN_LABEL not in (meta.get("labels") or {}), plan_id
        assert meta["finalizers"] == [FINALIZER], plan_id
    # A PlanCommit and a Checkpoint get the finalizer and the marker but no label.
    for other in (plancommit_manifest("pc", "plan-x"), checkpoint_manifest("cp", "mine")):
        meta = admitted(cluster, other)
        assert meta["finalizers"] == [FINALIZER], other["kind"]
        assert meta["annotations"] == {MARKER: "yes"}, other["kind"]
        assert PLAN_LABEL not in (meta.get("labels") or {}), other["kind"]


def test_the_policy_leaves_namespaces_the_operator_does_not_watch(
    local_apiserver: Any,
    cluster: Cluster,
) -> None:
    """Bound to ``watchNamespace``: elsewhere nobody would remove the finalizer."""
    other = Cluster.fresh(local_apiserver, prefix="map-other")
    meta = admitted(other, sandbox_manifest("elsewhere", "plan-x", "none", Path("/nonexistent")))
    assert "finalizers" not in meta
    assert MARKER not in (meta.get("annotations") or {})
