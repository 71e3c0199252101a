"""verify7: plan commit across a crash and a compensation blocked by a real git lock (issue 7,
section 4), through the `sandbox-core` CLI on a real repository and a real directory.

The process is killed after the git sandbox landed; `recover` then finds the repository's
``index.lock`` (another git is "running"): the compensation fails, recover exits 7 and nothing
changes; once the lock is gone `recover` rolls the plan back (exit 0, and again 0 with no
change), and a new `commit-plan` lands nothing: never half a plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox_core import SandboxFactory, SandboxStore
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.host.manager import SandboxManager
from tests.gitrepo import GIT_ENV, git, make_repo
from tests.test_plan_hygiene import (  # noqa: F401 - _git_identity is an autouse fixture
    CASES,
    IDS,
    _git_identity,
    edit,
    leftovers,
    make_original,
)

CLI = [sys.executable, "-m", "sandbox_core.cli"]


def test_recover_retries_a_compensation_blocked_by_a_git_lock(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "base\n"})
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "v").write_text("d0\n")
    env = {**os.environ, **GIT_ENV}
    base = [
        *CLI,
        "--json",
        "--state-dir",
        str(tmp_path / "st"),
        "--sandbox-root",
        str(tmp_path / "sbx"),
    ]

    def cli(*args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
        extra = {"SANDBOX_CORE_FAULT": fault} if fault else {}
        return subprocess.run([*base, *args], capture_output=True, text=True, env={**env, **extra})

    def create(resource: str, strategy: str, path: Path) -> str:
        done = cli(
            "create", "--plan", "P", "--resource", resource, "--strategy", strategy, str(path)
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return str(json.loads(done.stdout)["sandbox_id"])

    def sandbox_path(sandbox_id: str, rel: str) -> Path:
        return Path(json.loads(cli("path", sandbox_id, rel).stdout)["path"])

    git_id = create("r", "git_worktree", repo)
    dir_id = create("d", "copy_on_write", folder)
    with open(sandbox_path(git_id, "f"), "a") as handle:
        handle.write("X\n")
    with open(sandbox_path(dir_id, "v"), "a") as handle:
        handle.write("Y\n")

    killed = cli("commit-plan", "P", fault="before_commit:2")
    assert killed.returncode == -9
    assert (repo / "f").read_text() == "base\nX\n"  # step 1 landed, then the crash

    (repo / ".git" / "index.lock").touch()
    blocked = cli("recover", "P")
    assert blocked.returncode == 7, blocked.stdout
    assert (repo / "f").read_text() == "base\nX\n"  # nothing changed while the lock is there

    (repo / ".git" / "index.lock").unlink()
    assert cli("recover", "P").returncode == 0
    assert (repo / "f").read_text() == "base\n"
    assert (folder / "v").read_text() == "d0\n"
    assert git(repo, "status", "--porcelain") == ""
    assert cli("recover", "P").returncode == 0  # idempotent
    assert (repo / "f").read_text() == "base\n"

    # never half: refused (4, the plan must be re-run) or nothing to commit (0, no results),
    # as every sandbox of the plan was rolled back by the recovery
    again = cli("commit-plan", "P")
    assert again.returncode in (0, 4), again.stdout
    if again.returncode == 0:
        assert json.loads(again.stdout)["results"] == []
    assert (repo / "f").read_text() == "base\n"
    assert (folder / "v").read_text() == "d0\n"


# -- cleanup_all deletes the plan's checkpoints (issue 7, hygiene) ------------------------------


@pytest.mark.parametrize(("strategy", "options"), CASES, ids=IDS)
def test_cleanup_all_deletes_the_plans_checkpoints(
    tmp_path: Path, strategy: str, options: dict[str, Any]
) -> None:
    """Checkpoints taken through the manager and through another checkpoint manager over the
    same state dir (as the CLI does) are all gone after cleanup_all, refs included; again is a
    no-op, also from a fresh manager."""
    original = make_original(tmp_path, strategy)
    state = tmp_path / "state"
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(state))
    sandbox = manager.get_or_create_sandbox(
        "p-ckpt", "r", str(original), strategy, sandbox_root=str(tmp_path / "sbx"), **options
    )
    edit(strategy, sandbox)
    manager.checkpoints.create_checkpoint(sandbox, "p-ckpt", "pre")
    CheckpointManager(state_dir=state).create_checkpoint(sandbox, "p-ckpt", "other-process")
    assert len(list((state / "checkpoints").glob("records/*.json"))) == 2

    manager.cleanup_all("p-ckpt")

    assert leftovers(tmp_path, original) == {}
    assert CheckpointManager(state_dir=state).list_checkpoints(sandbox.sandbox_id) == []
    manager.cleanup_all("p-ckpt")
    SandboxManager.load(SandboxStore(state)).cleanup_all("p-ckpt")
    assert leftovers(tmp_path, original) == {}


def test_cleanup_all_without_a_store_deletes_in_memory_checkpoints(tmp_path: Path) -> None:
    folder = tmp_path / "orig"
    folder.mkdir()
    (folder / "v").write_text("0\n")
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
    sandbox = manager.get_or_create_sandbox(
        "p-mem", "r", str(folder), "copy_on_write", sandbox_root=str(tmp_path / "sbx")
    )
    checkpoint = manager.checkpoints.create_checkpoint(sandbox, "p-mem", "pre")
    assert Path(checkpoint.snapshot_path).is_dir()

    manager.cleanup_all("p-mem")

    assert not Path(checkpoint.snapshot_path).parent.exists()
    assert manager.checkpoints.get_checkpoint(checkpoint.checkpoint_id) is None
    manager.cleanup_all("p-mem")  # idempotent


def test_cli_cleanup_plan_deletes_checkpoints_and_is_idempotent(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "orig", {"v": "0\n"})
    env = {**os.environ, **GIT_ENV}
    base = [*CLI, "--json", "--state-dir", str(tmp_path / "state"),
            "--sandbox-root", str(tmp_path / "sbx")]  # fmt: skip

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, env=env)

    made = cli("create", "--plan", "P", "--resource", "r", "--strategy", "git_worktree", str(repo))
    assert made.returncode == 0, made.stderr
    sandbox_id = json.loads(made.stdout)["sandbox_id"]
    assert cli("checkpoint", sandbox_id).returncode == 0
    assert git(repo, "tag", "--list", "sandbox/*") != ""

    done = cli("cleanup-plan", "P")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["cleaned_up"] == [sandbox_id]
    assert leftovers(tmp_path, repo) == {}
    again = cli("cleanup-plan", "P")
    assert again.returncode == 0, again.stdout
    assert json.loads(again.stdout)["cleaned_up"] == []
