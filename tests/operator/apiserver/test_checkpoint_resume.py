"""A Checkpoint whose status was lost is repaired by the next operator (issue 11, tier 2).

kopf records a handler's outcome in two writes (the object's diff-base annotation, then its
``/status``); an operator killed between them leaves a Checkpoint that kopf thinks handled and
that never gets a phase. The resume handler takes the snapshot again, which is idempotent per
Checkpoint uid (case 18): the same snapshot is recorded, no second one is made.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    make_dir,
    run_operator,
    sandbox_manifest,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver)


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator (not started yet: tests start it, some with fault hooks)."""
    yield from run_operator(local_apiserver, cluster, tmp_path)


def test_a_checkpoint_whose_status_was_lost_gets_the_same_snapshot_back(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    operator.start()
    cluster.create(sandbox_manifest("s-res", "plan-res", "copy_on_write", data))
    cluster.wait_phase("sandbox", "s-res", {"Active"})
    cluster.create(checkpoint_manifest("c-res", "s-res"))
    first = cluster.wait_phase("checkpoint", "c-res", {"Ready", "Failed"})
    assert first["phase"] == "Ready", first
    snapshots = sorted(Path(first["snapshotLocation"]).parent.iterdir())

    operator.stop()
    # What a kill between kopf's two writes leaves: handled, but no status.
    cluster.kubectl(
        "patch",
        "checkpoint",
        "c-res",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": null}',
    )
    assert not cluster.status("checkpoint", "c-res").get("phase")
    operator.start()

    again = cluster.wait_phase("checkpoint", "c-res", {"Ready", "Failed"})
    assert again["phase"] == "Ready", again
    assert again["checkpointId"] == first["checkpointId"]
    assert again["snapshotLocation"] == first["snapshotLocation"]
    assert sorted(Path(first["snapshotLocation"]).parent.iterdir()) == snapshots
