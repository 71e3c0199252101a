"""Verified replay for every conflict-resolution form of an insert (issue 7, section 3), on real
SQLite (WAL and rollback journal) and, where the form exists, a real PostgreSQL (``tests/dbkit``).

Forms: plain ``INSERT``, ``INSERT OR ABORT/FAIL/ROLLBACK/IGNORE/REPLACE``, ``REPLACE INTO``,
``ON CONFLICT DO NOTHING`` and ``ON CONFLICT DO UPDATE`` (PostgreSQL: the plain insert and the two
``ON CONFLICT`` forms). Tables: a text primary key, a rowid alias (``INTEGER PRIMARY KEY`` given a
literal key), a ``WITHOUT ROWID`` table and a ``UNIQUE`` column that is not the key.

Property: the application writing the sandbox's key between the sandbox's statements (inserting
it where the sandbox created it, or deleting it where the sandbox met it) makes the replay a
divergence whatever the form, before or at commit: nothing lands and the application's rows stay.
An outside write to another key never is: the commit then lands exactly what the sandbox saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxReplayDivergedError
from sandbox_core.status import SandboxStatus
from tests.support.dbkit import SQLITE_MODES, Db, make_db


@dataclass(frozen=True)
class Table:
    name: str
    sqlite: str
    postgresql: str | None
    key: object  # the sandbox's key; the unrelated key is "other" / 8


TABLES = [
    Table("text-key", "CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)",
          "CREATE TABLE kv (k text PRIMARY KEY, v text)", "a"),
    Table("rowid-alias", "CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)",
          "CREATE TABLE kv (k int PRIMARY KEY, v text)", 7),
    Table("without-rowid", "CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID",
          None, "a"),
    Table("unique-column", "CREATE TABLE kv (k TEXT UNIQUE, v TEXT)",
          "CREATE TABLE kv (k text UNIQUE, v text)", "a"),
]  # fmt: skip

INSERT = "INSERT INTO kv(k, v) VALUES (?, 'sandbox')"
# (id, sql, exists on PostgreSQL, fails on a conflict)
Form = tuple[str, str, bool, bool]
FORMS: list[Form] = [
    ("insert", INSERT, True, True),
    ("or-abort", INSERT.replace("INSERT", "INSERT OR ABORT"), False, True),
    ("or-fail", INSERT.replace("INSERT", "INSERT OR FAIL"), False, True),
    ("or-rollback", INSERT.replace("INSERT", "INSERT OR ROLLBACK"), False, True),
    ("or-ignore", INSERT.replace("INSERT", "INSERT OR IGNORE"), False, False),
    ("or-replace", INSERT.replace("INSERT", "INSERT OR REPLACE"), False, False),
    ("replace-into", INSERT.replace("INSERT", "REPLACE"), False, False),
    ("do-nothing", INSERT + " ON CONFLICT (k) DO NOTHING", True, False),
    ("do-update", INSERT + " ON CONFLICT (k) DO UPDATE SET v = excluded.v", True, False),
]


def _other(table: Table) -> object:
    return 8 if isinstance(table.key, int) else "other"


def cases(*, fails_on_conflict: bool | None = None) -> list[object]:
    """Every (backend, table, form) where the form exists; ``fails_on_conflict`` filters."""
    found = []
    for kind in (*SQLITE_MODES, "postgresql"):
        for table in TABLES:
            for form in FORMS:
                if fails_on_conflict is not None and form[3] != fails_on_conflict:
                    continue
                if kind == "postgresql" and (table.postgresql is None or not form[2]):
                    continue
                marks = [pytest.mark.postgres] if kind == "postgresql" else []
                found.append(pytest.param(kind, table, form, marks=marks,
                                          id=f"{kind}-{table.name}-{form[0]}"))  # fmt: skip
    return found


@pytest.fixture
def database(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> Iterator[Db]:
    yield from make_db(request, kind, tmp_path)


def _setup(database: Db, table: Table) -> None:
    database.run(table.sqlite if database.sqlite else str(table.postgresql))
    database.run("CREATE TABLE marker (x int)")


def kv(database: Db) -> list[tuple[object, ...]]:
    return sorted(database.run("SELECT k, v FROM kv"), key=repr)


def _diverges_before_or_at_commit(database: Db, sandbox: object) -> None:
    with pytest.raises(SandboxReplayDivergedError, match="statement 1 of"):
        sandbox.execute(database.sql("INSERT INTO marker VALUES (1)"))  # type: ignore[attr-defined]
        sandbox.commit()  # type: ignore[attr-defined]
    assert sandbox.status is SandboxStatus.ACTIVE  # type: ignore[attr-defined]
    assert database.run("SELECT * FROM marker") == []


@pytest.mark.parametrize(("kind", "table", "form"), cases())
def test_the_application_inserting_the_key_between_is_a_divergence(
    database: Db, table: Table, form: Form
) -> None:
    """The sandbox created the row; on replay the application's row holds the key."""
    _setup(database, table)
    sandbox = database.sandbox()
    sandbox.execute(database.sql(form[1]), (table.key,))
    sandbox.close()  # hand-over (PostgreSQL would make the application wait on the key)
    database.run(database.sql("INSERT INTO kv(k, v) VALUES (?, 'app')"), (table.key,))

    _diverges_before_or_at_commit(database, sandbox)

    assert kv(database) == [(table.key, "app")]


@pytest.mark.parametrize(("kind", "table", "form"), cases(fails_on_conflict=False))
def test_the_application_deleting_the_key_between_is_a_divergence(
    database: Db, table: Table, form: Form
) -> None:
    """The sandbox met the application's row (replaced, skipped or updated it); on replay the
    row is gone."""
    _setup(database, table)
    database.run(database.sql("INSERT INTO kv(k, v) VALUES (?, 'app')"), (table.key,))
    sandbox = database.sandbox()
    sandbox.execute(database.sql(form[1]), (table.key,))
    sandbox.close()
    database.run(database.sql("DELETE FROM kv WHERE k = ?"), (table.key,))

    _diverges_before_or_at_commit(database, sandbox)

    assert kv(database) == []


def _replays_what_the_sandbox_saw(database: Db, table: Table, form: Form, *, met: bool) -> None:
    """No false divergence: the commit lands exactly the rows the sandbox showed."""
    _setup(database, table)
    if met:
        database.run(database.sql("INSERT INTO kv(k, v) VALUES (?, 'app')"), (table.key,))
    sandbox = database.sandbox()
    sandbox.execute(database.sql(form[1]), (table.key,))
    seen = sorted(sandbox.execute("SELECT k, v FROM kv"), key=repr)
    sandbox.close()
    database.run(database.sql("INSERT INTO kv(k, v) VALUES (?, 'app')"), (_other(table),))
    sandbox.execute(database.sql("INSERT INTO marker VALUES (1)"))

    sandbox.commit()

    assert kv(database) == sorted([*seen, (_other(table), "app")], key=repr)
    assert database.run("SELECT * FROM marker") == [(1,)]


@pytest.mark.parametrize(("kind", "table", "form"), cases())
def test_a_created_row_replays_after_an_outside_write_to_another_key(
    database: Db, table: Table, form: Form
) -> None:
    _replays_what_the_sandbox_saw(database, table, form, met=False)


@pytest.mark.parametrize(("kind", "table", "form"), cases(fails_on_conflict=False))
def test_a_met_row_replays_after_an_outside_write_to_another_key(
    database: Db, table: Table, form: Form
) -> None:
    _replays_what_the_sandbox_saw(database, table, form, met=True)
