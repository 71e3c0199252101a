"""Short reads on the agent's event loop (sandbox_core.agent.server, ``_loop_is_free``): a text
range of at most ``ON_LOOP_MAX_BYTES`` or a stat of an open sandbox is answered without the hop
to the worker thread when the worker has nothing to do; a longer read gets the whole reply from
the worker; a read that comes while a change waits in the worker waits for it (one operation at
a time, in order); changes always run in the worker. The reply is encoded once, the same text
journaled and sent, secrets hidden."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.agent import server, wire
from sandbox_core.agent.operations import AgentConfig, Operations
from tests.core.agent.inprocess import InProcessAgent

SID = "01HZX0A7Q3J0F8K2M4N6P8R0T2"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[InProcessAgent]:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.txt").write_text("base\n")
    served = InProcessAgent(tmp_path).start()
    body = {
        "plan_id": "p", "resource_id": "r", "strategy": "copy_on_write",
        "original": str(tmp_path / "data"), "sandbox_id": SID,
    }  # fmt: skip
    assert served.json("POST", wire.CREATE.path(), body, request_id="create")[0] == 200
    yield served
    served.stop()


def put(agent: InProcessAgent, rel: str, data: bytes, request_id: str) -> int:
    path = wire.FILE_PUT.path(sid=SID) + "?path=" + rel
    status, _, _ = agent.call("PUT", path, data, request_id=request_id)
    return status


def read_text(agent: InProcessAgent, rel: str, query: str = "") -> tuple[int, Any]:
    status, _, reply = agent.json("GET", wire.FILE_TEXT.path(sid=SID) + "?path=" + rel + query)
    return status, reply


def threads_of_reads(agent: InProcessAgent, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads the agent's text reads and stats run in, from now on."""
    seen: list[str] = []
    ops = agent.agent.ops
    for name in ("read_text", "stat_file"):
        original = getattr(ops, name)

        def spy(*args: Any, _original: Any = original) -> Any:
            seen.append(threading.current_thread().name)
            return _original(*args)

        monkeypatch.setattr(ops, name, spy)
    return seen


