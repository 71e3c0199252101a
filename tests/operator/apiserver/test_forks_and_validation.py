"""Forks, pre-commit checks and a selective commit on the real kube-apiserver (tier 2,
docs/forks.md).

The operator runs as a subprocess with the local executor on a real directory: three Sandboxes
start from one Checkpoint of a parent; the API server refuses a fork of a strategy that cannot
fork; a PlanCommit whose check fails ends Failed (ValidationFailed) with the original untouched
and the command, exit code and last lines in its status and an Event; a PlanCommit that names
one fork shows its checks in the review the approver sees, commits it with the approved digest,
and discards the other Sandboxes of the plan in the same step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    make_dir,
    plancommit_manifest,
    run_operator,
    sandbox_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, prefix="fork")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path, cleanup_kinds="sandboxes")


def fork_manifest(name: str, plan: str, original: Path, parent: str, checkpoint: str) -> Any:
    manifest = sandbox_manifest(name, plan, "copy_on_write", original, resource_id=name)
    manifest["spec"]["source"]["fromCheckpoint"] = {"sandbox": parent, "checkpoint": checkpoint}
    return manifest


def reasons(cluster: Cluster, name: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in cluster.events(name)]


def three_forks(cluster: Cluster, tmp_path: Path, plan: str) -> Path:
    original = make_dir(tmp_path / "data", {"app.txt": "v0\n"})
    cluster.create(sandbox_manifest("parent", plan, "copy_on_write", original))
    parent = cluster.wait_active("parent")
    (Path(parent["sandboxPath"]) / "app.txt").write_text("v1 (parent)\n")
    cluster.create(checkpoint_manifest("explore", "parent"))
    assert cluster.wait_phase("checkpoint", "explore", {"Ready", "Failed"})["phase"] == "Ready"
    for n in range(3):
        cluster.create(fork_manifest(f"try-{n}", plan, original, "parent", "explore"))
    for n in range(3):
        status = cluster.wait_active(f"try-{n}")
        root = Path(status["sandboxPath"])
        assert (root / "app.txt").read_text() == "v1 (parent)\n"
        (root / "answer").write_text(f"{n}\n")
    return original


def test_a_fork_of_a_strategy_that_cannot_fork_is_refused_at_admission(
    cluster: Cluster, tmp_path: Path
) -> None:
    manifest = sandbox_manifest("db-fork", "plan-x", "none", tmp_path)
    manifest["spec"]["source"]["fromCheckpoint"] = {"sandbox": "p", "checkpoint": "c"}
    refused = cluster.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
    assert refused.returncode != 0
    assert "source.fromCheckpoint is refused for strategies transaction_rollback" in (
        refused.stderr
    )
    assert cluster.gone("sandbox", "db-fork")


def test_a_failed_check_ends_the_plancommit_before_anything_is_prepared(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    original = three_forks(cluster, tmp_path, "plan-bad")
    checks = [
        {"name": "has-answer", "sandbox": "try-0", "command": ["test", "-f", "answer"]},
        {
            "name": "unit",
            "sandbox": "try-1",
            "command": ["/bin/sh", "-c", "echo token=s3cr3tvalue; echo boom >&2; exit 3"],
            "timeoutSeconds": 30,
        },
    ]
    cluster.create(plancommit_manifest("pc-bad", "plan-bad", sandboxes=["try-1"], checks=checks))

    status = cluster.wait_phase("pcommit", "pc-bad", {"Committed", "Failed"})

    assert status["phase"] == "Failed", status
    committed = cluster.condition("pcommit", "pc-bad", "Committed")
    assert (committed["status"], committed["reason"]) == ("False", "ValidationFailed")
    assert "unit in Sandbox try-1: exit code 3" in committed["message"]
    results = {row["name"]: row for row in status["validation"]}
    assert results["has-answer"]["passed"] is True
    assert results["has-answer"]["exitCode"] == 0
    failed = results["unit"]
    assert (failed["passed"], failed["exitCode"], failed["sandbox"]) == (False, 3, "try-1")
    assert failed["outputTail"].splitlines() == ["token=***", "boom"]
    assert "s3cr3tvalue" not in json.dumps([status["validation"], status["conditions"]])
    wait_for(lambda: ("Warning", "CheckFailed") in reasons(cluster, "pc-bad"), 30, "event")
    assert (original / "app.txt").read_text() == "v0\n"
    assert sorted(p.name for p in original.iterdir()) == ["app.txt"]
    for name in ("parent", "try-0", "try-1", "try-2"):
        assert cluster.status("sandbox", name)["phase"] == "Active"


def test_one_fork_is_committed_after_approval_and_the_others_are_discarded(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    original = three_forks(cluster, tmp_path, "plan-ok")
    checks = [
        {"name": f"check-{n}", "sandbox": f"try-{n}", "command": ["test", "-f", "answer"]}
        for n in range(3)
    ]
    cluster.create(
        plancommit_manifest(
            "pc-ok", "plan-ok", sandboxes=["try-2"], checks=checks, approval="Required"
        )
    )
    status = cluster.wait_phase("pcommit", "pc-ok", {"AwaitingApproval", "Failed", "Committed"})
    assert status["phase"] == "AwaitingApproval", status
    review = status["review"]
    assert [row["name"] for row in review["sandboxes"]] == ["try-2"]
    assert [(c["name"], c["sandbox"], c["passed"]) for c in review["checks"]] == [
        ("check-0", "try-0", True),
        ("check-1", "try-1", True),
        ("check-2", "try-2", True),
    ]

    cluster.kubectl(
        "patch", "pcommit", "pc-ok", "--type", "merge",
        "-p", json.dumps({"spec": {"approvedDigest": review["digest"]}}),
    )  # fmt: skip
    status = cluster.wait_phase("pcommit", "pc-ok", {"Committed", "Failed"}, handled=True)

    assert status["phase"] == "Committed", status
    assert (original / "answer").read_text() == "2\n"
    assert (original / "app.txt").read_text() == "v1 (parent)\n"
    final = wait_for(
        lambda: (s := cluster.status("pcommit", "pc-ok")).get("discardedSandboxes") and s,
        30,
        "discardedSandboxes",
    )
    assert final["discardedSandboxes"] == ["parent", "try-0", "try-1"]
    for name in ("parent", "try-0", "try-1"):
        wait_for(lambda n=name: cluster.gone("sandbox", n), 60, f"sandbox {name} deleted")
    assert cluster.status("sandbox", "try-2")["phase"] == "Committed"
    wait_for(lambda: ("Normal", "Discarded") in reasons(cluster, "pc-ok"), 30, "event")


def test_a_fork_of_a_parent_of_another_plan_is_refused_with_reason_fork_refused(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    original = make_dir(tmp_path / "data", {"app.txt": "v0\n"})
    cluster.create(sandbox_manifest("other-parent", "plan-a", "copy_on_write", original))
    cluster.wait_active("other-parent")
    cluster.create(checkpoint_manifest("other-cp", "other-parent"))
    assert cluster.wait_phase("checkpoint", "other-cp", {"Ready", "Failed"})["phase"] == "Ready"
    cluster.create(fork_manifest("stray", "plan-b", original, "other-parent", "other-cp"))

    ready = wait_for(
        lambda: (
            (c := cluster.condition("sandbox", "stray", "Ready"))
            and c["status"] == "False"
            and c.get("reason") == "ForkRefused"
            and c
        ),
        60,
        "Ready False ForkRefused",
    )

    assert "its planId differ" in ready["message"]

    def refused_event() -> bool:
        return any(
            e["reason"] == "ProvisionFailed" and "ForkRefused" in e["message"]
            for e in cluster.events("stray")
        )

    wait_for(refused_event, 30, "ProvisionFailed event naming ForkRefused")


def test_a_fork_is_deleted_whatever_became_of_its_parent(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Deleting a Sandbox never waits for another object: a refused fork whose parent is
    deleted first, and a fork still waiting for a parent that never comes, both go."""
    operator.start()
    original = make_dir(tmp_path / "data", {"app.txt": "v0\n"})
    cluster.create(sandbox_manifest("other-parent", "plan-a", "copy_on_write", original))
    cluster.wait_active("other-parent")
    cluster.create(checkpoint_manifest("other-cp", "other-parent"))
    assert cluster.wait_phase("checkpoint", "other-cp", {"Ready", "Failed"})["phase"] == "Ready"
    cluster.create(fork_manifest("refused", "plan-b", original, "other-parent", "other-cp"))
    cluster.create(fork_manifest("orphan", "plan-b", original, "never-made", "never-made-cp"))
    wait_for(
        lambda: (
            (c := cluster.condition("sandbox", "refused", "Ready"))
            and c.get("reason") == "ForkRefused"
        ),
        60,
        "refused fork Ready False ForkRefused",
    )

    cluster.kubectl("delete", "checkpoint", "other-cp", "--wait=true", "--timeout=60s")
    cluster.kubectl("delete", "sandbox", "other-parent", "--wait=true", "--timeout=60s")
    cluster.kubectl("delete", "sandbox", "refused", "orphan", "--wait=false")

    wait_for(
        lambda: cluster.gone("sandbox", "refused") and cluster.gone("sandbox", "orphan"),
        30,
        "both forks deleted",
    )
    assert original.joinpath("app.txt").read_text() == "v0\n"
