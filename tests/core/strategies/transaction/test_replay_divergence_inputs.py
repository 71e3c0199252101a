"""verify7: new inputs against the transaction_rollback replay promise of issue 7
(docs/transaction-strategy.md: "Replay of the statement log is only applied when it reproduces
what the sandbox saw"). Real SQLite files (WAL and rollback journal) and a real PostgreSQL.

What holds (plain tests): SQLite ``AUTOINCREMENT`` ids burnt by the application between the
sandbox's insert and its commit are caught as a divergence, in both journal modes; an upsert that
inserted in the sandbox but would update on replay is a divergence (what each statement wrote is
recorded and compared: ``Result.effects``); a write made by a function called from a ``SELECT``
is logged and survives a reconnect (test_replay_effects.py checks the kind on every backend).

A key computed from data (``max(id) + 1``) in a table whose key is not the rowid is recorded
with the insert and compared on replay, so an application row taking that key is a divergence,
not a re-linked child.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import psycopg
import pytest

from sandbox_core.errors import SandboxReplayDivergedError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import TransactionSandbox

JOURNALS = [pytest.param("wal", id="wal"), pytest.param("delete", id="rollback-journal")]


def sqlite_db(path: Path, journal: str, schema: str) -> Path:
    connection = sqlite3.connect(path)
    connection.execute(f"PRAGMA journal_mode={journal}")
    connection.executescript(schema)
    connection.commit()
    connection.close()
    return path


def app_write(path: Path, *statements: str) -> None:
    """The application's own writes, committed between the sandbox's statements."""
    connection = sqlite3.connect(path)
    for sql in statements:
        connection.execute(sql)
    connection.commit()
    connection.close()


def rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


@pytest.mark.parametrize("journal", JOURNALS)
def test_autoincrement_id_burnt_by_the_application_is_a_divergence(
    tmp_path: Path, journal: str
) -> None:
    """AUTOINCREMENT never reuses an id: the application inserting and deleting a row moves
    sqlite_sequence, so the replayed insert gets another id than the child refers to."""
    path = sqlite_db(tmp_path / "app.db", journal,
                     "CREATE TABLE parent(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT);"
                     "CREATE TABLE child(id INTEGER PRIMARY KEY, parent_id INTEGER);")  # fmt: skip
    sandbox = TransactionSandbox("db", str(path), sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan-ai")
    sandbox.execute("INSERT INTO parent(name) VALUES ('sandbox')")
    parent_id = sandbox.last_outcome["last_id"]
    sandbox.execute("INSERT INTO child(parent_id) VALUES (?)", (parent_id,))
    app_write(path, "INSERT INTO parent(name) VALUES ('app')", "DELETE FROM parent")

    with pytest.raises(SandboxReplayDivergedError):
        sandbox.commit()

    assert sandbox.status is SandboxStatus.ACTIVE
    assert rows(path, "SELECT * FROM parent") == []
    assert rows(path, "SELECT * FROM child") == []


@pytest.mark.parametrize("journal", JOURNALS)
def test_child_is_not_relinked_when_the_key_is_not_a_rowid_alias(
    tmp_path: Path, journal: str
) -> None:
    path = sqlite_db(tmp_path / "app.db", journal,
                     "CREATE TABLE orders(id INT PRIMARY KEY, who TEXT);"
                     "CREATE TABLE lines(order_id INT, item TEXT);")  # fmt: skip
    sandbox = TransactionSandbox("db", str(path), sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan-int")
    sandbox.execute(
        "INSERT INTO orders(id, who) SELECT coalesce(max(id), 0) + 1, 'sandbox' FROM orders"
    )
    (order_id,) = sandbox.execute("SELECT id FROM orders WHERE who = 'sandbox'")[0]
    sandbox.execute("INSERT INTO lines VALUES (?, 'widget')", (order_id,))
    app_write(path, "INSERT INTO orders VALUES (1, 'app')")

    with contextlib.suppress(SandboxReplayDivergedError):  # refused: then nothing landed
        sandbox.commit()
    owner = rows(path, "SELECT o.who FROM lines l JOIN orders o ON o.id = l.order_id")
    assert owner in ([], [("sandbox",)])


@pytest.mark.parametrize("journal", JOURNALS)
def test_upsert_that_inserted_in_the_sandbox_does_not_overwrite_on_replay(
    tmp_path: Path, journal: str
) -> None:
    schema = "CREATE TABLE kv(k TEXT PRIMARY KEY, v TEXT, hits INTEGER DEFAULT 0);"
    path = sqlite_db(tmp_path / "app.db", journal, schema)
    sandbox = TransactionSandbox("db", str(path), sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan-upsert")
    sandbox.execute(
        "INSERT INTO kv(k, v) VALUES ('a', 'sandbox') "
        "ON CONFLICT(k) DO UPDATE SET v = excluded.v, hits = hits + 1"
    )
    assert sandbox.execute("SELECT v, hits FROM kv") == [("sandbox", 0)]
    app_write(path, "INSERT INTO kv(k, v) VALUES ('a', 'app')")

    with pytest.raises(SandboxReplayDivergedError):
        sandbox.commit()
    assert rows(path, "SELECT v, hits FROM kv") == [("app", 0)]


def test_write_through_a_select_survives_a_reconnect(
    postgres_schema_dsn: str,
    tmp_path: Path,
) -> None:
    with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE v7_kv(k text PRIMARY KEY, v text)")
        connection.execute(
            "CREATE FUNCTION v7_put(k text, v text) RETURNS int LANGUAGE sql AS "
            "$$ INSERT INTO v7_kv VALUES (k, v); SELECT 1 $$"
        )
    sandbox = TransactionSandbox("db", postgres_schema_dsn, sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan-fn")
    try:
        sandbox.execute("INSERT INTO v7_kv VALUES ('a', '1')")
        sandbox.execute("SELECT v7_put('b', '2')")
        seen = sandbox.execute("SELECT k FROM v7_kv ORDER BY k")
        sandbox.close()  # hand-over to another process: its transaction dies, the log stays

        try:
            sandbox.commit()
        except SandboxReplayDivergedError:
            seen = []  # refused as a divergence: acceptable, then nothing may have landed
    finally:
        sandbox.cleanup()
    with psycopg.connect(postgres_schema_dsn) as connection:
        landed = connection.execute("SELECT k FROM v7_kv ORDER BY k").fetchall()
    assert landed == seen
