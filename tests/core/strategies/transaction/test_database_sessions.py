"""Database sessions as they really are (docs/transaction-strategy.md, "Database sessions"):
constraints checked at COMMIT, sequences, the database's default isolation, full-text tables,
temporary tables and large objects, on the real PostgreSQL server and real SQLite files.

Cases 47 (a deferred foreign key violated at COMMIT), 48 (``setval`` in a rolled-back sandbox)
and 52 (SQLite FTS4/FTS5 tables and the sandbox's own replay).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sandbox_core.errors import (
    SandboxConflictError,
    SandboxStatementError,
)
from sandbox_core.host.manager import PlanCommitMode, SandboxManager
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.factory import SandboxFactory
from sandbox_core.strategies.transaction import TransactionSandbox
from tests.support.dbkit import Db

# -- case 47: a constraint checked at COMMIT ------------------------------------------------------

DEFERRED_SCHEMA = (
    "CREATE TABLE parent(id int PRIMARY KEY)",
    "CREATE TABLE child(id int PRIMARY KEY, "
    "pid int REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)",
)


def _deferred_schema(db: Db) -> None:
    for sql in DEFERRED_SCHEMA:
        db.run(sql)


def _fks_on(db: Db, sandbox: TransactionSandbox) -> None:
    if db.sqlite:  # SQLite enforces foreign keys only when the connection turns them on
        sandbox.execute("PRAGMA foreign_keys = ON")


def _expected_conflict(db: Db) -> str:
    return "child row 1 -> parent" if db.sqlite else "child_pid_fkey"


def test_case_47_deferred_fk_violated_at_commit_keeps_the_sandbox_active(db: Db) -> None:
    """Case 47, one-shot: the commit is refused naming the constraint, nothing lands, the
    sandbox stays ACTIVE with its log, and commits once the parent is inserted."""
    _deferred_schema(db)
    sandbox = db.sandbox("p47")
    _fks_on(db, sandbox)
    sandbox.execute("INSERT INTO child VALUES (1, 7)")
    logged = sandbox.statements()
    with pytest.raises(SandboxConflictError) as refused:
        sandbox.commit()
    assert refused.value.conflicts
    assert _expected_conflict(db) in refused.value.conflicts[0]
    assert _expected_conflict(db) in str(refused.value)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert sandbox.statements() == logged
    assert db.run("SELECT * FROM child") == []
    assert not sandbox.commit_landed()
    sandbox.execute("INSERT INTO parent VALUES (7)")
    sandbox.commit()
    assert db.run("SELECT * FROM child") == [(1, 7)]
    assert db.run("SELECT * FROM parent") == [(7,)]


@pytest.mark.parametrize("mode", ["saga", "two_phase", "auto"])
def test_case_47_deferred_fk_in_a_plan_keeps_the_sandbox_active(
    db: Db, mode: PlanCommitMode
) -> None:
    """Case 47 through the plan commit (``commit_all``'s saga, two phases, auto): the plan
    fails naming the constraint, nothing lands, the sandbox stays ACTIVE and the plan commits
    after the fix."""
    _deferred_schema(db)
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
    sandbox = manager.get_or_create_sandbox(
        "p47", "db", db.original, "transaction_rollback", sandbox_root=str(db.root)
    )
    db.track(sandbox)
    _fks_on(db, sandbox)
    sandbox.execute("INSERT INTO child VALUES (1, 7)")
    results = manager.commit_all("p47") if mode == "saga" else manager.commit_plan("p47", mode=mode)
    assert len(results) == 1 and not results[0].success
    assert _expected_conflict(db) in str(results[0].error)
    assert any(_expected_conflict(db) in c for c in results[0].metadata["conflicts"])
    assert sandbox.status is SandboxStatus.ACTIVE
    assert db.run("SELECT * FROM child") == []
    sandbox.execute("INSERT INTO parent VALUES (7)")
    again = manager.commit_all("p47") if mode == "saga" else manager.commit_plan("p47", mode=mode)
    assert all(r.success for r in again), again
    assert db.run("SELECT * FROM child") == [(1, 7)]


@pytest.mark.postgres
def test_case_47_the_held_transaction_survives_the_refusal(db_pg: Db) -> None:
    """The refused COMMIT does not cost the held PostgreSQL transaction: ids drawn from a
    sequence before it are kept (no replay, which would draw others), in one-shot and prepare."""
    db = db_pg
    _deferred_schema(db)
    db.run("CREATE TABLE t(id serial PRIMARY KEY, v text)")
    sandbox = db.sandbox("p47")
    pid = sandbox.execute("SELECT pg_backend_pid()")[0][0]
    assert sandbox.execute("INSERT INTO t(v) VALUES ('a') RETURNING id") == [(1,)]
    db.run("INSERT INTO t(v) VALUES ('app')")  # the application draws 2
    sandbox.execute("INSERT INTO child VALUES (1, 7)")
    with pytest.raises(SandboxConflictError):
        sandbox.commit()
    with pytest.raises(SandboxConflictError, match="child_pid_fkey"):
        sandbox.prepare("tx47")
    assert sandbox.execute("SELECT pg_backend_pid()")[0][0] == pid
    sandbox.execute("INSERT INTO parent VALUES (7)")
    sandbox.commit()
    assert db.run("SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "app")]


@pytest.mark.postgres
def test_case_47_a_check_constraint_trigger_deferred_to_commit(db_pg: Db) -> None:
    """A deferred constraint trigger (not a foreign key) raising at COMMIT: refused, ACTIVE."""
    db = db_pg
    db.run("CREATE TABLE acct(id int PRIMARY KEY, balance int NOT NULL)")
    db.run(
        "CREATE FUNCTION acct_check() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF (SELECT sum(balance) FROM acct) <> 0 THEN "
        "RAISE EXCEPTION 'books do not balance' USING ERRCODE = 'check_violation', "
        "CONSTRAINT = 'acct_balanced'; END IF; RETURN NULL; END $$"
    )
    db.run(
        "CREATE CONSTRAINT TRIGGER acct_balanced AFTER INSERT OR UPDATE ON acct "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION acct_check()"
    )
    sandbox = db.sandbox()
    sandbox.execute("INSERT INTO acct VALUES (1, 10)")
    with pytest.raises(SandboxConflictError, match="books do not balance") as refused:
        sandbox.commit()
    assert refused.value.conflicts == ["acct_balanced: books do not balance"]
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.execute("INSERT INTO acct VALUES (2, -10)")
    sandbox.commit()
    assert db.run("SELECT sum(balance) FROM acct") == [(0,)]


# -- case 48: sequences ---------------------------------------------------------------------------


def _sequence(db: Db) -> tuple[Any, ...]:
    return db.run("SELECT last_value, is_called FROM t_id_seq")[0]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT setval('t_id_seq', 1)",
        "select SETVAL ( 't_id_seq'::regclass, 1, false )",
        "SELECT pg_catalog.setval('t_id_seq', 1)",
        "DO $$ BEGIN PERFORM setval('t_id_seq', 1); END $$",
        "WITH x AS (SELECT setval('t_id_seq', 1)) SELECT * FROM x",
    ],
)
def test_case_48_setval_is_refused_up_front(db_pg: Db, sql: str) -> None:
    """Case 48: ``setval`` is not transactional (it changes the application's sequence at once,
    before any rollback could undo it): refused before it runs, nothing changes."""
    db = db_pg
    db.run("CREATE TABLE t(id serial PRIMARY KEY, v text)")
    db.run("INSERT INTO t(v) VALUES ('a'), ('b'), ('c')")
    sandbox = db.sandbox()
    sandbox.execute("UPDATE t SET v = 'z' WHERE id = 3")
    with pytest.raises(SandboxStatementError, match="setval"):
        sandbox.execute(sql)
    assert _sequence(db) == (3, True)
    assert len(sandbox.statements()) == 1
    sandbox.rollback()
    assert _sequence(db) == (3, True)
    assert db.run("INSERT INTO t(v) VALUES ('app') RETURNING id") == [(4,)]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "sql",
    [
        "ALTER SEQUENCE t_id_seq RESTART WITH 1",
        "ALTER TABLE g ALTER COLUMN id RESTART WITH 1",
        "TRUNCATE t, g RESTART IDENTITY",
        "ALTER SEQUENCE t_id_seq INCREMENT BY 10",
    ],
)
def test_case_48_transactional_sequence_changes_are_undone_by_rollback(db_pg: Db, sql: str) -> None:
    """``ALTER SEQUENCE ... RESTART``, identity ``RESTART`` and ``TRUNCATE ... RESTART
    IDENTITY`` are transactional in PostgreSQL: allowed, undone by rollback, and the
    application's next insert gets the id it would have got."""
    db = db_pg
    db.run("CREATE TABLE t(id serial PRIMARY KEY, v text)")
    db.run("CREATE TABLE g(id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)")
    db.run("INSERT INTO t(v) VALUES ('a'), ('b'), ('c')")
    db.run("INSERT INTO g(v) VALUES ('a')")
    sandbox = db.sandbox()
    sandbox.execute(sql)
    sandbox.rollback()
    assert _sequence(db) == (3, True)
    assert db.run("INSERT INTO t(v) VALUES ('app') RETURNING id") == [(4,)]
    assert db.run("INSERT INTO g(v) VALUES ('app') RETURNING id") == [(2,)]


@pytest.mark.postgres
def test_case_48_values_consumed_leave_the_original_rows_alone(db_pg: Db) -> None:
    """Values a rolled-back sandbox drew are a gap, as after any rolled-back transaction: the
    application never gets a value twice and no row of the original changes."""
    db = db_pg
    db.run("CREATE TABLE t(id serial PRIMARY KEY, v text)")
    db.run("INSERT INTO t(v) VALUES ('a'), ('b'), ('c')")
    sandbox = db.sandbox()
    sandbox.execute("INSERT INTO t(v) VALUES ('x'), ('y')")
    assert sandbox.execute("SELECT nextval('t_id_seq')") == [(6,)]
    sandbox.rollback()
    assert db.run("SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b"), (3, "c")]
    assert db.run("INSERT INTO t(v) VALUES ('app') RETURNING id")[0][0] > 3


