"""The operator against a real etcd + kube-apiserver (tier 2), local executor, real git repos.

Issue 3, "The real API server tier": the full flows (Sandbox to Active, Checkpoint and restore,
PlanCommit success and failure with compensation), deletion with finalizers, TTL cleanup, a
restart in the middle of a PlanCommit, and bad custom resources refused at apply.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver.fixtures import local_apiserver  # noqa: F401 - pytest fixture
from tests.operator.support import (
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    git,
    make_dir,
    make_repo,
    plancommit_manifest,
    sandbox_manifest,
    wait_for,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:  # noqa: F811 - the imported fixture
    """A fresh namespace with the CRDs installed."""
    return Cluster.fresh(local_apiserver)


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:  # noqa: F811
    """The operator (not started yet: tests start it, some with fault hooks)."""
    work = tmp_path / "operator"
    work.mkdir()
    process = OperatorProcess(local_apiserver, cluster.namespace, work)
    cluster.operator = process
    yield process
    process.stop()
    print(process.logs()[-8000:])  # shown by pytest when the test failed


def ready(cluster: Cluster, name: str) -> dict[str, Any]:
    """Wait until Sandbox ``name`` is Active with Ready=True; return its status."""
    status = cluster.wait_phase("sandbox", name, {"Active", "Errored"})
    assert status["phase"] == "Active", status
    assert cluster.condition("sandbox", name, "Ready")["status"] == "True"
    return status


def test_sandbox_reaches_active_on_a_real_git_repo(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    operator.start()
    cluster.create(sandbox_manifest("s1", "plan-a", "git_worktree", repo))
    status = ready(cluster, "s1")
    assert len(status["sandboxId"]) == 26
    assert status["executor"] == "local"
    assert status["effectiveStrategy"] == "git_worktree"
    assert status["coreRecord"]["sandbox_id"] == status["sandboxId"]
    sandbox_path = Path(status["sandboxPath"])
    assert (sandbox_path / "f.txt").read_text() == "base\n"
    body = cluster.get("sandbox", "s1")
    assert "sandbox.cleveragents.io/cleanup" in body["metadata"]["finalizers"]
    assert "kopf" not in json_of(body["status"])  # case 15: no kopf progress in status
    assert "Patching failed with inconsistencies" not in operator.logs()


def json_of(data: Any) -> str:
    import json

    return json.dumps(data)
