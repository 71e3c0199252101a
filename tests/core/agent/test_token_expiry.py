"""Agent tokens expire: the agent refuses its own token with 401 ``TokenExpired`` once it has
held it longer than the lifetime the token carries, measured on the agent's clock (injected
here: the fault), and accepts the renewed token the kubelet writes into its token file without
a restart. A token without a lifetime (minted before tokens expired) never expires.

Real parts: the agent's aiohttp application on 127.0.0.1, called over HTTP, its token file.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_operator.executors.agent_client import derive_token

from sandbox_core.agent import wire
from sandbox_core.agent.tokens import TokenAges, lifetime_of
from tests.core.agent.inprocess import InProcessAgent

KEY = b"k" * 32
UID = "0b0c3d1e-1111-4222-8333-944455556666"
STATUS = wire.STATUS.path(sid="01HZX0A7Q3J0F8K2M4N6P8R0T2")


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[InProcessAgent, Clock]]:
    process = InProcessAgent(tmp_path).start()
    clock = Clock()
    process.agent.token_ages = TokenAges(clock)
    yield process, clock
    process.stop()


def _call(agent: InProcessAgent, token: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(  # noqa: S310 - a local test URL
        agent.url + STATUS, headers={wire.AUTHORIZATION_HEADER: f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read()).get("error") or {}


def test_a_token_held_past_its_lifetime_is_refused_and_a_renewed_one_accepted(
    agent: tuple[InProcessAgent, Clock], tmp_path: Path
) -> None:
    process, clock = agent
    token = derive_token(KEY, UID, serial=7, lifetime_seconds=100)
    assert lifetime_of(token) == 100 and token.startswith("v2.7.100.")
    (tmp_path / "token").write_text(token + "\n")
    # Valid: past the token check (no such sandbox: 404, not 401).
    assert _call(process, token)[0] == wire.NOT_FOUND
    clock.now += 99
    assert _call(process, token)[0] == wire.NOT_FOUND
    clock.now += 2  # held 101 s > 100 s
    status, error = _call(process, token)
    assert status == wire.UNAUTHORIZED
    assert error["type"] == wire.TOKEN_EXPIRED == "TokenExpired"
    assert "expired: held 101 s, lifetime 100 s" in error["message"]
    assert token not in json.dumps(error)
    # Another token is refused as not this Pod's, expired or not.
    wrong = derive_token(b"w" * 32, UID, serial=7, lifetime_seconds=100)
    assert _call(process, wrong) == (wire.UNAUTHORIZED, {
        "type": "Unauthorized", "message": "bad or no token",
    })  # fmt: skip
    # The kubelet writes the renewed token: accepted at once, its lifetime from now.
    renewed = derive_token(KEY, UID, serial=8, lifetime_seconds=100)
    (tmp_path / "token").write_text(renewed)
    assert _call(process, renewed)[0] == wire.NOT_FOUND
    assert _call(process, token)[0] == wire.UNAUTHORIZED  # the old one is no longer the file's
    clock.now += 100
    assert _call(process, renewed)[0] == wire.NOT_FOUND
    clock.now += 1
    assert _call(process, renewed)[1]["type"] == wire.TOKEN_EXPIRED


def test_a_token_without_a_lifetime_never_expires(
    agent: tuple[InProcessAgent, Clock], tmp_path: Path
) -> None:
    process, clock = agent
    legacy = derive_token(KEY, UID)
    assert lifetime_of(legacy) is None and len(legacy) == 64
    (tmp_path / "token").write_text(legacy)
    assert _call(process, legacy)[0] == wire.NOT_FOUND
    clock.now += 10**9
    assert _call(process, legacy)[0] == wire.NOT_FOUND


def test_the_lifetime_runs_on_the_agents_clock_not_the_minters() -> None:
    # The serial is a label from the operator's clock; the age is counted from the first sight.
    clock = Clock()
    ages = TokenAges(clock)
    far_future = derive_token(KEY, UID, serial=10**9, lifetime_seconds=60).encode()
    far_past = derive_token(KEY, UID, serial=0, lifetime_seconds=60).encode()
    assert ages.expired(far_future) is None and ages.expired(far_past) is None
    clock.now += 61
    assert ages.expired(far_future) == (61.0, 60)
    assert ages.expired(far_past) == (61.0, 60)
    # Malformed tokens carry no lifetime.
    assert lifetime_of("v2.1.x.abc") is None and lifetime_of("v3.1.5.abc") is None
