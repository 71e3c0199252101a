"""The agent's request journal (docs/security.md, "The request journal"): a reply is replayed
only for the same method, route, sandbox and request id; the journal is bounded by count and
age; a full state volume refuses a change before it runs (507), and a reply that cannot be kept
after the change ran is still sent, never an opaque 500."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.agent import wire
from sandbox_core.agent.server import RequestJournal
from tests.core.agent.inprocess import InProcessAgent

SID = "01HZX0A7Q3J0F8K2M4N6P8R0T2"
OTHER = "01HZX0A7Q3J0F8K2M4N6P8R0T3"
NEW = {"path": "new.txt", "content": "x"}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[InProcessAgent]:
    served = InProcessAgent(tmp_path).start()
    yield served
    served.stop()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.txt").write_text("base\n")
    return tmp_path / "data"


def create(agent: InProcessAgent, data: Path, sid: str, request_id: str) -> tuple[int, Any]:
    body = {
        "plan_id": "p", "resource_id": "r", "strategy": "copy_on_write",
        "original": str(data), "sandbox_id": sid,
    }  # fmt: skip
    status, headers, reply = agent.json("POST", wire.CREATE.path(), body, request_id=request_id)
    assert wire.REPLAY_HEADER not in headers
    return status, reply


def test_a_request_id_is_scoped_to_its_route_and_sandbox(agent: InProcessAgent, data: Path) -> None:
    assert create(agent, data, SID, "same-id")[0] == 200
    # The same id on DELETE of that sandbox is a cleanup, not the create's reply again.
    status, headers, reply = agent.json("DELETE", wire.CLEANUP.path(sid=SID), request_id="same-id")
    assert status == 200 and wire.REPLAY_HEADER not in headers
    assert reply == {"sandbox_id": SID, "status": "cleaned_up"}
    # On another sandbox, the same route and id is another request too.
    status, _, reply = agent.json("DELETE", wire.CLEANUP.path(sid=OTHER), request_id="same-id")
    assert status == 200 and reply["sandbox_id"] == OTHER
    # The very same request again is a replay.
    status, headers, _ = agent.json("DELETE", wire.CLEANUP.path(sid=SID), request_id="same-id")
    assert status == 200 and headers.get(wire.REPLAY_HEADER) == "true"


def test_the_journal_is_pruned_by_count_and_age(tmp_path: Path) -> None:
    journal = RequestJournal(tmp_path, max_entries=5, max_age=3600)
    for index in range(12):
        journal.put(f"k{index}", 200, {"n": index}, durable=False)
        path = journal._path(f"k{index}")
        os.utime(path, (1_000_000 + index, 1_000_000 + index))  # oldest first
    now = 1_000_000 + 100
    assert journal.prune(now) == 7
    assert [journal.get(f"k{i}") is not None for i in range(12)] == [False] * 7 + [True] * 5
    assert journal.prune(now + 3600 + 50) == 5  # all older than an hour by then
    assert list(journal.directory.iterdir()) == []


def test_the_journal_prunes_itself_as_it_grows(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr("sandbox_core.agent.server.JOURNAL_PRUNE_EVERY", 10)
    journal = RequestJournal(tmp_path, max_entries=4)
    for index in range(30):
        journal.put(f"k{index}", 200, {}, durable=False)
    assert len(list(journal.directory.glob("*.json"))) <= 4 + 9


def test_a_full_state_volume_refuses_a_change_before_it_runs(
    agent: InProcessAgent, data: Path
) -> None:
    assert create(agent, data, SID, "c1")[0] == 200
    agent.agent.journal.reserve = 1 << 62  # more than any volume holds: "full"
    path = wire.FILE_WRITE.path(sid=SID)
    status, _, reply = agent.json(
        "POST", path, {"path": "new.txt", "content": "x"}, request_id="w1"
    )
    assert status == wire.INSUFFICIENT_STORAGE == 507
    assert reply["error"]["type"] == "StateVolumeFull"
    assert "state volume full" in reply["error"]["message"]
    sandbox_root = Path(agent.agent.ops.path(SID, "."))
    assert not (sandbox_root / "new.txt").exists()  # nothing was done
    status, _, _ = agent.json("GET", wire.STATUS.path(sid=SID))
    assert status == 200  # reads still work
    agent.agent.journal.reserve = 0
    status, _, reply = agent.json(
        "POST", path, {"path": "new.txt", "content": "x"}, request_id="w1"
    )
    assert status == 200 and (sandbox_root / "new.txt").read_text() == "x"


def test_a_reply_that_cannot_be_kept_is_still_sent(
    agent: InProcessAgent, data: Path, monkeypatch: Any
) -> None:
    assert create(agent, data, SID, "c1")[0] == 200

    def full(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(agent.agent.journal, "put", full)
    path = wire.FILE_WRITE.path(sid=SID)
    status, _, reply = agent.json("POST", path, {"path": "n.txt", "content": "x"}, request_id="w2")
    assert status == 200, reply
    assert reply["path"] == "n.txt"


@pytest.mark.parametrize("durable", [True, False])
def test_a_torn_reply_is_no_reply_and_the_next_put_replaces_it(
    tmp_path: Path, durable: bool
) -> None:
    journal = RequestJournal(tmp_path)
    journal.put("first", 200, {"n": 1}, durable=durable)  # makes the directory
    torn = journal._path("k")
    torn.write_text('{"status": 200, "payload": {"pa')  # a crash in the middle of a put
    assert journal.get("k") is None  # the request runs again
    journal.put("k", 200, {"path": "a.txt", "bytes": 3}, durable=durable)
    assert journal.get("k") == (200, {"path": "a.txt", "bytes": 3})
    assert journal.get("first") == (200, {"n": 1})
    assert sorted(p.suffix for p in journal.directory.iterdir()) == [".json", ".json"]


def test_a_journal_over_the_directory_of_an_earlier_process_replays_its_replies(
    tmp_path: Path,
) -> None:
    first = RequestJournal(tmp_path)
    assert first.get("a") is None  # listed before the directory exists: nothing stored
    first.put("a", 200, {"n": 1}, durable=False)
    first.put("b", 409, {"error": {"type": "Conflict"}})
    again = RequestJournal(tmp_path, max_entries=1)  # the agent restarted
    assert again.get("a") == (200, {"n": 1})
    assert again.get("b") == (409, {"error": {"type": "Conflict"}})
    assert again.get("c") is None
    os.utime(again._path("a"), (1_000_000, 1_000_000))  # the older one
    assert again.prune() == 1
    assert (again.get("a"), again.get("b")) == (None, (409, {"error": {"type": "Conflict"}}))
    again.put("a", 200, {"n": 2}, durable=False)  # the same id, run again after its prune
    assert again.get("a") == (200, {"n": 2})
