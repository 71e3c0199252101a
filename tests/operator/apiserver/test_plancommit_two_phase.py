"""PlanCommit two-phase mode, review and approval on the real kube-apiserver (issue 9, tier 2).

The operator runs as a subprocess with the local executor on real git repositories and
directories: a PlanCommit with ``approval: Required`` waits and shows its review, refuses a
wrong digest, commits with the right one; a sandbox edited after approval fails with
``ChangedSinceApproval`` and no original changes; ``approvalTimeoutSeconds`` expires; mode Saga
keeps the compensating saga; a conflict in the last sandbox of a TwoPhase plan touches no
original; an operator killed during prepare aborts and one killed after the decision rolls
forward; invalid specs are refused by the API server at apply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    git,
    make_dir,
    make_repo,
    plancommit_manifest,
    run_operator,
    sandbox_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
WRONG = "sha256:" + "0" * 64


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    """A fresh namespace with the CRDs installed."""
    return Cluster.fresh(local_apiserver, prefix="tpc")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator (not started yet: tests start it, some with fault hooks)."""
    yield from run_operator(local_apiserver, cluster, tmp_path, cleanup_kinds="sandboxes")


def two_sandbox_plan(cluster: Cluster, tmp_path: Path, plan: str) -> dict[str, Any]:
    """A git_worktree and a copy_on_write Sandbox of ``plan``, Active, each with an edit."""
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    cluster.create(sandbox_manifest("sa-git", plan, "git_worktree", repo))
    cluster.create(sandbox_manifest("sb-copy", plan, "copy_on_write", data))
    out: dict[str, Any] = {"repo": repo, "data": data, "head": git(repo, "rev-parse", "HEAD")}
    for name, file, text in (("sa-git", "f.txt", "r1 (sandbox)\n"), ("sb-copy", "g.txt", "d1\n")):
        status = cluster.wait_active(name)
        (Path(status["sandboxPath"]) / file).write_text(text)
        out[name] = status
    (Path(out["sb-copy"]["sandboxPath"]) / "new.txt").write_text("n\n")
    return out


def assert_untouched(plan: dict[str, Any]) -> None:
    """The originals are exactly as the plan found them (real repository and directory)."""
    repo, data = plan["repo"], plan["data"]
    assert git(repo, "rev-parse", "HEAD") == plan["head"]
    assert (repo / "f.txt").read_text() == "r0\n"
    assert git(repo, "status", "--porcelain") == ""
    assert sorted(p.name for p in data.iterdir()) == ["g.txt"]  # nothing staged is left
    assert (data / "g.txt").read_text() == "d0\n"


def patch_digest(cluster: Cluster, name: str, digest: str) -> None:
    cluster.kubectl(
        "patch",
        "pcommit",
        name,
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"approvedDigest": digest}}),
    )


def reasons(cluster: Cluster, name: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in cluster.events(name)]


def awaiting(cluster: Cluster, name: str) -> dict[str, Any]:
    status = cluster.wait_phase("pcommit", name, {"AwaitingApproval", "Failed", "Committed"})
    assert status["phase"] == "AwaitingApproval", status
    return status


