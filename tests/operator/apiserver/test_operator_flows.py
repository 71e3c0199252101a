"""The operator against a real etcd + kube-apiserver (tier 2), local executor, real git repos.

Issue 3, "The real API server tier": the full flows (Sandbox to Active, Checkpoint and restore,
PlanCommit success and failure with compensation), deletion with finalizers, TTL cleanup, a
restart in the middle of a PlanCommit, and bad custom resources refused at apply.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.apiserver.harness import free_port
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    git,
    make_dir,
    make_repo,
    plancommit_manifest,
    ready,
    sandbox_manifest,
    three_sandbox_plan,
    wait_for,
    write_in_sandbox,
)

pytestmark = pytest.mark.slow


def test_sandbox_reaches_active_on_a_real_git_repo(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    port = free_port()
    operator.start({"SANDBOX_OPERATOR_METRICS_PORT": str(port)})
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
    annotations = body["metadata"].get("annotations") or {}
    assert not [key for key in annotations if key.startswith("kopf.zalando.org")]
    assert "sandbox.cleveragents.io/last-handled-configuration" not in annotations
    assert json.loads(body["status"]["lastHandledConfiguration"])["spec"]["planId"] == "plan-a"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        exposition = response.read().decode()
    assert (
        'sandbox_operator_reconciles_total{handler="provision",kind="Sandbox",outcome="ok"} 1.0'
        in exposition
    )
    assert "Patching failed with inconsistencies" not in operator.logs()


def json_of(data: Any) -> str:
    import json

    return json.dumps(data)


def test_plancommit_commits_every_sandbox_of_the_plan(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    plan = three_sandbox_plan(cluster, tmp_path, "plan-ok")
    cluster.create(plancommit_manifest("pc-ok", "plan-ok", message="apply plan-ok"))
    waited = cluster.kubectl(
        "wait", "--for=condition=Committed", "pcommit/pc-ok", "--timeout=90s", check=False
    )
    assert waited.returncode == 0, (waited.stderr, cluster.status("pcommit", "pc-ok"))
    status = cluster.status("pcommit", "pc-ok")
    assert status["phase"] == "Committed"
    assert [s["state"] for s in status["sandboxes"]] == ["Committed"] * 3
    assert all(r["success"] for r in status["results"])
    assert (plan["repo"] / "f.txt").read_text() == "r1\n"
    assert (plan["data"] / "g.txt").read_text() == "d1\n"
    assert (plan["layer"] / "h.txt").read_text() == "o1\n"
    for name in ("sa-git", "sb-copy", "sc-overlay"):
        sandbox = cluster.status("sandbox", name)
        assert sandbox["phase"] == "Committed"
        assert sandbox["lastCommit"]["success"] is True
        assert sandbox["lastCommit"]["planCommit"] == "pc-ok"


def test_plancommit_failure_compensates_and_names_the_ids(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    repo = make_repo(tmp_path / "repo", {"f.txt": "line1\n"})
    operator.start()
    cluster.create(sandbox_manifest("a-copy", "plan-bad", "copy_on_write", data))
    write_in_sandbox(ready(cluster, "a-copy"), "g.txt", "d1\n")
    cluster.create(sandbox_manifest("b-git", "plan-bad", "git_worktree", repo))
    write_in_sandbox(ready(cluster, "b-git"), "f.txt", "sandbox\n")
    (repo / "f.txt").write_text("main\n")  # a conflicting commit on the original (case 03)
    git(repo, "commit", "-qam", "main moved")
    head_before = git(repo, "rev-parse", "HEAD")
    cluster.create(plancommit_manifest("pc-bad", "plan-bad", mode="Saga"))
    status = cluster.wait_phase("pcommit", "pc-bad", {"Failed", "Committed", "RolledBack"})
    copy_id = cluster.status("sandbox", "a-copy")["sandboxId"]
    git_id = cluster.status("sandbox", "b-git")["sandboxId"]
    assert status["phase"] == "Failed"
    assert status["failedSandboxId"] == git_id
    assert status["rolledBackIds"] == [copy_id]
    assert status["failedRollbackIds"] == []
    committed = cluster.condition("pcommit", "pc-bad", "Committed")
    assert committed["status"] == "False"
    assert committed["reason"] in ("Conflict", "SandboxCommitFailed")
    assert "b-git" in committed["message"] and git_id in committed["message"]
    rolled = cluster.condition("pcommit", "pc-bad", "RolledBack")
    assert rolled["status"] == "True" and copy_id in rolled["message"]
    assert cluster.condition("pcommit", "pc-bad", "RollbackFailed")["status"] == "False"
    assert [s["state"] for s in status["sandboxes"]] == ["Compensated", "Failed"]
    assert (data / "g.txt").read_text() == "d0\n"  # compensated
    assert git(repo, "rev-parse", "HEAD") == head_before  # the original is untouched
    warnings = [e for e in cluster.events("pc-bad") if e["type"] == "Warning"]
    assert warnings and copy_id in warnings[0]["message"]


def test_terminal_plancommit_is_never_reprocessed_across_restarts(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Case 22: the first sandbox conflicts, nothing to compensate, three restarts change
    nothing; the sandboxes stay usable and a later PlanCommit succeeds."""
    repo = make_repo(tmp_path / "repo", {"f.txt": "line1\n"})
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    operator.start()
    cluster.create(sandbox_manifest("a-git", "p3", "git_worktree", repo))
    write_in_sandbox(ready(cluster, "a-git"), "f.txt", "sandbox\n")
    cluster.create(sandbox_manifest("b-copy", "p3", "copy_on_write", data))
    write_in_sandbox(ready(cluster, "b-copy"), "g.txt", "d1\n")
    (repo / "f.txt").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    cluster.create(plancommit_manifest("pc3", "p3"))
    terminal = {"Failed", "Committed", "RolledBack"}
    status = cluster.wait_phase("pcommit", "pc3", terminal, handled=True)
    assert status["phase"] == "Failed"
    assert status["rolledBackIds"] == []
    # TwoPhase (the default): the conflict is found at prepare, every prepared sandbox aborted.
    assert cluster.condition("pcommit", "pc3", "RolledBack")["reason"] == "Aborted"
    assert (data / "g.txt").read_text() == "d0\n"
    events_before = len(cluster.events("pc3"))
    for _ in range(3):
        operator.stop()
        operator.start()
        wait_for(lambda: "resuming" in operator.logs().lower() or True, 5)
    time.sleep(4)  # give a wrongly re-processing operator the time to do it
    assert cluster.status("pcommit", "pc3") == status
    assert len(cluster.events("pc3")) == events_before
    # The sandboxes are still usable: resolve the conflict in A, commit again.
    a_status = cluster.status("sandbox", "a-git")
    assert a_status["phase"] == "Active"
    # A refused prepare moved nothing, so the sandbox's edit is still uncommitted work there.
    worktree = Path(a_status["sandboxPath"])
    assert git(worktree, "status", "--porcelain").split() == ["M", "f.txt"]
    git(worktree, "commit", "-qam", "sandbox work")
    git(worktree, "merge", "-q", "-X", "theirs", "main")
    cluster.create(plancommit_manifest("pc3-again", "p3"))
    again = cluster.wait_phase("pcommit", "pc3-again", {"Failed", "Committed", "RolledBack"})
    assert again["phase"] == "Committed", again
    assert (data / "g.txt").read_text() == "d1\n"


