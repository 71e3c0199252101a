"""transaction_rollback on a real PostgreSQL server: connection loss and ambiguous COMMIT.

Each test gets its own schema (fixture ``postgres_schema_dsn``); mocks only inject faults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
import pytest

from sandbox_core.errors import SandboxStateError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import TransactionSandbox
from sandbox_core.strategies.transaction import db as _db

pytestmark = pytest.mark.postgres


def new_sandbox(made: list[TransactionSandbox], dsn: str, tmp_path: Path) -> TransactionSandbox:
    sandbox = TransactionSandbox("db", dsn, sandbox_root=str(tmp_path))
    made.append(sandbox)
    sandbox.create("plan")
    return sandbox


def names(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM items ORDER BY name")]


def backend_pid(sandbox: TransactionSandbox) -> int:
    return int(sandbox.execute("SELECT pg_backend_pid()")[0][0])


def test_killed_connection_is_replaced_and_the_log_replayed(
    made: list[TransactionSandbox], dsn: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, dsn, tmp_path)
    sandbox.execute("INSERT INTO items VALUES (%s)", ("a",))
    pid = backend_pid(sandbox)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # The statement on the dead connection is retried in a new, replayed transaction.
    sandbox.execute("INSERT INTO items VALUES (%s)", ("b",))
    assert sandbox.status is SandboxStatus.ACTIVE
    assert backend_pid(sandbox) != pid
    assert sandbox.execute("SELECT name FROM items ORDER BY name") == [("a",), ("b",)]
    assert names(dsn) == []
    sandbox.commit()
    assert names(dsn) == ["a", "b"]


def test_connection_lost_after_commit_landed_counts_as_committed(
    made: list[TransactionSandbox], dsn: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, dsn, tmp_path)
    sandbox.execute("INSERT INTO items VALUES (%s)", ("a",))
    real = _db.Connection.execute

    def commit_then_lose_reply(self: _db.Connection, sql: str, params: Any = None) -> Any:
        result = real(self, sql, params)
        if sql == "COMMIT":
            raise _db.DatabaseError("server closed the connection", connection_lost=True)
        return result

    with mock.patch.object(_db.Connection, "execute", commit_then_lose_reply):
        result = sandbox.commit("ambiguous")
    assert result.success is True
    assert result.metadata["already_committed"] is False
    assert sandbox.status is SandboxStatus.COMMITTED
    assert names(dsn) == ["a"]


def test_a_sandbox_committed_elsewhere_is_never_applied_twice(
    made: list[TransactionSandbox], dsn: str, tmp_path: Path
) -> None:
    first = new_sandbox(made, dsn, tmp_path)
    first.execute("INSERT INTO items VALUES (%s)", ("a",))
    record = first.to_record()  # saved while ACTIVE, as a process about to commit would
    first.commit()
    second = TransactionSandbox.reopen(record)  # e.g. the operator after a restart
    second.use_credentials(dsn)  # the record keeps no password
    made.append(second)
    assert second.commit_landed() is True
    # Replaying the log would apply "a" again: refused, without marking the sandbox errored.
    with pytest.raises(SandboxStateError, match="already committed"):
        second.execute("SELECT name FROM items")
    assert second.status is SandboxStatus.ACTIVE
    result = second.commit()
    assert result.metadata["already_committed"] is True
    assert second.status is SandboxStatus.COMMITTED
    assert names(dsn) == ["a"]