def test_approval_required_waits_refuses_a_wrong_digest_and_commits_with_the_right_one(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    plan = two_sandbox_plan(cluster, tmp_path, "plan-ap")
    cluster.create(plancommit_manifest("pc-ap", "plan-ap", approval="Required"))
    status = awaiting(cluster, "pc-ap")
    review = status["review"]
    digest = review["digest"]
    assert DIGEST.match(digest)
    rows = {row["name"]: row for row in review["sandboxes"]}
    assert rows["sa-git"]["paths"] == ["M f.txt"]
    assert (rows["sb-copy"]["added"], rows["sb-copy"]["changed"]) == (1, 1)
    assert sorted(rows["sb-copy"]["paths"]) == ["A new.txt", "M g.txt"]
    assert review["truncated"] is False
    assert cluster.condition("pcommit", "pc-ap", "Reviewed")["status"] == "True"
    approved = cluster.condition("pcommit", "pc-ap", "Approved")
    assert (approved["status"], approved["reason"]) == ("False", "AwaitingApproval")
    assert digest in approved["message"]
    assert cluster.condition("pcommit", "pc-ap", "Finished")["status"] == "False"
    wait_for(lambda: ("Normal", "AwaitingApproval") in reasons(cluster, "pc-ap"), 30, "event")
    assert ("Normal", "Reviewed") in reasons(cluster, "pc-ap")

    patch_digest(cluster, "pc-ap", WRONG)
    mismatch = wait_for(
        lambda: (
            (c := cluster.condition("pcommit", "pc-ap", "Approved"))
            and c["reason"] == "DigestMismatch"
            and c
        ),
        30,
        "Approved reason DigestMismatch",
    )
    assert mismatch["status"] == "False"
    assert WRONG in mismatch["message"] and digest in mismatch["message"]
    wait_for(lambda: ("Warning", "DigestMismatch") in reasons(cluster, "pc-ap"), 30, "warning")
    assert cluster.status("pcommit", "pc-ap")["phase"] == "AwaitingApproval"
    assert_untouched(plan)  # nothing committed on a refused digest

    patch_digest(cluster, "pc-ap", digest)
    status = cluster.wait_phase("pcommit", "pc-ap", {"Committed", "Failed"})
    assert status["phase"] == "Committed", status
    assert status["mode"] == "TwoPhase"
    assert status["twoPhase"]["digest"] == digest
    assert status["twoPhase"]["approvedDigest"] == digest
    assert [s["state"] for s in status["sandboxes"]] == ["Committed", "Committed"]
    approved = cluster.condition("pcommit", "pc-ap", "Approved")
    assert (approved["status"], approved["reason"]) == ("True", "DigestMatched")
    assert (plan["repo"] / "f.txt").read_text() == "r1 (sandbox)\n"
    assert (plan["data"] / "g.txt").read_text() == "d1\n"
    assert (plan["data"] / "new.txt").read_text() == "n\n"
    assert ("Normal", "Approved") in reasons(cluster, "pc-ap")


def test_a_sandbox_edited_after_approval_fails_with_changed_since_approval(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    plan = two_sandbox_plan(cluster, tmp_path, "plan-ed")
    cluster.create(plancommit_manifest("pc-ed", "plan-ed", approval="Required"))
    digest = awaiting(cluster, "pc-ed")["review"]["digest"]
    (Path(plan["sb-copy"]["sandboxPath"]) / "g.txt").write_text("edited after the review\n")
    patch_digest(cluster, "pc-ed", digest)
    status = cluster.wait_phase("pcommit", "pc-ed", {"Committed", "Failed"})
    assert status["phase"] == "Failed", status
    committed = cluster.condition("pcommit", "pc-ed", "Committed")
    assert (committed["status"], committed["reason"]) == ("False", "ChangedSinceApproval")
    assert status["twoPhase"]["reason"] == "ChangedSinceApproval"
    assert status["twoPhase"]["digest"] != digest
    assert status["rolledBackIds"] == []
    assert {s["state"] for s in status["sandboxes"]} == {"Aborted"}
    assert_untouched(plan)
    for name in ("sa-git", "sb-copy"):  # the sandboxes keep their changes, still Active
        assert cluster.status("sandbox", name)["phase"] == "Active"


def test_an_unapproved_plancommit_expires(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    plan = two_sandbox_plan(cluster, tmp_path, "plan-ex")
    cluster.create(
        plancommit_manifest("pc-ex", "plan-ex", approval="Required", approvalTimeoutSeconds=3)
    )
    status = cluster.wait_phase("pcommit", "pc-ex", {"Expired", "Committed", "Failed"}, 60)
    assert status["phase"] == "Expired", status
    finished = cluster.condition("pcommit", "pc-ex", "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Expired")
    wait_for(lambda: ("Warning", "Expired") in reasons(cluster, "pc-ex"), 30, "Expired event")
    patch_digest(cluster, "pc-ex", status["review"]["digest"])  # too late: terminal
    assert cluster.status("pcommit", "pc-ex")["phase"] == "Expired"
    assert_untouched(plan)


def test_mode_saga_keeps_the_compensating_saga(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start({"SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "sb-copy"})
    plan = two_sandbox_plan(cluster, tmp_path, "plan-sg")
    cluster.create(plancommit_manifest("pc-sg", "plan-sg", mode="Saga"))
    status = cluster.wait_phase("pcommit", "pc-sg", {"Committed", "Failed"})
    assert status["phase"] == "Failed", status
    assert status["mode"] == "Saga"
    assert "review" not in status and "twoPhase" not in status
    git_id = plan["sa-git"]["sandboxId"]
    assert status["rolledBackIds"] == [git_id]  # the landed commit was compensated
    states = {s["name"]: s["state"] for s in status["sandboxes"]}
    assert states == {"sa-git": "Compensated", "sb-copy": "Failed"}
    assert (plan["repo"] / "f.txt").read_text() == "r0\n"


def test_a_conflict_in_the_last_sandbox_touches_no_original(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    first = make_dir(tmp_path / "first", {"a.txt": "a0\n"})
    second = make_dir(tmp_path / "second", {"b.txt": "b0\n"})
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    cluster.create(sandbox_manifest("s1-copy", "plan-cf", "copy_on_write", first))
    s1 = cluster.wait_active("s1-copy")
    cluster.create(sandbox_manifest("s2-copy", "plan-cf", "copy_on_write", second))
    s2 = cluster.wait_active("s2-copy")
    cluster.create(sandbox_manifest("s3-git", "plan-cf", "git_worktree", repo))
    s3 = cluster.wait_active("s3-git")
    (Path(s1["sandboxPath"]) / "a.txt").write_text("a1\n")
    (Path(s2["sandboxPath"]) / "b.txt").write_text("b1\n")
    (Path(s3["sandboxPath"]) / "f.txt").write_text("sandbox\n")
    (repo / "f.txt").write_text("someone else\n")  # the original moved on: a conflict
    git(repo, "commit", "-qam", "concurrent change")
    head = git(repo, "rev-parse", "HEAD")
    cluster.create(plancommit_manifest("pc-cf", "plan-cf"))
    status = cluster.wait_phase("pcommit", "pc-cf", {"Committed", "Failed"})
    assert status["phase"] == "Failed", status
    assert status["mode"] == "TwoPhase"
    assert status["failedSandboxId"] == s3["sandboxId"]
    assert status["rolledBackIds"] == []
    states = {s["name"]: s["state"] for s in status["sandboxes"]}
    assert states == {"s1-copy": "Aborted", "s2-copy": "Aborted", "s3-git": "Failed"}
    committed = cluster.condition("pcommit", "pc-cf", "Committed")
    assert committed["reason"] == "Conflict", committed
    rolled = cluster.condition("pcommit", "pc-cf", "RolledBack")
    assert rolled["reason"] == "Aborted"
    # No original was touched: not even for a moment (nothing to compensate).
    assert sorted(p.name for p in first.iterdir()) == ["a.txt"]
    assert (first / "a.txt").read_text() == "a0\n"
    assert sorted(p.name for p in second.iterdir()) == ["b.txt"]
    assert (second / "b.txt").read_text() == "b0\n"
    assert git(repo, "rev-parse", "HEAD") == head
    assert (repo / "f.txt").read_text() == "someone else\n"


@pytest.mark.parametrize(
    ("fault", "stage"),
    [("after_prepare:2", "Preparing"), ("after_decision:0", "Applying")],
)
def test_an_operator_killed_mid_two_phase_resumes_from_the_status_journal(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path, fault: str, stage: str
) -> None:
    operator.start()
    plan = two_sandbox_plan(cluster, tmp_path, "plan-kl")
    operator.stop()
    operator.start({"SANDBOX_CORE_FAULT": fault})  # SIGKILLs itself at that point
    cluster.create(plancommit_manifest("pc-kl", "plan-kl"))
    operator.wait_exit(90)
    mid = cluster.status("pcommit", "pc-kl")
    assert mid["phase"] == "Committing", mid
    assert mid["twoPhase"]["stage"] == stage
    operator.start()
    status = cluster.wait_phase("pcommit", "pc-kl", {"Committed", "Failed"})
    # Issue 11: before the decision every prepared sandbox is aborted (nothing touched) and a
    # new attempt commits; after it, the apply rolls forward.
    assert status["phase"] == "Committed", status
    assert status["twoPhase"]["attempt"] == (2 if stage == "Preparing" else 1), status
    assert (plan["repo"] / "f.txt").read_text() == "r1 (sandbox)\n"
    assert (plan["data"] / "g.txt").read_text() == "d1\n"
    assert sorted(p.name for p in plan["data"].iterdir()) == ["g.txt", "new.txt"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"approval": "Required", "approvedDigest": "sha256:abc"}, "approvedDigest"),
        ({"approval": "Required", "approvedDigest": "md5:" + "0" * 64}, "approvedDigest"),
        ({"approval": "Required", "approvalTimeoutSeconds": 0}, "approvalTimeoutSeconds"),
        ({"approval": "Required", "action": "Rollback"}, "only for action Commit"),
        ({"approvedDigest": WRONG}, "approvedDigest needs approval Required"),
        ({"approvalTimeoutSeconds": 5}, "approvalTimeoutSeconds needs approval Required"),
        ({"mode": "Parallel"}, "mode"),
        ({"approval": "Maybe"}, "approval"),
    ],
)
def test_invalid_two_phase_specs_are_refused_at_apply(
    cluster: Cluster, spec: dict[str, Any], message: str
) -> None:
    result = cluster.apply(plancommit_manifest("pc-bad", "plan-bad", **spec))
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert cluster.get("pcommit", "pc-bad") is None


def test_mode_and_approval_are_immutable_and_the_digest_is_not(cluster: Cluster) -> None:
    cluster.create(plancommit_manifest("pc-im", "plan-im", approval="Required"))
    for patch, refused in (
        ({"mode": "Saga"}, "mode is immutable"),
        ({"approval": "NotRequired"}, "approval is immutable"),
    ):
        result = cluster.kubectl(
            "patch", "pcommit", "pc-im", "--type", "merge", "-p", json.dumps({"spec": patch}),
            check=False,
        )  # fmt: skip
        assert result.returncode != 0 and refused in result.stderr, result.stderr
    patch_digest(cluster, "pc-im", WRONG)
    body = cluster.get("pcommit", "pc-im")
    assert body is not None
    assert body["spec"]["approvedDigest"] == WRONG
    assert body["spec"]["mode"] == "TwoPhase"  # the default


def sqlite_sandbox(cluster: Cluster, tmp_path: Path, name: str, plan: str) -> Path:
    """A transaction_rollback Sandbox over a new SQLite database (DSN in a Secret), with one
    INSERT made through it; returns the database path."""
    import base64
    import sqlite3

    from sandbox_core import SandboxFactory

    database = tmp_path / f"{name}.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    dsn = base64.b64encode(f"sqlite:///{database}".encode()).decode()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {"dsn": dsn},
    }
    cluster.create(secret)
    cluster.create(
        {
            "apiVersion": "sandbox.cleveragents.io/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {
                "planId": plan,
                "resourceId": name,
                "strategy": "transaction_rollback",
                "source": {"secretRef": {"name": name}},
            },
        }
    )
    actor = SandboxFactory().reopen(cluster.wait_active(name)["coreRecord"])
    actor.execute("INSERT INTO notes VALUES (?)", (name,))  # type: ignore[attr-defined]
    actor.close()  # type: ignore[attr-defined]
    return database


def notes(database: Path) -> list[tuple[str, ...]]:
    import sqlite3

    with sqlite3.connect(database) as connection:
        return list(connection.execute("SELECT body FROM notes").fetchall())


def test_a_sqlite_sandbox_is_the_last_resource_of_a_two_phase_plan(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    database = sqlite_sandbox(cluster, tmp_path, "s-db", "plan-lr")
    cluster.create(sandbox_manifest("s-files", "plan-lr", "copy_on_write", data))
    (Path(cluster.wait_active("s-files")["sandboxPath"]) / "g.txt").write_text("d1\n")
    cluster.create(plancommit_manifest("pc-lr", "plan-lr"))
    status = cluster.wait_phase("pcommit", "pc-lr", {"Committed", "Failed"})
    assert status["phase"] == "Committed", status
    assert status["mode"] == "TwoPhase"
    last = {s["name"]: s["lastResource"] for s in status["sandboxes"]}
    assert last == {"s-files": False, "s-db": True}
    assert [s["name"] for s in status["sandboxes"]][-1] == "s-db"
    assert cluster.condition("pcommit", "pc-lr", "TwoPhase") is None  # no fallback
    assert notes(database) == [("s-db",)]
    assert (data / "g.txt").read_text() == "d1\n"


def test_a_plan_that_cannot_use_two_phases_falls_back_to_the_saga_and_says_so(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    first = sqlite_sandbox(cluster, tmp_path, "s-db1", "plan-fb")
    second = sqlite_sandbox(cluster, tmp_path, "s-db2", "plan-fb")
    cluster.create(plancommit_manifest("pc-fb", "plan-fb"))
    status = cluster.wait_phase("pcommit", "pc-fb", {"Committed", "Failed"})
    assert status["phase"] == "Committed", status
    assert status["mode"] == "Saga"
    two_phase = cluster.condition("pcommit", "pc-fb", "TwoPhase")
    assert (two_phase["status"], two_phase["reason"]) == ("False", "FellBackToSaga")
    assert "cannot prepare durably" in two_phase["message"]
    wait_for(lambda: ("Warning", "FellBackToSaga") in reasons(cluster, "pc-fb"), 30, "event")
    assert notes(first) == [("s-db1",)]
    assert notes(second) == [("s-db2",)]
