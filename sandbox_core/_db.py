"""One small connection interface over sqlite3 and psycopg 3 (used by ``transaction_rollback``).

The strategy drives transactions with explicit SQL (``BEGIN`` / ``SAVEPOINT`` / ``COMMIT`` /
``ROLLBACK``, seed 002: "commit() issues COMMIT; rollback() issues ROLLBACK"), so both drivers run
in autocommit mode and never open a transaction behind our back. Driver exceptions become
:class:`DatabaseError`; the strategy turns that into the sandbox error hierarchy.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

Backend = Literal["sqlite", "postgresql"]
Params = Sequence[Any] | dict[str, Any] | None

_POSTGRES_SCHEMES = ("postgresql", "postgres")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")


class DatabaseError(Exception):
    """A driver error, with the driver's message.

    Attributes:
        connection_lost: the connection is unusable (server gone, connection killed); the open
            transaction died with it.
        integrity: a constraint was violated (unique, foreign key, not null, check).
    """

    def __init__(self, message: str, *, connection_lost: bool = False, integrity: bool = False):
        super().__init__(message)
        self.connection_lost = connection_lost
        self.integrity = integrity


@dataclass(frozen=True)
class DatabaseTarget:
    """Where the original database is.

    Attributes:
        backend: ``"sqlite"`` or ``"postgresql"``.
        location: absolute file path (SQLite) or the libpq connection URI (PostgreSQL).
        display: ``location`` with any password replaced by ``***`` (for logs and metadata).
    """

    backend: Backend
    location: str
    display: str


def parse_target(original_path: str) -> DatabaseTarget:
    """Classify ``original_path``: a SQLite file path, ``sqlite:///abs/path``, or a PostgreSQL URI.

    Relative SQLite paths are made absolute against the current directory.

    Raises:
        ValueError: unsupported URL scheme, or an in-memory SQLite database (it cannot be shared
            between the sandbox's connections and processes).
    """
    text = original_path.strip()
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme in _POSTGRES_SCHEMES:
            return DatabaseTarget("postgresql", text, redact(text))
        if scheme != "sqlite":
            raise ValueError(f"unsupported database URL scheme {scheme!r}")
        text = text.split("://", 1)[1]
        # sqlite:///abs/path and sqlite:////abs/path both name /abs/path.
        text = "/" + text.lstrip("/") if text.startswith("/") else text
    if text in ("", ":memory:") or text.startswith("file::memory:"):
        raise ValueError("an in-memory SQLite database cannot be sandboxed")
    path = str(Path(text).absolute())
    return DatabaseTarget("sqlite", path, path)


def redact(uri: str) -> str:
    """``uri`` with the password of its user-info part replaced by ``***``."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def check_identifier(name: str) -> str:
    """Return ``name`` when it is a plain (optionally schema-qualified) SQL identifier.

    Raises:
        ValueError: ``"invalid bookkeeping table name: <name>"``.
    """
    if not _IDENTIFIER.match(name):
        raise ValueError(f"invalid bookkeeping table name: {name!r}")
    return name


class Connection:
    """An autocommit connection to the original database; transactions are explicit SQL.

    ``placeholder`` is the driver's positional parameter marker (``?`` or ``%s``).
    """

    def __init__(self, target: DatabaseTarget, *, timeout_seconds: float) -> None:
        self.target = target
        self.backend: Backend = target.backend
        self.placeholder = "?" if target.backend == "sqlite" else "%s"
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[tuple[Any, ...]] | None = None
        try:
            if target.backend == "sqlite":
                if not Path(target.location).is_file():
                    raise DatabaseError(f"no SQLite database file at {target.location}")
                uri = f"file:{quote(target.location)}?mode=rw"
                # isolation_level=None: sqlite3 must not open transactions implicitly.
                self._sqlite = sqlite3.connect(
                    uri,
                    uri=True,
                    isolation_level=None,
                    timeout=timeout_seconds,
                    check_same_thread=False,
                )
            else:
                self._pg = psycopg.connect(
                    target.location, autocommit=True, connect_timeout=max(1, int(timeout_seconds))
                )
        except (sqlite3.Error, psycopg.Error) as exc:
            raise DatabaseError(_message(exc, target), connection_lost=True) from exc

    @property
    def broken(self) -> bool:
        """True when the connection can no longer be used."""
        if self._pg is not None:
            return self._pg.closed or self._pg.broken
        return self._sqlite is None

    def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one statement; rows it returns (``[]`` for statements without a result)."""
        try:
            if self._sqlite is not None:
                cursor = self._sqlite.execute(sql, params if params is not None else ())
                rows = cursor.fetchall() if cursor.description else []
                cursor.close()
                return [tuple(row) for row in rows]
            assert self._pg is not None
            with self._pg.cursor() as pg_cursor:
                pg_cursor.execute(sql, params)
                return list(pg_cursor.fetchall()) if pg_cursor.description else []
        except (sqlite3.Error, psycopg.Error) as exc:
            raise self._translate(exc) from exc

    def executemany(self, sql: str, seq_of_params: Iterable[Params]) -> None:
        """Run one statement once per parameter set."""
        try:
            if self._sqlite is not None:
                self._sqlite.executemany(sql, [p if p is not None else () for p in seq_of_params])
                return
            assert self._pg is not None
            with self._pg.cursor() as pg_cursor:
                pg_cursor.executemany(sql, [p if p is not None else () for p in seq_of_params])
        except (sqlite3.Error, psycopg.Error) as exc:
            raise self._translate(exc) from exc

    def table_exists(self, name: str) -> bool:
        """True when table ``name`` (optionally ``schema.table`` on PostgreSQL) exists."""
        if self.backend == "sqlite":
            rows = self.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            )
            return bool(rows)
        return bool(self.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))[0][0])

    def close(self) -> None:
        """Close the connection; an open transaction is rolled back by the server. Idempotent."""
        try:
            if self._sqlite is not None:
                self._sqlite.close()
            if self._pg is not None:
                self._pg.close()
        except (sqlite3.Error, psycopg.Error):  # pragma: no cover - closing a dead connection
            pass
        finally:
            self._sqlite = None
            self._pg = None

    def _translate(self, exc: Exception) -> DatabaseError:
        integrity = isinstance(exc, sqlite3.IntegrityError | psycopg.IntegrityError)
        return DatabaseError(
            _message(exc, self.target), connection_lost=self.broken, integrity=integrity
        )


def _message(exc: Exception, target: DatabaseTarget) -> str:
    """The driver's message, with the DSN's password never echoed."""
    text = str(exc).strip() or type(exc).__name__
    if target.backend == "postgresql" and target.location in text:
        text = text.replace(target.location, target.display)
    return text
