"""The lifecycle metrics read from a running operator's /metrics (tier 2, local executor): a
Sandbox's create->Active and startup phases, a PlanCommit's review, approval and commit phases,
the per-phase gauge and build_info."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from sandbox_operator import __version__

from tests.support.apiserver.harness import free_port
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    make_repo,
    plancommit_manifest,
    ready,
    sandbox_manifest,
    wait_for,
    write_in_sandbox,
)

pytestmark = pytest.mark.slow


def _scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of every sample."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def test_lifecycle_metrics_of_a_sandbox_and_an_approved_plan_commit(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    port = free_port()
    operator.start({"SANDBOX_OPERATOR_METRICS_PORT": str(port)})
    cluster.create(sandbox_manifest("s1", "plan-m", "git_worktree", repo))
    write_in_sandbox(ready(cluster, "s1"), "f.txt", "changed\n")
    first = _scrape(port)
    assert first["sandbox_operator_sandbox_create_to_active_seconds_count"] == 1.0
    # creationTimestamp has one-second resolution: the total is below the test's own time.
    assert 0.0 <= first["sandbox_operator_sandbox_create_to_active_seconds_sum"] < 30.0
    phase = 'sandbox_operator_sandbox_startup_phase_seconds_count{phase="%s"}'
    assert first[phase % "reconcile_start"] == 1.0
    assert first[phase % "active"] == 1.0
    assert first.get(phase % "workspace_pod", 0.0) == 0.0  # the local executor has no Pod
    assert first['sandbox_operator_objects{kind="Sandbox",phase="Active"}'] == 1.0
    build = [k for k in first if k.startswith("sandbox_operator_build_info{")]
    assert len(build) == 1 and f'version="{__version__}"' in build[0]

    cluster.create(plancommit_manifest("pc-m", "plan-m", approval="Required"))
    status = cluster.wait_phase("pcommit", "pc-m", {"AwaitingApproval", "Failed", "Committed"})
    assert status["phase"] == "AwaitingApproval", status
    wait_for(
        lambda: _scrape(port).get(
            'sandbox_operator_objects{kind="PlanCommit",phase="AwaitingApproval"}'
        ),
        30,
        "the gauge to count the waiting PlanCommit",
    )
    time.sleep(2.1)  # the recorded times have one-second resolution: approval takes >= 2 s
    cluster.kubectl(
        "patch", "pcommit", "pc-m", "--type", "merge",
        "-p", json.dumps({"spec": {"approvedDigest": status["review"]["digest"]}}),
    )  # fmt: skip
    done = cluster.wait_phase("pcommit", "pc-m", {"Committed", "Failed"})
    assert done["phase"] == "Committed", done
    assert (repo / "f.txt").read_text() == "changed\n"

    def committed() -> dict[str, float] | None:
        samples = _scrape(port)
        key = 'sandbox_operator_objects{kind="PlanCommit",phase="Committed"}'
        return samples if samples.get(key) == 1.0 else None

    last = wait_for(committed, 30, "the gauge to count the committed PlanCommit")
    plan = 'sandbox_operator_plan_commit_phase_seconds_%s{action="Commit",phase="%s"}'
    assert {p: last[plan % ("count", p)] for p in ("review", "approval", "commit")} == {
        "review": 1.0,
        "approval": 1.0,
        "commit": 1.0,
    }
    assert last[plan % ("sum", "approval")] >= 2.0
    assert 'sandbox_operator_objects{kind="PlanCommit",phase="AwaitingApproval"}' not in last
    assert last['sandbox_operator_objects{kind="Sandbox",phase="Committed"}'] == 1.0
    assert 'sandbox_operator_objects{kind="Sandbox",phase="Active"}' not in last
