"""Leader-election fencing on the real API server (tier 2), under a slow API server.

Two electors (``kube.leader``) share one Lease: 6 s duration, 3 s renew deadline, 0.3 s retry
period. Once the first leads, its renewals are slowed (the fault: each Lease read sleeps 5 s
before it is sent, as a starved API server or a paused process would). Then:

- every write of the leader (the operator's client, :class:`~sandbox_operator.kube.fence.
  FencedApiClient`) is refused unsent from the moment its sure lead ends: the start of its last
  successful renewal plus the renew deadline; the object is not on the server;
- its watchdog gives up the lead at that moment (not after the slow call returns);
- the standby takes over no earlier than the lease duration after that renewal started: the
  margin between the leader's last possible write and the new leader's first is measured, and
  it is about ``lease_duration - renew_deadline`` = 3 s, well above 1 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from sandbox_operator.kube.fence import Fence, FencedApiClient, NotLeading
from sandbox_operator.kube.leader import LeaderElector
from sandbox_operator.settings import Settings

from tests.support.operator import Cluster, wait_for

pytestmark = pytest.mark.slow

DURATION, DEADLINE, PERIOD = 6.0, 3.0, 0.3
SLOW_READ_SECONDS = 5.0


class Elector(LeaderElector):
    """A LeaderElector whose loss is recorded instead of exiting the process, with a fence of
    its own, and whose Lease reads can be slowed (the fault)."""

    def __init__(self, settings: Settings, api_client: Any, identity: str) -> None:
        super().__init__(settings, api_client, identity)
        self.fence = Fence()
        self.lost_at: float | None = None
        self.slow = threading.Event()

    def _read(self) -> dict[str, Any] | None:
        if self.slow.is_set():
            time.sleep(SLOW_READ_SECONDS)
        return super()._read()

    def _lost(self, why: str) -> Any:
        if self.lost_at is None:
            self.lost_at = time.monotonic()
        self.stopping.set()  # the renewer and watchdog end; the process lives on for the test


@pytest.fixture
def cluster(local_apiserver: Any) -> Iterator[Cluster]:
    yield Cluster.fresh(local_apiserver, "fence")


def _client(server: Any) -> Any:
    return k8s_config.new_client_from_config(config_file=str(server.kubeconfig_path))


def _config_map(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {}}


def test_a_slowed_leader_stops_writing_with_a_margin_before_the_standby_leads(
    local_apiserver: Any, cluster: Cluster
) -> None:
    settings = Settings(
        pod_namespace=cluster.namespace, leader_election_lease_name="fenced",
        lease_duration_seconds=DURATION, renew_deadline_seconds=DEADLINE,
        retry_period_seconds=PERIOD,
    )  # fmt: skip
    leader = Elector(settings, _client(local_apiserver), "leader")
    standby = Elector(settings, _client(local_apiserver), "standby")
    writes = FencedApiClient(local_apiserver_configuration(local_apiserver))
    writes.fence = leader.fence
    core = k8s_client.CoreV1Api(writes)
    assert leader.acquire()
    core.create_namespaced_config_map(cluster.namespace, _config_map("while-leading"))

    took: list[float] = []
    thread = threading.Thread(target=lambda: standby.acquire() and took.append(time.monotonic()))
    thread.start()
    # The API server turns slow for the leader: its next renewal read hangs 5 s.
    renewal_started_by = time.monotonic() + PERIOD  # at the latest, the last success started
    leader.slow.set()
    wait_for(lambda: leader.fence.remaining() <= 0, 30, "the leader's sure lead to end")
    fenced_at = time.monotonic()
    with pytest.raises(NotLeading, match="may have lost the lead"):
        core.create_namespaced_config_map(cluster.namespace, _config_map("after-the-lead"))
    assert cluster.get("configmap", "after-the-lead") is None
    assert cluster.get("configmap", "while-leading") is not None
    # The watchdog gave the lead up at the bound, not after the slow read returned.
    wait_for(lambda: leader.lost_at, 5, "the watchdog")
    assert leader.lost_at is not None and leader.lost_at - fenced_at < 0.5
    assert fenced_at < renewal_started_by + DEADLINE + 0.5

    # The standby leads only a lease duration after the last renewal it saw.
    thread.join(60)
    assert took, "the standby never led"
    margin = took[0] - fenced_at
    print(f"margin between the leader's last write and the standby's lead: {margin:.2f} s")
    assert margin >= DURATION - DEADLINE - 0.5 > 1.0
    standby.stopping.set()
    leader._released = standby._released = True  # nothing to release at the test's exit


def local_apiserver_configuration(server: Any) -> Any:
    """The kubeconfig's client configuration."""
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(
        config_file=str(server.kubeconfig_path), client_configuration=configuration
    )
    return configuration
