"""Cases 31 and 32 (shared/cases), as written, with the right outcome asserted (issue 7, §3).

The kinds they sample are tested broadly in test_locking.py and test_replay_verification.py.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from sandbox_core import SandboxFactory
from sandbox_core.errors import SandboxReplayDivergedError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import TransactionSandbox


def _case31_database(tmp_path: Path, journal_mode: str) -> str:
    path = str(tmp_path / "app.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute(f"PRAGMA journal_mode={journal_mode}")
    c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    c.execute("INSERT INTO t(v) VALUES ('seed')")
    c.close()
    return path


def _values(path: str) -> list[str]:
    c = sqlite3.connect(path)
    try:
        return [row[0] for row in c.execute("SELECT v FROM t ORDER BY id")]
    finally:
        c.close()


def test_case_31_an_outside_write_after_a_sandbox_read_does_not_wedge_the_wal_sandbox(
    tmp_path: Path,
) -> None:
    db = _case31_database(tmp_path, "wal")
    s = SandboxFactory().create(
        "transaction_rollback", "r", db, sandbox_root=str(tmp_path / "root"), timeout_seconds=3
    )
    assert isinstance(s, TransactionSandbox)
    try:
        s.create("p31")
        assert s.execute("SELECT count(*) FROM t") == [(1,)]  # 1. the agent reads first
        app = sqlite3.connect(db, isolation_level=None, timeout=3)
        app.execute("INSERT INTO t(v) VALUES ('app')")  # 2. the application writes
        app.close()
        started = time.monotonic()
        s.execute("INSERT INTO t(v) VALUES ('sandbox')")  # 3. succeeds at once
        assert time.monotonic() - started < 1.0
        result = s.commit()  # 4.
        assert result.success is True
        assert s.status is SandboxStatus.COMMITTED
        assert _values(db) == ["seed", "app", "sandbox"]
    finally:
        s.cleanup()


def test_case_31_related_the_rollback_journal_sandbox_holds_no_read_lock_between_statements(
    tmp_path: Path,
) -> None:
    db = _case31_database(tmp_path, "delete")
    s = TransactionSandbox("r", db, sandbox_root=str(tmp_path / "root"), timeout_seconds=3)
    try:
        s.create("p31")
        s.execute("SELECT count(*) FROM t")
        app = sqlite3.connect(db, isolation_level=None, timeout=3)
        started = time.monotonic()
        app.execute("INSERT INTO t(v) VALUES ('app')")  # was: "database is locked" after 3 s
        app.close()
        assert time.monotonic() - started < 1.0
        s.execute("INSERT INTO t(v) VALUES ('sandbox')")
        s.commit()
        assert _values(db) == ["seed", "app", "sandbox"]
    finally:
        s.cleanup()


def test_case_32_sqlite_replay_that_would_relink_a_child_to_another_parent_is_refused(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "app.db")
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("CREATE TABLE parent(id INTEGER PRIMARY KEY, name TEXT)")
    c.execute(
        "CREATE TABLE child(id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent(id), "
        "note TEXT)"
    )
    c.close()
    s = SandboxFactory().create("transaction_rollback", "r", db, sandbox_root=str(tmp_path / "r"))
    assert isinstance(s, TransactionSandbox)
    try:
        s.create("p32")
        pid = s.execute("INSERT INTO parent(name) VALUES ('agent-parent') RETURNING id")[0][0]
        assert pid == 1
        s.execute("INSERT INTO child(parent_id, note) VALUES (?, 'mine')", (pid,))
        s.close()
        app = sqlite3.connect(db, isolation_level=None)
        app.execute("INSERT INTO parent(name) VALUES ('app-parent')")  # gets id 1
        app.close()
        with pytest.raises(SandboxReplayDivergedError) as caught:
            s.commit()
        message = str(caught.value)
        assert caught.value.statement == 1
        assert "INSERT INTO parent(name) VALUES ('agent-parent') RETURNING id" in message
        assert "generated id 2 instead of 1" in message
        assert "database is unchanged" in message
        assert s.status is SandboxStatus.ACTIVE  # usable: roll back and redo
        c = sqlite3.connect(db)
        try:
            assert c.execute("SELECT id, name FROM parent").fetchall() == [(1, "app-parent")]
            assert c.execute("SELECT count(*) FROM child").fetchone() == (0,)
        finally:
            c.close()
        assert s.commit_landed() is False
    finally:
        s.cleanup()


@pytest.mark.postgres
@pytest.mark.parametrize("foreign_key", [False, True], ids=["no-fk", "fk"])
def test_case_32_postgres_replay_after_close_never_dangles_a_child(
    postgres_schema_dsn: str,
    tmp_path: Path,
    foreign_key: bool,
) -> None:
    dsn = postgres_schema_dsn
    reference = " REFERENCES parent(id)" if foreign_key else ""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE parent(id serial PRIMARY KEY, name TEXT)")
        conn.execute(
            f"CREATE TABLE child(id serial PRIMARY KEY, parent_id INTEGER{reference}, note TEXT)"
        )
    s = SandboxFactory().create("transaction_rollback", "r", dsn, sandbox_root=str(tmp_path))
    assert isinstance(s, TransactionSandbox)
    try:
        s.create("p32")
        pid = s.execute("INSERT INTO parent(name) VALUES ('agent-parent') RETURNING id")[0][0]
        assert pid == 1
        s.execute("INSERT INTO child(parent_id, note) VALUES (%s, 'mine')", (pid,))
        s.close()  # the transaction dies; its sequence values are gone for good
        with pytest.raises(SandboxReplayDivergedError) as caught:
            s.commit()
        assert caught.value.statement == 1  # named before the child could dangle or fail
        assert "instead of 1" in str(caught.value)
        assert s.status is SandboxStatus.ACTIVE  # not ERRORED: the work is not silently lost
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM parent").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM child").fetchone() == (0,)
        # Redo after a rollback: without a replay, the ids the agent sees are the ids committed.
        s.rollback()
        pid = s.execute("INSERT INTO parent(name) VALUES ('agent-parent') RETURNING id")[0][0]
        s.execute("INSERT INTO child(parent_id, note) VALUES (%s, 'mine')", (pid,))
        s.commit()
        with psycopg.connect(dsn) as conn:
            joined = conn.execute(
                "SELECT c.note, p.name FROM child c LEFT JOIN parent p ON p.id = c.parent_id"
            ).fetchall()
        assert joined == [("mine", "agent-parent")]
    finally:
        s.cleanup()
