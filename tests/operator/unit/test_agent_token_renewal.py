"""The pod executor's tokens expire and are renewed without breaking a live Sandbox: it mints
the current window's token, still reaches an agent holding the previous window's (the kubelet
has not brought the new one yet) or one minted before tokens expired, and says "token expired"
when the agent refuses its token as held past its lifetime.

Real parts: a workspace agent process on 127.0.0.1 with its token file and a real sandbox, the
pod executor unchanged except for its Pod lookup (straight to the agent) and its clock (the
renewal window; the agent counts a token's age on its own clock, for real).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_operator.executors.agent_client import (
    AgentUnauthorized,
    derive_token,
    token_serial,
)
from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.executors.pod import PodExecutor
from sandbox_operator.settings import Settings

from sandbox_core.agent import wire
from tests.support.agent import KEY, SANDBOX_ID, UID, AgentProcess

LIFETIME = 4  # seconds: a new window every 2 s
NOW = 1_000_000.0  # the operator's clock (only labels windows)
SERIAL = token_serial(NOW, LIFETIME)

TARGET = SandboxTarget(
    name="s", namespace="ns", uid=UID, sandbox_id=SANDBOX_ID, plan_id="plan-t",
    resource_id="r", strategy="copy_on_write", original="/unused",
)  # fmt: skip


class DirectPodExecutor(PodExecutor):
    """The pod executor whose Pod lookup answers the agent process's address."""

    def __init__(self, agent: AgentProcess, key_file: Path, now: float = NOW) -> None:
        settings = Settings(
            executor="pod", agent_port=agent.port, agent_key_file=key_file,
            agent_token_lifetime_seconds=LIFETIME,
        )  # fmt: skip
        super().__init__(settings, api=None, clock=lambda: now)  # type: ignore[arg-type]

    def _ready_pod_ip(self, target: SandboxTarget) -> str:
        return "127.0.0.1"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    """An agent with one sandbox, its token file holding the previous window's token."""
    process = AgentProcess(tmp_path).start()
    original = tmp_path / "orig"
    original.mkdir()
    body = {
        "plan_id": "plan-t", "resource_id": "r", "strategy": "copy_on_write",
        "original": str(original), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    process.client().call("POST", "/v1/sandboxes", body, request_id="create-t")
    process.token_file.write_text(derive_token(KEY, UID, SERIAL - 1, LIFETIME))
    yield process
    process.stop()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    directory = tmp_path / "key"
    directory.mkdir()
    (directory / "key").write_bytes(KEY)
    return directory / "key"


def _status(executor: PodExecutor) -> str:
    return str(executor.call(TARGET, "GET", wire.STATUS.path(sid=SANDBOX_ID))["record"]["status"])


def test_the_minted_token_carries_its_window_lifetime_and_mac(
    agent: AgentProcess, key_file: Path
) -> None:
    token = DirectPodExecutor(agent, key_file).token(TARGET)
    version, serial, lifetime, mac = token.split(".")
    assert (version, int(serial), int(lifetime)) == ("v2", SERIAL, LIFETIME)
    signed = f"{UID}|{SERIAL}|{LIFETIME}".encode()
    assert mac == hmac.new(KEY, signed, hashlib.sha256).hexdigest()
    # The next window (half a lifetime later) mints another token.
    later = DirectPodExecutor(agent, key_file, NOW + LIFETIME / 2).token(TARGET)
    assert later != token and later.startswith(f"v2.{SERIAL + 1}.")


def test_renewal_keeps_the_sandbox_served_and_an_unrenewed_token_expires(
    agent: AgentProcess, key_file: Path
) -> None:
    executor = DirectPodExecutor(agent, key_file)
    # The Pod still holds the previous window's token: served.
    assert _status(executor) in ("created", "active")
    # The kubelet brings the renewed token: served, with the current window's.
    agent.token_file.write_text(executor.token(TARGET))
    assert _status(executor) in ("created", "active")
    # Nobody renews it any more: once the agent has held it for a lifetime it is refused,
    # named as expired (the token itself is never in the message).
    time.sleep(LIFETIME + 0.5)
    with pytest.raises(AgentUnauthorized, match=r"refused \(token expired\)") as refused:
        _status(executor)
    assert refused.value.expired and refused.value.retryable
    assert executor.token(TARGET) not in str(refused.value)
    # Renewed again: served again, without restarting anything.
    renewed = DirectPodExecutor(agent, key_file, NOW + LIFETIME)
    agent.token_file.write_text(renewed.token(TARGET))
    assert _status(renewed) in ("created", "active")


def test_a_token_minted_before_tokens_expired_still_reaches_its_agent(
    agent: AgentProcess, key_file: Path
) -> None:
    agent.token_file.write_text(derive_token(KEY, UID))
    assert _status(DirectPodExecutor(agent, key_file)) in ("created", "active")
