"""The multi-node tier: the real kube-scheduler and kube-controller-manager place workspace Pods
on three fake Nodes (`tests.support.apiserver.multinode`). Every test in this folder is marked
``multinode`` and ``apiserver`` here (``-m "not apiserver"`` leaves it out with tier 2).

Fixtures: ``nodes`` (the control plane, one per module), ``cluster`` (a fresh namespace with the
CRDs) and ``pod_operator`` (the operator with the pod executor, started).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apiserver.harness import free_port
from tests.support.apiserver.multinode import MultiNodeCluster
from tests.support.kubelet import KEY
from tests.support.operator import Cluster, OperatorProcess, pod_executor_env

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``multinode`` and ``apiserver`` every test of this folder."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.multinode)
            item.add_marker(pytest.mark.apiserver)


@pytest.fixture(scope="module")
def nodes() -> Iterator[MultiNodeCluster]:
    """etcd, kube-apiserver, kube-scheduler, kube-controller-manager and three fake Nodes."""
    with MultiNodeCluster(nodes=3) as control_plane:
        yield control_plane


@pytest.fixture
def cluster(nodes: MultiNodeCluster) -> Cluster:
    """A fresh namespace with the CRDs installed."""
    return Cluster.fresh(nodes.server, prefix="mn")


@pytest.fixture
def pod_operator(
    nodes: MultiNodeCluster, cluster: Cluster, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator with the pod executor, watching ``cluster``'s namespace, started."""
    key = tmp_path / "agent-key"
    key.write_text(KEY)
    work = tmp_path / "operator"
    work.mkdir()
    operator = OperatorProcess(
        nodes.server,
        cluster.namespace,
        work,
        pod_executor_env(cluster.namespace, key, free_port()),
    )
    cluster.operator = operator
    operator.start()
    yield operator
    cluster.kubectl("delete", "sandboxes", "--all", "--timeout=60s", check=False)
    operator.stop()
    print(operator.logs()[-6000:])
