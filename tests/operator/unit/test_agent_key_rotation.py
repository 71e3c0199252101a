"""Rotating the agent key keeps live Sandboxes working: the previous key's token is offered when
the current one is refused.

Real parts: a workspace agent process on 127.0.0.1 whose token file holds the token of the
previous key (a Sandbox made before the rotation), a real sandbox in it, and the pod executor
unchanged except for its Pod lookup (straight to the agent, as the other agent tests do); its
keys come from real files (the Secret's layout as a mounted volume).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.agent_client import AgentUnauthorized, derive_token
from sandbox_operator.executors.agent_keys import (
    AgentKeys,
    keys_from_secret_data,
    new_key_secret,
    read_key_files,
)
from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.executors.pod import PodExecutor
from sandbox_operator.settings import Settings

from sandbox_core.agent import wire
from tests.support.agent import KEY, SANDBOX_ID, UID, AgentProcess

NEW_KEY = b"n" * 64


class DirectPodExecutor(PodExecutor):
    """The pod executor whose Pod lookup answers the agent process's address."""

    def __init__(self, agent: AgentProcess, key_file: Path) -> None:
        settings = Settings(executor="pod", agent_port=agent.port, agent_key_file=key_file)
        super().__init__(settings, api=None)  # type: ignore[arg-type]
        self.agent_calls = 0

    def _ready_pod_ip(self, target: SandboxTarget) -> str:
        self.agent_calls += 1
        return "127.0.0.1"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    """An agent holding the token of the previous key (:data:`KEY`), with one sandbox."""
    process = AgentProcess(tmp_path).start()
    original = tmp_path / "orig"
    original.mkdir()
    (original / "f").write_text("v0\n")
    body = {
        "plan_id": "plan-k", "resource_id": "r", "strategy": "copy_on_write",
        "original": str(original), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    process.client().call("POST", "/v1/sandboxes", body, request_id="create-k")
    yield process
    process.stop()


def _keys(tmp_path: Path, current: bytes, previous: bytes | None) -> Path:
    directory = tmp_path / "key"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "key").write_bytes(current + b"\n")
    if previous is not None:
        (directory / "previous").write_bytes(previous)
    return directory / "key"


TARGET = SandboxTarget(
    name="s", namespace="ns", uid=UID, sandbox_id=SANDBOX_ID, plan_id="plan-k",
    resource_id="r", strategy="copy_on_write", original="/unused",
)  # fmt: skip


def _status(executor: PodExecutor) -> str:
    reply = executor.call(TARGET, "GET", wire.STATUS.path(sid=SANDBOX_ID))
    return str(reply["record"]["status"])


def test_after_a_rotation_the_previous_keys_token_still_reaches_the_agent(
    agent: AgentProcess, tmp_path: Path
) -> None:
    executor = DirectPodExecutor(agent, _keys(tmp_path, NEW_KEY, KEY))
    assert executor.keys() == AgentKeys(NEW_KEY, KEY)
    # New Sandboxes get the new key's token (of the current renewal window).
    token = executor.token(TARGET)
    _, serial, lifetime, _ = token.split(".")
    assert token == derive_token(NEW_KEY, UID, int(serial), int(lifetime))
    assert _status(executor) in ("created", "active")
    # The accepted key is remembered: the next call offers it first (one Pod lookup per call).
    calls = executor.agent_calls
    assert _status(executor) in ("created", "active")
    assert executor.agent_calls == calls + 1


def test_without_the_previous_key_the_old_token_is_refused(
    agent: AgentProcess, tmp_path: Path
) -> None:
    executor = DirectPodExecutor(agent, _keys(tmp_path, NEW_KEY, None))
    with pytest.raises(AgentUnauthorized) as refused:
        _status(executor)
    assert refused.value.retryable
    # A wrong previous key is no better, and neither key appears in the message.
    wrong = DirectPodExecutor(agent, _keys(tmp_path / "w", NEW_KEY, b"w" * 64))
    with pytest.raises(AgentUnauthorized) as again:
        _status(wrong)
    assert "n" * 16 not in str(again.value) and "w" * 16 not in str(again.value)


def test_the_key_before_any_rotation_works_alone(agent: AgentProcess, tmp_path: Path) -> None:
    executor = DirectPodExecutor(agent, _keys(tmp_path, KEY, None))
    assert _status(executor) in ("created", "active")


def test_key_sources_refuse_empty_keys_and_make_random_ones(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    empty = tmp_path / "a" / "key"
    empty.write_text("\n")
    with pytest.raises(ExecutorError, match="is empty") as refused:
        read_key_files(empty)
    assert not refused.value.retryable
    with pytest.raises(ExecutorError, match="unreadable"):
        read_key_files(tmp_path / "missing")
    (tmp_path / "a" / "key").write_text("k1")
    (tmp_path / "a" / "previous").write_text("")
    with pytest.raises(ExecutorError, match="previous"):
        read_key_files(empty)

    def b64(value: bytes) -> str:
        return base64.b64encode(value).decode()

    assert keys_from_secret_data({"key": b64(b"k1\n")}, "s") == AgentKeys(b"k1")
    both = keys_from_secret_data({"key": b64(b"k1"), "previous": b64(b"k0")}, "s")
    assert both == AgentKeys(b"k1", b"k0") and both.all() == (b"k1", b"k0")
    with pytest.raises(ExecutorError, match="key of Secret s is empty"):
        keys_from_secret_data({"other": b64(b"x")}, "s")
    one, two = (new_key_secret("ns", "k", {"a": "b"}) for _ in range(2))
    assert one["stringData"]["key"] != two["stringData"]["key"]
    assert len(one["stringData"]["key"]) == 64 and one["metadata"]["labels"] == {"a": "b"}
