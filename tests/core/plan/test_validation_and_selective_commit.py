"""Pre-commit checks and a commit that names which sandboxes of a plan land (docs/forks.md):
checks run through the local door in each fork, a failure refuses before anything is prepared
(the original untouched, the command, exit code and scrubbed tail kept), the results are shown
in the review and bound by its digest, and a selective commit lands one fork and discards the
others in the same step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from sandbox_core import SandboxFactory, SandboxStatus, SandboxStore
from sandbox_core.actor.checks import local_check_runner
from sandbox_core.actor.local import LocalActor
from sandbox_core.host.manager import SandboxManager
from sandbox_core.plan.validation import (
    Check,
    CheckOutcome,
    CheckResult,
    run_checks,
    scrub_output,
)
from tests.support.hygiene import leftovers

pytestmark = pytest.mark.usefixtures("git_identity")


def _three_forks(tmp_path: Path) -> tuple[SandboxManager, Path, list[Any], Any]:
    original = tmp_path / "orig"
    original.mkdir()
    (original / "app.txt").write_text("v0\n")
    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(tmp_path / "state")
    )
    parent = manager.get_or_create_sandbox(
        "plan", "parent", str(original), "copy_on_write", sandbox_root=str(tmp_path / "sbx")
    )
    parent.activate()
    Path(parent.get_path("app.txt")).write_text("v1\n")
    checkpoint = manager.checkpoints.create_checkpoint(parent, "plan", "explore")
    forks = [manager.fork_sandbox("plan", f"try-{n}", checkpoint.checkpoint_id) for n in range(3)]
    for n, fork in enumerate(forks):
        fork.activate()
        Path(fork.get_path("answer")).write_text(f"{n}\n")
        manager.persist("plan")
    parent.cleanup()
    return manager, original, forks, parent


def _checks(forks: list[Any], script: str) -> list[Check]:
    return [
        Check(f"test-{n}", fork.sandbox_id, ("/bin/sh", "-c", script), timeout_seconds=20)
        for n, fork in enumerate(forks)
    ]


def test_a_failed_check_refuses_before_prepare_and_keeps_its_tail(tmp_path: Path) -> None:
    manager, original, forks, _ = _three_forks(tmp_path)
    runner = local_check_runner(LocalActor(tmp_path / "state"))
    script = (
        'for i in $(seq 1 40); do echo "line $i"; done; echo "password=hunter22 leaked"; '
        'test "$(cat answer)" != 1'
    )

    results = run_checks(_checks(forks, script), runner, secrets=["hunter22"])

    assert [r.passed for r in results] == [True, False, True]
    failed = results[1]
    assert failed.exit_code == 1
    assert failed.timed_out is False
    assert failed.command == ["/bin/sh", "-c", script.replace("hunter22", "***")]
    tail = failed.output_tail.splitlines()
    assert len(tail) == 20
    assert tail[-1] == "password=*** leaked"
    assert tail[0] == "line 22"
    assert "hunter22" not in failed.output_tail

    outcome = manager.commit_plan(
        "plan", sandbox_ids=[forks[0].sandbox_id], checks=results, mode="two_phase"
    )

    assert len(outcome) == 1
    assert outcome[0].success is False
    assert outcome[0].metadata["reason"] == "ValidationFailed"
    assert outcome[0].metadata["touched_originals"] == 0
    assert outcome[0].metadata["failed_checks"][0]["name"] == "test-1"
    assert "test-1 in sandbox" in str(outcome[0].error)
    assert (original / "app.txt").read_text() == "v0\n"
    assert not (original / "answer").exists()
    assert all(fork.status is SandboxStatus.ACTIVE for fork in forks)


def test_a_check_is_killed_at_its_timeout(tmp_path: Path) -> None:
    _, _, forks, _ = _three_forks(tmp_path)
    runner = local_check_runner(LocalActor(tmp_path / "state"))
    check = Check("slow", forks[0].sandbox_id, ("/bin/sh", "-c", "sleep 30"), timeout_seconds=1)

    [result] = run_checks([check], runner)

    assert result.timed_out is True
    assert result.passed is False
    assert result.duration_seconds < 15


def test_a_check_of_an_unknown_sandbox_fails_with_the_refusal(tmp_path: Path) -> None:
    runner = local_check_runner(LocalActor(tmp_path / "state"))
    [result] = run_checks([Check("c", "01NOSUCHSANDBOX", ("true",))], runner)
    assert result.passed is False
    assert result.exit_code is None
    assert "01NOSUCHSANDBOX" in result.output_tail


def test_checks_are_shown_in_the_review_and_bound_by_its_digest(tmp_path: Path) -> None:
    manager, original, forks, _ = _three_forks(tmp_path)
    runner = local_check_runner(LocalActor(tmp_path / "state"))
    results = run_checks(_checks(forks, "test -f answer"), runner)
    assert all(result.passed for result in results)
    chosen = [forks[2].sandbox_id]

    plain = manager.review_plan("plan", sandbox_ids=chosen)
    review = manager.review_plan("plan", sandbox_ids=chosen, checks=results)

    assert review.digest != plain.digest
    shown = review.to_dict()
    assert [row["sandbox_id"] for row in shown["sandboxes"]] == chosen
    assert [check["name"] for check in shown["checks"]] == ["test-0", "test-1", "test-2"]
    assert shown["checks"][0]["exitCode"] == 0
    # An approval of the digest without the checks does not commit the plan with them.
    refused = manager.commit_plan(
        "plan", sandbox_ids=chosen, checks=results, approved_digest=plain.digest
    )
    assert refused[0].metadata["reason"] == "ChangedSinceApproval"
    assert not (original / "answer").exists()

    landed = manager.commit_plan(
        "plan", sandbox_ids=chosen, checks=results, approved_digest=review.digest
    )

    assert [result.success for result in landed] == [True]
    assert landed[0].metadata["discarded_ids"] == sorted(f.sandbox_id for f in forks[:2])
    assert (original / "answer").read_text() == "2\n"
    assert (original / "app.txt").read_text() == "v1\n"
    tracked = {
        sb.sandbox_id: sb.status
        for sb in manager.list_sandboxes("plan")
        if sb.status is not SandboxStatus.CLEANED_UP
    }
    assert tracked == {chosen[0]: SandboxStatus.COMMITTED}
    assert forks[0].status is SandboxStatus.CLEANED_UP
    assert forks[1].status is SandboxStatus.CLEANED_UP
    manager.cleanup_all("plan")
    assert leftovers(tmp_path, original) == {}


def test_a_selective_commit_naming_a_stranger_is_refused(tmp_path: Path) -> None:
    manager, _, forks, _ = _three_forks(tmp_path)
    with pytest.raises(ValueError, match="commit names nope; name one or more"):
        manager.commit_plan("plan", sandbox_ids=["nope"])
    assert all(fork.status is SandboxStatus.ACTIVE for fork in forks)


def test_results_survive_a_round_trip_and_digest_what_they_say() -> None:
    def runner(check: Check) -> CheckOutcome:
        return CheckOutcome(exit_code=3, output=b"token: abc123 here\n")

    [result] = run_checks([Check("lint", "sb", ("ruff", "check", "--token=abcd1234"))], runner)
    assert result.command == ["ruff", "check", "--token=***"]
    assert result.output_tail == "token: *** here"
    again = CheckResult.from_dict(result.to_dict())
    assert again == dataclasses.replace(result, duration_seconds=round(result.duration_seconds, 3))
    assert again.digest_line().endswith(":3:failed")
    assert scrub_output("secret=xyz") == "secret=***"
    with pytest.raises(ValueError, match="unique"):
        run_checks([Check("a", "sb", ("true",)), Check("a", "sb", ("true",))], runner)
    with pytest.raises(ValueError, match="letters, digits"):
        Check("../x", "sb", ("true",))
