"""The operator on the real API server (tier 2): every test in this folder is marked
``apiserver`` here, once; and the fixtures its modules share: ``cluster`` (a fresh namespace
with the CRDs), ``operator`` (the operator with the local executor, not started yet) and
``pod_operator`` (the operator with the pod executor, started, and the :class:`Kubelet` that
plays the workspace Pod). A module that needs another namespace prefix or cleanup defines its
own ``cluster`` / ``operator``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apiserver.harness import free_port
from tests.support.kubelet import KEY, Kubelet
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    pod_executor_env,
    run_operator,
    secret_manifest,
)

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``apiserver`` every test of this folder."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.apiserver)


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    """A fresh namespace with the CRDs installed."""
    return Cluster.fresh(local_apiserver)


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator (not started yet: tests start it, some with fault hooks)."""
    yield from run_operator(
        local_apiserver, cluster, tmp_path, cleanup_kinds="sandboxes,checkpoints"
    )


@pytest.fixture
def pod_operator(
    local_apiserver: Any,
    cluster: Cluster,
    tmp_path: Path,
) -> Iterator[tuple[OperatorProcess, Kubelet]]:
    key = tmp_path / "agent-key"
    key.write_text(KEY)
    port = free_port()
    database = tmp_path / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    dsn = f"sqlite:///{database}"
    cluster.create(secret_manifest("db", dsn))
    # The ServiceAccount admission needs the namespace's default account (no controller here).
    cluster.kubectl("create", "serviceaccount", "default", check=False)
    work = tmp_path / "operator"
    work.mkdir()
    operator = OperatorProcess(
        local_apiserver,
        cluster.namespace,
        work,
        pod_executor_env(cluster.namespace, key, port, EXEC_TIMEOUT_SECONDS="30"),
    )
    cluster.operator = operator
    kubelet = Kubelet(cluster, tmp_path, port, dsn)
    operator.start()
    try:
        yield operator, kubelet
        cluster.kubectl("delete", "plancommits,sandboxes", "--all", "--timeout=60s", check=False)
    finally:
        operator.stop()
        kubelet.stop()  # the agent process never outlives its test
    print(operator.logs()[-6000:])
    assert "Patching failed with inconsistencies" not in operator.logs()
