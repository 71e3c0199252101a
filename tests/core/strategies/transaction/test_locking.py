"""Lock policy of ``transaction_rollback`` on every backend (issue 7, §3; kind of case 31).

Properties:
- the sandbox never blocks the application between its statements (SQLite WAL and rollback
  journal: no lock at all; PostgreSQL: no lock on rows the sandbox did not write);
- an outside write between a sandbox read and a sandbox write never wedges the sandbox;
- a lock held by someone else is retried with backoff, then raised as ``SandboxBusyError``
  (retryable), and the sandbox stays ACTIVE with every earlier write; it never becomes ERRORED.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from unittest import mock

import pytest

from sandbox_core.errors import SandboxBusyError, SandboxRetryableError, SandboxStatementError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import db as _db
from tests.support.dbkit import Db

APP_TIMEOUT = 0.5  # the application gives up after this long: "without waiting"


def _names(database: Db) -> list[str]:
    return [row[0] for row in database.run("SELECT name FROM t ORDER BY name")]


@pytest.fixture
def t(db: Db) -> Db:
    db.run("CREATE TABLE t (name TEXT PRIMARY KEY, v INTEGER)")
    db.run(db.sql("INSERT INTO t VALUES (?, ?)"), ("seed", 0))
    return db


def test_the_application_writes_between_two_sandbox_statements_without_waiting(t: Db) -> None:
    sandbox = t.sandbox()
    app = t.app(timeout_seconds=APP_TIMEOUT)
    assert sandbox.execute("SELECT count(*) FROM t") == [(1,)]  # a read first (case 31)
    for name in ("app-1", "app-2"):
        started = time.monotonic()
        app.execute(t.sql("INSERT INTO t VALUES (?, 1)"), (name,))
        app.execute(t.sql("UPDATE t SET v = v + 1 WHERE name = ?"), ("seed",))
        assert time.monotonic() - started < APP_TIMEOUT
        sandbox.execute(t.sql("INSERT INTO t VALUES (?, 2)"), (f"sandbox-{name}",))
    # The application's schema changes and reads are not blocked either.
    app.execute("CREATE TABLE app_side (x INTEGER)")
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.commit()
    assert _names(t) == ["app-1", "app-2", "sandbox-app-1", "sandbox-app-2", "seed"]
    assert t.run("SELECT v FROM t WHERE name = 'seed'") == [(2,)]


def test_an_outside_write_between_a_sandbox_read_and_write_never_wedges_the_sandbox(
    t: Db,
) -> None:
    sandbox = t.sandbox(timeout_seconds=3)
    for round_ in range(3):
        sandbox.execute("SELECT name, v FROM t ORDER BY name")
        t.run(t.sql("INSERT INTO t VALUES (?, 0)"), (f"app-{round_}",))  # and it finishes
        started = time.monotonic()
        sandbox.execute(t.sql("UPDATE t SET v = ? WHERE name = 'seed'"), (round_ + 10,))
        assert time.monotonic() - started < 1.0  # no stale snapshot: no busy wait, no failure
    sandbox.commit()
    assert _names(t) == ["app-0", "app-1", "app-2", "seed"]
    assert t.run("SELECT v FROM t WHERE name = 'seed'") == [(12,)]


def _hold_lock(database: Db, app: Any) -> None:
    """The application takes a lock the sandbox's next write needs, and keeps it."""
    if database.sqlite:
        app.execute("BEGIN IMMEDIATE")  # the write lock of the whole file
        app.execute("INSERT INTO t VALUES ('app-open', 0)")
    else:
        app.execute("BEGIN")
        app.execute("UPDATE t SET v = 99 WHERE name = 'seed'")  # the row lock of 'seed'


