"""Named approvals end to end on the real API server, the operator judging them
(docs/approvals.md).

People are impersonated (``kubectl --as``), the chart's admission policy is installed, and the
operator (local executor) commits a real directory only once enough distinct eligible people
approved the reviewed digest: the status and ``kubectl get`` name them and when they were seen,
Events say it, a rejection ends the PlanCommit with nothing touched, and a digest approved for
one original is refused when the Sandbox's original was replaced by another at the same path.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.approvals import (
    add_approval,
    create_as,
    created_by,
    entry,
    grant_plancommit_rights,
    install_approval_policy,
)
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    make_dir,
    plancommit_manifest,
    run_operator,
    sandbox_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy(local_apiserver: Any) -> Iterator[None]:
    probe = Cluster.fresh(local_apiserver, prefix="naf-probe")
    manifest = install_approval_policy(local_apiserver, probe, "naf")
    yield
    local_apiserver.kubectl("delete", "-f", "-", input=manifest, check=False)


@pytest.fixture
def cluster(local_apiserver: Any, policy: None) -> Cluster:
    cluster = Cluster.fresh(local_apiserver, prefix="naf")
    grant_plancommit_rights(cluster)
    return cluster


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path)


def one_sandbox_plan(cluster: Cluster, tmp_path: Path, plan: str) -> Path:
    """A copy_on_write Sandbox of ``plan`` over a real directory, with one edit; the directory."""
    data = make_dir(tmp_path / f"{plan}-data", {"g.txt": "d0\n"})
    cluster.create(sandbox_manifest(f"{plan}-sb", plan, "copy_on_write", data))
    status = cluster.wait_active(f"{plan}-sb")
    (Path(status["sandboxPath"]) / "g.txt").write_text("d1\n")
    return data


def awaiting(cluster: Cluster, name: str, plan: str, **spec: Any) -> str:
    """Create PlanCommit ``name`` as carol (approval Required); its reviewed digest."""
    manifest = created_by(plancommit_manifest(name, plan, approval="Required", **spec), "carol")
    result = create_as(cluster, "carol", manifest)
    assert result.returncode == 0, result.stderr
    status = cluster.wait_phase("pcommit", name, {"AwaitingApproval", "Failed", "Committed"})
    assert status["phase"] == "AwaitingApproval", status
    return str(status["review"]["digest"])


def reasons(cluster: Cluster, name: str) -> list[tuple[str, str, str]]:
    return [(e["type"], e["reason"], e["message"]) for e in cluster.events(name)]


def test_alice_approves_and_the_commit_names_her(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    data = one_sandbox_plan(cluster, tmp_path, "plan-one")
    digest = awaiting(cluster, "pc-one", "plan-one")
    assert (data / "g.txt").read_text() == "d0\n"
    result = add_approval(cluster, "pc-one", "alice", entry("alice", digest))
    assert result.returncode == 0, result.stderr
    status = cluster.wait_phase("pcommit", "pc-one", {"Committed", "Failed"}, handled=True)
    assert status["phase"] == "Committed", status
    assert (data / "g.txt").read_text() == "d1\n"
    assert status["approvedBy"] == "alice"
    (row,) = status["approvals"]
    assert (row["user"], row["digest"], row["decision"], row["counted"]) == (
        "alice",
        digest,
        "Approve",
        True,
    )
    assert row["observedAt"] >= status["review"]["reviewedAt"]
    approved = cluster.condition("pcommit", "pc-one", "Approved") or {}
    assert (approved["status"], approved["reason"]) == ("True", "Approved")
    assert f"plan digest {digest} approved by alice (1 of 1 needed)" == approved["message"]
    events = reasons(cluster, "pc-one")
    assert ("Normal", "Approved", approved["message"]) in events
    assert any(
        r == "ApprovalRecorded" and m.startswith(f"alice approved plan digest {digest}; it counts")
        for _, r, m in events
    ), events
    table = cluster.kubectl("get", "plancommit", "pc-one").stdout
    header, line = table.splitlines()
    assert "APPROVED-BY" in header.split()
    assert line.split()[header.split().index("APPROVED-BY")] == "alice"


def test_two_distinct_approvers_are_needed_when_asked(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    data = one_sandbox_plan(cluster, tmp_path, "plan-two")
    digest = awaiting(cluster, "pc-two", "plan-two", requiredApprovals=2)
    assert add_approval(cluster, "pc-two", "alice", entry("alice", digest)).returncode == 0

    def waiting_after_alice() -> dict[str, Any] | None:
        status = cluster.status("pcommit", "pc-two")
        return status if status.get("approvedBy") == "alice" else None

    status = wait_for(waiting_after_alice, 30, "alice's approval shown")
    assert status["phase"] == "AwaitingApproval"
    approved = cluster.condition("pcommit", "pc-two", "Approved") or {}
    assert approved["reason"] == "AwaitingApproval"
    assert "needs 2 distinct approval(s)" in approved["message"]
    assert "approved by: alice" in approved["message"]
    assert (data / "g.txt").read_text() == "d0\n"
    assert add_approval(cluster, "pc-two", "bob", entry("bob", digest)).returncode == 0
    status = cluster.wait_phase("pcommit", "pc-two", {"Committed", "Failed"})
    assert status["phase"] == "Committed", status
    assert status["approvedBy"] == "alice, bob"
    assert (data / "g.txt").read_text() == "d1\n"


def test_a_rejection_ends_it_with_nothing_touched(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    data = one_sandbox_plan(cluster, tmp_path, "plan-no")
    digest = awaiting(cluster, "pc-no", "plan-no")
    rejection = entry("bob", digest, decision="Reject")
    rejection["comment"] = "not before the release"
    assert add_approval(cluster, "pc-no", "bob", rejection).returncode == 0
    status = cluster.wait_phase("pcommit", "pc-no", {"Committed", "Failed"})
    assert status["phase"] == "Failed", status
    committed = cluster.condition("pcommit", "pc-no", "Committed") or {}
    assert (committed["status"], committed["reason"]) == ("False", "Rejected")
    assert "rejected by bob" in committed["message"]
    assert "not before the release" in committed["message"]
    assert (cluster.condition("pcommit", "pc-no", "Finished") or {})["status"] == "True"
    assert (data / "g.txt").read_text() == "d0\n"
    # A later approval changes nothing: the PlanCommit is over.
    assert add_approval(cluster, "pc-no", "alice", entry("alice", digest)).returncode == 0
    assert cluster.status("pcommit", "pc-no")["phase"] == "Failed"
    assert (data / "g.txt").read_text() == "d0\n"


def test_a_digest_approved_for_one_original_is_refused_on_another(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    data = one_sandbox_plan(cluster, tmp_path, "plan-swap")
    digest = awaiting(cluster, "pc-swap", "plan-swap")
    # Another directory now sits at the original's path: same files, another tree.
    data.rename(tmp_path / "plan-swap-data-old")
    shutil.copytree(tmp_path / "plan-swap-data-old", data)
    assert add_approval(cluster, "pc-swap", "alice", entry("alice", digest)).returncode == 0
    status = cluster.wait_phase("pcommit", "pc-swap", {"Committed", "Failed"})
    assert status["phase"] == "Failed", status
    committed = cluster.condition("pcommit", "pc-swap", "Committed") or {}
    assert (committed["status"], committed["reason"]) == ("False", "ChangedSinceApproval")
    assert status["twoPhase"]["approvedDigest"] == digest
    assert status["twoPhase"]["digest"] != digest
    assert (data / "g.txt").read_text() == "d0\n"
    assert (tmp_path / "plan-swap-data-old" / "g.txt").read_text() == "d0\n"


def test_where_the_operator_requires_approval_it_cannot_be_skipped_or_preset(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """The operator's own check, behind the policy's (here the policy does not require
    approval: ``approvals.required`` reaches only the operator)."""
    operator.start({"SANDBOX_OPERATOR_APPROVAL_REQUIRED": "true"})
    data = one_sandbox_plan(cluster, tmp_path, "plan-req")
    skipped = create_as(cluster, "carol", plancommit_manifest("pc-skip", "plan-req"))
    assert skipped.returncode == 0, skipped.stderr
    status = cluster.wait_phase("pcommit", "pc-skip", {"Committed", "Failed"})
    assert status["phase"] == "Failed", status
    committed = cluster.condition("pcommit", "pc-skip", "Committed") or {}
    assert (committed["status"], committed["reason"]) == ("False", "ApprovalRequired")
    assert (data / "g.txt").read_text() == "d0\n"
    # The engine presets the digest it reviewed: it does not count, a person's approval does.
    digest = awaiting(cluster, "pc-preset", "plan-req")
    patched = cluster.kubectl(
        "--as=carol", "patch", "plancommit", "pc-preset", "--type", "merge", "-p",
        '{"spec": {"approvedDigest": "' + digest + '"}}',
    )  # fmt: skip
    assert patched.returncode == 0, patched.stderr

    def still_waiting() -> dict[str, Any] | None:
        approved = cluster.condition("pcommit", "pc-preset", "Approved") or {}
        message = str(approved.get("message"))
        return approved if "spec.approvedDigest" not in message and approved else None

    approved = wait_for(still_waiting, 30, "the wait named without the deprecated field")
    assert approved["reason"] == "AwaitingApproval"
    assert cluster.status("pcommit", "pc-preset")["phase"] == "AwaitingApproval"
    assert (data / "g.txt").read_text() == "d0\n"
    assert add_approval(cluster, "pc-preset", "alice", entry("alice", digest)).returncode == 0
    status = cluster.wait_phase("pcommit", "pc-preset", {"Committed", "Failed"})
    assert status["phase"] == "Committed", status
    assert status["approvedBy"] == "alice"
