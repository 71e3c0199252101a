"""A compensation that failed is retried by ``recover`` once its cause is gone (case 21).

Policy (``sandbox_core.plan.saga``): every compensation is attempted in LIFO order (best effort); a
failed one keeps the attempt open (phase ``compensating``, reason ``CompensationFailed``) and its
sandbox COMMITTED; ``recover`` (library and ``sandbox-core recover``) retries it, and once it
succeeds the plan ends as if nothing had failed: the originals as they were before the commit.

Real parts: real directories, real git repositories, the real strategies. Faults are injected
(mocks only inject faults): the saga's fault hook for "C's commit fails" and "B's compensation
fails", and failures *inside* a strategy's undo (after part of it ran), which is what makes a
retry dangerous if the undo is not safe to run twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest

from sandbox_core import SandboxFactory, SandboxStatus, SandboxStore
from sandbox_core.host.manager import SandboxManager, state_dir_journal_path
from sandbox_core.plan.journal import FileCommitJournal, JournalPhase, JournalReason, StepState
from sandbox_core.plan.saga import InjectedFaultError
from tests.support.gitrepo import GIT_ENV, git, make_repo

ROLLBACKABLE = ("copy_on_write", "git_worktree", "overlay")


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path) -> Iterator[None]:
    """Clean the plan's sandboxes up after each test (an overlay mount must not outlive it)."""
    yield
    state = tmp_path / "state"
    if state.is_dir():
        SandboxManager.load(SandboxStore(state)).cleanup_all("p2")


class Switch:
    """A fault hook that raises at chosen (point, index) pairs while it is on."""

    def __init__(self, *faults: tuple[str, int]) -> None:
        self.faults = set(faults)
        self.on = True
        self.fired: list[tuple[str, int]] = []

    def __call__(self, point: str, index: int, sandbox_id: str) -> None:
        if self.on and (point, index) in self.faults:
            self.fired.append((point, index))
            raise InjectedFaultError(f"injected fault at {point} of step {index}")


def make_original(tmp_path: Path, name: str, strategy: str, text: str) -> Path:
    """A directory (or a git repository for git_worktree) holding ``v`` = ``text``."""
    if strategy == "git_worktree":
        return make_repo(tmp_path / name, {"v": text})
    path = tmp_path / name
    path.mkdir()
    (path / "v").write_text(text)
    return path


