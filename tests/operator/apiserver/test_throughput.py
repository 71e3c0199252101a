"""Writes per new Sandbox and the operator's own Event requests, on the real API server (tier 2).

Issue 11 §4 (throughput): every request per object costs the operator, the API server and etcd
CPU on the same cores as the user's ``kubectl apply``. Without the chart's admission policy
(``test_admission_policy_apiserver.py``: two writes with it) a new Sandbox costs exactly three:
kopf's finalizer PATCH (its own processing cycle, before any on-disk work: case 16), which also
carries the plan-id label; the ``/status`` PATCH, which also carries kopf's diff-base; and one
``Provisioned`` Event. A fourth (e.g. a diff-base that no longer matches what kopf built, so kopf
handles the object again) fails here. Counted by the API server's own
``apiserver_request_total``.

The Event goes out as a plain JSON request (``k8s.Api.raw``): it must still land, and a refusal
must still raise the ``ApiException`` that :func:`events.is_terminating_refusal` recognises.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config
from kubernetes.client.exceptions import ApiException
from sandbox_operator.kube.api import Api
from sandbox_operator.kube.events import build_event, is_terminating_refusal

from tests.support.api_writes import writes_per_new_sandbox
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    run_operator,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, prefix="thr")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path)


@pytest.fixture
def api(local_apiserver: Any) -> Api:
    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(local_apiserver.kubeconfig_path)
    )
    return Api(api_client)


def test_a_new_sandbox_costs_three_writes(
    local_apiserver: Any,
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    per_sandbox, names = writes_per_new_sandbox(local_apiserver, cluster, operator, tmp_path, "thr")
    assert per_sandbox == {
        "PATCH sandboxes": 1.0,  # kopf's finalizer and the plan-id label
        "PATCH sandboxes/status": 1.0,  # the outcome and kopf's diff-base
        "POST events": 1.0,  # Provisioned
    }
    for name in names:
        events = cluster.events(name)
        assert [(e["type"], e["reason"]) for e in events] == [("Normal", "Provisioned")]
        assert events[0]["involvedObject"]["kind"] == "Sandbox"
        body = cluster.get("sandbox", name) or {}
        labels = body["metadata"].get("labels") or {}
        assert labels.get("sandbox.cleveragents.io/plan-id") == "thr-plan"
        assert "sandbox.cleveragents.io/cleanup" in body["metadata"]["finalizers"]
        assert body["status"]["lastHandledConfiguration"]


def test_the_plain_event_post_lands_and_a_terminating_namespace_still_refuses(
    local_apiserver: Any,
    cluster: Cluster,
    api: Api,
) -> None:
    body = {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "ghost", "namespace": cluster.namespace, "uid": "u-ghost"},
    }
    api.post_event(cluster.namespace, build_event(body, "Normal", "Probe", "a plain post"))
    [event] = cluster.events("ghost")
    assert (event["reason"], event["message"]) == ("Probe", "a plain post")
    # No namespace controller on this tier: a deleted namespace stays Terminating.
    doomed = Cluster.fresh(local_apiserver, prefix="thr-doomed")
    doomed.kubectl("create", "configmap", "keep", "--from-literal=a=b")
    local_apiserver.kubectl("delete", "namespace", doomed.namespace, "--wait=false", check=True)
    body["metadata"]["namespace"] = doomed.namespace
    with pytest.raises(ApiException) as refused:
        api.post_event(doomed.namespace, build_event(body, "Normal", "Probe", "refused"))
    assert is_terminating_refusal(refused.value), refused.value
    body["metadata"]["namespace"] = "thr-no-such-namespace"
    with pytest.raises(ApiException) as missing:
        api.post_event("thr-no-such-namespace", build_event(body, "Normal", "Probe", "nowhere"))
    assert missing.value.status == 404
    assert not is_terminating_refusal(missing.value)
