"""Property tests over statement sequences (hypothesis; ``SANDBOX_HYPOTHESIS_EXAMPLES`` for a
longer search): database sessions as they really are, on real SQLite files and the real
PostgreSQL server (docs/transaction-strategy.md, "Database sessions").

- Deferred keys (case 47, both engines): whatever order children and parents are written in,
  the commit lands exactly the sandbox's rows when every child has its parent; otherwise it is
  refused as a conflict naming the key, nothing lands, the sandbox stays ACTIVE, and it commits
  once the missing parents are written through it.
- Full-text tables (case 52, FTS4 and FTS5): any sequence of sandbox inserts, updates, deletes
  and searches, with the application inserting into the same full-text table in between,
  commits, and the table then holds the application's documents and the sandbox's.
"""

# ruff: noqa: S608 - every table name is made by the test itself (uuid), never input

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_core.errors import SandboxConflictError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import TransactionSandbox
from tests.support.dbkit import Db
from tests.support.tree_generators import PROPERTY

# Every example makes its own tables (and SQLite files), so the function-scoped fixtures (the
# database, tmp_path) are shared safely between examples.
PROPERTY_OVER_FIXTURES = settings(
    PROPERTY,
    suppress_health_check=[*PROPERTY.suppress_health_check, HealthCheck.function_scoped_fixture],
)

# -- deferred keys --------------------------------------------------------------------------------

# ("parent", id) or ("child", id, parent id); ids small so that collisions are skipped, not errors.
writes = st.lists(
    st.one_of(
        st.tuples(st.just("parent"), st.integers(1, 6)),
        st.tuples(st.just("child"), st.integers(1, 6), st.integers(1, 6)),
    ),
    min_size=1,
    max_size=8,
)


@PROPERTY_OVER_FIXTURES
@given(steps=writes)
def test_deferred_keys_commit_or_refuse_and_stay_active(db: Db, steps: list[Any]) -> None:
    """Case 47 as a property, on SQLite (WAL, rollback journal) and PostgreSQL."""
    tag = uuid.uuid4().hex[:8]
    parent, child = f"parent_{tag}", f"child_{tag}"
    db.run(f"CREATE TABLE {parent}(id int PRIMARY KEY)")
    db.run(
        f"CREATE TABLE {child}(id int PRIMARY KEY, pid int "
        f"CONSTRAINT {child}_pid_fkey REFERENCES {parent}(id) DEFERRABLE INITIALLY DEFERRED)"
    )
    sandbox = db.sandbox(f"prop-{tag}")
    if db.sqlite:
        sandbox.execute("PRAGMA foreign_keys = ON")
    parents: set[int] = set()
    children: dict[int, int] = {}
    for step in steps:
        if step[0] == "parent" and step[1] not in parents:
            sandbox.execute(db.sql(f"INSERT INTO {parent} VALUES (?)"), (step[1],))
            parents.add(step[1])
        elif step[0] == "child" and step[1] not in children:
            sandbox.execute(db.sql(f"INSERT INTO {child} VALUES (?, ?)"), (step[1], step[2]))
            children[step[1]] = step[2]
    missing = sorted(set(children.values()) - parents)
    if missing:
        with pytest.raises(SandboxConflictError) as refused:
            sandbox.commit()
        expected = f"{child} row" if db.sqlite else f"{child}_pid_fkey"
        assert all(expected in c for c in refused.value.conflicts)
        assert sandbox.status is SandboxStatus.ACTIVE
        assert db.run(f"SELECT count(*) FROM {parent}") == [(0,)]
        for pid in missing:
            sandbox.execute(db.sql(f"INSERT INTO {parent} VALUES (?)"), (pid,))
            parents.add(pid)
    sandbox.commit()
    assert db.run(f"SELECT id FROM {parent} ORDER BY id") == [(p,) for p in sorted(parents)]
    landed = db.run(f"SELECT id, pid FROM {child} ORDER BY id")
    assert landed == sorted(children.items())


# -- full-text tables -----------------------------------------------------------------------------

fts_steps = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.sampled_from(["alpha", "beta", "gamma"])),
        st.tuples(st.just("update"), st.sampled_from(["alpha", "beta", "gamma"])),
        st.tuples(st.just("delete"), st.sampled_from(["alpha", "beta", "gamma"])),
        st.tuples(st.just("search"), st.sampled_from(["alpha", "notes", "app"])),
        st.tuples(st.just("other"), st.just("")),
        st.tuples(st.just("app"), st.sampled_from(["one", "two"])),
    ),
    min_size=1,
    max_size=10,
)


