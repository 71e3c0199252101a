"""The audit log of a sandbox (issue "The actor's door", item 4): every command is appended
durably with its command, cwd, exit code and duration, never its environment's values or its
stdin; a torn last line (a crash mid-append) is skipped; reads are paged and the review's view
is bounded."""

from __future__ import annotations

import json
import os

import pytest

from sandbox_core.actor.audit import MAX_FIELD_CHARS, AuditLog
from sandbox_core.actor.exec import ExecRequest
from tests.support.actor import Layout, MakeSandbox


def test_every_command_is_recorded_with_what_it_ran_and_how_it_ended(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("git_worktree")
    runner = layout.runner()
    runner.run(
        sandbox, ExecRequest(argv=("sh", "-c", "exit 4"), cwd="d", env={"API_KEY": "hush-value"})
    )
    runner.run(sandbox, ExecRequest(shell_line="cat", stdin=b"stdin-secret", timeout_seconds=5))
    log = runner.audit(sandbox.sandbox_id)
    text = log.path.read_text()
    assert "hush-value" not in text and "stdin-secret" not in text
    first, second = log.read()["entries"]
    assert (first["seq"], first["op"], first["command"], first["cwd"]) == (
        1,
        "exec",
        ["sh", "-c", "exit 4"],
        "d",
    )
    assert (first["exit_code"], first["env_names"], first["timed_out"]) == (4, ["API_KEY"], False)
    assert first["duration_seconds"] > 0 and first["time"].endswith("+00:00")
    assert (second["seq"], second["shell"], second["exit_code"]) == (2, "cat", 0)
    assert oct(log.path.stat().st_mode & 0o777) == "0o600"


def test_a_torn_last_line_is_skipped_and_numbering_goes_on(layout: Layout) -> None:
    log = AuditLog(layout.state, "sid-1")
    log.append("exec", command=["true"])
    with open(log.path, "ab") as handle:
        handle.write(b'{"seq": 2, "op": "ex')  # a crash in the middle of an append
    log.path.write_bytes(log.path.read_bytes() + b"\n")
    entry = log.append("write", path="a.txt", bytes=3)
    assert entry["seq"] == 2
    assert [e["op"] for e in log.read()["entries"]] == ["exec", "write"]


def test_pages_and_the_bounded_summary(layout: Layout) -> None:
    log = AuditLog(layout.state, "sid-2")
    for n in range(30):
        log.append("exec", command=["echo", str(n)], cwd="x" * (MAX_FIELD_CHARS + 10))
    page = log.read(after=0, limit=10)
    assert [e["seq"] for e in page["entries"]] == list(range(1, 11)) and page["next"] == 10
    assert page["total"] == 30 and page["entries"][0]["cwd"].endswith("...[cut]")
    last = log.read(after=25, limit=10)
    assert [e["seq"] for e in last["entries"]] == [26, 27, 28, 29, 30] and last["next"] is None
    summary = log.summary(5)
    assert summary["total"] == 30 and summary["truncated"] is True
    assert [e["seq"] for e in summary["entries"]] == [26, 27, 28, 29, 30]
    assert log.summary(0) == {"total": 30, "entries": [], "truncated": True}
    with pytest.raises(ValueError):
        log.read(after=-1)
    for line in log.path.read_text().splitlines():
        json.loads(line)


@pytest.mark.parametrize("bad", ["", "../x", ".hidden", "a/b"])
def test_a_bad_sandbox_id_is_refused(layout: Layout, bad: str) -> None:
    from sandbox_core.errors import SandboxError

    with pytest.raises(SandboxError, match="invalid sandbox id"):
        AuditLog(layout.state, bad)
    assert not os.path.exists(layout.root / "x")


def test_the_plan_review_shows_what_the_actors_did_bounded_and_outside_the_digest(
    layout: Layout,
) -> None:
    """``sandbox-core review PLAN`` (a real process) shows each sandbox's audit log, the latest
    ``--max-paths`` entries; the digest is the same with or without it."""
    import subprocess
    import sys

    from sandbox_core.actor.local import LocalActor
    from sandbox_core.host.host import SandboxHost
    from sandbox_core.host.store import SandboxStore
    from sandbox_core.plan.review import PlanReview

    original = layout.root / "dir"
    original.mkdir()
    (original / "a.txt").write_text("a\n")
    host = SandboxHost(SandboxStore(layout.state))
    sandbox = host.provision(
        "plan-r", "dir", str(original), "copy_on_write", sandbox_root=str(layout.root / "sb")
    )
    actor = LocalActor(layout.state)
    for n in range(4):
        actor.exec(sandbox.sandbox_id, ExecRequest(shell_line=f"echo {n} >> a.txt")).wait()
    env = {**os.environ, "SANDBOX_CORE_STATE_DIR": str(layout.state)}
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_core.cli", "--json", "review", "plan-r",
         "--max-paths", "3"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    review = json.loads(done.stdout)
    activity = review["sandboxes"][0]["activity"]
    assert (activity["total"], activity["truncated"]) == (4, True)
    assert [entry["shell"] for entry in activity["entries"]] == [
        f"echo {n} >> a.txt" for n in (1, 2, 3)
    ]
    assert review["sandboxes"][0]["changed"] == 1
    bare = PlanReview(plan_id="p", digest="sha256:x")
    assert "activity" not in json.dumps(bare.to_dict())
    assert bare.with_activity({"s": {"total": 0, "entries": []}}).digest == bare.digest
    host.reopen(sandbox.sandbox_id).cleanup()


@pytest.mark.parametrize("chunk", [7, 64, 64 * 1024])
def test_numbering_goes_on_from_the_last_whole_entry_read_from_the_end(
    layout: Layout, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr("sandbox_core.actor.audit.TAIL_CHUNK_BYTES", chunk)
    log = AuditLog(layout.state, "sid-3")
    for n in range(5):
        assert log.append("write", path=f"f{n}.txt" + "p" * 100, bytes=n)["seq"] == n + 1
    with open(log.path, "ab") as handle:  # torn and foreign lines after the last whole entry
        handle.write(b'{"seq": 6, "op": "wr\n[1, 2]\n{"seq": "7"}\n\n' + b"x" * 300 + b"\n")
    assert log.append("move", path="a", to="b")["seq"] == 6
    assert [e["seq"] for e in log.read()["entries"]] == [1, 2, 3, 4, 5, 6]


def test_a_log_with_no_whole_entry_starts_at_one(layout: Layout) -> None:
    log = AuditLog(layout.state, "sid-4")
    log.path.parent.mkdir(parents=True)
    log.path.write_bytes(b'{"seq": 1, "op": "ex\n')
    assert log.append("exec", command=["true"])["seq"] == 1
