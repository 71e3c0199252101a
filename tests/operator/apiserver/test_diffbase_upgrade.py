"""An operator upgrade moves kopf's diff-base from the annotation to the status (tier 2, issue 11).

Operators before issue 11's throughput work kept kopf's diff-base in the annotation
``sandbox.cleveragents.io/last-handled-configuration``; this one keeps it in
``status.lastHandledConfiguration``. A Sandbox handled by the earlier operator must read as
handled by this one: not provisioned again, no second ``Provisioned`` Event, and a later spec
change is an update (served once), after which the diff-base is in the status and the
annotation is gone. The earlier
operator is run from git at :data:`PREVIOUS_OPERATOR_COMMIT`, as a user's cluster ran it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    files_at,
    make_dir,
    run_operator,
    sandbox_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow

PREVIOUS_OPERATOR_COMMIT = "8c54757"
"""The last commit whose operator kept kopf's diff-base in an annotation."""
LEGACY = "sandbox.cleveragents.io/last-handled-configuration"


def previous_operator(into: Path) -> str:
    """``operator/`` and ``sandbox_core/`` at :data:`PREVIOUS_OPERATOR_COMMIT`: a PYTHONPATH."""
    files_at(PREVIOUS_OPERATOR_COMMIT, ["operator", "sandbox_core"], into)
    return os.pathsep.join([str(into / "operator"), str(into)])


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, prefix="dbup")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path)


def test_a_sandbox_handled_by_the_earlier_operator_is_not_handled_again(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    source = make_dir(tmp_path / "source", {"f.txt": "base\n"})
    operator.start({"PYTHONPATH": previous_operator(tmp_path / "previous")})
    cluster.create(sandbox_manifest("s1", "plan-up", "copy_on_write", source))
    status = cluster.wait_active("s1")
    body = cluster.get("sandbox", "s1") or {}
    assert LEGACY in body["metadata"]["annotations"], "the earlier operator's storage"
    assert "lastHandledConfiguration" not in body["status"]
    wait_for(lambda: cluster.events("s1") or None, 30, "the Provisioned Event")
    sandbox_path = Path(status["sandboxPath"])
    (sandbox_path / "f.txt").write_text("edited\n")

    operator.stop()
    operator.start()  # this tree's operator
    time.sleep(5)  # its first cycle over every object (resume handlers, event handlers)
    new_log = operator.log_paths[-1].read_text(errors="replace")
    assert "Handler 'provision' succeeded" not in new_log
    assert [e["reason"] for e in cluster.events("s1")] == ["Provisioned"]
    assert (sandbox_path / "f.txt").read_text() == "edited\n"
    assert cluster.status("sandbox", "s1")["sandboxId"] == status["sandboxId"]

    # A spec change after the upgrade is an update against the annotation's diff-base.
    cluster.kubectl(
        "patch", "sandbox", "s1", "--type=merge", "-p", '{"spec":{"rollbackRequest":{"id":"x1"}}}'
    )
    wait_for(lambda: cluster.status("sandbox", "s1").get("lastRollbackRequestId") == "x1", 60)
    assert (sandbox_path / "f.txt").read_text() == "base\n"
    after = cluster.get("sandbox", "s1") or {}
    stored = json.loads(after["status"]["lastHandledConfiguration"])
    assert stored["spec"]["rollbackRequest"] == {"id": "x1"}
    assert LEGACY not in after["metadata"]["annotations"], "a stale diff-base is never kept"
    new_log = operator.log_paths[-1].read_text(errors="replace")
    assert new_log.count("Handler 'requests/spec' succeeded") == 1
    assert "Handler 'provision' succeeded" not in new_log
