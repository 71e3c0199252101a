"""The client's actor operations (commands, files, search, SQL, audit) against both doors: a real
workspace agent process reached at its address (the pod executor's door, minus the API server's
proxy) and the local executor's state directory (the core's own code). The same exercise runs
on both and must give the same results; the original is never touched."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sandbox_operator.executors.agent_client import derive_token

from sandbox_client.actor import ActorOperations, AgentActor, AsyncAgentActor, actor_error
from sandbox_client.agent_files import AsyncDirectTransport, DirectTransport
from sandbox_client.errors import ConflictError, NotFoundError, OperationFailedError, RefusedError
from sandbox_client.local_actor import AsyncLocalDoor, LocalDoor
from sandbox_client.models import SandboxInfo
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.store import SandboxStore
from tests.support.agent import KEY, SANDBOX_ID, UID, AgentProcess
from tests.support.gitrepo import GIT_ENV, make_repo

FILES = {"README.md": "hello\n", "src/app.py": "print('v0')\nprint('v0')\n"}


@dataclass
class Door:
    """One door onto one sandbox: its operations, the Sandbox as the client sees it, the
    original repository, and an async twin of the operations."""

    ops: ActorOperations
    aops: Any
    info: SandboxInfo
    repo: Path
    sql_info: SandboxInfo | None = None
    database: Path | None = None


def info_of(sandbox_id: str, executor: str, strategy: str = "git_worktree") -> SandboxInfo:
    return SandboxInfo.from_object(
        {
            "metadata": {"name": "sbx", "namespace": "ns", "uid": UID},
            "spec": {
                "planId": "plan-a",
                "resourceId": "repo",
                "strategy": strategy,
                "source": {"persistentVolumeClaim": {"claimName": "src"}},
            },
            "status": {
                "phase": "Active",
                "executor": executor,
                "sandboxId": sandbox_id,
                "workspacePod": "pod-1" if executor == "pod" else "",
            },
        }
    )


def database(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    connection.close()
    return path


@pytest.fixture
def agent_door(tmp_path: Path) -> Iterator[Door]:
    repo = make_repo(tmp_path / "repo", FILES)
    db = database(tmp_path)
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": f"sqlite:///{db}"}).start()
    calls = agent.client()
    body = {
        "plan_id": "plan-a", "resource_id": "repo", "strategy": "git_worktree",
        "original": str(repo), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    calls.call("POST", "/v1/sandboxes", body, request_id="create-repo")
    sql_id = SANDBOX_ID[:-2] + "DB"
    body = {
        "plan_id": "plan-a", "resource_id": "db", "strategy": "transaction_rollback",
        "original": "env:SANDBOX_SOURCE_DSN", "sandbox_id": sql_id,
    }  # fmt: skip
    calls.call("POST", "/v1/sandboxes", body, request_id="create-db")
    direct = DirectTransport(agent.url, derive_token(KEY, UID), timeout_seconds=30)
    yield Door(
        AgentActor(direct),
        AsyncAgentActor(AsyncDirectTransport(direct)),
        info_of(SANDBOX_ID, "pod"),
        repo,
        info_of(sql_id, "pod", "transaction_rollback"),
        db,
    )
    agent.stop()


@pytest.fixture
def local_door(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Door]:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    repo = make_repo(tmp_path / "repo", FILES)
    db = database(tmp_path)
    state = tmp_path / "state"
    host = SandboxHost(SandboxStore(state))
    root = str(tmp_path / "sandboxes")
    sandbox = host.provision("plan-a", "repo", str(repo), "git_worktree", sandbox_root=root)
    sql = host.provision(
        "plan-a", "db", f"sqlite:///{db}", "transaction_rollback", sandbox_root=root
    )
    yield Door(
        LocalDoor(state),
        AsyncLocalDoor(state),
        info_of(sandbox.sandbox_id, "local"),
        repo,
        info_of(sql.sandbox_id, "local", "transaction_rollback"),
        db,
    )
    for made in (sandbox, sql):
        host.reopen(made.sandbox_id).cleanup()


@pytest.fixture(params=["agent", "local"])
def door(request: pytest.FixtureRequest) -> Door:
    return request.getfixturevalue(f"{request.param}_door")  # type: ignore[no-any-return]


def test_commands_run_in_the_sandbox_with_their_output_and_exit_code(door: Door) -> None:
    ops, info = door.ops, door.info
    done = ops.exec(info, ["cat", "README.md"])
    assert (done.exit_code, done.stdout, done.stderr, done.ok) == (0, b"hello\n", b"", True)
    assert done.stdout_bytes == 6 and done.duration_seconds > 0 and done.exec_id
    shell = ops.exec(
        info, "pwd; echo $GREETING; cat; echo oops >&2; echo made > made.txt; exit 3",
        cwd="src", env={"GREETING": "hi"}, stdin="from stdin\n",
    )  # fmt: skip
    assert shell.exit_code == 3 and not shell.ok
    lines = shell.stdout.decode().splitlines()
    assert lines[0].endswith("/src") and lines[1:] == ["hi", "from stdin"]
    assert shell.stderr == b"oops\n"
    assert ops.read_bytes(info, "src/made.txt") == b"made\n"
    capped = ops.exec(info, "head -c 5000 /dev/zero", max_output_bytes=100)
    assert capped.truncated and len(capped.stdout) == 100 and capped.stdout_bytes == 5000
    slow = ops.exec(info, "sleep 5", timeout=0.5)
    assert slow.timed_out and slow.exit_code == 137
    with pytest.raises(RefusedError) as refused:
        ops.exec(info, "true", cwd="../..")
    assert refused.value.reason == "PathTraversal"
    assert not (door.repo / "src" / "made.txt").exists()  # the original is untouched


def test_a_streamed_command_yields_its_chunks_in_order_then_its_exit(door: Door) -> None:
    chunks = list(door.ops.exec_stream(door.info, "echo one; sleep 0.2; echo two >&2; echo three"))
    assert chunks[0].kind == "started" and chunks[0].exec_id
    assert chunks[-1].kind == "exit" and chunks[-1].result is not None
    assert chunks[-1].result.exit_code == 0
    output = [(c.kind, c.data) for c in chunks[1:-1]]
    assert b"".join(d for k, d in output if k == "stdout") == b"one\nthree\n"
    assert b"".join(d for k, d in output if k == "stderr") == b"two\n"
    assert output.index(("stdout", b"one\n")) < output.index(("stderr", b"two\n"))


def test_an_async_stream_is_signalled_by_its_exec_id(door: Door) -> None:
    script = "trap 'echo caught; exit 7' TERM; echo ready; sleep 20 & wait"

    async def run() -> tuple[list[Any], Any]:
        seen: list[Any] = []
        async for chunk in door.aops.exec_stream(door.info, script):
            seen.append(chunk)
            if chunk.kind == "stdout" and b"ready" in chunk.data:
                assert await door.aops.signal(door.info, chunk.exec_id, "SIGTERM")
        return seen, seen[-1].result

    seen, result = asyncio.run(run())
    assert result.exit_code == 7 and result.duration_seconds < 15
    assert b"caught" in b"".join(c.data for c in seen)


def test_file_operations_edit_search_and_batches(door: Door) -> None:
    ops, info = door.ops, door.info
    assert ops.write(info, "notes/a.txt", "line 1\n").size == 7
    assert ops.write(info, "notes/a.txt", b"line 2\n", append=True).appended
    assert ops.read_bytes(info, "notes/a.txt") == b"line 1\nline 2\n"
    assert ops.read_bytes(info, "notes/a.txt", offset=7, length=4) == b"line"
    stat = ops.stat(info, "notes/a.txt")
    assert (stat.type, stat.size) == ("file", 14) and stat.mode.startswith("0o")
    assert ops.stat(info, "notes").type == "dir"
    # edit: exact text, refused when absent or not unique, replace_all replaces every one
    with pytest.raises(RefusedError) as absent:
        ops.edit(info, "src/app.py", "v9", "v1")
    assert absent.value.reason == "InvalidOperation"
    with pytest.raises(RefusedError) as twice:
        ops.edit(info, "src/app.py", "v0", "v1")
    assert twice.value.reason == "InvalidOperation" and "2" in twice.value.message
    assert ops.read_bytes(info, "src/app.py") == FILES["src/app.py"].encode()  # untouched
    assert ops.edit(info, "src/app.py", "v0", "v1", replace_all=True).occurrences == 2
    assert ops.edit(info, "README.md", "hello", "hello world").occurrences == 1
    # move, mkdir, delete
    assert ops.mkdir(info, "out/deep").created
    assert ops.move(info, "notes/a.txt", "out/deep/a.txt").to == "out/deep/a.txt"
    with pytest.raises(NotFoundError):
        ops.stat(info, "notes/a.txt")
    ops.write(info, "out/b.txt", "b")
    with pytest.raises(RefusedError) as exists:
        ops.move(info, "out/b.txt", "out/deep/a.txt")
    assert exists.value.reason == "InvalidOperation"
    assert ops.delete(info, "out", recursive=True).type == "dir"
    with pytest.raises(NotFoundError):
        ops.read_bytes(info, "out/b.txt")
    # grep and glob: capped, with a cursor that continues
    for n in range(5):
        ops.write(info, f"logs/{n}.log", f"TODO {n}\nnothing\n")
    first = ops.grep(info, r"TODO \d", path="logs", max_matches=3)
    assert len(first.matches) == 3 and first.truncated and first.next_cursor
    rest = ops.grep(info, r"TODO \d", path="logs", max_matches=3, cursor=first.next_cursor)
    assert [m.path for m in first.matches + rest.matches] == [f"logs/{n}.log" for n in range(5)]
    assert rest.next_cursor is None and first.matches[0].line == 1
    assert (
        ops.grep(info, "todo", path="logs", ignore_case=True, glob="1.*").matches[0].text
        == "TODO 1"
    )
    globbed = ops.glob(info, "**/*.py")
    assert [e.path for e in globbed.paths] == ["src/app.py"] and not globbed.truncated
    # batches: one result per file, a refused one does not stop the others
    uploaded = ops.upload(info, {"up/x.bin": b"\x00\x01", "../escape": b"no", "up/y.txt": "y"})
    assert [(r.path, r.ok) for r in uploaded] == [
        ("up/x.bin", True), ("../escape", False), ("up/y.txt", True),
    ]  # fmt: skip
    assert uploaded[1].error and "Path traversal" in uploaded[1].error["message"]
    down = ops.download(info, ["up/x.bin", "missing.txt", "up/y.txt"])
    assert [(r.path, r.ok, r.data) for r in down] == [
        ("up/x.bin", True, b"\x00\x01"), ("missing.txt", False, b""), ("up/y.txt", True, b"y"),
    ]  # fmt: skip
    assert not (door.repo / "up").exists() and (door.repo / "README.md").read_text() == "hello\n"


def test_paths_that_leave_the_sandbox_are_refused_everywhere(door: Door) -> None:
    ops, info = door.ops, door.info
    attempts = [
        lambda: ops.read_bytes(info, "../repo/README.md"),
        lambda: ops.write(info, "/etc/passwd", "x"),
        lambda: ops.edit(info, ".git/config", "a", "b"),
        lambda: ops.delete(info, "src/../../x"),
        lambda: ops.move(info, "README.md", "../moved"),
        lambda: ops.grep(info, "x", path="/"),
    ]
    for attempt in attempts:
        with pytest.raises(RefusedError) as refused:
            attempt()
        assert refused.value.reason in ("PathTraversal", "ReservedPath")


def test_the_audit_log_records_each_operation_without_contents(door: Door) -> None:
    ops, info = door.ops, door.info
    ops.write(info, "a.txt", "secret-content")
    ops.edit(info, "a.txt", "secret", "public")
    ops.exec(info, ["true"], env={"TOKEN": "secret-value"})
    page = ops.audit(info)
    assert [e["op"] for e in page.entries] == ["write", "edit", "exec"]
    assert page.total == 3 and page.next is None
    assert page.entries[2]["env_names"] == ["TOKEN"]
    assert "secret" not in str(page.entries).replace("env_names", "")
    assert [e["op"] for e in ops.audit(info, after=page.entries[0]["seq"], limit=1).entries] == [
        "edit"
    ]


def test_sql_runs_in_the_sandbox_transaction_and_returns_rows(door: Door) -> None:
    ops, info = door.ops, door.sql_info
    assert info is not None and door.database is not None
    one = ops.sql(info, "INSERT INTO notes (body) VALUES (?)", ["one"])
    assert (one.kind, one.rowcount, one.last_id) == ("INSERT", 1, 1)
    many = ops.sql_many(info, "INSERT INTO notes (body) VALUES (?)", [["two"], ["three"]])
    assert many.rowcount == 2
    rows = ops.sql(info, "SELECT id, body FROM notes ORDER BY id", max_rows=2)
    assert rows.columns == ["id", "body"] and rows.rows == [[1, "one"], [2, "two"]]
    assert rows.truncated
    with sqlite3.connect(door.database) as connection:  # not committed: the original is empty
        assert connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    connection.close()
    with pytest.raises(RefusedError) as refused:
        ops.sql(door.info, "SELECT 1")  # a git_worktree sandbox has no SQL
    assert refused.value.reason == "InvalidState"
    with pytest.raises(RefusedError) as no_tree:
        ops.exec(info, ["true"])  # a transaction sandbox has no working tree
    assert no_tree.value.reason == "ExecRefused"


def test_core_errors_map_to_the_client_errors() -> None:
    assert isinstance(actor_error("ExecLimitError", "busy", 429), ConflictError)
    assert actor_error("ExecLimitError", "busy").reason == "ExecLimit"
    assert actor_error("JailUnavailableError", "no bwrap").reason == "JailUnavailable"
    assert isinstance(actor_error("JailUnavailableError", "x"), OperationFailedError)
    assert actor_error("Weird", "Path traversal not allowed: ..").reason == "PathTraversal"
    assert actor_error("Weird", "x", 404).reason == "NotFound"
    assert actor_error("Weird", "x").reason == "IOError"


def test_a_command_may_stay_silent_longer_than_the_transports_timeout(
    agent_door: Door,
) -> None:
    assert isinstance(agent_door.ops, AgentActor)
    direct = agent_door.ops.transport
    assert isinstance(direct, DirectTransport)
    impatient = AgentActor(DirectTransport(direct.base_url, direct._token, timeout_seconds=0.5))
    done = impatient.exec(agent_door.info, "sleep 1.5; echo late")
    assert (done.exit_code, done.stdout) == (0, b"late\n")
    assert not done.timed_out and done.duration_seconds >= 1.5


def test_the_exec_reply_is_read_in_both_encodings_whatever_the_chunk_boundaries() -> None:
    import base64
    import json

    from sandbox_client.actor import ExecStream

    exit_event = {"event": "exit", "exec_id": "e1", "exit_code": 3, "stdout_bytes": 6}
    events = [{"event": "started", "exec_id": "e1"}, exit_event]

    def frame(tag: bytes, payload: bytes) -> bytes:
        return tag + len(payload).to_bytes(4, "big") + payload

    framed = (
        frame(b"j", json.dumps(events[0]).encode())
        + frame(b"o", b"out\n")
        + frame(b"e", b"er")
        + frame(b"j", json.dumps(events[1]).encode())
    )
    lines = b"".join(
        json.dumps(e).encode() + b"\n"
        for e in (
            events[0],
            {"event": "stdout", "data_b64": base64.b64encode(b"out\n").decode()},
            {"event": "stderr", "data_b64": base64.b64encode(b"er").decode()},
            events[1],
        )
    )
    for data, is_framed in ((framed, True), (lines, False)):
        for step in (1, 3, 7, len(data)):
            reader = ExecStream("exec", collect=True, framed=is_framed)
            kinds = []
            for at in range(0, len(data), step):
                kinds += [c.kind for c in reader.feed(data[at : at + step])]
            result = reader.end()
            assert kinds == ["started", "stdout", "stderr", "exit"], (is_framed, step)
            assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"er")
    cut = ExecStream("exec", collect=True, framed=True)
    cut.feed(framed[:-3])
    with pytest.raises(OperationFailedError) as stream_cut:
        cut.end()
    assert stream_cut.value.reason == "StreamCut"


def test_frames_of_every_size_are_cut_byte_exact_from_reads_of_every_size() -> None:
    import json
    import random

    from sandbox_client.actor import ExecStream

    def frame(tag: bytes, payload: bytes) -> bytes:
        return tag + len(payload).to_bytes(4, "big") + payload

    rng = random.Random(7)
    sizes = [0, 1, 4, 5, 6, 4095, 65536, 1 << 20, 3, 0, 200_000]
    outputs = [(b"o" if n % 3 else b"e", rng.randbytes(size)) for n, size in enumerate(sizes)]
    exit_event = {"event": "exit", "exec_id": "e1", "exit_code": 0, "stdout_bytes": 1}
    data = (
        frame(b"j", json.dumps({"event": "started", "exec_id": "e1"}).encode())
        + b"".join(frame(tag, payload) for tag, payload in outputs)
        + frame(b"j", json.dumps(exit_event).encode())
    )
    want_out = b"".join(payload for tag, payload in outputs if tag == b"o")
    want_err = b"".join(payload for tag, payload in outputs if tag == b"e")
    # reads as a socket gives them: a whole frame, a header split, many frames in one read
    for cuts in ([], [5], [3, 7, 11], sorted(rng.sample(range(1, len(data)), 300))):
        reader = ExecStream("exec", collect=True, framed=True)
        chunks = []
        for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
            chunks += reader.feed(data[start:end])
        result = reader.end()
        got = [(c.kind, c.data) for c in chunks if c.kind in ("stdout", "stderr")]
        assert got == [("stdout" if t == b"o" else "stderr", p) for t, p in outputs], cuts
        assert (result.stdout, result.stderr) == (want_out, want_err)
        assert all(type(c.data) is bytes for c in chunks if c.data is not None)
