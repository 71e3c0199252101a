"""One database per backend for the ``transaction_rollback`` property tests (issue 7, section 3).

``db`` (fixture, parametrized): a :class:`Db` on SQLite in WAL mode, SQLite in rollback-journal
mode, or a fresh schema of the real PostgreSQL server (``postgres_schema_dsn``), so that a test
written once states its property for every backend it applies to. Use ``db_sqlite`` for
SQLite-only properties. Everything a test makes (sandboxes, the application's connections) is
closed before the PostgreSQL schema is dropped.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sandbox_core.strategies.transaction import TransactionSandbox

SQLITE_MODES = ("sqlite-wal", "sqlite-journal")
ALL_BACKENDS = (*SQLITE_MODES, "postgresql")


class Db:
    """A database the tests write to, through sandboxes and as "the application".

    Attributes:
        kind: ``sqlite-wal``, ``sqlite-journal`` or ``postgresql``.
        original: the sandbox's ``original_path`` (file path or DSN with password).
        p: the placeholder (``?`` / ``%s``).
        id_column: an auto-generated integer primary key column definition.
    """

    def __init__(self, kind: str, original: str, root: Path) -> None:
        self.kind = kind
        self.original = original
        self.root = root
        self.sqlite = kind != "postgresql"
        self.p = "?" if self.sqlite else "%s"
        self.id_column = "id INTEGER PRIMARY KEY" if self.sqlite else "id serial PRIMARY KEY"
        self.sandboxes: list[TransactionSandbox] = []
        self._apps: list[Any] = []

    def app(self, timeout_seconds: float = 5.0) -> Any:
        """An autocommit connection of "the application" (sqlite3 or psycopg)."""
        if self.sqlite:
            conn: Any = sqlite3.connect(
                self.original,
                isolation_level=None,
                timeout=timeout_seconds,
                check_same_thread=False,
            )
        else:
            conn = psycopg.connect(self.original, autocommit=True)
        self._apps.append(conn)
        return conn

    def run(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One autocommit statement as the application; the rows it returned."""
        conn = self.app()
        try:
            cursor = conn.execute(sql, params or ())
            return [tuple(r) for r in cursor.fetchall()] if cursor.description else []
        finally:
            conn.close()

    def sql(self, text: str) -> str:
        """``text`` with ``?`` placeholders turned into this backend's."""
        return text if self.sqlite else text.replace("?", "%s")

    def sandbox(self, plan_id: str = "plan", **options: Any) -> TransactionSandbox:
        """A created sandbox of this database (cleaned up at teardown)."""
        options.setdefault("sandbox_root", str(self.root))
        sandbox = TransactionSandbox("db", self.original, **options)
        self.sandboxes.append(sandbox)
        sandbox.create(plan_id)
        return sandbox

    def track(self, sandbox: TransactionSandbox) -> TransactionSandbox:
        """Clean ``sandbox`` up at teardown too (e.g. one made by ``reopen``)."""
        self.sandboxes.append(sandbox)
        return sandbox

    def close_all(self) -> None:
        for sandbox in self.sandboxes:
            sandbox.cleanup()
        for conn in self._apps:
            conn.close()


def make_db(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> Iterator[Db]:
    if kind == "postgresql":
        dsn = request.getfixturevalue("postgres_schema_dsn")
        db = Db(kind, dsn, tmp_path / "root")
        # Registered after the schema fixture: runs before the schema is dropped.
        request.addfinalizer(db.close_all)
        yield db
        return
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path, isolation_level=None)
    mode = conn.execute(f"PRAGMA journal_mode={'wal' if kind == 'sqlite-wal' else 'delete'}")
    assert mode.fetchone()[0] == ("wal" if kind == "sqlite-wal" else "delete")
    conn.close()
    db = Db(kind, str(path), tmp_path / "root")
    try:
        yield db
    finally:
        db.close_all()


@pytest.fixture(params=[*SQLITE_MODES, pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    """A :class:`Db` on every backend (SQLite WAL, SQLite rollback journal, PostgreSQL)."""
    yield from make_db(request, request.param, tmp_path)


@pytest.fixture(params=SQLITE_MODES)
def db_sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    """A :class:`Db` on SQLite, in WAL and in rollback-journal mode."""
    yield from make_db(request, request.param, tmp_path)