def test_a_short_read_is_answered_on_the_loop_and_a_long_one_whole_by_the_worker(
    agent: InProcessAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = server.ON_LOOP_MAX_BYTES
    short, exact, long = b"s" * 1024, b"e" * limit, bytes(range(256)) * (limit // 256 + 3)
    for rel, data in (("short.txt", short), ("exact.txt", exact), ("long.bin", long)):
        assert put(agent, rel, data, f"put-{rel}") == 200
    seen = threads_of_reads(agent, monkeypatch)

    assert read_text(agent, "short.txt") == (200, {
        "path": "short.txt", "offset": 0, "length": 1024, "size": 1024,
        "encoding": "utf-8", "content": short.decode(),
    })  # fmt: skip
    assert read_text(agent, "exact.txt")[1]["content"] == exact.decode()
    assert [name.startswith("agent") for name in seen] == [False, False]  # the loop's thread

    status, reply = read_text(agent, "long.bin")
    assert status == 200 and reply["length"] == reply["size"] == len(long)
    assert reply["encoding"] == "base64" and len(reply["content"]) > 4 * limit // 3
    # tried on the loop with one byte more than the bound, then read whole in the worker
    assert [name.startswith("agent") for name in seen[2:]] == [False, True]

    # a range within the bound stays on the loop, wherever it starts
    status, reply = read_text(agent, "long.bin", f"&offset={len(long) - 10}&length=100")
    assert (status, reply["length"], reply["offset"]) == (200, 10, len(long) - 10)
    status, _, stat = agent.json("GET", wire.FILE_STAT.path(sid=SID) + "?path=short.txt")
    assert status == 200 and stat["size"] == 1024 and stat["type"] == "file"
    assert [name.startswith("agent") for name in seen[4:]] == [False, False]


def test_replies_and_refusals_on_the_loop_are_the_workers(
    agent: InProcessAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert put(agent, "f.txt", "é\n".encode(), "activate") == 200
    seen = threads_of_reads(agent, monkeypatch)
    asked = [("missing.txt", ""), ("../outside.txt", ""), ("f.txt", "&offset=x"), ("f.txt", "")]
    on_loop = [read_text(agent, rel, query) for rel, query in asked]
    assert [status for status, _ in on_loop] == [404, 422, 400, 200]
    assert on_loop[0][1]["error"]["type"] == "SandboxFileNotFoundError"
    assert on_loop[1][1]["error"]["message"].startswith("Path traversal not allowed")
    assert on_loop[3][1]["content"] == "é\n"
    assert len(seen) == 3 and not any(name.startswith("agent") for name in seen)  # 400: no call
    # The same requests with the loop's way shut: the worker's replies are the same.
    monkeypatch.setattr(agent.agent.ops, "is_open", lambda _sid: False)
    del seen[:]
    assert [read_text(agent, rel, query) for rel, query in asked] == on_loop
    assert len(seen) == 3 and all(name.startswith("agent") for name in seen)


def test_a_read_waits_for_the_change_queued_before_it(agent: InProcessAgent) -> None:
    assert put(agent, "f.txt", b"old", "first") == 200
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # the worker busy with an earlier operation
        held.set()
        release.wait(30)

    agent.agent.worker.submit(hold)
    assert held.wait(10)
    writer = threading.Thread(target=put, args=(agent, "f.txt", b"new", "second"))
    replies: list[tuple[int, Any]] = []
    reader = threading.Thread(target=lambda: replies.append(read_text(agent, "f.txt")))
    try:
        writer.start()
        deadline = time.monotonic() + 10
        while agent.agent._queued == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert agent.agent._queued == 1  # the write waits in the worker's queue
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not replies  # not answered past the queued write
    finally:
        release.set()
    writer.join(30)
    reader.join(30)
    assert replies[0][0] == 200 and replies[0][1]["content"] == "new"


def test_the_reply_is_encoded_once_the_same_text_journaled_and_sent(
    agent: InProcessAgent,
) -> None:
    path = wire.FILE_PUT.path(sid=SID) + "?path=j.txt"
    status, _, first = agent.call("PUT", path, b"abc", request_id="once")
    assert status == 200
    key = "\n".join(("PUT", wire.FILE_PUT.template, SID, "once"))
    stored = json.loads(agent.agent.journal._path(key).read_text())
    assert stored == {"status": 200, "payload": json.loads(first)}
    status, headers, again = agent.call("PUT", path, b"abc", request_id="once")
    assert (status, headers.get(wire.REPLAY_HEADER), again) == (200, "true", first)


def test_reply_text_hides_secrets_and_is_plain_json_without_them(tmp_path: Path) -> None:
    dsn = "postgresql://app:s3cret-passw0rd@db.example:5432/app"
    payload = {"message": f"cannot reach {dsn}", "path": tmp_path, "n": (1, 2)}
    hiding = Operations(
        AgentConfig(state_dir=tmp_path / "a", sandbox_root=tmp_path / "s", environ={
            "SANDBOX_SOURCE_DSN": dsn})
    )  # fmt: skip
    text = hiding.reply_text(payload)
    assert "s3cret-passw0rd" not in text and "env:SANDBOX_SOURCE_DSN" in text
    assert json.loads(text) == hiding.hide(payload)

    plain = Operations(
        AgentConfig(state_dir=tmp_path / "b", sandbox_root=tmp_path / "t", environ={})
    )
    text = plain.reply_text(payload)
    assert json.loads(text) == {
        "message": f"cannot reach {dsn}",
        "path": str(tmp_path),
        "n": [1, 2],
    }
    assert text == json.dumps(plain.hide(payload))


def test_the_agent_runs_on_uvloop() -> None:
    """The operator extra (which hack/setup.sh installs, and the image has) brings uvloop: a
    missing one fails here rather than skipping, as the agent would quietly run slower."""
    import uvloop

    loop = server._event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
