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


def test_usage_errors_are_json_with_json_flag(env):
    done = subprocess.run([*CLI, "--json", "status"], capture_output=True, text=True, env=env)
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"] == {
        "type": "UsageError",
        "message": "Missing argument 'SANDBOX_ID'.",
    }


def test_concurrent_plan_commits_commit_once(env, directory, tmp_path):
    """Two ``commit-plan`` of one plan at once: one commits, the other finds nothing left."""
    second = tmp_path / "dir2"
    second.mkdir()
    (second / "g").write_text("e0\n")
    ids = [create(env, "pc", "d1", "copy_on_write", directory),
           create(env, "pc", "d2", "copy_on_write", second)]
    for sid in ids:
        Path(cli(env, "path", sid, "g")["path"]).write_text("new\n")
    runs = [
        subprocess.Popen([*CLI, "--json", "commit-plan", "pc"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outputs = [json.loads(run.communicate()[0]) for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    committed = sorted(len(out["results"]) for out in outputs)
    assert committed == [0, 2], outputs
    assert (directory / "g").read_text() == "new\n"
    assert (second / "g").read_text() == "new\n"
    statuses = {s["status"] for s in cli(env, "list", "--plan", "pc")["sandboxes"]}
    assert statuses == {"committed"}


def test_restore_of_a_committed_sandbox_is_a_state_error(env, directory):
    sid = create(env, "p5", "dir", "copy_on_write", directory)
    Path(cli(env, "path", sid, "g")["path"]).write_text("x\n")
    ckpt = cli(env, "checkpoint", sid)["checkpoint_id"]
    cli(env, "commit", sid)
    out = cli(env, "restore", ckpt, expect=4)
    assert "in status committed" in out["error"]["message"]


def test_failed_create_leaves_no_record(env, tmp_path):
    empty = tmp_path / "empty"
    subprocess.run(["git", "init", "-q", str(empty)], check=True, env=env)
    out = cli(env, "create", "--plan", "e", "--resource", "r", "--strategy", "git_worktree",
              str(empty), expect=1)
    assert "has no commit" in out["error"]["message"]
    assert cli(env, "list")["sandboxes"] == []


def test_create_with_a_sandbox_id_twice_reopens_the_first(env, repo):
    args = ("create", "--plan", "p", "--resource", "r", "--strategy", "git_worktree",
            "--sandbox-id", "01J00000000000000000000CLI", str(repo))
    first = cli(env, *args)
    Path(cli(env, "path", first["sandbox_id"], "work.txt")["path"]).write_text("kept\n")
    again = cli(env, *args)
    assert again["sandbox_id"] == first["sandbox_id"]
    assert again["sandbox_path"] == first["sandbox_path"]
    assert again["status"] == "active"  # reopened as `path` left it, nothing made again
    assert (Path(first["sandbox_path"]) / "work.txt").read_text() == "kept\n"
    assert [s["sandbox_id"] for s in cli(env, "list")["sandboxes"]] == [first["sandbox_id"]]


def test_transaction_diff_lists_pending_statements_and_hides_passwords(env, tmp_path):
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE items (name TEXT)")
    sid = create(env, "p6", "db", "transaction_rollback", db)
    script = (
        "import sys; from sandbox_core.host.store import SandboxStore; "
        "from sandbox_core.strategies.factory import SandboxFactory; "
        "s = SandboxFactory().reopen(SandboxStore().load(sys.argv[1])); "
        "s.execute('INSERT INTO items VALUES (?)', ['apple']); SandboxStore().save(s)"
    )
    subprocess.run([sys.executable, "-c", script, sid], check=True, env=env)
    text = cli(env, "diff", sid)["diff"]
    assert text == 'INSERT INTO items VALUES (?);  -- params: ["apple"]\n'

    dsn_out = cli(env, "create", "--plan", "p7", "--resource", "pg", "--strategy",
                  "transaction_rollback", "postgresql://user:s3cret@127.0.0.1:1/none", expect=1)
    assert "s3cret" not in json.dumps(dsn_out)
