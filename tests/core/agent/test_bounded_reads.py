"""Large reads stream with bounded memory (docs/security.md, "Large reads").

A real agent process serves a 300 MiB file (sparse: no disk is spent) of a ``none`` sandbox:
the byte route and the batch download stream it in chunks, and the agent's peak resident set
(``VmHWM``) grows by far less than the file; the JSON read route, which base64-encodes what it
returns, refuses a file above its inline cap instead of loading it.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core.actor.files import MAX_INLINE_READ_BYTES
from sandbox_core.agent import wire
from tests.support.agent import SANDBOX_ID, AgentProcess

SIZE = 300 * 1024 * 1024
GROWTH_BOUND = 64 * 1024 * 1024  # what the agent's peak may grow by while serving the file


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    data = tmp_path / "data"
    data.mkdir()
    with (data / "big.bin").open("wb") as handle:
        handle.truncate(SIZE)
    process = AgentProcess(tmp_path).start()
    body = {
        "plan_id": "p", "resource_id": "r", "strategy": "none",
        "original": str(data), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    process.client().call("POST", wire.CREATE.template, body, request_id="create-big")
    yield process
    process.stop()


def peak_bytes(agent: AgentProcess) -> int:
    assert agent.process is not None
    status = Path(f"/proc/{agent.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def stream(agent: AgentProcess, route: wire.Route, query: list[tuple[str, str]]) -> int:
    """Bytes of the reply, read in chunks and dropped."""
    url = agent.url + route.path(sid=SANDBOX_ID) + "?" + urllib.parse.urlencode(query)
    token = agent.client()._token
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    total = 0
    with urllib.request.urlopen(request, timeout=120) as reply:  # noqa: S310
        while chunk := reply.read(1 << 20):
            total += len(chunk)
    return total


def test_a_300_mib_file_streams_with_bounded_agent_memory(agent: AgentProcess) -> None:
    before = peak_bytes(agent)
    assert stream(agent, wire.FILE_BYTES, [("path", "big.bin")]) == SIZE
    after_bytes = peak_bytes(agent)
    downloaded = stream(agent, wire.DOWNLOAD, [("path", "big.bin")])
    assert downloaded > SIZE  # NDJSON lines of base64 chunks
    after_download = peak_bytes(agent)
    assert after_bytes - before < GROWTH_BOUND, (before, after_bytes)
    assert after_download - before < GROWTH_BOUND, (before, after_download)


def test_the_json_read_route_refuses_a_file_above_its_inline_cap(agent: AgentProcess) -> None:
    before = peak_bytes(agent)
    url = agent.url + wire.READ.path(sid=SANDBOX_ID) + "?path=big.bin"
    token = agent.client()._token
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)  # noqa: S310
    assert refused.value.code == 422
    message = json.loads(refused.value.read())["error"]["message"]
    assert str(MAX_INLINE_READ_BYTES) in message and "stream" in message
    assert peak_bytes(agent) - before < GROWTH_BOUND
