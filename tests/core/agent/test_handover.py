"""A warm-pool Pod's agent is handed its Sandbox's token (``wire.HANDOVER``): authenticated with
the pool's bootstrap token once, then only the handed token is accepted, the bootstrap token
never again (not even for another hand-over), a renewal is authenticated with the handed token,
the allowed root only narrows, and a restarted agent on the same state keeps all of it.

Real parts: the agent's aiohttp application on 127.0.0.1, called over HTTP, its files.
"""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.agent import wire
from tests.core.agent.inprocess import InProcessAgent

BOOT = "bootstrap-" + "b" * 40
FIRST = "v2.1.100." + "1" * 64
SECOND = "v2.2.100." + "2" * 64
STATUS = wire.STATUS.path(sid="01HZX0A7Q3J0F8K2M4N6P8R0T2")


def _pool_agent(work: Path) -> InProcessAgent:
    (work / "source" / "a").mkdir(parents=True, exist_ok=True)
    (work / "source" / "b").mkdir(parents=True, exist_ok=True)
    (work / "boot").write_text(BOOT + "\n")
    process = InProcessAgent(
        work, bootstrap_token_file=work / "boot", allowed_roots=(work / "source",)
    )
    (work / "token").unlink()  # a pool Pod mounts no Sandbox token
    return process.start()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[InProcessAgent]:
    process = _pool_agent(tmp_path)
    yield process
    process.stop()


def _call(
    agent: InProcessAgent, route: wire.Route, token: str, body: Any = None, path: str = ""
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    headers = {wire.AUTHORIZATION_HEADER: f"Bearer {token}", wire.REQUEST_ID_HEADER: "r-1"}
    request = urllib.request.Request(  # noqa: S310 - a local test URL
        agent.url + (path or route.template), data=data, method=route.method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read()).get("error") or {}


def test_the_bootstrap_token_hands_over_once_and_never_works_again(
    agent: InProcessAgent, tmp_path: Path
) -> None:
    root = str(tmp_path / "source" / "a")
    # Before the hand-over: the bootstrap token opens nothing but the hand-over.
    assert _call(agent, wire.STATUS, BOOT, path=STATUS)[0] == wire.UNAUTHORIZED
    assert _call(agent, wire.HANDOVER, "wrong", {"token": FIRST})[0] == wire.UNAUTHORIZED
    assert _call(agent, wire.HANDOVER, FIRST, {"token": FIRST})[0] == wire.UNAUTHORIZED
    status, reply = _call(agent, wire.HANDOVER, BOOT, {"token": FIRST, "allowed_root": root})
    assert (status, reply) == (200, {"handed_over": True})
    # Now only the Sandbox's token: past the token check (no such sandbox: 404, not 401).
    assert _call(agent, wire.STATUS, FIRST, path=STATUS)[0] == wire.NOT_FOUND
    assert _call(agent, wire.STATUS, BOOT, path=STATUS)[0] == wire.UNAUTHORIZED
    again = _call(agent, wire.HANDOVER, BOOT, {"token": SECOND, "allowed_root": root})
    assert again[0] == wire.UNAUTHORIZED  # a claimed Pod is never handed to anyone else
    assert _call(agent, wire.STATUS, SECOND, path=STATUS)[0] == wire.UNAUTHORIZED
    # The allowed root narrowed to the Sandbox's: a sibling under the Pod's root is refused.
    create = {
        "plan_id": "p",
        "resource_id": "r",
        "strategy": "none",
        "sandbox_id": "01HZX0A7Q3J0F8K2M4N6P8R0T2",
        "original": str(tmp_path / "source" / "b"),
    }
    status, error = _call(agent, wire.CREATE, FIRST, create)
    assert (status, error["type"]) == (wire.UNPROCESSABLE, "RefusedOriginal")
    # The token is kept under the state directory, readable by the agent's user only.
    kept = tmp_path / "state" / wire.HANDED_TOKEN_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert json.loads(kept.read_text()) == {"token": FIRST, "allowed_root": root}


def test_a_renewal_is_authenticated_by_the_handed_token_and_keeps_the_root(
    tmp_path: Path,
) -> None:
    agent = _pool_agent(tmp_path)
    root = str(tmp_path / "source" / "a")
    assert _call(agent, wire.HANDOVER, BOOT, {"token": FIRST, "allowed_root": root})[0] == 200
    moved = _call(agent, wire.HANDOVER, FIRST, {"token": SECOND, "allowed_root": "/"})
    assert (moved[0], moved[1]["type"]) == (wire.UNPROCESSABLE, "RefusedOriginal")
    assert _call(agent, wire.HANDOVER, FIRST, {"token": SECOND, "allowed_root": root})[0] == 200
    assert _call(agent, wire.STATUS, SECOND, path=STATUS)[0] == wire.NOT_FOUND
    assert _call(agent, wire.STATUS, FIRST, path=STATUS)[0] == wire.UNAUTHORIZED
    # A restart of the container (same state directory) keeps the hand-over.
    agent.stop()
    restarted = _pool_agent(tmp_path)
    try:
        assert _call(restarted, wire.STATUS, SECOND, path=STATUS)[0] == wire.NOT_FOUND
        assert _call(restarted, wire.STATUS, BOOT, path=STATUS)[0] == wire.UNAUTHORIZED
        hand = _call(restarted, wire.HANDOVER, BOOT, {"token": FIRST, "allowed_root": root})
        assert hand[0] == wire.UNAUTHORIZED
    finally:
        restarted.stop()


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"token": ""}, "ValueError"),
        ({"token": "x" * 513}, "ValueError"),
        ({"token": "tab\there"}, "ValueError"),
        ({"token": FIRST, "allowed_root": "/elsewhere"}, "RefusedOriginal"),
        ({"token": FIRST, "allowed_root": "relative/path"}, "RefusedOriginal"),
    ],
)
def test_a_bad_hand_over_is_refused_and_changes_nothing(
    agent: InProcessAgent, body: dict[str, str], kind: str
) -> None:
    status, error = _call(agent, wire.HANDOVER, BOOT, body)
    assert (status, error["type"]) == (wire.UNPROCESSABLE, kind)
    assert FIRST not in json.dumps(error)
    assert _call(agent, wire.STATUS, FIRST, path=STATUS)[0] == wire.UNAUTHORIZED
    assert _call(agent, wire.HANDOVER, BOOT, {"token": FIRST})[0] == 200  # still free


def test_a_pod_made_for_its_sandbox_refuses_every_hand_over(tmp_path: Path) -> None:
    process = InProcessAgent(tmp_path).start()  # a token file, no bootstrap token
    try:
        from tests.core.agent.inprocess import TOKEN

        status, _ = _call(process, wire.HANDOVER, TOKEN, {"token": FIRST})
        assert status == wire.UNAUTHORIZED
        assert _call(process, wire.STATUS, TOKEN, path=STATUS)[0] == wire.NOT_FOUND
    finally:
        process.stop()
