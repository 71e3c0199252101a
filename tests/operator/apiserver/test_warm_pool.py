"""The warm pool of workspace Pods (sandbox_operator.executors.warm_pool) on the real API server
(tier 2): the pool fills to its size, a Sandbox claims a Ready Pod atomically (two claimants of
one Pod: one wins), a claimed Pod is never offered again, the pool refills, and a pool Pod that
went bad is replaced.

Tier 2 has no kubelet: the test reports a Pod's status (Running and Ready, or Failed) through
the status subresource, as tests/support/kubelet.py does for the pod executor's Pods.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import config as k8s_config
from sandbox_operator.executors.agent_keys import AgentKeys
from sandbox_operator.executors.warm_pool import POOL_LABEL, WarmPool, shape_of
from sandbox_operator.kube.api import Api
from sandbox_operator.settings import Settings

from tests.support.operator import Cluster, db_sandbox, wait_for

pytestmark = pytest.mark.slow

SHAPE = {"resources": {"requests": {"cpu": "10m"}}}
KEYS = AgentKeys(b"k" * 64)


@pytest.fixture
def pool(cluster: Cluster) -> WarmPool:
    api_client = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.server.kubeconfig_path)
    )
    settings = Settings(workspace_image="example.test/workspace:1")
    return WarmPool(settings, Api(api_client), lambda: KEYS, start_grace_seconds=60)


def _report(cluster: Cluster, pod: str, phase: str, ready: bool) -> None:
    now = datetime.now(UTC)
    status = {
        "status": {
            "phase": phase,
            "startTime": (now - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "podIP": "127.0.0.1",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ],
        }
    }
    cluster.kubectl(
        "patch", "pod", pod, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )


def _sandbox(cluster: Cluster, name: str) -> dict[str, Any]:
    cluster.create(db_sandbox(name, "plan-w", "db"))
    body = cluster.get("sandbox", name)
    assert body is not None
    return body


def _pool_pods(cluster: Cluster) -> list[dict[str, Any]]:
    listed = json.loads(cluster.kubectl("get", "pods", "-l", POOL_LABEL, "-o", "json").stdout)
    return list(listed["items"])


def test_the_pool_fills_claims_once_refills_and_never_reuses(
    cluster: Cluster, pool: WarmPool
) -> None:
    namespace = cluster.namespace
    first = pool.reconcile(namespace, 2, SHAPE)
    assert len(first.created) == 2 and first.replaced == []
    assert pool.reconcile(namespace, 2, SHAPE).created == []  # full: nothing more
    shape = shape_of(pool.settings, SHAPE)
    pods = _pool_pods(cluster)
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(first.created)
    spec = pods[0]["spec"]
    assert {v["name"]: sorted(v) for v in spec["volumes"]} == {
        "tmp": ["emptyDir", "name"],
        "scratch": ["emptyDir", "name"],
        "bootstrap": ["name", "secret"],
    }
    assert spec["containers"][0]["resources"] == SHAPE["resources"]
    assert pods[0]["metadata"]["labels"][POOL_LABEL] == shape
    # Not Ready yet: nothing to claim; the Sandbox makes its own Pod.
    owner = _sandbox(cluster, "s-one")
    assert pool.claim(namespace, owner, "plan-w", SHAPE) is None
    # Another shape's Sandbox never gets these Pods.
    for name in first.created:
        _report(cluster, name, "Running", ready=True)
    assert pool.claim(namespace, owner, "plan-w", {"resources": {}}) is None
    claimed_pod = pool.claim(namespace, owner, "plan-w", SHAPE)
    assert claimed_pod is not None
    claimed = claimed_pod["metadata"]["name"]
    assert claimed in first.created
    pod = cluster.get("pod", claimed)
    assert pod is not None
    labels = pod["metadata"]["labels"]
    assert POOL_LABEL not in labels
    assert labels["sandbox.cleveragents.io/sandbox-uid"] == owner["metadata"]["uid"]
    (ref,) = pod["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "Sandbox", "s-one", owner["metadata"]["uid"], True,
    )  # fmt: skip
    # The claimed Pod is no longer free: the pool refills to two free Pods.
    assert [p["metadata"]["name"] for p in pool.free(namespace, shape)] == [
        n for n in first.created if n != claimed
    ]
    refill = pool.reconcile(namespace, 2, SHAPE)
    assert len(refill.created) == 1
    # A second Sandbox gets the other Ready Pod, never the claimed one; then nothing is Ready.
    other = _sandbox(cluster, "s-two")
    second = pool.claim(namespace, other, "plan-w", SHAPE)
    assert second is not None and second["metadata"]["name"] != claimed
    assert pool.claim(namespace, _sandbox(cluster, "s-three"), "plan-w", SHAPE) is None
    again = cluster.get("pod", claimed)
    assert again is not None
    assert again["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]


def test_two_sandboxes_racing_for_one_pod_one_wins(cluster: Cluster, pool: WarmPool) -> None:
    namespace = cluster.namespace
    (name,) = pool.reconcile(namespace, 1, SHAPE).created
    _report(cluster, name, "Running", ready=True)
    owners = [_sandbox(cluster, f"s-race-{i}") for i in range(4)]
    barrier = threading.Barrier(len(owners))
    results: dict[str, dict[str, Any] | None] = {}

    def claim(owner: dict[str, Any]) -> None:
        barrier.wait()
        results[owner["metadata"]["name"]] = pool.claim(namespace, owner, "plan-w", SHAPE)

    threads = [threading.Thread(target=claim, args=(o,)) for o in owners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    winners = [sandbox for sandbox, pod in results.items() if pod is not None]
    assert len(results) == 4 and len(winners) == 1
    assert (results[winners[0]] or {})["metadata"]["name"] == name
    pod = cluster.get("pod", name)
    assert pod is not None
    (ref,) = pod["metadata"]["ownerReferences"]
    assert ref["name"] == winners[0]


def test_a_stale_listing_claims_nothing(cluster: Cluster, pool: WarmPool) -> None:
    """The resourceVersion precondition: a Pod changed after it was listed answers 409."""
    namespace = cluster.namespace
    (name,) = pool.reconcile(namespace, 1, SHAPE).created
    _report(cluster, name, "Running", ready=True)
    listed = pool.free(namespace, shape_of(pool.settings, SHAPE))
    cluster.kubectl("label", "pod", name, "touched=yes")  # a change after the listing
    stale = WarmPool(pool.settings, pool.api, pool.keys)
    stale.free = lambda *_: listed  # type: ignore[method-assign]
    assert stale.claim(namespace, _sandbox(cluster, "s-stale"), "plan-w", SHAPE) is None
    pod = cluster.get("pod", name)
    assert pod is not None and not pod["metadata"].get("ownerReferences")
    fresh = pool.claim(namespace, _sandbox(cluster, "s-fresh"), "plan-w", SHAPE)
    assert fresh is not None and fresh["metadata"]["name"] == name


def test_a_pool_pod_that_went_bad_is_replaced(cluster: Cluster, pool: WarmPool) -> None:
    namespace = cluster.namespace
    failed, lost, fine = pool.reconcile(namespace, 3, SHAPE).created
    _report(cluster, failed, "Failed", ready=False)
    _report(cluster, lost, "Running", ready=False)  # Ready=False after it started: a failing probe
    _report(cluster, fine, "Running", ready=True)
    report = pool.reconcile(namespace, 3, SHAPE)
    assert sorted(report.replaced) == sorted([failed, lost])
    assert len(report.created) == 2
    wait_for(
        lambda: not {failed, lost} & {p["metadata"]["name"] for p in _pool_pods(cluster)},
        30,
        "the bad pool Pods to be gone",
    )
    # One never Ready past the start grace is replaced too.
    late = datetime.now(UTC) + timedelta(seconds=120)
    replaced = pool.reconcile(namespace, 3, SHAPE, now=late).replaced
    assert sorted(replaced) == sorted(report.created)
