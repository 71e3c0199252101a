"""The terminal ``Finished`` condition and suspend / resume (issue 8) on the real API server
(tier 2, local executor): one ``kubectl wait --for=condition=Finished`` returns on a committed
and on a failed PlanCommit; a suspended Sandbox keeps its changes, and a PlanCommit of its plan
resumes it first and commits it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    make_dir,
    make_repo,
    plancommit_manifest,
    ready,
    sandbox_manifest,
    write_in_sandbox,
)

pytestmark = pytest.mark.slow


TERMINAL = {"Committed", "Failed", "RolledBack"}


def test_finished_lets_one_kubectl_wait_return_on_success_and_on_failure(
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    ok = make_dir(tmp_path / "ok", {"g.txt": "0\n"})
    bad = make_dir(tmp_path / "bad", {"g.txt": "0\n"})
    operator.start({"SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "r-bad"})
    cluster.create(sandbox_manifest("s-ok", "plan-ok", "copy_on_write", ok))
    cluster.create(sandbox_manifest("s-bad", "plan-bad", "copy_on_write", bad, resource_id="r-bad"))
    write_in_sandbox(ready(cluster, "s-ok"), "g.txt", "1\n")
    write_in_sandbox(ready(cluster, "s-bad"), "g.txt", "1\n")
    cluster.create(plancommit_manifest("pc-ok", "plan-ok"))
    cluster.create(plancommit_manifest("pc-bad", "plan-bad"))
    for name, outcome in (("pc-ok", "Committed"), ("pc-bad", "Failed")):
        waited = cluster.kubectl(
            "wait", "--for=condition=Finished", f"pcommit/{name}", "--timeout=90s", check=False
        )
        assert waited.returncode == 0, (waited.stderr, cluster.status("pcommit", name))
        finished = cluster.condition("pcommit", name, "Finished")
        assert finished is not None
        assert (finished["status"], finished["reason"]) == ("True", outcome)
    # The Sandbox that was committed is Finished too; the one compensated is usable again.
    sandbox_done = cluster.kubectl(
        "wait", "--for=condition=Finished", "sandbox/s-ok", "--timeout=30s", check=False
    )
    assert sandbox_done.returncode == 0, cluster.status("sandbox", "s-ok")
    assert cluster.condition("sandbox", "s-bad", "Finished")["status"] == "False"


def test_suspend_keeps_changes_and_a_plancommit_resumes_a_suspended_sandbox(
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    operator.start()
    cluster.create(sandbox_manifest("s-git", "plan-s", "git_worktree", repo))
    write_in_sandbox(ready(cluster, "s-git"), "f.txt", "kept\n")
    cluster.kubectl("patch", "sandbox", "s-git", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    suspended = cluster.wait_phase("sandbox", "s-git", {"Suspended"}, timeout=60)
    assert cluster.condition("sandbox", "s-git", "Ready")["reason"] == "Suspended"
    cluster.kubectl("patch", "sandbox", "s-git", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    resumed = ready(cluster, "s-git")
    assert resumed["sandboxId"] == suspended["sandboxId"]
    assert (Path(resumed["sandboxPath"]) / "f.txt").read_text() == "kept\n"
    # Suspended again, then a PlanCommit of its plan: it is resumed first and committed.
    cluster.kubectl("patch", "sandbox", "s-git", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    cluster.wait_phase("sandbox", "s-git", {"Suspended"}, timeout=60)
    cluster.create(plancommit_manifest("pc-s", "plan-s"))
    status = cluster.wait_phase("pcommit", "pc-s", TERMINAL, timeout=120)
    assert status["phase"] == "Committed", status
    assert (repo / "f.txt").read_text() == "kept\n"
    assert cluster.get("sandbox", "s-git")["spec"]["suspend"] is False
    warnings = [e for e in cluster.events("s-git") if e["type"] == "Warning"]
    assert warnings == []
