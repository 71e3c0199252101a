"""A database's identity reaches the plan digest through the workspace agent too (pod executor):
the agent's ``target-identity`` route reports what the original database *is* (PostgreSQL's
system identifier, the database's oid and name; never the DSN), the pod handle
(:class:`RemoteSandbox`) exposes it as the local executor's handle does, and the operator's
:class:`BoundHandle` binds its review and prepare digests to it.

Real parts: an agent process on 127.0.0.1 and the real PostgreSQL (``hack/postgres.sh``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.executors.remote import RemoteSandbox
from sandbox_operator.resources.target_identity import BoundHandle, bind_digest

from tests.support.agent import SANDBOX_ID, UID, AgentProcess
from tests.support.postgres import postgres_dsn  # noqa: F401 - the session fixture

K8S_IDENTITY = "sandbox=ns/s/uid-1"


class DirectExecutor:
    """The pod executor's ``call`` without the Pod lookup: straight to the agent process."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent

    def call(
        self, target: SandboxTarget, method: str, path: str, body: Any = None, **kw: Any
    ) -> dict[str, Any]:
        return self.agent.client().call(method, path, body, **kw)


def create(agent: AgentProcess, strategy: str, original: str) -> None:
    body = {
        "plan_id": "plan-a", "resource_id": "r", "strategy": strategy, "original": original,
        "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    agent.client().call("POST", "/v1/sandboxes", body, request_id="create-i")
    agent.client().call("POST", f"/v1/sandboxes/{SANDBOX_ID}/activate", request_id="act-i")


def handle(agent: AgentProcess, strategy: str) -> RemoteSandbox:
    """The pod executor's handle (status read now), as the plan coordinator opens one."""
    target = SandboxTarget(
        name="s", namespace="ns", uid=UID, sandbox_id=SANDBOX_ID, plan_id="plan-a",
        resource_id="r", strategy=strategy, original="",
    )  # fmt: skip
    executor = DirectExecutor(agent)
    reply = executor.call(target, "GET", f"/v1/sandboxes/{SANDBOX_ID}")
    return RemoteSandbox(executor, target, reply)  # type: ignore[arg-type]  # duck-typed


@pytest.fixture
def pg_agent(tmp_path: Path, postgres_dsn: str) -> Iterator[AgentProcess]:  # noqa: F811
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": postgres_dsn}).start()
    yield agent
    agent.stop()


def test_the_agent_reports_the_database_identity_and_the_digest_binds_it(
    pg_agent: AgentProcess,
    postgres_dsn: str,  # noqa: F811
) -> None:
    create(pg_agent, "transaction_rollback", "env:SANDBOX_SOURCE_DSN")
    remote = handle(pg_agent, "transaction_rollback")
    with psycopg.connect(postgres_dsn) as connection:
        system = connection.execute("SELECT system_identifier FROM pg_control_system()")
        system_id = str(system.fetchone()[0])  # type: ignore[index]
        row = connection.execute(
            "SELECT oid, datname FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
    identity = remote.target_identity()
    assert identity == f"database=postgresql:{system_id}/{row[0]}/{row[1]}"
    assert "sandbox:sandbox@" not in identity and "password" not in identity
    # The digest people approve names the database, at review and at prepare.
    raw = remote.review().digest
    bound = BoundHandle(remote, lambda: K8S_IDENTITY)
    assert bound.review().digest == bind_digest(f"{K8S_IDENTITY}\n{identity}", raw)
    # The same changes against another database give another digest: no replay there.
    other = identity.replace(system_id, str(int(system_id) + 1))
    assert bind_digest(f"{K8S_IDENTITY}\n{other}", raw) != bound.review().digest


def test_a_sandbox_without_a_database_reports_no_identity(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path).start()
    try:
        original = tmp_path / "orig"
        original.mkdir()
        create(agent, "copy_on_write", str(original))
        assert handle(agent, "copy_on_write").target_identity() == ""
    finally:
        agent.stop()
