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

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config
from kubernetes.client.exceptions import ApiException
from sandbox_operator.kube.api import Api
from sandbox_operator.kube.events import build_event, is_terminating_refusal

from tests.apiserver.fixtures import local_apiserver  # noqa: F401 - pytest fixture
from tests.operator.support import (
    Cluster,
    OperatorProcess,
    make_dir,
    run_operator,
    sandbox_manifest,
    wait_for,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

SANDBOXES = 8
WRITES = ("PATCH sandboxes", "PATCH sandboxes/status", "POST events")


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:  # noqa: F811 - the imported fixture
    return Cluster.fresh(local_apiserver, prefix="thr")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:  # noqa: F811
    yield from run_operator(local_apiserver, cluster, tmp_path)


@pytest.fixture
def api(local_apiserver: Any) -> Api:  # noqa: F811
    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(local_apiserver.kubeconfig_path)
    )
    return Api(api_client)


def writes(server: Any) -> dict[str, float]:
    """``apiserver_request_total`` of the operator's writes, by verb and resource."""
    raw = server.kubectl("get", "--raw", "/metrics", check=True).stdout
    out = dict.fromkeys(WRITES, 0.0)
    for line in raw.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        key = f"{labels.get('verb')} {labels.get('resource')}"
        if labels.get("subresource"):
            key += f"/{labels['subresource']}"
        if key in out:
            out[key] += float(line.rsplit(" ", 1)[1])
    return out


def writes_per_new_sandbox(
    server: Any, cluster: Cluster, operator: OperatorProcess, tmp_path: Path, prefix: str
) -> tuple[dict[str, float], list[str]]:
    """Start the operator, warm it up with one Sandbox, then create :data:`SANDBOXES`
    copy_on_write Sandboxes (of one 5-file source under ``tmp_path``) of plan ``<prefix>-plan``
    and wait until each is Active with its Event and kopf is idle.

    Returns the operator's writes (:data:`WRITES`) per new Sandbox and the Sandboxes' names.
    """
    source = make_dir(tmp_path / "source", {f"f{i}.txt": f"line {i}\n" for i in range(5)})
    operator.start()
    # The operator is up and idle (its startup writes, if any, are not counted).
    cluster.create(sandbox_manifest("warm", f"{prefix}-warm", "copy_on_write", source))
    cluster.wait_active("warm")
    wait_for(lambda: cluster.events("warm") or None, 30, "the warm-up Event")
    time.sleep(2)
    before = writes(server)
    names = [f"{prefix}-{i}" for i in range(SANDBOXES)]
    for name in names:
        cluster.create(sandbox_manifest(name, f"{prefix}-plan", "copy_on_write", source))
    for name in names:
        cluster.wait_active(name)
    wait_for(
        lambda: all(cluster.events(name) for name in names) or None, 30, "one Event per Sandbox"
    )
    time.sleep(3)  # anything kopf would still do (another cycle, another patch) lands now
    after = writes(server)
    return {key: (after[key] - before[key]) / SANDBOXES for key in WRITES}, names


def test_a_new_sandbox_costs_three_writes(
    local_apiserver: Any,  # noqa: F811
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
    local_apiserver: Any,  # noqa: F811
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