def tree_of(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (``.git`` excluded) with its bytes: what the user sees."""
    out = {}
    for item in sorted(path.rglob("*")):
        rel = item.relative_to(path)
        if rel.parts[0] == ".git" or not item.is_file():
            continue
        out[str(rel)] = item.read_bytes()
    return out


def git_state(path: Path) -> tuple[str, str] | None:
    if not (path / ".git").exists():
        return None
    return git(path, "rev-parse", "HEAD"), git(path, "status", "--porcelain")


def snapshot(originals: dict[str, Path]) -> dict[str, Any]:
    return {key: (tree_of(path), git_state(path)) for key, path in originals.items()}


def plan(
    tmp_path: Path, strategies: dict[str, str], fault_hook: Any
) -> tuple[SandboxManager, dict[str, Any], dict[str, Path]]:
    """Plan ``p2``: one sandbox per resource, each writing ``v`` = ``<X>1`` (case 21, step 1)."""
    store = SandboxStore(tmp_path / "state")
    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=store, fault_hook=fault_hook
    )
    originals, sandboxes = {}, {}
    for key, strategy in strategies.items():
        originals[key] = make_original(tmp_path, f"T{key}", strategy, f"{key}0\n")
        sandbox = manager.get_or_create_sandbox(
            "p2", key, str(originals[key]), strategy, sandbox_root=str(tmp_path / "sbx")
        )
        Path(sandbox.get_path("v")).write_text(f"{key}1\n")
        sandboxes[key] = sandbox
    manager.persist("p2")
    return manager, sandboxes, originals


def journal_path(tmp_path: Path) -> Path:
    return state_dir_journal_path(tmp_path / "state", "p2")


# -- case 21, as written ------------------------------------------------------------------------


def test_case21_failed_compensation_is_retried_by_recover_and_the_plan_ends_rolled_back(
    tmp_path: Path,
) -> None:
    faults = Switch(("before_commit", 3), ("before_compensate", 2))
    strategies = dict.fromkeys("ABC", "copy_on_write")
    manager, sandboxes, originals = plan(tmp_path, strategies, faults)
    before = snapshot(originals)
    ids = {key: sandbox.sandbox_id for key, sandbox in sandboxes.items()}

    # Step 3: the commit fails and exposes both C's commit failure and B's compensation failure.
    [result] = manager.commit_all("p2")
    assert result.success is False
    assert result.metadata["failed_sandbox_id"] == ids["C"]
    assert "injected fault at before_commit of step 3" in (result.error or "")
    assert result.metadata["rolled_back_ids"] == [ids["A"]]  # best effort: A still compensated
    assert result.metadata["failed_rollback_ids"] == [ids["B"]]
    assert faults.fired == [("before_commit", 3), ("before_compensate", 2)]
    assert (originals["A"] / "v").read_text() == "A0\n"
    assert (originals["B"] / "v").read_text() == "B1\n"  # its compensation failed
    assert (originals["C"] / "v").read_text() == "C0\n"  # never committed
    journal = FileCommitJournal(journal_path(tmp_path)).load()
    assert journal is not None
    # Neither succeeded nor rolled back: the attempt stays open, B's undo is owed.
    assert journal.phase is JournalPhase.COMPENSATING
    assert not journal.phase.is_terminal
    assert journal.reason is JournalReason.COMPENSATION_FAILED
    assert [step.state for step in journal.steps] == [
        StepState.COMPENSATED,
        StepState.COMPENSATION_FAILED,
        StepState.FAILED,
    ]
    assert "injected fault at before_compensate of step 2" in (journal.steps[1].error or "")
    assert sandboxes["B"].status is SandboxStatus.COMMITTED  # the undo is still possible

    # A new commit of the plan while B's undo is owed recovers instead (still failing now).
    [again] = manager.commit_all("p2")
    assert again.success is False and again.metadata["failed_rollback_ids"] == [ids["B"]]
    assert (originals["B"] / "v").read_text() == "B1\n"

    # Step 4: the fault is removed; recovery, from a fresh process-like manager, finishes.
    faults.on = False
    recovered = SandboxManager.load(SandboxStore(tmp_path / "state")).recover("p2")
    assert recovered is not None
    assert recovered.phase is JournalPhase.FAILED  # C failed to commit; everything undone
    assert recovered.reason is JournalReason.COMMIT_FAILED
    assert recovered.failed_rollback_ids == []
    assert recovered.rolled_back_ids == [ids["A"], ids["B"]]
    assert [step.state for step in recovered.steps] == [
        StepState.COMPENSATED,
        StepState.COMPENSATED,
        StepState.FAILED,
    ]
    assert snapshot(originals) == before
    # The second recovery changes nothing (same journal bytes, same originals).
    written = journal_path(tmp_path).read_bytes()
    assert SandboxManager.load(SandboxStore(tmp_path / "state")).recover("p2") == recovered
    assert journal_path(tmp_path).read_bytes() == written
    assert snapshot(originals) == before


# -- the kind: every rollbackable strategy, faults before and inside the undo --------------------


@contextmanager
def failing_once(target: Any, name: str, when: Callable[..., bool]) -> Iterator[list[int]]:
    """Make ``target.name`` raise OSError the first time ``when(*args)`` holds."""
    real = getattr(target, name)
    calls: list[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not calls and when(*args):
            calls.append(1)
            raise OSError(f"injected failure in {name}")
        return real(*args, **kwargs)

    with patch.object(target, name, wrapper):
        yield calls


def inside_undo_fault(strategy: str, sandbox: Any) -> AbstractContextManager[list[int]]:
    """A failure after the strategy's undo moved the original back but before it finished."""
    if strategy == "git_worktree":
        # The original's branch is already back at the pre-commit tag; resetting the
        # worktree fails.
        return failing_once(sandbox, "_do_rollback", lambda *args: True)
    # copy_on_write: precommit/ backup; overlay: its commit area. Both are removed after undo.
    names = {"copy_on_write": "precommit", "overlay": "commit"}
    return failing_once(shutil, "rmtree", lambda path, *a: Path(path).name == names[strategy])


@pytest.mark.parametrize("where", ["before_undo", "inside_undo"])
@pytest.mark.parametrize("strategy", ROLLBACKABLE)
def test_failed_compensation_is_retried_for_every_rollbackable_strategy(
    tmp_path: Path, strategy: str, where: str
) -> None:
    faults = Switch(("before_commit", 3))
    if where == "before_undo":
        faults.faults.add(("before_compensate", 2))
    strategies = {"A": "copy_on_write", "B": strategy, "C": "copy_on_write"}
    manager, sandboxes, originals = plan(tmp_path, strategies, faults)
    before = snapshot(originals)
    b_id = sandboxes["B"].sandbox_id

    if where == "inside_undo":
        with inside_undo_fault(strategy, sandboxes["B"]) as fired:
            [result] = manager.commit_all("p2")
        assert fired, "the fault inside the undo did not fire"
    else:
        [result] = manager.commit_all("p2")
    assert result.success is False
    assert result.metadata["failed_rollback_ids"] == [b_id]
    assert sandboxes["B"].status is SandboxStatus.COMMITTED
    state = FileCommitJournal(journal_path(tmp_path)).load()
    assert state is not None and state.phase is JournalPhase.COMPENSATING

    faults.on = False
    recovered = SandboxManager.load(SandboxStore(tmp_path / "state")).recover("p2")
    assert recovered is not None
    assert recovered.phase is JournalPhase.FAILED, recovered
    assert recovered.failed_rollback_ids == []
    assert b_id in recovered.rolled_back_ids
    assert snapshot(originals) == before
    again = SandboxManager.load(SandboxStore(tmp_path / "state")).recover("p2")
    assert again == recovered
    assert snapshot(originals) == before


def test_a_compensation_that_can_never_succeed_ends_the_attempt_failed(tmp_path: Path) -> None:
    """Two non-rollbackable steps: the first (a transaction) committed, the second failed. Its
    compensation can never succeed, so the attempt ends (terminal ``failed``,
    ``CompensationFailed``) instead of being retried forever."""
    import sqlite3

    database = tmp_path / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    connection.close()
    store = SandboxStore(tmp_path / "state")
    faults = Switch(("before_commit", 2))
    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=store, fault_hook=faults
    )
    txn = manager.get_or_create_sandbox(
        "p2", "db", str(database), "transaction_rollback", sandbox_root=str(tmp_path / "sbx")
    )
    txn.execute("INSERT INTO notes VALUES ('x')")
    direct = tmp_path / "direct"
    direct.mkdir()
    manager.get_or_create_sandbox("p2", "api", str(direct), "none")
    [result] = manager.commit_all("p2")
    assert result.success is False
    assert result.metadata["failed_rollback_ids"] == [txn.sandbox_id]
    state = FileCommitJournal(journal_path(tmp_path)).load()
    assert state is not None
    assert state.phase is JournalPhase.FAILED
    assert state.reason is JournalReason.COMPENSATION_FAILED
    assert manager.recover("p2") == state  # terminal: nothing retried