def test_a_held_lock_is_reported_busy_after_the_timeout_and_the_sandbox_stays_active(
    t: Db,
) -> None:
    sandbox = t.sandbox(timeout_seconds=0.6)
    sandbox.execute(t.sql("INSERT INTO t VALUES (?, 1)"), ("mine",))
    app = t.app()
    _hold_lock(t, app)
    started = time.monotonic()
    with pytest.raises(SandboxBusyError, match="stayed locked") as caught:
        sandbox.execute("UPDATE t SET v = 5 WHERE name = 'seed'")
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 5.0
    assert isinstance(caught.value, SandboxRetryableError) and caught.value.retryable is True
    assert not isinstance(caught.value, SandboxStatementError)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert len(sandbox.statements()) == 1  # the busy statement did not happen
    app.execute("ROLLBACK")
    # Retried once the lock is gone: the earlier write is still there.
    sandbox.execute("UPDATE t SET v = 5 WHERE name = 'seed'")
    assert sandbox.execute("SELECT name, v FROM t ORDER BY name") == [("mine", 1), ("seed", 5)]
    sandbox.commit()
    assert t.run("SELECT name, v FROM t ORDER BY name") == [("mine", 1), ("seed", 5)]


def test_a_lock_released_within_the_timeout_is_waited_for(t: Db) -> None:
    sandbox = t.sandbox(timeout_seconds=5)
    sandbox.execute(t.sql("INSERT INTO t VALUES (?, 1)"), ("mine",))
    app = t.app()
    _hold_lock(t, app)
    releaser = threading.Timer(0.4, lambda: app.execute("COMMIT"))
    releaser.start()
    try:
        sandbox.execute("UPDATE t SET v = 5 WHERE name = 'seed'")
    finally:
        releaser.join()
    sandbox.commit()
    assert t.run("SELECT v FROM t WHERE name = 'seed'") == [(5,)]
    assert sorted(_names(t)) == sorted(["mine", "seed", *(["app-open"] if t.sqlite else [])])


def test_a_commit_that_finds_the_database_locked_stays_active_and_commits_later(t: Db) -> None:
    sandbox = t.sandbox(timeout_seconds=0.6)
    sandbox.execute(t.sql("INSERT INTO t VALUES (?, 1)"), ("mine",))
    app = t.app()
    if t.sqlite:
        _hold_lock(t, app)
    else:
        # The marker insert needs the bookkeeping table; the application locks it.
        app.execute(
            "CREATE TABLE sandbox_commits (sandbox_id TEXT PRIMARY KEY, resource_id TEXT NOT "
            "NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL, statement_count INTEGER "
            "NOT NULL, message TEXT)"
        )
        app.execute("BEGIN")
        app.execute("LOCK TABLE sandbox_commits IN SHARE MODE")
    with pytest.raises(SandboxBusyError):
        sandbox.commit()
    assert sandbox.status is SandboxStatus.ACTIVE  # never ERRORED for a lock
    assert sandbox.commit_landed() is False
    app.execute("ROLLBACK")
    assert sandbox.commit().success is True
    assert sandbox.status is SandboxStatus.COMMITTED
    assert _names(t) == ["mine", "seed"]


def test_busy_answers_are_retried_with_backoff_until_they_stop(
    db_sqlite: Db,
) -> None:
    db_sqlite.run("CREATE TABLE t (name TEXT PRIMARY KEY, v INTEGER)")
    sandbox = db_sqlite.sandbox(timeout_seconds=5)
    real = _db.Connection.run
    calls = {"busy": 0}

    def busy_twice(self: _db.Connection, sql: str, *args: Any, **kwargs: Any) -> Any:
        if sql.startswith("INSERT INTO t") and calls["busy"] < 2:
            calls["busy"] += 1
            raise _db.DatabaseError("database is locked", busy=True)  # injected fault
        return real(self, sql, *args, **kwargs)

    with mock.patch.object(_db.Connection, "run", busy_twice):
        started = time.monotonic()
        sandbox.execute("INSERT INTO t VALUES ('a', 1)")
    assert calls["busy"] == 2
    assert time.monotonic() - started >= 0.05 + 0.1  # two backoff sleeps
    sandbox.commit()
    assert db_sqlite.run("SELECT name FROM t") == [("a",)]
