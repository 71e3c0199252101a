"""The ``sandbox-core`` CLI on real repositories and directories, through a real subprocess.

Each test drives the console script as the operator's pod executor does (``--json``), across
separate invocations sharing one state directory, and asserts the documented exit codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "sandbox_core.cli"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "SANDBOX_CORE_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_CORE_ROOT": str(tmp_path / "sandboxes"),
    }


@pytest.fixture
def repo(tmp_path: Path, env: dict[str, str]) -> Path:
    path = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=env)
    (path / "f").write_text("line1\n")
    subprocess.run(["git", "-C", str(path), "add", "f"], check=True, env=env)
    subprocess.run(["git", "-C", str(path), "commit", "-qm", "base"], check=True, env=env)
    return path


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    path = tmp_path / "dir"
    path.mkdir()
    (path / "g").write_text("d0\n")
    return path


def cli(env: dict[str, str], *args: str, expect: int = 0) -> Any:
    done = subprocess.run([*CLI, "--json", *args], capture_output=True, text=True, env=env)
    assert done.returncode == expect, done.stdout + done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def create(env: dict[str, str], plan: str, resource: str, strategy: str, path: Path) -> str:
    out = cli(
        env, "create", "--plan", plan, "--resource", resource, "--strategy", strategy, str(path)
    )
    assert out["status"] == "created"
    return str(out["sandbox_id"])


def test_plan_commit_across_invocations(env, repo, directory):
    git_id = create(env, "p1", "repo", "git_worktree", repo)
    dir_id = create(env, "p1", "dir", "copy_on_write", directory)
    Path(cli(env, "path", git_id, "f")["path"]).write_text("sandbox\n")
    Path(cli(env, "path", dir_id, "new.txt")["path"]).write_text("added\n")

    diff = cli(env, "diff", git_id)["diff"]
    assert "-line1" in diff and "+sandbox" in diff
    assert (repo / "f").read_text() == "line1\n", "original untouched before commit"

    out = cli(env, "commit-plan", "p1", "-m", "apply p1")
    results = {r["sandbox_id"]: r for r in out["results"]}
    assert results[git_id]["changed_files"] == ["f"]
    assert results[dir_id]["added_files"] == ["new.txt"]
    assert (repo / "f").read_text() == "sandbox\n"
    assert (directory / "new.txt").read_text() == "added\n"
    listed = {s["sandbox_id"]: s["status"] for s in cli(env, "list", "--plan", "p1")["sandboxes"]}
    assert listed == {git_id: "committed", dir_id: "committed"}


def test_failed_plan_commit_is_compensated_exit_6(env, repo, directory):
    dir_id = create(env, "p2", "dir", "copy_on_write", directory)
    git_id = create(env, "p2", "repo", "git_worktree", repo)
    Path(cli(env, "path", dir_id, "g")["path"]).write_text("d1\n")
    Path(cli(env, "path", git_id, "f")["path"]).write_text("sandbox\n")
    (repo / "f").write_text("main\n")
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "main"], check=True, env=env)

    out = cli(env, "commit-plan", "p2", expect=6)
    assert out["error"]["rolled_back_ids"] == [dir_id]
    assert out["error"]["failed_rollback_ids"] == []
    assert git_id in out["error"]["message"] and "f" in out["error"]["message"]
    assert (directory / "g").read_text() == "d0\n"
    assert (repo / "f").read_text() == "main\n"

    journal = cli(env, "recover", "p2")["journal"]
    assert journal["phase"] == "failed"
    assert journal["rolled_back_ids"] == [dir_id]


def test_single_commit_conflict_exit_5_and_state_errors(env, repo):
    sid = create(env, "p3", "repo", "git_worktree", repo)
    Path(cli(env, "path", sid, "f")["path"]).write_text("sandbox\n")
    (repo / "f").write_text("main\n")
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "main"], check=True, env=env)

    out = cli(env, "commit", sid, expect=5)
    assert out["error"]["conflicts"] == ["f"]
    assert cli(env, "status", sid)["status"] == "active"

    out = cli(env, "path", sid, "../escape", expect=1)
    assert out["error"]["message"] == "Path traversal not allowed"
    cli(env, "rollback", sid)
    assert cli(env, "rollback", sid, expect=4)["error"]["type"] == "SandboxStateError"
    assert cli(env, "status", "01NOSUCHSANDBOX0000000000", expect=3)["error"]["type"]


def test_checkpoint_restore_and_cleanup(env, directory):
    sid = create(env, "p4", "dir", "copy_on_write", directory)
    target = Path(cli(env, "path", sid, "g")["path"])
    target.write_text("checkpointed\n")
    ckpt = cli(env, "checkpoint", sid, "--phase", "pre_apply")["checkpoint_id"]
    target.write_text("later\n")
    assert cli(env, "restore", ckpt)["restored"] is True
    assert target.read_text() == "checkpointed\n"

    cli(env, "cleanup", sid)
    assert not target.exists()
    assert (directory / "g").read_text() == "d0\n", "cleanup never touches the original"
    assert cli(env, "list")["sandboxes"] == []


def test_demo_passes_on_a_real_source_tree(tmp_path, env):
    source = Path(json.__file__).parent  # the stdlib json package: a real tree on any machine
    done = subprocess.run(
        [*CLI, "demo", "--workdir", str(tmp_path / "demo"), "--source-tree", str(source)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo PASSED" in done.stdout
    assert "rolled back (compensated): ['" in done.stdout