@pytest.mark.parametrize(
    ("fault", "journaled"),
    [
        ("after_record:1", ["Committed", "Pending", "Pending"]),
        ("before_commit:2", ["Committed", "Committing", "Pending"]),
        ("after_commit:2", ["Committed", "Committing", "Pending"]),
        ("after_record:3", ["Committed", "Committed", "Committed"]),
    ],
)
def test_restart_in_the_middle_of_a_plancommit_ends_all_or_nothing(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path, fault: str, journaled: list[str]
) -> None:
    """Case 20: the operator is SIGKILLed inside the saga (the core's fault points: before a
    commit, after it landed but before the journal says so, after the journal says so); a new
    operator finishes the PlanCommit all committed or all compensated, never committing twice,
    and a further restart changes nothing."""
    operator.start()
    plan = three_sandbox_plan(cluster, tmp_path, "plan-crash")
    head_before = git(plan["repo"], "rev-parse", "HEAD")
    operator.stop()
    operator.start({"SANDBOX_CORE_FAULT": fault})
    cluster.create(plancommit_manifest("pc-crash", "plan-crash", mode="Saga"))
    assert operator.wait_exit(90) != 0  # the fault hook killed it
    mid = cluster.status("pcommit", "pc-crash")
    assert mid["phase"] == "Committing"
    assert [step["state"] for step in mid["sandboxes"]] == journaled
    operator.start()
    final = cluster.wait_phase(
        "pcommit", "pc-crash", {"Committed", "RolledBack", "Failed"}, handled=True
    )
    changed = [
        (plan["repo"] / "f.txt").read_text() == "r1\n",
        (plan["data"] / "g.txt").read_text() == "d1\n",
        (plan["layer"] / "h.txt").read_text() == "o1\n",
    ]
    assert all(changed) or not any(changed), (changed, final)
    assert final["failedRollbackIds"] == []
    if final["phase"] == "Committed":
        assert all(changed)
        assert cluster.condition("pcommit", "pc-crash", "Committed")["status"] == "True"
    else:
        assert final["phase"] == "Failed"  # a Commit that did not land (issue 11 §6)
        assert git(plan["repo"], "rev-parse", "HEAD") == head_before
        assert mid["sandboxes"][0]["sandboxId"] in final["rolledBackIds"]
        assert cluster.condition("pcommit", "pc-crash", "RolledBack")["status"] == "True"
        assert cluster.condition("pcommit", "pc-crash", "Committed")["status"] == "False"
    log = git(plan["repo"], "log", "--format=%s", "--all")
    assert log.count("plan-crash") <= 1  # the git sandbox was merged at most once
    operator.stop()
    operator.start()
    time.sleep(3)  # a wrongly re-processing operator would act now
    assert cluster.status("pcommit", "pc-crash") == final  # recovery twice changes nothing


