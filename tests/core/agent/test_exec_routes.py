"""Commands and the audit log through a real workspace agent (issue "The actor's door", items 1
and 4): the output streamed as NDJSON while the command runs, the exit code last, a retried
request id never running a command twice, signals and cancel by the caller going away, the
limit per sandbox (429), commits refused while a command runs, the audit log and its bounded
view in the review, the jail seeing nothing of the agent (its token file, its state, its
environment's DSN), megabytes of output byte-exact in both encodings with the connection fit for
its next request, and a caller who stops reading endless output and leaves."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_operator.executors.agent_client import AgentClient

from sandbox_core.agent import wire
from tests.support.agent import SANDBOX_ID, AgentProcess
from tests.support.exec_stream import ExecStream, post_json
from tests.support.gitrepo import git, make_repo

DSN = "postgresql://app:agent-dsn-secret@db/app"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": DSN}).start()
    yield process
    process.stop()


@pytest.fixture
def repo(agent: AgentProcess, tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    body = {
        "plan_id": "plan-a", "resource_id": "repo", "strategy": "git_worktree",
        "original": str(repo), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    agent.client().call("POST", wire.CREATE.template, body, request_id="create-1")
    return repo


def token(agent: AgentProcess) -> str:
    return agent.token_file.read_text()


def run(
    agent: AgentProcess, body: dict, request_id: str = "exec-1"
) -> tuple[ExecStream, list[dict]]:
    stream = ExecStream(agent.url, token(agent), SANDBOX_ID, body, request_id)
    try:
        if stream.status != 200:
            return stream, [stream.json()]
        return stream, list(stream.events())
    finally:
        stream.close()


def output(events: list[dict], name: str = "stdout") -> bytes:
    return b"".join(base64.b64decode(e["data_b64"]) for e in events if e["event"] == name)


def test_a_command_streams_ndjson_and_ends_with_its_exit(agent: AgentProcess, repo: Path) -> None:
    stream = ExecStream(
        agent.url, token(agent), SANDBOX_ID,
        {"shell": "echo one; sleep 1; echo two >&2; cat; exit 5",
         "stdin_b64": base64.b64encode(b"in").decode()},
        "exec-stream",
    )  # fmt: skip
    assert stream.status == 200
    assert stream.headers["Content-Type"].startswith(wire.NDJSON_CONTENT_TYPE)
    started = time.monotonic()
    events = []
    for event in stream.events():
        events.append((event, time.monotonic() - started))
    stream.close()
    kinds = [event["event"] for event, _ in events]
    assert kinds[0] == "started" and kinds[-1] == "exit"
    assert events[1][0]["event"] == "stdout" and events[1][1] < 0.8  # before the command ended
    plain = [event for event, _ in events]
    assert output(plain) == b"one\nin" and output(plain, "stderr") == b"two\n"
    assert plain[-1]["exit_code"] == 5 and plain[-1]["exec_id"] == plain[0]["exec_id"]


def test_shell_writes_reach_the_diff_review_and_commit_through_the_agent(
    agent: AgentProcess, repo: Path
) -> None:
    client = agent.client()
    sid = wire.STATUS.path(sid=SANDBOX_ID)
    revision = client.call("GET", sid).get("revision", 0)
    _, events = run(agent, {"shell": "sed -i s/base/edited/ f.txt && echo b > built.txt"})
    assert events[-1]["exit_code"] == 0
    assert client.call("GET", sid)["revision"] > revision  # a later commit is a new request
    assert "+edited" in client.call("GET", f"{sid}/diff")["diff"]
    review = client.call("GET", f"{sid}/review")
    assert "built.txt" in review["summary"]["added"] or review["summary"]["added"]
    assert review["audit"]["total"] == 1 and review["audit"]["entries"][0]["op"] == "exec"
    result = client.call("POST", f"{sid}/commit", {"message": "m"}, request_id="commit-1")
    assert result["result"]["success"] is True
    assert (repo / "f.txt").read_text() == "edited\n" and (repo / "built.txt").exists()


def test_the_same_request_id_replays_the_exit_and_never_runs_twice(
    agent: AgentProcess, repo: Path
) -> None:
    body = {"shell": "echo x >> counter.txt; wc -l < counter.txt"}
    _, first = run(agent, body, "exec-once")
    again_stream, again = run(agent, body, "exec-once")
    assert output(first) == b"1\n"
    assert again_stream.headers.get(wire.REPLAY_HEADER) == "true"
    assert [e["event"] for e in again] == ["exit"] and again[0] == first[-1]
    _, third = run(agent, {"shell": "wc -l < counter.txt"}, "exec-count")
    assert output(third) == b"1\n"
    audit = agent.client().call("GET", wire.AUDIT.path(sid=SANDBOX_ID))
    assert audit["total"] == 2


def test_refusals_before_a_command_starts_are_plain_json(agent: AgentProcess, repo: Path) -> None:
    stream, events = run(agent, {"argv": ["ls"], "cwd": "../.."}, "exec-traversal")
    assert stream.status == 422 and "Path traversal" in events[0]["error"]["message"]
    stream, events = run(agent, {"argv": ["ls"], "shell": "ls"}, "exec-both")
    assert stream.status == 422 and events[0]["error"]["type"] == "ExecRefusedError"
    no_id = ExecStream(agent.url, token(agent), SANDBOX_ID, {"argv": ["ls"]}, None)
    assert no_id.status == 400
    no_id.close()
    wrong = ExecStream(agent.url, "wrong-token", SANDBOX_ID, {"argv": ["ls"]}, "exec-x")
    assert wrong.status == 401
    wrong.close()
    missing = ExecStream(agent.url, token(agent), "no-such-sandbox", {"argv": ["ls"]}, "exec-y")
    assert missing.status == 404
    missing.close()


def test_a_signal_by_exec_id_and_a_caller_who_goes_away(agent: AgentProcess, repo: Path) -> None:
    line = "trap 'echo term; exit 9' TERM; echo ready; while :; do sleep 0.1; done"
    stream = ExecStream(agent.url, token(agent), SANDBOX_ID, {"shell": line}, "exec-sig")
    events = stream.events()
    exec_id = next(events)["exec_id"]
    assert next(events)["event"] == "stdout"
    path = wire.EXEC_SIGNAL.path(sid=SANDBOX_ID, eid=exec_id)
    status, reply = post_json(agent.url, token(agent), path, {"signal": "SIGTERM"}, "sig-1")
    assert (status, reply) == (200, {"exec_id": exec_id, "signalled": True})
    rest = list(events)
    stream.close()
    assert rest[-1]["event"] == "exit" and rest[-1]["exit_code"] == 9
    status, _ = post_json(agent.url, token(agent), path, {"signal": "SIGTERM"}, "sig-2")
    assert status == 404

    stream = ExecStream(
        agent.url, token(agent), SANDBOX_ID, {"shell": "echo ready; sleep 60"}, "exec-gone"
    )
    events = stream.events()
    next(events)
    next(events)
    stream.close()  # the caller goes away: the command is killed and recorded
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        audit = agent.client().call("GET", wire.AUDIT.path(sid=SANDBOX_ID))
        if audit["total"] == 2:
            break
        time.sleep(0.2)
    assert audit["entries"][-1]["cancelled"] is True


def test_the_limit_per_sandbox_and_a_commit_while_commands_run(
    agent: AgentProcess, repo: Path
) -> None:
    streams = [
        ExecStream(agent.url, token(agent), SANDBOX_ID, {"shell": "echo up; sleep 60"}, f"exec-{n}")
        for n in range(4)
    ]
    try:
        for stream in streams:
            assert stream.status == 200 and next(stream.events())["event"] == "started"
        stream, events = run(agent, {"argv": ["true"]}, "exec-5")
        assert stream.status == 429 and events[0]["error"]["type"] == "ExecLimitError"
        status, reply = post_json(
            agent.url, token(agent), wire.COMMIT.path(sid=SANDBOX_ID), {"message": "m"}, "c-1"
        )
        assert status == 409 and "commands are running" in reply["error"]["message"]
    finally:
        for stream in streams:
            stream.close()
    deadline = time.monotonic() + 20
    while agent.client().call("GET", wire.AUDIT.path(sid=SANDBOX_ID))["total"] < 4:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    _, events = run(agent, {"argv": ["true"]}, "exec-6")
    assert events[-1]["exit_code"] == 0


def test_the_jail_sees_nothing_of_the_agent(agent: AgentProcess, repo: Path) -> None:
    state = agent.work / "state"
    line = (
        f"cat {agent.token_file}; ls -R {state}; cat {state}/requests/*; cat /proc/*/environ; "
        f"env; git -C {repo} status; echo evil > {repo}/f.txt; echo done"
    )
    _, events = run(agent, {"shell": line}, "exec-attack")
    text = (output(events) + output(events, "stderr")).decode(errors="replace")
    assert output(events).rstrip().endswith(b"done")
    assert (
        token(agent) not in text
        and "agent-dsn-secret" not in text
        and "SANDBOX_SOURCE_DSN" not in text
    )
    assert (repo / "f.txt").read_text() == "base\n"
    assert git(repo, "status", "--porcelain") == ""


def test_the_audit_route_pages(agent: AgentProcess, repo: Path) -> None:
    for n in range(3):
        run(agent, {"argv": ["sh", "-c", f"exit {n}"]}, f"exec-page-{n}")
    client: AgentClient = agent.client()
    page = client.call("GET", wire.AUDIT.path(sid=SANDBOX_ID), query={"after": "1", "limit": "1"})
    assert (
        [e["exit_code"] for e in page["entries"]] == [1]
        and page["next"] == 2
        and page["total"] == 3
    )
    with pytest.raises(Exception, match="integers"):
        client.call("GET", wire.AUDIT.path(sid=SANDBOX_ID), query={"after": "x"})
    assert json.dumps(page)


def test_binary_frames_carry_the_same_events_without_base64(
    agent: AgentProcess, repo: Path
) -> None:
    body = {"shell": "printf 'a\\000b'; printf err >&2; exit 2"}
    stream = ExecStream(agent.url, token(agent), SANDBOX_ID, body, "exec-frames", frames=True)
    assert stream.headers["Content-Type"].startswith(wire.FRAMES_CONTENT_TYPE)
    frames = list(stream.frames())
    stream.close()
    assert frames[0][0] == wire.FRAME_EVENT and json.loads(frames[0][1])["event"] == "started"
    out = b"".join(data for tag, data in frames if tag == wire.FRAME_STDOUT)
    err = b"".join(data for tag, data in frames if tag == wire.FRAME_STDERR)
    assert (out, err) == (b"a\x00b", b"err")
    last = json.loads(frames[-1][1])
    assert frames[-1][0] == wire.FRAME_EVENT and last["event"] == "exit" and last["exit_code"] == 2


def test_megabytes_of_output_arrive_byte_exact_in_both_encodings_on_a_reused_connection(
    agent: AgentProcess, repo: Path
) -> None:
    size = 5 * 1024 * 1024 + 7  # several chunks of the command runner, and an odd tail
    line = f"seq 1 10000000 | head -c {size}; printf tail >&2"
    want = subprocess.run(
        ["sh", "-c", f"seq 1 10000000 | head -c {size}"], capture_output=True, check=True
    ).stdout
    for frames in (True, False):
        stream = ExecStream(
            agent.url, token(agent), SANDBOX_ID, {"shell": line, "max_output_bytes": size},
            f"exec-big-{frames}", frames=frames,
        )  # fmt: skip
        if frames:
            pieces = list(stream.frames())
            out = b"".join(data for tag, data in pieces if tag == wire.FRAME_STDOUT)
            err = b"".join(data for tag, data in pieces if tag == wire.FRAME_STDERR)
            last = json.loads(pieces[-1][1])
        else:
            events = list(stream.events())
            out, err, last = output(events), output(events, "stderr"), events[-1]
        assert (len(out), out == want, err) == (size, True, b"tail")
        assert (last["event"], last["exit_code"], last["stdout_bytes"]) == ("exit", 0, size)
        # the reply ended on a chunk boundary: the same connection carries the next request
        bearer = {"Authorization": f"Bearer {token(agent)}"}
        stream.connection.request("GET", wire.AUDIT.path(sid=SANDBOX_ID), headers=bearer)
        again = stream.connection.getresponse()
        assert again.status == 200 and json.loads(again.read())["total"] >= 1
        stream.close()


def test_a_caller_who_stops_reading_endless_output_and_leaves_cancels_the_command(
    agent: AgentProcess, repo: Path
) -> None:
    stream = ExecStream(
        agent.url, token(agent), SANDBOX_ID, {"argv": ["yes", "0123456789"]}, "exec-endless",
        frames=True,
    )  # fmt: skip
    frames = stream.frames()
    assert next(frames)[0] == wire.FRAME_EVENT
    assert next(frames)[0] == wire.FRAME_STDOUT
    time.sleep(1)  # the agent fills the connection's buffers and waits for room
    stream.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        audit = agent.client().call("GET", wire.AUDIT.path(sid=SANDBOX_ID))
        if audit["total"] == 1:
            break
        time.sleep(0.2)
    entry = audit["entries"][-1]
    assert (entry["cancelled"], entry["exit_code"]) == (True, 128 + 9)
    _, events = run(agent, {"argv": ["echo", "after"]}, "exec-after")
    assert output(events) == b"after\n" and events[-1]["exit_code"] == 0
