"""``sandbox-core review`` and ``commit-plan --two-phase/--saga/--approved-digest`` (issue 9),
through a real subprocess on real directories and SQLite files, with the documented exit codes.
"""

from __future__ import annotations

import json
import os
import sqlite3
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
        "SANDBOX_CORE_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_CORE_ROOT": str(tmp_path / "sandboxes"),
    }


def run(env: dict[str, str], *args: str, expect: int = 0, json_output: bool = True) -> Any:
    flags = ["--json"] if json_output else []
    done = subprocess.run([*CLI, *flags, *args], capture_output=True, text=True, env=env)
    assert done.returncode == expect, done.stdout + done.stderr
    return json.loads(done.stdout) if json_output and done.stdout.strip() else done.stdout


def directory_sandbox(
    env: dict[str, str], tmp_path: Path, name: str, text: str
) -> tuple[Path, str]:
    original = tmp_path / name
    original.mkdir()
    (original / "a.txt").write_text("one\ntwo\n")
    made = run(
        env,
        "create",
        "--plan",
        "p",
        "--resource",
        name,
        "--strategy",
        "copy_on_write",
        str(original),
    )
    sid = made["sandbox_id"]
    path = run(env, "path", sid, "a.txt")["path"]
    Path(path).write_text(text)
    Path(run(env, "path", sid, "new.txt")["path"]).write_text("fresh\n")
    return original, sid


def test_review_table_and_json_then_approved_commit(tmp_path: Path, env: dict[str, str]) -> None:
    first, sid1 = directory_sandbox(env, tmp_path, "d1", "one\nTWO\nthree\n")
    second, sid2 = directory_sandbox(env, tmp_path, "d2", "one\n")
    review = run(env, "review", "p")
    assert review["plan_id"] == "p" and review["digest"].startswith("sha256:")
    assert not review["has_conflicts"] and not review["truncated"]
    rows = {row["sandbox_id"]: row for row in review["sandboxes"]}
    assert (rows[sid1]["added"], rows[sid1]["changed"], rows[sid1]["deleted"]) == (1, 1, 0)
    assert sorted(rows[sid1]["paths"]) == ["A new.txt", "M a.txt"]
    assert rows[sid1]["lines_added"] >= 2 and rows[sid2]["lines_removed"] >= 1
    table = run(env, "review", "p", json_output=False)
    assert "STRATEGY" in table and "+LINES" in table and "CONFLICTS" in table
    assert sid1 in table and sid2 in table and f"digest {review['digest']}" in table
    done = run(env, "commit-plan", "p", "--two-phase", "--approved-digest", review["digest"])
    assert [r["success"] for r in done["results"]] == [True, True]
    assert (first / "a.txt").read_text() == "one\nTWO\nthree\n"
    assert (second / "new.txt").read_text() == "fresh\n"


def test_changed_since_approval_exits_10_and_touches_nothing(
    tmp_path: Path, env: dict[str, str]
) -> None:
    first, sid1 = directory_sandbox(env, tmp_path, "d1", "changed\n")
    digest = run(env, "review", "p")["digest"]
    Path(run(env, "path", sid1, "a.txt")["path"]).write_text("changed again\n")
    out = run(env, "commit-plan", "p", "--approved-digest", digest, expect=10)
    assert out["error"]["type"] == "ChangedSinceApprovalError"
    assert out["error"]["approved_digest"] == digest
    assert out["error"]["actual_digest"] != digest
    assert (first / "a.txt").read_text() == "one\ntwo\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_conflict_exits_5_with_nothing_touched(tmp_path: Path, env: dict[str, str]) -> None:
    first, _ = directory_sandbox(env, tmp_path, "d1", "mine\n")
    second, _ = directory_sandbox(env, tmp_path, "d2", "mine too\n")
    (second / "a.txt").write_text("theirs\n")
    assert run(env, "review", "p")["has_conflicts"]
    out = run(env, "commit-plan", "p", "--two-phase", expect=5)
    assert out["error"]["conflicts"] == ["a.txt"]
    assert (first / "a.txt").read_text() == "one\ntwo\n"
    assert (first / "new.txt").exists() is False


def sqlite_sandbox(env: dict[str, str], tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.sqlite"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
        conn.execute("INSERT INTO items VALUES ('x')")
    conn.close()
    run(
        env,
        "create",
        "--plan",
        "p",
        "--resource",
        name,
        "--strategy",
        "transaction_rollback",
        str(path),
    )
    return path


def test_two_last_resources_exit_11_with_two_phase_and_fall_back_without(
    tmp_path: Path, env: dict[str, str]
) -> None:
    sqlite_sandbox(env, tmp_path, "db1")
    sqlite_sandbox(env, tmp_path, "db2")
    directory_sandbox(env, tmp_path, "d1", "changed\n")
    out = run(env, "commit-plan", "p", "--two-phase", expect=11)
    assert out["error"]["type"] == "TwoPhaseUnavailableError"
    assert "last resource" in out["error"]["message"]
    done = run(env, "commit-plan", "p", "--auto")
    assert all(r["success"] for r in done["results"])
    assert {r["metadata"]["mode"] for r in done["results"]} == {"saga"}
    assert all("last resource" in r["metadata"]["fallback_reason"] for r in done["results"])


def test_saga_flag_keeps_the_saga(tmp_path: Path, env: dict[str, str]) -> None:
    first, _ = directory_sandbox(env, tmp_path, "d1", "mine\n")
    second, _ = directory_sandbox(env, tmp_path, "d2", "mine too\n")
    (second / "a.txt").write_text("theirs\n")
    out = run(env, "commit-plan", "p", "--saga", expect=6)
    assert len(out["error"]["rolled_back_ids"]) == 1  # the saga changed d1, then undid it
    assert (first / "a.txt").read_text() == "one\ntwo\n"
