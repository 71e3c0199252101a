"""Cleaning up a plan deletes its checkpoints, for every strategy (issue 7, "Hygiene"): those
taken through the manager and through another checkpoint manager over the same state directory
(as the CLI does), in-memory ones of a manager without a store, and through ``sandbox-core
cleanup-plan``; refs and snapshots included, and again is a no-op.
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
from tests.support.gitrepo import GIT_ENV, git, make_repo
from tests.support.hygiene import CASES, IDS, edit, leftovers, make_original

pytestmark = pytest.mark.usefixtures("git_identity")


CLI = [sys.executable, "-m", "sandbox_core.cli"]


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