# -- the CLI ------------------------------------------------------------------------------------

CLI = [sys.executable, "-m", "sandbox_core.cli", "--json"]


def run_cli(env: dict[str, str], *args: str, expect: int = 0) -> Any:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == expect, done.stdout + done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_case21_through_the_cli_recover_retries_the_failed_compensation(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SANDBOX_CORE_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_CORE_ROOT": str(tmp_path / "sbx"),
    }
    env.pop("SANDBOX_CORE_FAULT", None)
    env.pop("SANDBOX_CORE_FAULT_RAISE", None)
    originals, ids = {}, {}
    for key in "ABC":
        originals[key] = make_original(tmp_path, f"T{key}", "copy_on_write", f"{key}0\n")
        created = run_cli(
            env, "create", "--plan", "p2", "--resource", key, "--strategy", "copy_on_write",
            str(originals[key]),
        )
        ids[key] = created["sandbox_id"]
        Path(run_cli(env, "path", ids[key], "v")["path"]).write_text(f"{key}1\n")
    before = snapshot(originals)

    faulty = {**env, "SANDBOX_CORE_FAULT_RAISE": "before_commit:3,before_compensate:2"}
    failed = run_cli(faulty, "commit-plan", "p2", expect=7)
    assert failed["error"]["failed_rollback_ids"] == [ids["B"]]
    assert failed["error"]["rolled_back_ids"] == [ids["A"]]
    assert (originals["B"] / "v").read_text() == "B1\n"
    # While the fault is still there, recover says so (exit 7) and changes nothing.
    still = run_cli(faulty, "recover", "p2", expect=7)
    assert still["error"]["failed_rollback_ids"] == [ids["B"]]
    assert (originals["B"] / "v").read_text() == "B1\n"

    done = run_cli(env, "recover", "p2")
    journal = done["journal"]
    assert journal["phase"] == "failed" and journal["reason"] == "CommitFailed"
    assert journal["failed_rollback_ids"] == []
    assert journal["rolled_back_ids"] == [ids["A"], ids["B"]]
    assert snapshot(originals) == before
    assert run_cli(env, "recover", "p2") == done  # the second run changes nothing
    assert snapshot(originals) == before
    # Case 38 beside it: committing again now would land only C: refused, nothing touched.
    refused = run_cli(env, "commit-plan", "p2", expect=4)
    assert refused["error"]["type"] == "PlanRerunRequiredError"
    assert "must be re-run" in refused["error"]["message"]
    assert snapshot(originals) == before
