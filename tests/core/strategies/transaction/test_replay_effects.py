"""What each replayed statement wrote is verified too (issue 7, section 3; the kind of the
verify7 upsert and write-through-SELECT faults), on every backend (``tests/support/dbkit.py``).

Property: a statement whose row count, rows and generated id replay the same but which writes
something else (an upsert that inserted in the sandbox and would update on replay, or the
reverse) is a divergence: nothing lands and the sandbox stays ACTIVE. A statement the text calls
a read but which wrote (a function called from ``SELECT``, PostgreSQL) is logged like a write,
so its write survives a hand-off. Plain inserts into several fresh tables, and statements that
read ``last_insert_rowid()``, still replay fine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_core.errors import SandboxReplayDivergedError
from sandbox_core.status import SandboxStatus
from tests.support.dbkit import Db

UPSERT = "INSERT INTO kv(k, v) VALUES ('a', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v"


def kv(database: Db) -> list[tuple[object, ...]]:
    return database.run("SELECT k, v FROM kv ORDER BY k")


def test_upsert_that_inserted_does_not_update_on_replay(db: Db) -> None:
    db.run("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    sandbox = db.sandbox()
    sandbox.execute(db.sql(UPSERT), ("sandbox",))
    sandbox.close()
    db.run("INSERT INTO kv VALUES ('a', 'app')")

    with pytest.raises(SandboxReplayDivergedError, match="statement 1 of 1") as err:
        sandbox.commit()

    assert "wrote" in str(err.value)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert kv(db) == [("a", "app")]


def test_upsert_that_updated_does_not_insert_on_replay(db: Db) -> None:
    db.run("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    db.run("INSERT INTO kv VALUES ('a', 'app')")
    sandbox = db.sandbox()
    sandbox.execute(db.sql(UPSERT), ("sandbox",))
    sandbox.close()
    db.run("DELETE FROM kv")  # the row the sandbox updated is gone: replay would insert

    with pytest.raises(SandboxReplayDivergedError):
        sandbox.commit()

    assert sandbox.status is SandboxStatus.ACTIVE
    assert kv(db) == []


def test_upsert_replays_when_nothing_changed_in_between(db: Db) -> None:
    db.run("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    db.run("INSERT INTO kv VALUES ('b', 'app')")
    sandbox = db.sandbox()
    sandbox.execute(db.sql(UPSERT), ("sandbox",))
    sandbox.execute(db.sql(UPSERT.replace("'a'", "'b'")), ("sandbox",))
    sandbox.close()

    sandbox.commit()

    assert kv(db) == [("a", "sandbox"), ("b", "sandbox")]


def test_inserts_into_fresh_tables_and_last_insert_rowid_replay(
    db_sqlite: Db,
) -> None:
    """Rowids of different tables collide (each starts at 1): never a false divergence."""
    db_sqlite.run("CREATE TABLE a (x TEXT)")
    db_sqlite.run("CREATE TABLE b (x TEXT)")
    db_sqlite.run("CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT)")
    db_sqlite.run("CREATE TABLE child (parent_id INTEGER)")
    sandbox = db_sqlite.sandbox()
    sandbox.execute("INSERT INTO a VALUES ('1')")
    sandbox.execute("INSERT INTO b VALUES ('1')")
    sandbox.execute("INSERT INTO parent(name) VALUES ('p')")
    sandbox.execute("INSERT INTO child VALUES (last_insert_rowid())")
    sandbox.commit()
    assert db_sqlite.run("SELECT parent_id FROM child") == [(1,)]
    assert db_sqlite.run("SELECT count(*) FROM a") == db_sqlite.run("SELECT count(*) FROM b")


@pytest.mark.postgres
def test_write_through_a_function_in_a_select_is_logged_and_replayed(
    postgres_schema_dsn: str,
    tmp_path: Path,
) -> None:
    database = Db("postgresql", postgres_schema_dsn, tmp_path / "root")
    try:
        database.run("CREATE TABLE kv (k text PRIMARY KEY, v text)")
        database.run(
            "CREATE FUNCTION put(k text, v text) RETURNS int LANGUAGE sql AS "
            "$$ INSERT INTO kv VALUES (k, v); SELECT 1 $$"
        )
        sandbox = database.sandbox()
        sandbox.execute("SELECT put('a', '1')")
        sandbox.execute("SELECT k FROM kv")  # a plain read stays out of the log
        assert [s["sql"] for s in sandbox.statements()] == ["SELECT put('a', '1')"]
        sandbox.close()

        sandbox.commit()

        assert database.run("SELECT k, v FROM kv") == [("a", "1")]
    finally:
        database.close_all()


KEYED_TABLES = [
    pytest.param("CREATE TABLE orders (id INT PRIMARY KEY, who TEXT)", id="int-primary-key"),
    pytest.param("CREATE TABLE orders (id BIGINT, who TEXT, PRIMARY KEY (id))", id="bigint"),
    pytest.param(
        "CREATE TABLE orders (id INTEGER, who TEXT, PRIMARY KEY (id, who))", id="composite"
    ),
    pytest.param("CREATE TABLE orders (id TEXT PRIMARY KEY, who TEXT)", id="text-key"),
]
NEXT_ORDER = (
    "INSERT INTO orders(id, who) SELECT coalesce(max(CAST(id AS INTEGER)), 0) + 1, 'sandbox' "
    "FROM orders"
)


@pytest.mark.parametrize("schema", KEYED_TABLES)
def test_a_key_computed_from_data_that_changes_on_replay_is_a_divergence(
    db_sqlite: Db,
    schema: str,
) -> None:
    """SQLite: the key of the inserted row is recorded when it is not the rowid itself."""
    db_sqlite.run(schema)
    db_sqlite.run("CREATE TABLE lines (order_id, item TEXT)")
    sandbox = db_sqlite.sandbox()
    sandbox.execute(NEXT_ORDER)
    (order_id,) = sandbox.execute("SELECT id FROM orders WHERE who = 'sandbox'")[0]
    sandbox.execute("INSERT INTO lines VALUES (?, 'widget')", (order_id,))
    db_sqlite.run("INSERT INTO orders VALUES ('1', 'app')")  # takes the key the sandbox computed

    with pytest.raises(SandboxReplayDivergedError, match="statement 1 of 2"):
        sandbox.commit()

    assert sandbox.status is SandboxStatus.ACTIVE
    assert db_sqlite.run("SELECT who FROM orders") == [("app",)]
    assert db_sqlite.run("SELECT * FROM lines") == []


@pytest.mark.parametrize("schema", KEYED_TABLES)
def test_a_computed_key_replays_when_nothing_changed_in_between(
    db_sqlite: Db,
    schema: str,
) -> None:
    db_sqlite.run(schema)
    sandbox = db_sqlite.sandbox()
    sandbox.execute(NEXT_ORDER)
    sandbox.execute(NEXT_ORDER)
    db_sqlite.run("CREATE TABLE unrelated (x)")
    db_sqlite.run("INSERT INTO unrelated VALUES (1)")  # other tables may change freely

    sandbox.commit()

    assert db_sqlite.run("SELECT count(*) FROM orders WHERE who = 'sandbox'") == [(2,)]


def test_without_rowid_tables_replay_without_false_divergence(
    db_sqlite: Db,
) -> None:
    db_sqlite.run("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID")
    db_sqlite.run("CREATE TABLE other (x)")
    sandbox = db_sqlite.sandbox()
    sandbox.execute("INSERT INTO kv VALUES ('a', '1')")
    db_sqlite.run("INSERT INTO other VALUES (1)")
    sandbox.commit()
    assert db_sqlite.run("SELECT k, v FROM kv") == [("a", "1")]
