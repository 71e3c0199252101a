"""Plan commit across a crash and a compensation blocked by a real git lock (issue 7,
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

import pytest

from tests.support.gitrepo import GIT_ENV, git, make_repo

pytestmark = pytest.mark.usefixtures("git_identity")


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
