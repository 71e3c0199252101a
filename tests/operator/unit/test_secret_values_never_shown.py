"""Nothing read from a Secret is ever shown, whatever its key (docs/security.md, "Secrets").

A ``secretRef`` may name any key of a Secret: a DSN, but also a private key (``tls.key``) or a
token. Random values of several shapes go through the real error paths (the operator's Sandbox
logic with the local executor, the workspace agent's create) and no status, Event, log line or
agent reply may carry the value, its stripped form or any of its lines of meaningful length.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import kopf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_operator.executors.local import LocalExecutor
from sandbox_operator.kube import redaction
from sandbox_operator.resources.sandbox import SandboxLogic
from sandbox_operator.settings import Settings

from sandbox_core.agent import wire
from sandbox_core.agent.operations import AgentConfig, Operations
from sandbox_core.agent.server import HideSecrets
from sandbox_core.redaction import MIN_LINE_SCRUB_LENGTH, scrub, secret_forms

UID = "0b9f7c1e-5d3a-4c55-9e0a-2d7b9c41f0aa"
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
URLSAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@st.composite
def pem_blocks(draw: st.DrawFn) -> str:
    lines = draw(st.lists(st.text(B64, min_size=16, max_size=64), min_size=1, max_size=6))
    body = "\n".join(lines)
    return f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"


@st.composite
def tokens(draw: st.DrawFn) -> str:
    return draw(st.text(URLSAFE, min_size=12, max_size=80)) + draw(st.sampled_from(["\n", "\r\n"]))


@st.composite
def dsns(draw: st.DrawFn) -> str:
    """A DSN libpq refuses at once (its socket directory does not exist)."""
    password = draw(st.text(URLSAFE, min_size=12, max_size=40))
    tail = draw(st.sampled_from(["", "\n"]))
    return f"host=/nonexistent/{password[:6]} dbname=app user=app password={password}{tail}"


SECRET_VALUES = st.one_of(pem_blocks(), tokens(), dsns())


def shown_pieces(value: str) -> list[str]:
    """What must never appear: the value, stripped, and each line of meaningful length."""
    pieces = {value, value.strip()}
    pieces |= {line.strip() for line in value.splitlines()}
    if "password=" in value:
        pieces.add(value.split("password=", 1)[1].strip())
    return sorted(p for p in pieces if len(p) >= MIN_LINE_SCRUB_LENGTH)


class SecretReader:
    """The one API call the Secret path makes (``secret_value``), answering ``value``."""

    def __init__(self, value: str) -> None:
        self.value = value

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        return self.value


def sandbox_body(key: str) -> dict[str, Any]:
    return {
        "apiVersion": "sandbox.example.com/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "db", "namespace": "ns", "uid": UID, "generation": 1},
        "spec": {
            "planId": "p",
            "resourceId": "r",
            "strategy": "transaction_rollback",
            "source": {"secretRef": {"name": "creds", "key": key}},
        },
    }


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.handler.addFilter(redaction.ScrubFilter())  # the operator's handlers carry it
    caplog.set_level(logging.DEBUG)
    return caplog


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=SECRET_VALUES, key=st.sampled_from(["tls.key", "token", "dsn"]))
def test_no_secret_value_in_status_events_or_logs(
    logs: pytest.LogCaptureFixture, value: str, key: str
) -> None:
    logs.clear()
    events: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Settings(state_dir=Path(tmp) / "state", sandbox_root=Path(tmp) / "sandboxes")
        logic = SandboxLogic(
            config,
            LocalExecutor(config),
            SecretReader(value),  # type: ignore[arg-type]
            lambda body, type_, reason, message: events.append(f"{type_} {reason} {message}"),
        )
        patch: dict[str, Any] = {}
        with pytest.raises(Exception) as raised:
            logic.provision(sandbox_body(key), patch)
    visible = json.dumps(patch) + json.dumps(events) + logs.text + str(raised.value)
    assert "Degraded" in json.dumps(patch) and events, (patch, events)
    for piece in shown_pieces(value):
        assert piece not in visible, (piece, visible)


def test_a_value_that_is_not_a_dsn_is_refused_by_secret_and_key() -> None:
    value = (
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    )
    with tempfile.TemporaryDirectory() as tmp:
        config = Settings(state_dir=Path(tmp) / "state", sandbox_root=Path(tmp) / "sandboxes")
        logic = SandboxLogic(
            config,
            LocalExecutor(config),
            SecretReader(value),
            lambda *a: None,  # type: ignore[arg-type]
        )
        patch: dict[str, Any] = {}
        with pytest.raises(kopf.PermanentError):
            logic.provision(sandbox_body("tls.key"), patch)
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Degraded")
    assert "the value of key 'tls.key' in Secret ns/creds is not a DSN" in ready["message"]
    assert patch["status"]["phase"] == "Errored"


@settings(max_examples=40, deadline=None)
@given(value=SECRET_VALUES)
def test_the_agent_never_replies_with_the_value(value: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = AgentConfig(
            state_dir=Path(tmp) / "state",
            sandbox_root=Path(tmp) / "sandboxes",
            environ={wire.SOURCE_DSN_ENV: value},
        )
        ops = Operations(config)
        body = {
            "plan_id": "p",
            "resource_id": "r",
            "strategy": "transaction_rollback",
            "original": wire.ENV_REF + wire.SOURCE_DSN_ENV,
        }
        try:
            reply: Any = ops.hide(ops.create(body))
        except Exception as exc:  # the agent's one error table
            reply = ops.hide(wire.error_reply(exc)[1])
    text = json.dumps(reply)
    for piece in shown_pieces(value):
        assert piece not in text, (piece, text)


@given(value=SECRET_VALUES)
def test_every_form_of_a_secret_is_scrubbed_from_free_text(value: str) -> None:
    stripped = value.strip()
    message = (
        f"a {value} b {stripped} c {base64.b64encode(value.encode()).decode()} "
        f"d {base64.b64encode(stripped.encode()).decode()} e "
        + " ".join(line for line in value.splitlines())
    )
    cleaned = scrub(message, (value,))
    for piece in shown_pieces(value):
        assert piece not in cleaned
    assert base64.b64encode(stripped.encode()).decode().rstrip("=") not in cleaned
    assert secret_forms(value)  # never empty for these shapes


@given(value=SECRET_VALUES)
def test_the_agents_log_lines_hide_every_form_of_the_value(value: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = AgentConfig(
            state_dir=Path(tmp) / "state",
            sandbox_root=Path(tmp) / "sandboxes",
            environ={wire.SOURCE_DSN_ENV: value},
        )
        hide = HideSecrets(Operations(config))
    lines = value.splitlines()

    def fail() -> None:
        raise RuntimeError(f"failed on {lines[-1]!s} and {value.strip()}")

    try:
        fail()
    except RuntimeError:
        record = logging.LogRecord(
            "sandbox_core.agent", logging.ERROR, __file__, 1, "bad %s", (value,), sys.exc_info()
        )
    assert hide.filter(record)
    text = record.getMessage() + (record.exc_text or "")
    for piece in shown_pieces(value):
        assert piece not in text
    assert wire.ENV_REF + wire.SOURCE_DSN_ENV in text
