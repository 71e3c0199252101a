"""The actor's file routes through a real workspace agent process (issue "The actor's door",
item 2, the pod executor's door): the same operations as on local paths, with their refusals
as HTTP statuses (404 missing, 422 refused path or edit), streamed byte ranges and batch
downloads, request-id replay of a change, and the audit log in the agent's state directory."""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_operator.executors.agent_client import AgentNotFound, AgentRefused

from sandbox_core.actor.audit import AuditLog
from sandbox_core.agent import wire
from tests.support.agent import SANDBOX_ID, AgentProcess
from tests.support.gitrepo import make_repo

SID = wire.STATUS.path(sid=SANDBOX_ID)
STRATEGIES = ["git_worktree", "copy_on_write", "overlay"]
# One agent serves the module; request ids are made unique per test by this prefix (an id
# seen before is a replay, by design).
PREFIX = {"test": ""}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    yield process
    process.stop()


@pytest.fixture(params=STRATEGIES)
def sandbox(agent: AgentProcess, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A sandbox of the parametrized strategy over a new repository; yields the original."""
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n", "d/g.txt": "g\n"})
    body = {
        "plan_id": "p", "resource_id": "r", "strategy": request.param,
        "original": str(repo), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    agent.client().call("POST", wire.CREATE.template, body, request_id=f"create-{tmp_path.name}")
    PREFIX["test"] = tmp_path.name
    yield repo
    agent.client().call("DELETE", SID, request_id=f"cleanup-{tmp_path.name}")


def raw(agent: AgentProcess, route: wire.Route, query: list[tuple[str, str]]) -> Any:
    """An open urllib reply of a GET ``route`` (streamed routes)."""
    url = agent.url + route.path(sid=SANDBOX_ID) + "?" + urllib.parse.urlencode(query)
    token = agent.client()._token
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    return urllib.request.urlopen(request, timeout=30)  # noqa: S310


def call(agent: AgentProcess, route: wire.Route, body: Any = None, **kwargs: Any) -> Any:
    if kwargs.get("request_id"):
        kwargs["request_id"] = f"{PREFIX['test']}-{kwargs['request_id']}"
    return agent.client().call(route.method, route.path(sid=SANDBOX_ID), body, **kwargs)


def test_bytes_stream_in_ranges_and_text_comes_back_decoded(
    agent: AgentProcess, sandbox: Path
) -> None:
    blob = os.urandom(3 * 1024 * 1024 + 17)
    put = call(agent, wire.FILE_PUT, blob, query={"path": "big/blob"}, request_id="put-1")
    assert put == {"path": "big/blob", "size": len(blob), "appended": False}
    with raw(agent, wire.FILE_BYTES, [("path", "big/blob")]) as reply:
        assert reply.headers[wire.FILE_SIZE_HEADER] == str(len(blob))
        assert int(reply.headers["Content-Length"]) == len(blob)
        assert reply.read() == blob
    query = [("path", "big/blob"), ("offset", "1048570"), ("length", "20")]
    with raw(agent, wire.FILE_BYTES, query) as reply:
        assert reply.headers[wire.RANGE_OFFSET_HEADER] == "1048570"
        assert reply.read() == blob[1048570:1048590]
    call(agent, wire.FILE_PUT, b"more\n", query={"path": "f.txt", "append": "1"}, request_id="a-1")
    text = call(agent, wire.FILE_TEXT, query={"path": "f.txt"})
    assert text["content"] == "base\nmore\n" and text["encoding"] == "utf-8"
    written = call(
        agent, wire.FILE_WRITE,
        {"path": "b64.bin", "encoding": "base64",
         "content": base64.b64encode(b"\xff\x00").decode()},
        request_id="w-b64",
    )  # fmt: skip
    assert written["size"] == 2
    assert call(agent, wire.FILE_TEXT, query={"path": "b64.bin"})["encoding"] == "base64"
    assert call(agent, wire.FILE_STAT, query={"path": "big"})["type"] == "dir"
    with pytest.raises(AgentNotFound):
        call(agent, wire.FILE_TEXT, query={"path": "missing"})


def test_edit_delete_move_mkdir_and_their_refusals(agent: AgentProcess, sandbox: Path) -> None:
    body = {"path": "f.txt", "content": "a\nb\na\n"}
    call(agent, wire.FILE_WRITE, body, request_id="w-1")
    with pytest.raises(AgentRefused) as refused:
        call(agent, wire.FILE_EDIT, {"path": "f.txt", "old": "a", "new": "c"}, request_id="e-1")
    assert refused.value.error_type == "SandboxFileOperationError"
    assert "occurs 2 times" in refused.value.detail
    edited = call(
        agent, wire.FILE_EDIT, {"path": "f.txt", "old": "a", "new": "c", "replace_all": True},
        request_id="e-2",
    )  # fmt: skip
    assert edited == {"path": "f.txt", "occurrences": 2}
    assert call(agent, wire.FILE_MKDIR, {"path": "x/y"}, request_id="m-1")["created"] is True
    moved = call(agent, wire.FILE_MOVE, {"path": "f.txt", "to": "x/y/f.txt"}, request_id="mv-1")
    assert moved == {"path": "f.txt", "to": "x/y/f.txt"}
    with pytest.raises(AgentRefused) as not_empty:
        call(agent, wire.FILE_DELETE, {"path": "x"}, request_id="d-1")
    assert not_empty.value.error_type == "SandboxFileOperationError"
    deleted = call(agent, wire.FILE_DELETE, {"path": "x", "recursive": True}, request_id="d-2")
    assert deleted == {"path": "x", "type": "dir"}
    with pytest.raises(AgentNotFound):
        call(agent, wire.FILE_DELETE, {"path": "x"}, request_id="d-3")
    for index, bad in enumerate(("../../etc/passwd", "/etc/passwd", ".git/config")):
        with pytest.raises(AgentRefused) as path_refused:
            call(agent, wire.FILE_WRITE, {"path": bad, "content": "x"}, request_id=f"bad-{index}")
        assert path_refused.value.error_type == "SandboxPathError"
    with pytest.raises(AgentRefused, match="path is needed"):
        call(agent, wire.FILE_EDIT, {"old": "a"}, request_id="e-none")
    records = AuditLog(agent.work / "state", SANDBOX_ID).read(limit=1000)["entries"]
    ops = [(r["op"], r["path"]) for r in records][-5:]
    assert ops == [
        ("write", "f.txt"), ("edit", "f.txt"), ("mkdir", "x/y"), ("move", "f.txt"),
        ("delete", "x"),
    ]  # fmt: skip


def test_a_change_sent_again_with_its_request_id_is_done_once(
    agent: AgentProcess, sandbox: Path
) -> None:
    body = {"path": "log.txt", "content": "line\n", "append": True}
    first = call(agent, wire.FILE_WRITE, body, request_id="append-once")
    again = call(agent, wire.FILE_WRITE, body, request_id="append-once")
    assert first == again
    assert call(agent, wire.FILE_TEXT, query={"path": "log.txt"})["content"] == "line\n"


def test_grep_glob_pages_and_batch_transfer(agent: AgentProcess, sandbox: Path) -> None:
    files = [
        {"path": f"src/m{i}.py", "content_b64": base64.b64encode(b"# TODO\n").decode()}
        for i in range(4)
    ]
    files.append({"path": "../out", "content_b64": ""})
    uploaded = call(agent, wire.UPLOAD, {"files": files}, request_id="up-1")["results"]
    assert [r["ok"] for r in uploaded] == [True, True, True, True, False]
    seen, cursor = [], ""
    while True:
        query = {"pattern": "TODO", "path": "src", "max": "3"}
        if cursor:
            query["cursor"] = cursor
        page = call(agent, wire.GREP, query=query)
        seen += [m["path"] for m in page["matches"]]
        if not page["truncated"]:
            break
        cursor = page["next_cursor"]
    assert seen == [f"src/m{i}.py" for i in range(4)]
    page = call(agent, wire.GLOB, query={"pattern": "**/*.py", "max": "2"})
    assert page["truncated"] is True and len(page["paths"]) == 2
    rest = call(agent, wire.GLOB, query={"pattern": "**/*.py", "cursor": page["next_cursor"]})
    assert [p["path"] for p in page["paths"] + rest["paths"]] == seen
    query = [("path", "src/m0.py"), ("path", "nope"), ("path", "d/g.txt")]
    with raw(agent, wire.DOWNLOAD, query) as reply:
        assert reply.headers["Content-Type"].startswith(wire.NDJSON_CONTENT_TYPE)
        events = [json.loads(line) for line in reply.read().splitlines()]
    done = [(e["path"], e["ok"]) for e in events if "ok" in e]
    assert done == [("src/m0.py", True), ("nope", False), ("d/g.txt", True)]
    data = [base64.b64decode(e["data_b64"]) for e in events if "data_b64" in e]
    assert data == [b"# TODO\n", b"g\n"]


def test_what_the_actor_wrote_through_the_agent_is_committed(
    agent: AgentProcess, sandbox: Path
) -> None:
    call(agent, wire.FILE_EDIT, {"path": "f.txt", "old": "base", "new": "agent"}, request_id="e")
    call(agent, wire.FILE_MOVE, {"path": "d/g.txt", "to": "d/h.txt"}, request_id="mv")
    assert (sandbox / "f.txt").read_text() == "base\n"
    commit = wire.COMMIT
    result = call(agent, commit, {"message": "m"}, request_id="commit")
    assert result["result"]["success"] is True
    assert (sandbox / "f.txt").read_text() == "agent\n"
    assert (sandbox / "d/h.txt").read_text() == "g\n" and not (sandbox / "d/g.txt").exists()
