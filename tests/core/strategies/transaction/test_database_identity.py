"""What a database sandbox's original *is* (docs/approvals.md, "What the digest binds"): the
identity approvals are bound to. Another database under the same DSN name, or another SQLite
file at the same path, answers differently; the identity is the server's system identifier and
the database's oid and name, never a DSN."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import psycopg
import pytest

from sandbox_core.strategies.transaction import TransactionSandbox


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    return path


def test_a_sqlite_file_replaced_at_the_same_path_is_another_database(
    sqlite_file: Path, tmp_path: Path
) -> None:
    sandbox = TransactionSandbox("db", str(sqlite_file), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("plan-id")
    try:
        before = sandbox.target_identity()
        assert before == sandbox.target_identity()
        assert before.startswith(f"database=sqlite:{sqlite_file.resolve()}:")
        sqlite_file.rename(tmp_path / "old.db")
        with sqlite3.connect(sqlite_file) as connection:
            connection.execute("CREATE TABLE notes (body TEXT)")
        assert sandbox.target_identity() != before
    finally:
        sandbox.cleanup()


def test_a_postgresql_database_is_its_server_and_oid(postgres_dsn: str, tmp_path: Path) -> None:
    other = psycopg.conninfo.make_conninfo(postgres_dsn, dbname="postgres")
    identities = []
    for index, dsn in enumerate((postgres_dsn, other)):
        sandbox = TransactionSandbox("db", dsn, sandbox_root=str(tmp_path / f"sbx{index}"))
        sandbox.create("plan-id")
        try:
            identities.append(sandbox.target_identity())
        finally:
            sandbox.cleanup()
    with psycopg.connect(postgres_dsn) as connection:
        row = connection.execute(
            "SELECT system_identifier::text, (SELECT oid::text FROM pg_database WHERE datname"
            " = current_database()), current_database() FROM pg_control_system()"
        ).fetchone()
    assert row is not None
    assert identities[0] == f"database=postgresql:{row[0]}/{row[1]}/{row[2]}"
    # The same server (system identifier), another database (oid and name).
    assert re.fullmatch(rf"database=postgresql:{row[0]}/\d+/postgres", identities[1])
    assert identities[0] != identities[1]