def test_sqlite_autoincrement_counter_is_rolled_back(db_sqlite: Db) -> None:
    """SQLite's only sequence (``sqlite_sequence`` of ``AUTOINCREMENT``) is a table: a
    rolled-back sandbox leaves it exactly as it was."""
    db = db_sqlite
    db.run("CREATE TABLE t(id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)")
    db.run("INSERT INTO t(v) VALUES ('a')")
    sandbox = db.sandbox()
    sandbox.execute("INSERT INTO t(v) VALUES ('x')")
    sandbox.execute("UPDATE sqlite_sequence SET seq = 100 WHERE name = 't'")
    sandbox.rollback()
    assert db.run("SELECT seq FROM sqlite_sequence") == [(1,)]
    assert db.run("INSERT INTO t(v) VALUES ('app') RETURNING id") == [(2,)]


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def db_pg(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from tests.support.dbkit import make_db

    yield from make_db(request, "postgresql", tmp_path)


def _with_options(dsn: str, extra: str) -> str:
    fields = conninfo_to_dict(dsn)
    return make_conninfo(dsn, options=f"{fields.get('options', '')} {extra}".strip())


def _sqlite_file(path: Path, script: str) -> str:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.executescript(script)
    conn.close()
    return str(path)


def _sqlite_rows(path: str, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


# -- case 52: SQLite full-text tables --------------------------------------------------------------

FTS_SCHEMA = """
CREATE VIRTUAL TABLE docs USING {fts}(title, body);
INSERT INTO docs(title, body) VALUES ('seed', 'hello world');
CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT NOT NULL, cents INT NOT NULL,
                  price REAL GENERATED ALWAYS AS (cents / 100.0) STORED) STRICT;
CREATE VIEW item_v AS SELECT id, name, cents FROM item;
CREATE TRIGGER item_v_ins INSTEAD OF INSERT ON item_v
BEGIN INSERT INTO item(name, cents) VALUES (NEW.name, NEW.cents); END;
CREATE TABLE audit(id INTEGER PRIMARY KEY, what TEXT);
CREATE TRIGGER item_audit AFTER INSERT ON item
BEGIN INSERT INTO audit(what) VALUES ('item ' || NEW.name); END;
"""

fts_versions = pytest.mark.parametrize("fts", ["fts5", "fts4"])


def _fts_db(tmp_path: Path, fts: str) -> str:
    return _sqlite_file(tmp_path / "app.db", FTS_SCHEMA.format(fts=fts))


def _fts_sandbox(path: str, tmp_path: Path) -> TransactionSandbox:
    sandbox = TransactionSandbox("db", path, sandbox_root=str(tmp_path / "root"))
    sandbox.create("p52")
    return sandbox


@fts_versions
def test_case_52_a_full_text_insert_then_other_writes_commit(tmp_path: Path, fts: str) -> None:
    """Case 52 A: an FTS insert, a MATCH query and a write to another table commit."""
    path = _fts_db(tmp_path, fts)
    sandbox = _fts_sandbox(path, tmp_path)
    try:
        sandbox.execute("INSERT INTO docs(title, body) VALUES ('agent', 'hello from agent')")
        found = sandbox.execute("SELECT title FROM docs WHERE docs MATCH 'hello'")
        assert sorted(found) == [("agent",), ("seed",)]
        sandbox.execute("INSERT INTO audit(what) VALUES ('indexed')")
        sandbox.commit()
    finally:
        sandbox.cleanup()
    assert _sqlite_rows(path, "SELECT title FROM docs WHERE docs MATCH 'agent'") == [("agent",)]
    assert _sqlite_rows(path, "SELECT what FROM audit") == [("indexed",)]


@fts_versions
def test_case_52_b_the_application_writes_the_full_text_table_meanwhile(
    tmp_path: Path, fts: str
) -> None:
    """Case 52 B: the FTS rowid is hidden (never returned to the agent): the application's
    insert between the sandbox's two inserts does not make the replay diverge."""
    path = _fts_db(tmp_path, fts)
    sandbox = _fts_sandbox(path, tmp_path)
    try:
        sandbox.execute("INSERT INTO docs(title, body) VALUES ('agent', 'agent notes')")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("INSERT INTO docs(title, body) VALUES ('app', 'indexed by the app')")
        conn.close()
        sandbox.execute("INSERT INTO docs(title, body) VALUES ('agent2', 'more notes')")
        sandbox.commit()
    finally:
        sandbox.cleanup()
    titles = sorted(r[0] for r in _sqlite_rows(path, "SELECT title FROM docs"))
    assert titles == ["agent", "agent2", "app", "seed"]
    assert _sqlite_rows(path, "SELECT title FROM docs WHERE docs MATCH 'notes'") != []


@fts_versions
def test_case_52_c_views_strict_generated_columns_and_triggers(tmp_path: Path, fts: str) -> None:
    """Case 52 C (no FTS involved): insert through a view, a STRICT violation refused as a
    statement error, a direct insert; the commit lands both items, their prices and audits."""
    path = _fts_db(tmp_path, fts)
    sandbox = _fts_sandbox(path, tmp_path)
    try:
        sandbox.execute("INSERT INTO item_v(name, cents) VALUES ('x', 250)")
        with pytest.raises(SandboxStatementError):
            sandbox.execute("INSERT INTO item(name, cents) VALUES ('bad', 'y')")
        sandbox.execute("INSERT INTO item(name, cents) VALUES ('y', 100)")
        sandbox.commit()
    finally:
        sandbox.cleanup()
    assert _sqlite_rows(path, "SELECT name, price FROM item ORDER BY id") == [
        ("x", 2.5),
        ("y", 1.0),
    ]
    assert _sqlite_rows(path, "SELECT what FROM audit ORDER BY id") == [("item x",), ("item y",)]


@fts_versions
def test_full_text_writes_through_a_trigger_and_updates_and_deletes(
    tmp_path: Path, fts: str
) -> None:
    """An AFTER trigger that indexes into the FTS table, FTS updates and deletes, interleaved
    with the application's own FTS writes: the sandbox's statements and its commit replay."""
    path = _fts_db(tmp_path, fts)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "CREATE TRIGGER item_index AFTER INSERT ON item "
        "BEGIN INSERT INTO docs(title, body) VALUES (NEW.name, 'item ' || NEW.name); END"
    )
    sandbox = _fts_sandbox(path, tmp_path)
    try:
        sandbox.execute("INSERT INTO item(name, cents) VALUES ('lamp', 100)")
        conn.execute("INSERT INTO docs(title, body) VALUES ('app', 'app words')")
        sandbox.execute("UPDATE docs SET body = 'hello there' WHERE title = 'seed'")
        sandbox.execute("INSERT INTO item(name, cents) VALUES ('desk', 200)")
        conn.execute("INSERT INTO docs(title, body) VALUES ('app2', 'more app words')")
        sandbox.execute("DELETE FROM docs WHERE title = 'lamp'")
        sandbox.commit()
    finally:
        sandbox.cleanup()
        conn.close()
    titles = sorted(r[0] for r in _sqlite_rows(path, "SELECT title FROM docs"))
    assert titles == ["app", "app2", "desk", "seed"]
    assert _sqlite_rows(path, "SELECT title FROM docs WHERE docs MATCH 'there'") == [("seed",)]


# -- the database's default isolation -------------------------------------------------------------

isolation_levels = pytest.mark.parametrize(
    "level", ["repeatable read", "serializable", "read committed"]
)


@pytest.mark.postgres
@isolation_levels
def test_default_isolation_of_the_session_works(db_pg: Db, level: str) -> None:
    """REPEATABLE READ / SERIALIZABLE as the session's default (here through ``options``, as a
    role or database default gives it): a row the application changed after the sandbox's
    snapshot is updated by the sandbox (the stale snapshot is replaced by a verified replay
    instead of failing until the timeout), and the commit lands both writes."""
    db = db_pg
    db.run("CREATE TABLE counter(id int PRIMARY KEY, n int NOT NULL)")
    db.run("CREATE TABLE items(name text PRIMARY KEY)")
    db.run("INSERT INTO counter VALUES (1, 0)")
    dsn = _with_options(
        db.original, "-c default_transaction_isolation=" + level.replace(" ", "\\ ")
    )
    sandbox = TransactionSandbox("db", dsn, sandbox_root=str(db.root), timeout_seconds=5)
    db.track(sandbox)
    sandbox.create("iso")
    assert sandbox.execute("SHOW transaction_isolation") == [(level,)]
    sandbox.execute("INSERT INTO items VALUES ('a')")
    db.run("UPDATE counter SET n = n + 10 WHERE id = 1")  # after the sandbox's snapshot
    sandbox.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
    assert sandbox.execute("SELECT n FROM counter") == [(11,)]
    db.run("INSERT INTO items VALUES ('app')")
    sandbox.commit()
    assert db.run("SELECT n FROM counter") == [(11,)]
    assert db.run("SELECT name FROM items ORDER BY name") == [("a",), ("app",)]


# -- effects beyond plain rows: temporary tables, notifications, large objects --------------------


@pytest.mark.postgres
@pytest.mark.parametrize(
    "session_effect",
    [
        "CREATE TEMP TABLE scratch(v int)",
        "NOTIFY plan_done",
        "SELECT pg_notify('plan_done', 'x')",
    ],
)
def test_two_phases_unavailable_for_session_effects_fall_back_to_the_saga(
    db_pg: Db, session_effect: str
) -> None:
    """PostgreSQL cannot ``PREPARE TRANSACTION`` a transaction that used temporary objects or
    ``NOTIFY``: the prepare says so with :class:`TwoPhaseUnavailableError` before anything is
    lost (the held transaction, its sequence values included, is kept); ``two_phase`` raises
    it with nothing touched, ``auto`` commits the plan as a saga."""
    from sandbox_core.errors import TwoPhaseUnavailableError

    db = db_pg
    db.run("CREATE TABLE t(id serial PRIMARY KEY, v text)")
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
    sandbox = manager.get_or_create_sandbox(
        "pt", "db", db.original, "transaction_rollback", sandbox_root=str(db.root)
    )
    db.track(sandbox)
    sandbox.execute(session_effect)
    if session_effect.startswith("CREATE"):
        sandbox.execute("INSERT INTO scratch VALUES (1)")
    assert sandbox.execute("INSERT INTO t(v) VALUES ('a') RETURNING id") == [(1,)]
    db.run("INSERT INTO t(v) VALUES ('app')")  # draws 2: a replay of the sandbox would diverge
    with pytest.raises(TwoPhaseUnavailableError, match="PREPARE"):
        manager.commit_plan("pt", mode="two_phase")
    assert sandbox.status is SandboxStatus.ACTIVE
    assert db.run(
        "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{sandbox.sandbox_id}",)
    ) == [(0,)]
    results = manager.commit_plan("pt", mode="auto")
    assert all(r.success for r in results), results
    assert results[0].metadata["mode"] == "saga"
    assert db.run("SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "app")]


@pytest.mark.postgres
def test_large_objects_are_replayed_after_a_lost_connection(db_pg: Db) -> None:
    """A large object written through ``SELECT lo_from_bytea(<oid>, ...)`` is logged although it
    reads as a ``SELECT`` (it writes a catalog the per-table counts do not see): after the
    connection is killed the replay brings it back, and the commit lands it."""
    db = db_pg
    oid = 900_000 + int(db.root.parent.name[-4:], 36) % 50_000
    sandbox = db.sandbox()
    assert sandbox.execute("SELECT lo_from_bytea(%s, 'hello')", (oid,)) == [(oid,)]
    assert len(sandbox.statements()) == 1
    pid = sandbox.execute("SELECT pg_backend_pid()")[0][0]
    db.run("SELECT pg_terminate_backend(%s)", (pid,))
    assert sandbox.execute("SELECT lo_get(%s)", (oid,)) == [(b"hello",)]
    sandbox.commit()
    try:
        assert db.run("SELECT lo_get(%s)", (oid,)) == [(b"hello",)]
    finally:
        db.run("SELECT lo_unlink(%s)", (oid,))


def test_sqlite_temporary_tables_are_replayed(db_sqlite: Db) -> None:
    """SQLite: a temporary table lives in one connection, and every sandbox statement gets a
    fresh one: the log recreates it, so later statements (and the commit) see it."""
    db = db_sqlite
    db.run("CREATE TABLE items(name TEXT PRIMARY KEY)")
    sandbox = db.sandbox()
    sandbox.execute("CREATE TEMP TABLE picks(name TEXT)")
    sandbox.execute("INSERT INTO picks VALUES ('a'), ('b')")
    sandbox.execute("INSERT INTO items SELECT name FROM picks")
    assert sandbox.execute("SELECT count(*) FROM picks") == [(2,)]
    sandbox.commit()
    assert db.run("SELECT name FROM items ORDER BY name") == [("a",), ("b",)]
    assert db.run("SELECT name FROM sqlite_temp_master") == []


# -- replay after a lost connection: generated keys -----------------------------------------------


@pytest.mark.postgres
def test_generated_keys_after_a_lost_connection_replay_or_refuse(db_pg: Db) -> None:
    """A lost connection replays the log, and keys the sandbox generated are compared. The dead
    transaction's sequence values are gone for good (PostgreSQL never hands a value out twice,
    and ``setval`` would move the application's sequence), so the replay draws others and is
    refused,
    naming the statement; nothing lands, the sandbox stays ACTIVE, a rollback starts over. Keys
    the actor chooses (or ``ALTER SEQUENCE ... RESTART`` in the sandbox) replay exactly."""
    from sandbox_core.errors import SandboxReplayDivergedError

    db = db_pg
    db.run("CREATE TABLE t(id serial PRIMARY KEY, v text)")
    sandbox = db.sandbox()
    assert sandbox.execute("INSERT INTO t(v) VALUES ('a') RETURNING id") == [(1,)]
    pid = sandbox.execute("SELECT pg_backend_pid()")[0][0]
    db.run("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(SandboxReplayDivergedError, match="statement 1") as diverged:
        sandbox.execute("SELECT count(*) FROM t")
    assert "generated id 2 instead of 1" in str(diverged.value)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert db.run("SELECT count(*) FROM t") == [(0,)]
    sandbox.rollback()
    # Restarting the sequence inside the sandbox makes its keys reproducible by a replay.
    sandbox.execute("ALTER SEQUENCE t_id_seq RESTART WITH 100")
    assert sandbox.execute("INSERT INTO t(v) VALUES ('b') RETURNING id") == [(100,)]
    pid = sandbox.execute("SELECT pg_backend_pid()")[0][0]
    db.run("SELECT pg_terminate_backend(%s)", (pid,))
    assert sandbox.execute("SELECT id, v FROM t") == [(100, "b")]
    sandbox.commit()
    assert db.run("SELECT id, v FROM t") == [(100, "b")]


def test_sqlite_generated_keys_are_reproduced_by_every_replay(db_sqlite: Db) -> None:
    """SQLite replays the log in a new connection for every statement: the keys the sandbox
    saw come back each time (and a child row keeps pointing at its parent)."""
    db = db_sqlite
    db.run("CREATE TABLE p(id INTEGER PRIMARY KEY, v TEXT)")
    db.run("CREATE TABLE c(id INTEGER PRIMARY KEY, pid INT REFERENCES p(id))")
    sandbox = db.sandbox()
    for n in range(3):
        key = sandbox.execute("INSERT INTO p(v) VALUES (?) RETURNING id", (str(n),))[0][0]
        sandbox.execute("INSERT INTO c(pid) VALUES (?)", (key,))
        assert sandbox.last_outcome is not None
    sandbox.commit()
    assert db.run("SELECT c.id, p.v FROM c JOIN p ON p.id = c.pid ORDER BY c.id") == [
        (1, "0"),
        (2, "1"),
        (3, "2"),
    ]


@pytest.mark.postgres
def test_session_state_set_from_a_select_survives_a_lost_connection(db_pg: Db) -> None:
    """``SELECT set_config('search_path', ...)`` changes where later statements write; it is
    logged, so after the connection is killed the replay (and the next statement) still write
    to the schema the sandbox chose, never silently to another one."""
    db = db_pg
    other = f"o_{db.root.parent.name[-12:].lower().replace('-', '_')}"
    db.run(f"CREATE SCHEMA {other}")
    try:
        db.run("CREATE TABLE items(name text PRIMARY KEY)")
        db.run(f"CREATE TABLE {other}.items(name text PRIMARY KEY)")
        sandbox = db.sandbox()
        sandbox.execute("SELECT set_config('search_path', %s, false)", (other,))
        sandbox.execute("INSERT INTO items VALUES ('a')")
        pid = sandbox.execute("SELECT pg_backend_pid()")[0][0]
        db.run("SELECT pg_terminate_backend(%s)", (pid,))
        sandbox.execute("INSERT INTO items VALUES ('b')")
        sandbox.commit()
        assert db.run(f"SELECT name FROM {other}.items ORDER BY name") == [("a",), ("b",)]  # noqa: S608 - a name the test made
        assert db.run("SELECT name FROM items") == []
    finally:
        db.run(f"DROP SCHEMA {other} CASCADE")


@pytest.mark.postgres
def test_a_read_only_default_is_refused_clearly_at_create(db_pg: Db) -> None:
    """A session whose transactions are read-only by default (``default_transaction_read_only``
    set on the database, the role or the DSN) could never commit: refused at create, naming
    the setting, instead of a sandbox that fails at every write."""
    from sandbox_core.errors import SandboxCreationError

    db = db_pg
    dsn = _with_options(db.original, "-c default_transaction_read_only=on")
    sandbox = TransactionSandbox("db", dsn, sandbox_root=str(db.root))
    db.track(sandbox)
    with pytest.raises(SandboxCreationError, match="default_transaction_read_only"):
        sandbox.create("ro")
    assert "password" not in str(sandbox.original_path).replace("password=***", "")


@pytest.mark.postgres
def test_the_isolation_level_is_recorded_at_create(db_pg: Db) -> None:
    """The context says which isolation the sandbox's transactions run at."""
    db = db_pg
    dsn = _with_options(db.original, "-c default_transaction_isolation=serializable")
    sandbox = TransactionSandbox("db", dsn, sandbox_root=str(db.root))
    db.track(sandbox)
    context = sandbox.create("iso")
    assert context.metadata["isolation"] == "serializable"


def test_sqlite_rtree_virtual_table_replays_with_the_application_writing(tmp_path: Path) -> None:
    """An R*Tree (another virtual table with shadow tables): the sandbox's inserts replay and
    commit although the application inserts into the same table in between."""
    path = _sqlite_file(
        tmp_path / "geo.db", "CREATE VIRTUAL TABLE box USING rtree(id, x0, x1, y0, y1);"
    )
    sandbox = TransactionSandbox("db", path, sandbox_root=str(tmp_path / "root"))
    sandbox.create("geo")
    try:
        sandbox.execute("INSERT INTO box VALUES (1, 0, 1, 0, 1)")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("INSERT INTO box VALUES (2, 5, 6, 5, 6)")
        conn.close()
        sandbox.execute("INSERT INTO box VALUES (3, 0, 2, 0, 2)")
        assert sandbox.execute("SELECT id FROM box WHERE x0 < 3 ORDER BY id") == [(1,), (3,)]
        sandbox.commit()
    finally:
        sandbox.cleanup()
    assert _sqlite_rows(path, "SELECT id FROM box ORDER BY id") == [(1,), (2,), (3,)]


def test_sqlite_attach_is_refused_before_any_work_is_lost(db_sqlite: Db) -> None:
    """``ATTACH`` (another database file, outside the sandbox's transaction) cannot run inside
    a transaction: a statement error, and the sandbox keeps its work and commits."""
    db = db_sqlite
    db.run("CREATE TABLE items(name TEXT PRIMARY KEY)")
    sandbox = db.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    with pytest.raises(SandboxStatementError, match="ATTACH"):
        sandbox.execute("ATTACH DATABASE ? AS other", (str(db.root.parent / "other.db"),))
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.commit()
    assert db.run("SELECT name FROM items") == [("a",)]


@pytest.mark.parametrize(
    ("sql", "refused", "logged"),
    [
        ("SELECT setval('s', 1)", True, False),
        ("SELECT \"setval\"('s', 1)", True, False),
        ("SELECT mysetval(1)", False, False),
        ("INSERT INTO notes VALUES ('remember setval(s, 1)')", False, False),
        ("SELECT * FROM dblink('dbname=x', 'DELETE FROM t') AS r(x int)", True, False),
        ("SELECT dblink_exec('dbname=x', 'DELETE FROM t')", True, False),
        ("SELECT lo_from_bytea(0, 'x')", False, True),
        ("SELECT pg_catalog.lo_unlink(42)", False, True),
        ("SELECT set_config('search_path', 'app', false)", False, True),
        ("SELECT pg_advisory_xact_lock(7)", False, True),
        ("SELECT 'lo_put(' AS text", False, False),
        ("SELECT count(*) FROM t", False, False),
    ],
)
def test_calls_refused_or_logged_although_they_read(sql: str, refused: bool, logged: bool) -> None:
    """The lexical reading of PostgreSQL statements: functions acting outside the transaction
    are refused, functions acting beyond user-table rows are logged; data in string literals
    never counts as a call."""
    from sandbox_core.strategies.transaction import nontransactional

    assert (nontransactional.refusal(sql) is not None) is refused
    assert nontransactional.acts_beyond_rows(sql) is logged


def test_case_47_the_review_names_the_constraint_before_the_commit(db: Db) -> None:
    """Case 47 seen at review: the plan's reviewer sees the deferred key the commit would
    refuse (in the held PostgreSQL transaction, or in a dry replay), and nothing is written."""
    _deferred_schema(db)
    sandbox = db.sandbox("p47")
    _fks_on(db, sandbox)
    sandbox.execute("INSERT INTO child VALUES (1, 7)")
    conflicts = sandbox.review().conflicts
    assert len(conflicts) == 1 and _expected_conflict(db) in conflicts[0]
    sandbox.close()  # PostgreSQL: the review's dry replay runs in a new transaction
    assert _expected_conflict(db) in sandbox.review().conflicts[0]
    sandbox.execute("INSERT INTO parent VALUES (7)")
    assert sandbox.review().conflicts == []
    sandbox.commit()
    assert db.run("SELECT * FROM child") == [(1, 7)]
