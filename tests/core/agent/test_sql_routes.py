"""SQL through a real workspace agent (issue "The actor's door", item 3): statements run in the
sandbox's transaction, held by the agent between requests (nothing re-opened behind its back:
a PostgreSQL serial's generated ids survive the commit's verified replay), rows and columns
back, the statement log applied by the agent's commit and nowhere before, refusals as HTTP
statuses, the DSN never echoed, one audit record per statement."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sandbox_operator.executors.agent_client import AgentRefused

from sandbox_core.actor.audit import AuditLog
from sandbox_core.agent import wire
from tests.support.agent import SANDBOX_ID, AgentProcess
from tests.support.gitrepo import make_repo

SID = wire.STATUS.path(sid=SANDBOX_ID)
SQL = wire.SQL.path(sid=SANDBOX_ID)


def create(agent: AgentProcess, strategy: str, original: str) -> None:
    body = {
        "plan_id": "p", "resource_id": "db", "strategy": strategy,
        "original": original, "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    agent.client().call("POST", wire.CREATE.template, body, request_id="create")


@pytest.fixture
def sqlite_agent(tmp_path: Path) -> Iterator[tuple[AgentProcess, Path]]:
    database = tmp_path / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": f"sqlite:///{database}"}).start()
    create(agent, "transaction_rollback", "env:SANDBOX_SOURCE_DSN")
    yield agent, database
    agent.stop()


def test_sqlite_statements_through_the_agent_commit_once(
    sqlite_agent: tuple[AgentProcess, Path],
) -> None:
    agent, database = sqlite_agent
    client = agent.client()
    one = client.call(
        "POST", SQL, {"sql": "INSERT INTO notes (body) VALUES (?)", "params": ["one"]},
        request_id="s-1",
    )  # fmt: skip
    assert one["kind"] == "INSERT" and one["rowcount"] == 1 and one["last_id"] == 1
    again = client.call(
        "POST", SQL, {"sql": "INSERT INTO notes (body) VALUES (?)", "params": ["one"]},
        request_id="s-1",
    )  # fmt: skip
    assert again == one  # a retried request id is a replay: inserted once
    many = client.call(
        "POST", SQL,
        {"sql": "INSERT INTO notes (body) VALUES (?)", "params": [["two"], ["three"]],
         "many": True},
        request_id="s-2",
    )  # fmt: skip
    assert many["rowcount"] == 2
    rows = client.call(
        "POST", SQL, {"sql": "SELECT id, body FROM notes ORDER BY id"}, request_id="s-3"
    )
    assert rows["columns"] == ["id", "body"]
    assert rows["rows"] == [[1, "one"], [2, "two"], [3, "three"]]
    with pytest.raises(AgentRefused) as refused:
        client.call("POST", SQL, {"sql": "INSERT INTO nowhere VALUES (1)"}, request_id="s-4")
    assert refused.value.error_type == "SandboxStatementError"
    with pytest.raises(AgentRefused, match="sql is needed"):
        client.call("POST", SQL, {"params": []}, request_id="s-5")
    with sqlite3.connect(database) as connection:
        assert connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    committed = client.call("POST", f"{SID}/commit", {"message": "m"}, request_id="commit")
    assert committed["result"]["success"] is True
    with sqlite3.connect(database) as connection:
        bodies = [r[0] for r in connection.execute("SELECT body FROM notes ORDER BY id")]
    assert bodies == ["one", "two", "three"]
    records = AuditLog(agent.work / "state", SANDBOX_ID).read()["entries"]
    assert [(r["kind"], r["rowcount"]) for r in records] == [
        ("INSERT", 1), ("INSERT", 2), ("SELECT", 0),
    ]  # fmt: skip
    assert f"sqlite:///{database}" not in repr(rows) + repr(committed)


def test_sql_in_a_sandbox_of_another_strategy_is_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "x\n"})
    agent = AgentProcess(tmp_path).start()
    try:
        create(agent, "copy_on_write", str(repo))
        with pytest.raises(AgentRefused) as refused:
            agent.client().call("POST", SQL, {"sql": "SELECT 1"}, request_id="q")
        assert refused.value.error_type == "SandboxStateError"
    finally:
        agent.stop()


@pytest.mark.postgres
def test_postgres_statements_share_the_agents_one_transaction(
    tmp_path: Path, postgres_schema_dsn: str
) -> None:
    """The agent keeps the sandbox open between requests: one server backend serves every
    statement, and generated ids (a serial) are what the commit's verified replay gets again
    (re-opening per request would replay the log into a new transaction and diverge)."""
    with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE things (id serial PRIMARY KEY, body text)")
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": postgres_schema_dsn}).start()
    try:
        create(agent, "transaction_rollback", "env:SANDBOX_SOURCE_DSN")
        client = agent.client()
        pids, ids = set(), []
        for index in range(3):
            inserted = client.call(
                "POST", SQL,
                {"sql": "INSERT INTO things (body) VALUES (%s) RETURNING id, pg_backend_pid()",
                 "params": [f"row {index}"]},
                request_id=f"insert-{index}",
            )  # fmt: skip
            assert inserted["columns"] == ["id", "pg_backend_pid"]
            ids.append(inserted["rows"][0][0])
            pids.add(inserted["rows"][0][1])
        assert len(pids) == 1 and ids == sorted(ids)
        with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
            assert connection.execute("SELECT count(*) FROM things").fetchone() == (0,)
        committed = client.call("POST", f"{SID}/commit", {"message": "m"}, request_id="commit")
        assert committed["result"]["success"] is True
        with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
            found = connection.execute("SELECT id, body FROM things ORDER BY id").fetchall()
        assert found == [(ids[i], f"row {i}") for i in range(3)]
        assert postgres_schema_dsn not in repr(committed)
    finally:
        agent.stop()
