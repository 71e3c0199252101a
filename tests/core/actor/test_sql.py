"""SQL through the actor's door on local paths (issue "The actor's door", item 3): execute and
executemany with parameters, rows and columns back, row counts, bytes both ways; the statement
log as the transaction, applied at commit and nowhere before; one audit record per statement
with its kind and row count, never its text or values; a sandbox of another strategy refuses."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sandbox_core.actor.audit import AuditLog
from sandbox_core.actor.door import ActorDoor
from sandbox_core.errors import SandboxStateError, SandboxStatementError
from sandbox_core.strategies.transaction import TransactionSandbox
from tests.support.actor_files import make_sandbox


def test_sqlite_execute_executemany_rows_columns_and_commit(tmp_path: Path) -> None:
    sandbox, original = make_sandbox("transaction_rollback", tmp_path)
    door = ActorDoor(sandbox, tmp_path / "audit")
    try:
        inserted = door.sql("INSERT INTO items (name) VALUES (?)", ["one"])
        assert inserted["kind"] == "INSERT" and inserted["rowcount"] == 1
        assert inserted["last_id"] == 1 and inserted["columns"] == [] and inserted["rows"] == []
        many = door.sql(
            "INSERT INTO items (name) VALUES (:name)",
            [{"name": "two"}, {"name": "three"}, {"name": {"$bytes": "AAE="}}],
            many=True,
        )
        assert many["rowcount"] == 3
        rows = door.sql("SELECT id, name FROM items WHERE id > ? ORDER BY id", [1], max_rows=2)
        assert rows["columns"] == ["id", "name"]
        assert rows["rows"] == [[2, "two"], [3, "three"]] and rows["truncated"] is True
        blob = door.sql("SELECT name FROM items WHERE id = 4")
        assert blob["rows"] == [[{"$bytes": "AAE="}]]
        with pytest.raises(SandboxStatementError):
            door.sql("INSERT INTO nowhere VALUES (1)")
        with pytest.raises(SandboxStatementError, match="managed by the sandbox"):
            door.sql("COMMIT")
        with sqlite3.connect(original) as connection:
            assert connection.execute("SELECT count(*) FROM items").fetchone()[0] == 0
        assert len(sandbox.statements()) == 2  # the two writes, in the log
        assert sandbox.commit("actor").success
        with sqlite3.connect(original) as connection:
            names = [r[0] for r in connection.execute("SELECT name FROM items ORDER BY id")]
        assert names == ["one", "two", "three", b"\x00\x01"]
        log = AuditLog(tmp_path / "audit", sandbox.sandbox_id)
        records = [r for r in log.read()["entries"] if r["op"] == "sql"]
        assert [(r["kind"], r["rowcount"], r["many"]) for r in records] == [
            ("INSERT", 1, False), ("INSERT", 3, True), ("SELECT", 0, False), ("SELECT", 0, False),
        ]  # fmt: skip
        audit_text = log.path.read_text()
        assert "items" not in audit_text and "three" not in audit_text
    finally:
        sandbox.cleanup()


def test_a_sandbox_of_another_strategy_refuses_sql(tmp_path: Path) -> None:
    sandbox, _ = make_sandbox("copy_on_write", tmp_path)
    try:
        with pytest.raises(SandboxStateError, match="transaction_rollback sandboxes only"):
            ActorDoor(sandbox, None).sql("SELECT 1")
    finally:
        sandbox.cleanup()


@pytest.mark.postgres
def test_postgres_statements_hold_one_transaction_and_commit_verified(
    postgres_schema_dsn: str, tmp_path: Path
) -> None:
    """A serial column: each statement's generated id is what the commit's verified replay
    reproduces, because the door runs every statement in the sandbox's one open transaction."""
    with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE things (id serial PRIMARY KEY, body text, at date)")
    sandbox = TransactionSandbox("db", postgres_schema_dsn, sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan-sql")
    door = ActorDoor(sandbox, tmp_path / "audit")
    try:
        first = door.sql("INSERT INTO things (body, at) VALUES (%s, %s) RETURNING id", ["a", None])
        assert first["columns"] == ["id"] and first["rows"] == [[first["last_id"]]]
        door.sql("INSERT INTO things (body) VALUES (%(b)s)", [{"b": "b"}, {"b": "c"}], many=True)
        door.sql("UPDATE things SET at = DATE '2026-12-02' WHERE body = %s", ["b"])
        rows: dict[str, Any] = door.sql("SELECT body, at FROM things ORDER BY id")
        assert rows["columns"] == ["body", "at"]
        assert rows["rows"] == [["a", None], ["b", "2026-12-02"], ["c", None]]
        with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
            assert connection.execute("SELECT count(*) FROM things").fetchone() == (0,)
        assert sandbox.commit("actor").success
        with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
            found = connection.execute("SELECT body FROM things ORDER BY id").fetchall()
        assert [r[0] for r in found] == ["a", "b", "c"]
        log = AuditLog(tmp_path / "audit", sandbox.sandbox_id)
        kinds = [r["kind"] for r in log.read()["entries"]]
        assert kinds == ["INSERT", "INSERT", "UPDATE", "SELECT"]
    finally:
        sandbox.cleanup()