def test_checkpoint_and_restore_request(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    operator.start()
    cluster.create(sandbox_manifest("s-ck", "plan-ck", "copy_on_write", data))
    status = ready(cluster, "s-ck")
    write_in_sandbox(status, "g.txt", "checkpointed\n")
    cluster.create(checkpoint_manifest("c1", "s-ck"))
    checkpoint = cluster.wait_phase("checkpoint", "c1", {"Ready", "Failed"})
    assert checkpoint["phase"] == "Ready", checkpoint
    assert checkpoint["sandboxId"] == status["sandboxId"]
    assert checkpoint["kind"] == "directory-snapshot"
    assert Path(checkpoint["snapshotLocation"]).is_dir()
    write_in_sandbox(status, "g.txt", "later\n")
    cluster.kubectl(
        "patch",
        "sandbox",
        "s-ck",
        "--type=merge",
        "-p",
        '{"spec":{"restoreRequest":{"id":"r1","checkpointName":"c1"}}}',
    )
    wait_for(lambda: cluster.status("sandbox", "s-ck").get("lastRestoreRequestId") == "r1", 60)
    assert (Path(status["sandboxPath"]) / "g.txt").read_text() == "checkpointed\n"
    assert cluster.condition("sandbox", "s-ck", "Restored")["status"] == "True"
    # Rollback request: discard all changes, once per id; the sandbox stays usable.
    cluster.kubectl(
        "patch", "sandbox", "s-ck", "--type=merge", "-p", '{"spec":{"rollbackRequest":{"id":"x1"}}}'
    )
    wait_for(lambda: cluster.status("sandbox", "s-ck").get("lastRollbackRequestId") == "x1", 60)
    assert (Path(status["sandboxPath"]) / "g.txt").read_text() == "d0\n"
    assert cluster.status("sandbox", "s-ck")["phase"] == "Active"
    # Deleting the Checkpoint removes its snapshot through the finalizer.
    cluster.kubectl("delete", "checkpoint", "c1", "--timeout=60s")
    assert not Path(checkpoint["snapshotLocation"]).exists()
    assert (data / "g.txt").read_text() == "d0\n"


def test_deletion_cleans_up_through_the_finalizer(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    operator.start()
    cluster.create(sandbox_manifest("s-del", "plan-del", "git_worktree", repo))
    status = ready(cluster, "s-del")
    write_in_sandbox(status, "new.txt", "x\n")
    assert len(git(repo, "worktree", "list").splitlines()) == 2
    cluster.kubectl("delete", "sandbox", "s-del", "--timeout=60s")
    assert cluster.gone("sandbox", "s-del")
    assert not Path(status["sandboxPath"]).exists()
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert git(repo, "branch", "--list").strip() == "* main"
    assert (repo / "f.txt").read_text() == "base\n" and not (repo / "new.txt").exists()


def test_plancommit_with_cleanup_policy_delete_removes_the_plans_sandboxes(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    operator.start()
    cluster.create(sandbox_manifest("s-plan", "plan-gc", "copy_on_write", data))
    status = ready(cluster, "s-plan")
    cluster.create(
        plancommit_manifest("pc-gc", "plan-gc", action="Rollback", cleanupPolicy="Delete")
    )
    rolled = cluster.wait_phase("pcommit", "pc-gc", {"RolledBack", "Failed"})
    assert rolled["phase"] == "RolledBack"
    assert rolled["rolledBackIds"] == [status["sandboxId"]]
    cluster.kubectl("delete", "pcommit", "pc-gc", "--timeout=60s")
    wait_for(lambda: cluster.gone("sandbox", "s-plan"), 60, "plan sandboxes deleted")
    assert not Path(status["sandboxPath"]).exists()
    assert (data / "g.txt").read_text() == "d0\n"


def test_ttl_deletes_finished_sandboxes(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    operator.start()
    cluster.create(
        sandbox_manifest("s-ttl", "plan-ttl", "copy_on_write", data, ttlSecondsAfterFinished=1)
    )
    write_in_sandbox(ready(cluster, "s-ttl"), "g.txt", "d1\n")
    cluster.create(plancommit_manifest("pc-ttl", "plan-ttl"))
    cluster.wait_phase("pcommit", "pc-ttl", {"Committed", "Failed"})
    wait_for(lambda: cluster.gone("sandbox", "s-ttl"), 60, "TTL deletion")
    assert (data / "g.txt").read_text() == "d1\n"


def test_strategy_none_posts_a_warning_event(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    operator.start()
    cluster.create(sandbox_manifest("s-none", "plan-none", "none", data))
    ready(cluster, "s-none")
    events = wait_for(
        lambda: [e for e in cluster.events("s-none") if e["reason"] == "NoSandbox"], 30
    )
    assert events[0]["type"] == "Warning"


def test_a_missing_source_ends_in_a_condition_not_a_retry_loop(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    cluster.create(sandbox_manifest("s-missing", "plan-x", "git_worktree", tmp_path / "nope"))
    status = cluster.wait_phase("sandbox", "s-missing", {"Errored", "Active"})
    assert status["phase"] == "Errored"
    ready_condition = cluster.condition("sandbox", "s-missing", "Ready")
    assert ready_condition["status"] == "False"
    assert ready_condition["reason"] == "SandboxCreationFailed"
    assert [e for e in cluster.events("s-missing") if e["type"] == "Warning"]


def test_bad_custom_resources_are_refused_at_apply(cluster: Cluster) -> None:
    bad = sandbox_manifest("s-bad", "plan", "bogus", "/tmp")
    result = cluster.apply(bad)
    assert result.returncode != 0
    assert "spec.strategy" in result.stderr and "Unsupported value" in result.stderr
    cluster.create(sandbox_manifest("s-imm", "plan", "copy_on_write", "/tmp/x"))
    changed = cluster.apply(sandbox_manifest("s-imm", "other-plan", "copy_on_write", "/tmp/x"))
    assert changed.returncode != 0 and "immutable" in changed.stderr.lower()


def test_sandbox_deleted_while_its_create_handler_runs(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Case 16: the finalizer is there before on-disk work; deleting mid-create still cleans
    up, without 404 loops, and the operator is not wedged."""
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    operator.start({"SANDBOX_OPERATOR_FAULT_PROVISION_DELAY_SECONDS": "4"})
    cluster.create(sandbox_manifest("s1", "plan-16", "git_worktree", repo))
    wait_for(
        lambda: (
            "sandbox.cleveragents.io/cleanup"
            in ((cluster.get("sandbox", "s1") or {}).get("metadata", {}).get("finalizers") or [])
        ),
        30,
        "finalizer on s1",
    )
    wait_for(lambda: len(git(repo, "worktree", "list").splitlines()) == 2, 30, "worktree made")
    cluster.kubectl("delete", "sandbox", "s1", "--wait=false")
    wait_for(lambda: cluster.gone("sandbox", "s1"), 120, "s1 gone")
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert git(repo, "branch", "--list").strip() == "* main"
    assert not any((operator.work_dir / "sandboxes").rglob("f.txt"))
    operator.stop()
    operator.start()
    cluster.create(
        sandbox_manifest(
            "s2", "plan-16", "copy_on_write", make_dir(tmp_path / "small", {"a.txt": "a\n"})
        )
    )
    ready(cluster, "s2")
    assert operator.logs().count("Traceback") == 0


def test_a_second_plancommit_waits_for_the_running_one(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Issue 3: a second PlanCommit of a plan whose commit is still running waits with
    Blocked=True (PlanCommitInProgress); it never commits a sandbox a second time."""
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    operator.start({"SANDBOX_OPERATOR_FAULT_COMMIT_DELAY_SECONDS": "4"})
    cluster.create(sandbox_manifest("s-blk", "plan-blk", "copy_on_write", data))
    write_in_sandbox(ready(cluster, "s-blk"), "g.txt", "d1\n")
    cluster.create(plancommit_manifest("pc-first", "plan-blk"))
    cluster.wait_phase("pcommit", "pc-first", {"Committing"}, timeout=30)
    cluster.create(plancommit_manifest("pc-second", "plan-blk"))
    blocked = wait_for(lambda: cluster.condition("pcommit", "pc-second", "Blocked"), 30)
    assert blocked["status"] == "True"
    assert blocked["reason"] == "PlanCommitInProgress"
    assert "pc-first" in blocked["message"]
    first = cluster.wait_phase("pcommit", "pc-first", {"Committed", "Failed", "RolledBack"})
    assert first["phase"] == "Committed"
    second = cluster.wait_phase("pcommit", "pc-second", {"Committed", "Failed", "RolledBack"})
    assert second["phase"] == "Failed"
    assert cluster.condition("pcommit", "pc-second", "Committed")["reason"] == "NoActiveSandboxes"
    assert cluster.condition("pcommit", "pc-second", "Blocked")["status"] == "False"
    assert (data / "g.txt").read_text() == "d1\n"


def test_a_failed_compensation_is_named_and_retried_until_it_succeeds(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Case 21 on the real API server: C's commit fails, B is compensated, A's compensation
    fails (fault hooks: mocks only inject faults). The status and conditions name each id, the
    PlanCommit is not left Failed but stays RollingBack and is retried with backoff; once the
    fault is gone (an operator without it), A is rolled back and the plan ends rolled back."""
    dirs = {key: make_dir(tmp_path / key, {"g.txt": "0\n"}) for key in ("a", "b", "c")}
    operator.start(
        {
            "SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "res-c",
            "SANDBOX_OPERATOR_FAULT_FAIL_ROLLBACK": "res-a",
        }
    )
    for key in ("a", "b", "c"):
        cluster.create(
            sandbox_manifest(f"s-{key}", "plan-rf", "copy_on_write", dirs[key], f"res-{key}")
        )
        write_in_sandbox(ready(cluster, f"s-{key}"), "g.txt", "1\n")
    ids = {key: cluster.status("sandbox", f"s-{key}")["sandboxId"] for key in ("a", "b", "c")}
    cluster.create(plancommit_manifest("pc-rf", "plan-rf", mode="Saga"))
    wait_for(
        lambda: (
            (cluster.condition("pcommit", "pc-rf", "RollbackFailed") or {}).get("status") == "True"
        ),
        90,
        "RollbackFailed=True",
    )
    status = cluster.status("pcommit", "pc-rf")
    assert status["phase"] == "RollingBack"  # not terminal: the compensation is owed
    assert status["failedSandboxId"] == ids["c"]
    assert status["rolledBackIds"] == [ids["b"]]
    assert status["failedRollbackIds"] == [ids["a"]]
    assert [s["state"] for s in status["sandboxes"]] == [
        "CompensationFailed",
        "Compensated",
        "Failed",
    ]
    committed = cluster.condition("pcommit", "pc-rf", "Committed")
    assert committed["status"] == "False"
    assert committed["reason"] == "SandboxCommitFailed" and "s-c" in committed["message"]
    assert "injected commit failure" in committed["message"]
    failed = cluster.condition("pcommit", "pc-rf", "RollbackFailed")
    assert ids["a"] in failed["message"] and "retrying" in failed["message"]
    assert ids["b"] in cluster.condition("pcommit", "pc-rf", "RolledBack")["message"]
    assert (dirs["b"] / "g.txt").read_text() == "0\n"  # compensated
    assert (dirs["a"] / "g.txt").read_text() == "1\n"  # its compensation failed: still committed
    assert (dirs["c"] / "g.txt").read_text() == "0\n"  # never committed
    # Retried with backoff while the fault lasts: more than one attempt, still RollingBack.
    wait_for(lambda: operator.logs().count("rollback failed for sandboxes") >= 2, 30, "a retry")
    assert cluster.status("pcommit", "pc-rf")["phase"] == "RollingBack"
    warnings = [e for e in cluster.events("pc-rf") if e["reason"] == "CompensationFailed"]
    assert warnings and ids["a"] in warnings[0]["message"]

    # The cause is gone: the next retry compensates A and the plan ends rolled back.
    operator.stop()
    operator.start()
    final = cluster.wait_phase(
        "pcommit", "pc-rf", {"Failed", "Committed", "RolledBack"}, 120, handled=True
    )
    assert final["phase"] == "Failed"  # C failed to commit; every committed one undone
    assert final["failedRollbackIds"] == []
    assert final["rolledBackIds"] == [ids["b"], ids["a"]]
    assert [s["state"] for s in final["sandboxes"]] == ["Compensated", "Compensated", "Failed"]
    assert cluster.condition("pcommit", "pc-rf", "RollbackFailed")["status"] == "False"
    rolled = cluster.condition("pcommit", "pc-rf", "RolledBack")
    assert rolled["status"] == "True" and ids["a"] in rolled["message"]
    for key in ("a", "b", "c"):
        assert (dirs[key] / "g.txt").read_text() == "0\n"
    operator.stop()
    operator.start()
    time.sleep(3)  # a wrongly re-processing operator would act now
    assert cluster.status("pcommit", "pc-rf") == final


def test_a_new_plancommit_after_a_rolled_back_one_never_commits_half_the_plan(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Case 38 on the real API server: the first PlanCommit fails on B's commit and compensates
    A (its changes discarded); a second PlanCommit of the plan is refused (PlanRerunRequired),
    both originals unchanged, instead of committing B alone."""
    dirs = {key: make_dir(tmp_path / key, {"g.txt": "0\n"}) for key in ("a", "b")}
    operator.start({"SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "res-b"})
    for key in ("a", "b"):
        cluster.create(
            sandbox_manifest(f"s-{key}", "plan-38", "copy_on_write", dirs[key], f"res-{key}")
        )
        write_in_sandbox(ready(cluster, f"s-{key}"), "g.txt", "1\n")
    cluster.create(plancommit_manifest("pc-38", "plan-38", mode="Saga"))
    first = cluster.wait_phase("pcommit", "pc-38", {"Failed", "Committed", "RolledBack"})
    assert first["phase"] == "Failed"
    assert cluster.status("sandbox", "s-a")["phase"] == "RolledBack"
    operator.stop()
    operator.start()  # the fault is gone: only the plan's state can stop a half commit now
    cluster.create(plancommit_manifest("pc-38-again", "plan-38"))
    again = cluster.wait_phase("pcommit", "pc-38-again", {"Failed", "Committed", "RolledBack"})
    assert again["phase"] == "Failed"
    committed = cluster.condition("pcommit", "pc-38-again", "Committed")
    assert committed["reason"] == "PlanRerunRequired"
    assert "s-a" in committed["message"] and "must be re-run" in committed["message"]
    assert (dirs["a"] / "g.txt").read_text() == "0\n"
    assert (dirs["b"] / "g.txt").read_text() == "0\n"  # never B without A


def test_a_transaction_sandbox_reads_its_dsn_from_a_secret_and_commits_last(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """source.secretRef (transaction_rollback) and seed 002's order: rollbackable first, the
    transaction last."""
    import base64
    import sqlite3

    from sandbox_core import SandboxFactory

    database = tmp_path / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    dsn = base64.b64encode(f"sqlite:///{database}".encode()).decode()
    cluster.create(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "data": {"dsn": dsn}}
    )
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    operator.start()
    db_sandbox = {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "s-db"},
        "spec": {
            "planId": "plan-db",
            "resourceId": "db",
            "strategy": "transaction_rollback",
            "source": {"secretRef": {"name": "db"}},
        },
    }
    cluster.create(db_sandbox)
    cluster.create(sandbox_manifest("s-files", "plan-db", "copy_on_write", data))
    write_in_sandbox(ready(cluster, "s-files"), "g.txt", "d1\n")
    record = ready(cluster, "s-db")["coreRecord"]
    actor = SandboxFactory().reopen(record)  # an actor writing through the sandbox
    actor.execute("INSERT INTO notes VALUES ('from the plan')")  # type: ignore[attr-defined]
    actor.close()  # type: ignore[attr-defined]  # the actor's process is done writing
    with sqlite3.connect(database) as connection:
        assert connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    cluster.create(plancommit_manifest("pc-db", "plan-db"))
    status = cluster.wait_phase("pcommit", "pc-db", {"Committed", "Failed", "RolledBack"})
    assert status["phase"] == "Committed", status
    assert [s["name"] for s in status["sandboxes"]] == ["s-files", "s-db"]
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT body FROM notes").fetchall()
    assert rows == [("from the plan",)]
    assert (data / "g.txt").read_text() == "d1\n"
