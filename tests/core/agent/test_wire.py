"""The workspace agent's wire contract (``sandbox_core.agent.wire``): light to import, the table
the server serves, and an error body that reads back as the core exception it came from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_core.agent import wire
from sandbox_core.errors import (
    ChangedSinceApprovalError,
    SandboxCommitError,
    SandboxConflictError,
    SandboxError,
    SandboxStateError,
    TwoPhaseUnavailableError,
)


def test_the_contract_loads_no_aiohttp_git_psycopg_or_strategy() -> None:
    code = (
        "import sys, sandbox_core.agent.wire\n"
        "heavy = ('aiohttp', 'git', 'psycopg', 'click', 'sandbox_core.strategies.base',\n"
        "         'sandbox_core.agent.server', 'sandbox_core.agent.operations')\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "assert loaded == [], loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_agent_package_resolves_its_names_lazily() -> None:
    code = (
        "import sys, sandbox_core.agent as agent\n"
        "assert agent.TOKEN_HEADER == 'X-Sandbox-Agent-Token'\n"
        "assert agent.AgentConfig.__module__ == 'sandbox_core.agent.operations'\n"
        "assert 'aiohttp' not in sys.modules, 'aiohttp loaded before the server was asked for'\n"
        "assert callable(agent.serve) and 'aiohttp' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_server_serves_every_route_of_the_contract_and_no_other(tmp_path: Path) -> None:
    from sandbox_core.agent.operations import AgentConfig
    from sandbox_core.agent.server import Agent

    agent = Agent(AgentConfig(state_dir=tmp_path / "state", sandbox_root=tmp_path / "root"))
    try:
        served = {
            (route.method, route.resource.canonical)
            for route in agent.app().router.routes()
            if route.resource is not None and route.method != "HEAD"
        }
    finally:
        agent.worker.shutdown()
    assert served == {(route.method, route.template) for route in wire.ROUTES}
    assert len(wire.ROUTES) == len(set(wire.ROUTES))


def test_a_route_fills_in_and_quotes_its_parameters() -> None:
    assert wire.STATUS.path(sid="01J") == "/v1/sandboxes/01J"
    assert wire.RESTORE.path(cid="a/b") == "/v1/checkpoints/a%2Fb/restore"
    assert wire.WRITE.changes and wire.CLEANUP.changes and not wire.READ.changes


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (SandboxStateError("not active"), 409),
        (SandboxCommitError("conflict", conflicts=["a.txt"]), 409),
        (SandboxConflictError("merge conflict"), 409),
        (ChangedSinceApprovalError("changed", approved_digest="a1", actual_digest="b2"), 409),
        (TwoPhaseUnavailableError("cannot prepare"), 422),
        (SandboxError("failed"), 422),
    ],
)
def test_an_error_body_reads_back_as_the_core_error(raised: SandboxError, status: int) -> None:
    code, body = wire.error_reply(raised)
    assert code == status
    back = wire.core_error(wire.error_of(body))
    assert isinstance(raised, type(back))
    assert str(back) == str(raised)
    if isinstance(raised, SandboxCommitError):
        assert isinstance(back, SandboxCommitError)
        assert back.conflicts == raised.conflicts
    if isinstance(raised, ChangedSinceApprovalError):
        assert isinstance(back, ChangedSinceApprovalError)
        assert (back.approved_digest, back.actual_digest) == ("a1", "b2")


def test_the_agents_own_refusals_and_other_failures() -> None:
    assert wire.error_reply(wire.AgentError(404, "NotFound", "no such sandbox")) == (
        404,
        {"error": {"type": "NotFound", "message": "no such sandbox"}},
    )
    assert wire.error_reply(ValueError("outside the sandbox"))[0] == 422
    assert wire.error_reply(RuntimeError("boom"))[0] == 500
    assert wire.error_of({"kind": "Status"}) == {}
    assert type(wire.core_error({"type": "NotFound", "message": "gone"})) is SandboxError
