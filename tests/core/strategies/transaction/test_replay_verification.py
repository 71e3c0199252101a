"""Replay verification of ``transaction_rollback`` on every backend (issue 7, §3; kind of case 32).

Property: the statement log is applied only when replaying it reproduces what the sandbox saw
(generated ids, ``RETURNING`` rows, row counts). Otherwise commit raises
``SandboxReplayDivergedError`` naming the statement, the database is unchanged, and the sandbox
stays ACTIVE. Checked after both hand-offs: ``close()`` in the same process, and ``reopen`` of
the stored record (another process).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxReplayDivergedError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import STATEMENT_LOG, TransactionSandbox
from tests.support.dbkit import Db

Handoff = Callable[[Db, TransactionSandbox], TransactionSandbox]


def _close(database: Db, sandbox: TransactionSandbox) -> TransactionSandbox:
    sandbox.close()
    return sandbox


def _reopen(database: Db, sandbox: TransactionSandbox) -> TransactionSandbox:
    record = json.loads(json.dumps(sandbox.to_record()))  # as stored on disk
    sandbox.close()
    reopened = database.track(TransactionSandbox.reopen(record))
    if not database.sqlite:
        reopened.use_credentials(database.original)  # the record keeps no password
    return reopened


@pytest.fixture(params=[_close, _reopen], ids=["close", "reopen"])
def handoff(request: pytest.FixtureRequest) -> Handoff:
    """How the sandbox's transaction dies before commit: ``close()``, or another process."""
    handler: Handoff = request.param
    return handler


def _assert_refused(sandbox: TransactionSandbox, statement: int, what: str) -> None:
    with pytest.raises(SandboxReplayDivergedError) as caught:
        sandbox.commit()
    assert caught.value.statement == statement
    assert caught.value.conflicts and caught.value.conflicts[0].startswith(f"statement {statement}")
    assert what in str(caught.value)
    assert "database is unchanged" in str(caught.value)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert sandbox.commit_landed() is False


def test_a_replay_that_reproduces_everything_commits(db: Db, handoff: Handoff) -> None:
    db.run("CREATE TABLE kv (k TEXT PRIMARY KEY, n INTEGER)")
    db.run(db.sql("INSERT INTO kv VALUES (?, ?)"), ("a", 1))
    sandbox = db.sandbox()
    assert sandbox.execute(db.sql("INSERT INTO kv VALUES (?, ?) RETURNING k, n"), ("b", 2)) == [
        ("b", 2)
    ]
    updated = sandbox.execute("UPDATE kv SET n = n * 10 WHERE k IN ('a', 'b') RETURNING n")
    assert sorted(updated) == [(10,), (20,)]
    assert sandbox.last_outcome is not None and sandbox.last_outcome["rowcount"] == 2
    sandbox.executemany(db.sql("INSERT INTO kv VALUES (?, ?)"), [("c", 3), ("d", 4)])
    sandbox.execute("DELETE FROM kv WHERE k = 'd'")
    sandbox = handoff(db, sandbox)
    db.run(db.sql("INSERT INTO kv VALUES (?, ?)"), ("app", 0))  # unrelated: changes nothing seen
    result = sandbox.commit()
    assert result.metadata["statements"] == 4
    assert db.run("SELECT k, n FROM kv ORDER BY k") == [("a", 10), ("app", 0), ("b", 20), ("c", 3)]


def test_a_generated_id_that_changes_on_replay_is_refused(db: Db, handoff: Handoff) -> None:
    db.run(f"CREATE TABLE parent ({db.id_column}, name TEXT)")
    sandbox = db.sandbox()
    sandbox.execute("INSERT INTO parent(name) VALUES ('agent')")  # no RETURNING: still an id
    assert sandbox.last_outcome is not None and sandbox.last_outcome["last_id"] == 1
    sandbox = handoff(db, sandbox)
    db.run("INSERT INTO parent(name) VALUES ('app')")  # takes id 1 (and, on PostgreSQL, 2)
    _assert_refused(sandbox, 1, "generated id")
    assert db.run("SELECT name FROM parent") == [("app",)]


def test_returning_rows_that_change_on_replay_are_refused(db: Db, handoff: Handoff) -> None:
    db.run("CREATE TABLE kv (k TEXT PRIMARY KEY, n INTEGER)")
    db.run("INSERT INTO kv VALUES ('x', 1)")
    sandbox = db.sandbox()
    sandbox.execute("INSERT INTO kv VALUES ('y', 0)")
    assert sandbox.execute("UPDATE kv SET n = n + 1 WHERE k = 'x' RETURNING n") == [(2,)]
    sandbox = handoff(db, sandbox)
    db.run("UPDATE kv SET n = 10 WHERE k = 'x'")
    _assert_refused(sandbox, 2, "returned [[11]] instead of [[2]]")
    assert db.run("SELECT k, n FROM kv ORDER BY k") == [("x", 10)]