@pytest.mark.parametrize("fts", ["fts5", "fts4"])
@PROPERTY_OVER_FIXTURES
@given(steps=fts_steps)
def test_full_text_sequences_commit_with_the_application_writing(
    tmp_path: Path, fts: str, steps: list[tuple[str, str]]
) -> None:
    """Case 52 as a property: the sandbox's replay never diverges on a full-text table whose
    hidden rowids the application shifts, and the commit lands the expected documents."""
    folder = tmp_path / uuid.uuid4().hex[:8]
    folder.mkdir()
    path = folder / "app.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.executescript(
        f"CREATE VIRTUAL TABLE docs USING {fts}(title, body);"
        "INSERT INTO docs VALUES ('seed', 'hello world');"
        "CREATE TABLE audit(id INTEGER PRIMARY KEY, what TEXT);"
    )
    sandbox = TransactionSandbox("db", str(path), sandbox_root=str(folder / "root"))
    sandbox.create("p52")
    expected = {"seed": "hello world"}  # title -> body, as the sandbox sees it
    app_titles: list[str] = []
    audits = 0
    committed = False
    try:
        for number, (kind, word) in enumerate(steps):
            if kind == "insert" and word not in expected:
                sandbox.execute("INSERT INTO docs VALUES (?, ?)", (word, f"{word} notes"))
                expected[word] = f"{word} notes"
            elif kind == "update" and word in expected:
                sandbox.execute("UPDATE docs SET body = ? WHERE title = ?", (f"{word} v2", word))
                expected[word] = f"{word} v2"
            elif kind == "delete" and word in expected:
                sandbox.execute("DELETE FROM docs WHERE title = ?", (word,))
                del expected[word]
            elif kind == "search":
                found = sandbox.execute("SELECT title FROM docs WHERE docs MATCH ?", (word,))
                assert {t for (t,) in found} <= set(expected) | set(app_titles)
            elif kind == "other":
                sandbox.execute("INSERT INTO audit(what) VALUES ('x')")
                audits += 1
            elif kind == "app":
                title = f"app{number}{word}"
                conn.execute("INSERT INTO docs VALUES (?, 'app words')", (title,))
                app_titles.append(title)
        if sandbox.status is SandboxStatus.ACTIVE:
            sandbox.commit()
            committed = True
    finally:
        sandbox.cleanup()
    titles = sorted(t for (t,) in conn.execute("SELECT title FROM docs"))
    want = sorted([*(expected if committed else {"seed": ""}), *app_titles])
    assert titles == want
    if committed:
        for title, body in expected.items():
            assert conn.execute("SELECT body FROM docs WHERE title = ?", (title,)).fetchall() == [
                (body,)
            ]
    assert conn.execute("SELECT count(*) FROM audit").fetchone()[0] == (audits if committed else 0)
    conn.close()


# -- sequences ------------------------------------------------------------------------------------

sequence_steps = st.lists(
    st.one_of(
        st.just("INSERT INTO {t}(v) VALUES ('s')"),
        st.just("SELECT nextval('{t}_id_seq')"),
        st.just("ALTER SEQUENCE {t}_id_seq RESTART WITH 1"),
        st.just("TRUNCATE {t} RESTART IDENTITY"),
        st.just("UPDATE {t} SET v = 'u'"),
        st.sampled_from(
            [
                "SELECT setval('{t}_id_seq', 1)",
                "SELECT pg_catalog.setval('{t}_id_seq', 1, false)",
                "select SetVal ('{t}_id_seq'::regclass, 2)",
                "DO $$ BEGIN PERFORM setval('{t}_id_seq', 1); END $$",
                "SELECT x FROM (SELECT setval('{t}_id_seq', 1) AS x) s",
            ]
        ),
    ),
    min_size=1,
    max_size=8,
)


@pytest.mark.postgres
@PROPERTY_OVER_FIXTURES
@given(steps=sequence_steps)
def test_sequences_never_change_the_original_after_rollback(db_pg: Db, steps: list[str]) -> None:
    """Case 48 as a property: whatever a sandbox does with a sequence, after its rollback the
    original's rows are as before, its sequence never went backwards, and the application's
    next insert gets a fresh key (no collision); ``setval`` in any spelling is refused."""
    from sandbox_core.errors import SandboxStatementError

    db = db_pg
    t = f"t_{uuid.uuid4().hex[:8]}"
    db.run(f"CREATE TABLE {t}(id serial PRIMARY KEY, v text)")
    db.run(f"INSERT INTO {t}(v) VALUES ('a'), ('b'), ('c')")
    sandbox = db.sandbox(f"seq-{t}")
    drew = False
    for step in steps:
        sql = step.format(t=t)
        if "setval" in sql.lower():
            with pytest.raises(SandboxStatementError, match="setval"):
                sandbox.execute(sql)
        else:
            try:
                sandbox.execute(sql)
            except SandboxStatementError as exc:
                # After a restart an insert may hit an existing key: refused, as it should be.
                assert exc.integrity and "INSERT" in sql
            drew = drew or "INSERT" in sql or "nextval" in sql
    if sandbox.status is SandboxStatus.ACTIVE:
        sandbox.rollback()
    assert db.run(f"SELECT id, v FROM {t} ORDER BY id") == [(1, "a"), (2, "b"), (3, "c")]
    last, called = db.run(f"SELECT last_value, is_called FROM {t}_id_seq")[0]
    if drew:
        assert last >= 3
    else:
        assert (last, called) == (3, True)
    assert db.run(f"INSERT INTO {t}(v) VALUES ('app') RETURNING id")[0][0] > 3


@pytest.fixture
def db_pg(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from tests.support.dbkit import make_db

    yield from make_db(request, "postgresql", tmp_path)
