"""transaction_rollback on SQLite: statement log, replay, fault translation (seed 002).

Real SQLite files in tmp_path; mocks only inject faults.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from sandbox_core import SandboxFactory
from sandbox_core.errors import (
    SandboxCreationError,
    SandboxError,
    SandboxReplayDivergedError,
    SandboxRollbackError,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import (
    STATEMENT_LOG,
    SandboxStatementError,
    TransactionSandbox,
)
from sandbox_core.strategies.transaction import replay as transaction
from sandbox_core.strategies.transaction.statement_log import StatementLog


@pytest.fixture
def database(tmp_path: Path) -> str:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE items (name TEXT UNIQUE, blob BLOB)")
    conn.commit()
    conn.close()
    return str(path)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[list[TransactionSandbox]]:
    sandboxes: list[TransactionSandbox] = []
    yield sandboxes
    for sandbox in sandboxes:
        sandbox.cleanup()


def new_sandbox(
    made: list[TransactionSandbox], database: str, tmp_path: Path, **options: str
) -> TransactionSandbox:
    sandbox = TransactionSandbox("res", database, sandbox_root=str(tmp_path / "root"), **options)
    made.append(sandbox)
    sandbox.create("plan")
    return sandbox


def rows(database: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(database)
    try:
        return conn.execute("SELECT name, blob FROM items ORDER BY name").fetchall()
    finally:
        conn.close()


def test_factory_builds_the_strategy(database: str) -> None:
    sandbox = SandboxFactory().create("transaction_rollback", "res", database)
    assert isinstance(sandbox, TransactionSandbox)
    assert sandbox.rollbackable is False


def test_named_bytes_and_many_parameters_survive_replay(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, database, tmp_path)
    sandbox.execute("INSERT INTO items VALUES (:name, :blob)", {"name": "a", "blob": b"\x00\xff"})
    sandbox.executemany("INSERT INTO items VALUES (?, ?)", [("b", None), ("c", b"x")])
    sandbox.close()  # the transaction dies; the log restores it on next use
    reopened = TransactionSandbox.reopen(sandbox.to_record())
    made.append(reopened)
    assert reopened.execute("SELECT name, blob FROM items ORDER BY name") == [
        ("a", b"\x00\xff"),
        ("b", None),
        ("c", b"x"),
    ]
    assert reopened.commit().metadata["statements"] == 2
    assert rows(database) == [("a", b"\x00\xff"), ("b", None), ("c", b"x")]


def test_reads_are_not_logged_but_writes_hidden_in_selects_are(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, database, tmp_path)
    sandbox.execute("/* report */ SELECT count(*) FROM items")
    sandbox.execute("  VALUES (1)")
    sandbox.execute("WITH n AS (SELECT 'w' AS name) INSERT INTO items (name) SELECT name FROM n")
    assert [entry["sql"][:4] for entry in sandbox.statements()] == ["WITH"]
    assert transaction._is_read_only("SELECT", "SELECT * INTO copy FROM items") is False
    assert transaction._leading_keyword("-- note\n  begin;") == "BEGIN"
    assert transaction._leading_keyword("/* x */ (SELECT 1)") == "SELECT"


def test_unloggable_parameter_is_refused_before_running(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, database, tmp_path)
    with pytest.raises(SandboxStatementError, match="cannot be recorded"):
        sandbox.execute("INSERT INTO items (name) VALUES (?)", (object(),))
    assert sandbox.execute("SELECT name FROM items") == []
    assert sandbox.statements() == []


def test_log_write_failure_undoes_the_statement(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, database, tmp_path)
    with (
        mock.patch.object(StatementLog, "append", side_effect=OSError("disk full")),
        pytest.raises(SandboxError, match="could not be recorded"),
    ):
        sandbox.execute("INSERT INTO items (name) VALUES ('lost')")
    assert sandbox.execute("SELECT name FROM items") == []
    assert sandbox.status is SandboxStatus.ACTIVE


def test_torn_last_log_line_is_ignored(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, database, tmp_path)
    sandbox.execute("INSERT INTO items (name) VALUES ('kept')")
    sandbox.close()
    log = Path(sandbox.context.sandbox_path) / STATEMENT_LOG  # type: ignore[union-attr]
    with log.open("a") as handle:
        handle.write('{"sql": "INSERT INTO items (name) VALUES (\'torn')  # process died mid-write
    assert sandbox.execute("SELECT name FROM items") == [("kept",)]


def test_replay_conflicting_with_the_original_is_refused_and_the_sandbox_stays_active(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, database, tmp_path)
    sandbox.execute("INSERT INTO items (name) VALUES ('dup')")
    sandbox.close()
    conn = sqlite3.connect(database)
    conn.execute("INSERT INTO items (name) VALUES ('dup')")  # someone else wins the unique name
    conn.commit()
    conn.close()
    # SQLite replays the log for every statement: the conflict shows at once, named.
    with pytest.raises(SandboxReplayDivergedError, match="statement 1 of 1") as caught:
        sandbox.execute("SELECT 1")
    assert caught.value.statement == 1
    assert "UNIQUE constraint failed" in str(caught.value)
    assert sandbox.status is SandboxStatus.ACTIVE
    with pytest.raises(SandboxReplayDivergedError, match="nothing was committed"):
        sandbox.commit()
    assert sandbox.status is SandboxStatus.ACTIVE
    assert sandbox.commit_landed() is False
    assert rows(database) == [("dup", None)]
    sandbox.rollback()  # start over: the log is discarded
    sandbox.execute("INSERT INTO items (name) VALUES ('redo')")
    sandbox.commit()
    assert rows(database) == [("dup", None), ("redo", None)]


def test_rollback_failure_is_translated(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, database, tmp_path)
    sandbox.execute("INSERT INTO items (name) VALUES ('a')")
    with (
        mock.patch.object(StatementLog, "replace", side_effect=OSError("read-only fs")),
        pytest.raises(SandboxRollbackError, match="read-only fs"),
    ):
        sandbox.rollback()
    assert sandbox.status is SandboxStatus.ERRORED


def test_scratch_dir_failure_is_a_creation_error(database: str, tmp_path: Path) -> None:
    sandbox = TransactionSandbox("res", database, sandbox_root=str(tmp_path / "root"))
    with (
        mock.patch.object(Path, "mkdir", side_effect=OSError("no space")),
        pytest.raises(SandboxCreationError, match="no space"),
    ):
        sandbox.create("plan")
    assert sandbox.status is SandboxStatus.ERRORED
    sandbox.cleanup()


def test_bookkeeping_table_is_configurable_and_checked(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    bad = TransactionSandbox("res", database, bookkeeping_table="x; DROP TABLE items")
    with pytest.raises(SandboxCreationError, match="invalid bookkeeping table name"):
        bad.create("plan")
    sandbox = new_sandbox(made, database, tmp_path, bookkeeping_table="plan_audit")
    sandbox.commit("audited")
    conn = sqlite3.connect(database)
    try:
        marker = conn.execute("SELECT sandbox_id, plan_id, message FROM plan_audit").fetchall()
    finally:
        conn.close()
    assert marker == [(sandbox.sandbox_id, "plan", "audited")]


def test_other_writers_are_not_blocked_after_close(
    made: list[TransactionSandbox], database: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, database, tmp_path)
    sandbox.execute("INSERT INTO items (name) VALUES ('mine')")
    sandbox.close()
    conn = sqlite3.connect(database, timeout=1)
    conn.execute("INSERT INTO items (name) VALUES ('theirs')")
    conn.commit()
    conn.close()
    sandbox.commit()
    assert [name for name, _ in rows(database)] == ["mine", "theirs"]