def test_a_row_count_that_changes_on_replay_is_refused(db: Db, handoff: Handoff) -> None:
    db.run("CREATE TABLE job (k TEXT PRIMARY KEY, kind TEXT, done INTEGER)")
    db.run("INSERT INTO job VALUES ('j1', 'a', 0)")
    sandbox = db.sandbox()
    sandbox.execute("UPDATE job SET done = 1 WHERE kind = 'a'")  # the agent was told: 1 row
    sandbox = handoff(db, sandbox)
    db.run("INSERT INTO job VALUES ('j2', 'a', 0)")
    _assert_refused(sandbox, 1, "changed 2 rows instead of 1")
    assert db.run("SELECT k, done FROM job ORDER BY k") == [("j1", 0), ("j2", 0)]


def test_a_statement_that_fails_on_replay_is_refused(db: Db, handoff: Handoff) -> None:
    db.run("CREATE TABLE u (k TEXT PRIMARY KEY)")
    sandbox = db.sandbox()
    sandbox.execute("INSERT INTO u VALUES ('mine')")
    sandbox.execute("INSERT INTO u VALUES ('other')")
    sandbox = handoff(db, sandbox)
    db.run("INSERT INTO u VALUES ('other')")
    _assert_refused(sandbox, 2, "failed on replay")
    assert db.run("SELECT k FROM u") == [("other",)]


def test_after_a_refused_replay_rollback_starts_over_and_commits(db: Db) -> None:
    db.run(f"CREATE TABLE parent ({db.id_column}, name TEXT)")
    sandbox = db.sandbox()
    pid = sandbox.execute("INSERT INTO parent(name) VALUES ('agent') RETURNING id")[0][0]
    sandbox.close()
    db.run("INSERT INTO parent(name) VALUES ('app')")
    _assert_refused(sandbox, 1, f"instead of [[{pid}]]")
    sandbox.rollback()
    new_pid = sandbox.execute("INSERT INTO parent(name) VALUES ('agent') RETURNING id")[0][0]
    sandbox.commit()
    assert db.run(db.sql("SELECT name FROM parent WHERE id = ?"), (new_pid,)) == [("agent",)]


def test_sqlite_divergence_shows_at_the_next_statement_not_only_at_commit(
    db_sqlite: Db,
) -> None:
    # SQLite replays the log for every statement (no lock is held between statements).
    db_sqlite.run("CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT)")
    sandbox = db_sqlite.sandbox()
    sandbox.execute("INSERT INTO parent(name) VALUES ('agent')")
    db_sqlite.run("INSERT INTO parent(name) VALUES ('app')")
    with pytest.raises(SandboxReplayDivergedError, match="the statement did not run"):
        sandbox.execute("SELECT count(*) FROM parent")
    assert sandbox.status is SandboxStatus.ACTIVE


def test_sqlite_hidden_rowids_are_not_data_and_do_not_block_a_replay(
    db_sqlite: Db,
) -> None:
    # Without an INTEGER PRIMARY KEY the rowid is not a column (SQLite may renumber it): the
    # application inserting meanwhile changes nothing the sandbox could rely on.
    db_sqlite.run("CREATE TABLE note (body TEXT)")
    sandbox = db_sqlite.sandbox()
    sandbox.execute("INSERT INTO note VALUES ('mine')")
    assert sandbox.last_outcome is not None and sandbox.last_outcome["last_id"] is None
    db_sqlite.run("INSERT INTO note VALUES ('app')")
    sandbox.execute("INSERT INTO note VALUES ('mine too')")
    sandbox.commit()
    assert db_sqlite.run("SELECT body FROM note ORDER BY body") == [
        ("app",),
        ("mine",),
        ("mine too",),
    ]


def test_log_entries_without_a_recorded_outcome_replay_unchecked(
    db_sqlite: Db,
) -> None:
    # Logs written before outcomes were recorded still commit (as before: unchecked).
    db_sqlite.run("CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT)")
    sandbox = db_sqlite.sandbox()
    log = Path(sandbox.context.sandbox_path) / STATEMENT_LOG  # type: ignore[union-attr]
    old = {"sql": "INSERT INTO parent(name) VALUES ('old')", "params": None, "many": False}
    log.write_text(json.dumps(old) + "\n")
    db_sqlite.run("INSERT INTO parent(name) VALUES ('app')")
    sandbox.commit()
    assert db_sqlite.run("SELECT name FROM parent ORDER BY id") == [("app",), ("old",)]
