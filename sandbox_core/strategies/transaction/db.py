"""One small connection interface over sqlite3 and psycopg 3 (used by ``transaction_rollback``).

The strategy drives transactions with explicit SQL (``BEGIN`` / ``SAVEPOINT`` / ``COMMIT`` /
``ROLLBACK``, seed 002: "commit() issues COMMIT; rollback() issues ROLLBACK"), so both drivers run
in autocommit mode and never open a transaction behind our back. Driver exceptions become
:class:`DatabaseError`; the strategy turns that into the sandbox error hierarchy. psycopg is
imported here alone in the core (:mod:`sandbox_core.redaction` loads libpq's DSN parser lazily).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from sandbox_core.redaction import scrub
from sandbox_core.strategies.transaction.dsn import Backend, DatabaseTarget

__all__ = [
    "Connection",
    "DatabaseError",
    "Params",
    "check_identifier",
]

Params = Sequence[Any] | dict[str, Any] | None

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")
# A rowid no real insert assigns (SQLite picks positive ones unless told otherwise), in a
# connection-private temp table; see Connection._run_sqlite.
_ROWID_PROBE = "sandbox_rowid_probe"
_ROWID_SENTINEL = -(2**63) + 1
# SQLite: a connection-private BEFORE INSERT trigger per table counts, through this function, the
# rows each inserted row collides with on a unique key (Connection._arm_conflict_probe).
_CONFLICT_FUNCTION = "sandbox_conflicts"
_FLUSH_SAVEPOINT = "sandbox_flush"
_CREATES = re.compile(r"\bcreate\b", re.IGNORECASE)
_CAN_INSERT = re.compile(r"\b(?:insert|replace)\b", re.IGNORECASE)
# SQLite primary result codes of a lock held by another connection (retryable).
_SQLITE_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
# PostgreSQL: lock_not_available (lock_timeout), deadlock_detected, serialization_failure.
_PG_BUSY_STATES = frozenset({"55P03", "40P01", "40001"})
# Connection failures that waiting will not cure (wrong credentials, no such database or role).
_LOGIN_REFUSED = re.compile(
    r"authentication|password|no pg_hba\.conf entry|does not exist|permission denied",
    re.IGNORECASE,
)


class DatabaseError(Exception):
    """A driver error, with the driver's message (passwords scrubbed).

    Attributes:
        connection_lost: the connection is unusable (server gone, connection killed or never
            made); the open transaction died with it.
        integrity: a constraint was violated (unique, foreign key, not null, check).
        busy: another connection holds a lock the statement needs (SQLite ``SQLITE_BUSY`` /
            ``SQLITE_LOCKED``; PostgreSQL lock timeout, deadlock, serialization failure):
            nothing changed, and trying again later may succeed.
        permanent: the connection cannot be made by waiting (the server refused the login, no
            such database or role, the SQLite file is gone).
        sqlstate: PostgreSQL's five-character SQLSTATE of the error (``None`` for SQLite and
            for errors without one), e.g. ``"42704"`` for an unknown prepared transaction.
        constraint: the name of the constraint the server says was violated (PostgreSQL's
            ``constraint_name`` field; ``None`` when it names none, and for SQLite).
        primary: the server's one-line primary message, without ``DETAIL`` and ``HINT``
            (PostgreSQL; the whole message for SQLite).
    """

    def __init__(
        self,
        message: str,
        *,
        connection_lost: bool = False,
        integrity: bool = False,
        busy: bool = False,
        permanent: bool = False,
        sqlstate: str | None = None,
        constraint: str | None = None,
        primary: str | None = None,
    ) -> None:
        super().__init__(message)
        self.constraint = constraint
        self.primary = primary or (message.splitlines()[0] if message else "")
        self.connection_lost = connection_lost
        self.integrity = integrity
        self.busy = busy
        self.permanent = permanent
        self.sqlstate = sqlstate


def check_identifier(name: str) -> str:
    """Return ``name`` when it is a plain (optionally schema-qualified) SQL identifier.

    Raises:
        ValueError: ``"invalid bookkeeping table name: <name>"``.
    """
    if not _IDENTIFIER.match(name):
        raise ValueError(f"invalid bookkeeping table name: {name!r}")
    return name


@dataclass(frozen=True)
class Result:
    """What one statement produced.

    Attributes:
        rows: the rows it returned (``[]`` without a result, and always for ``many``).
        rowcount: rows it changed (SQLite: ``total_changes()`` difference, triggers included;
            PostgreSQL: the driver's row count, ``-1`` when not applicable).
        generated_id: the id the database generated for it, when asked and when there is one:
            SQLite ``last_insert_rowid()`` after an insert into a table with an
            ``INTEGER PRIMARY KEY``; PostgreSQL ``lastval()`` when the statement changed it.
        effects: what the statement wrote, as canonical JSON, when asked (``capture_id`` and
            ``effects``, both arguments of :meth:`Connection.run`) and
            when the backend can tell: PostgreSQL ``{"<schema>.<table>": [inserted, updated,
            deleted]}`` for every user table whose counts in ``pg_stat_xact_user_tables``
            moved (``{}`` for a statement that wrote nothing, so a function called from a
            ``SELECT`` that writes is seen); SQLite ``{"rowid": true|false, "key": [...]}`` for
            a statement that can insert: whether it assigned a new rowid (an upsert that
            inserted, not one that updated), and the primary key of the row it inserted last
            when that key is not the rowid itself (a key computed from data, such as
            ``max(id) + 1``, is data the actor may have used), and ``"conflicts"``: how many
            existing rows the inserted rows collided with on a unique key (primary key,
            ``UNIQUE``, rowid alias), whatever the conflict resolution did with them
            (``OR REPLACE``/``IGNORE``, ``ON CONFLICT DO UPDATE``/``NOTHING``; rowid and
            ``WITHOUT ROWID`` tables alike). Two runs with equal other outcomes but other
            effects did different things (replay verification compares them).
    """

    rows: list[tuple[Any, ...]]
    rowcount: int
    generated_id: int | None = None
    effects: str | None = None


class Connection:
    """An autocommit connection to the original database; transactions are explicit SQL.

    ``placeholder`` is the driver's positional parameter marker (``?`` or ``%s``).
    ``timeout_seconds`` bounds the connect (PostgreSQL) and each wait for a lock (SQLite busy
    timeout, PostgreSQL ``lock_timeout``).

    Raises:
        DatabaseError: the database cannot be reached (``connection_lost``; also ``permanent``
            when waiting will not help).
    """

    def __init__(self, target: DatabaseTarget, *, timeout_seconds: float) -> None:
        self.target = target
        self.backend: Backend = target.backend
        self.placeholder = "?" if target.backend == "sqlite" else "%s"
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[tuple[Any, ...]] | None = None
        self._rowid_tables: dict[tuple[str, str], bool] = {}
        self._key_columns: dict[tuple[str, str], list[str]] = {}
        self._conflict_triggers: dict[tuple[str, str], str | None] = {}
        self._conflicts = 0
        self._shadow_tables: set[tuple[str, str]] | None = None
        self._has_virtual = False
        # The column names of the last statement's rows ([] when it returned none).
        self.last_columns: list[str] = []
        try:
            if target.backend == "sqlite":
                if not Path(target.location).is_file():
                    raise DatabaseError(
                        f"no SQLite database file at {target.location}",
                        connection_lost=True,
                        permanent=True,
                    )
                uri = f"file:{quote(target.location)}?mode=rw"
                # isolation_level=None: sqlite3 must not open transactions implicitly.
                self._sqlite = sqlite3.connect(
                    uri,
                    uri=True,
                    isolation_level=None,
                    timeout=timeout_seconds,
                    check_same_thread=False,
                    # Every statement is prepared afresh, so the authorizer sees each one.
                    cached_statements=0,
                )
                # Registered once, before any statement: SQLite refuses to (re)define a function
                # while a statement is active, and a full-text table keeps one open (case 52).
                self._sqlite.create_function(_CONFLICT_FUNCTION, 1, self._count_conflicts)
            else:
                self._pg = psycopg.connect(
                    target.location, autocommit=True, connect_timeout=max(1, int(timeout_seconds))
                )
                # A statement waiting for a row lock gives up (retryably) instead of hanging.
                self._pg.execute(f"SET lock_timeout = {max(1, int(timeout_seconds * 1000))}")
        except (sqlite3.Error, psycopg.Error) as exc:
            self.close()
            message = _message(exc, target)
            raise DatabaseError(
                message,
                connection_lost=True,
                busy=_is_busy(exc),
                permanent=target.backend == "postgresql" and bool(_LOGIN_REFUSED.search(message)),
            ) from exc

    @property
    def broken(self) -> bool:
        """True when the connection can no longer be used."""
        if self._pg is not None:
            return self._pg.closed or self._pg.broken
        return self._sqlite is None

    def run(
        self,
        sql: str,
        params: Any = None,
        *,
        many: bool = False,
        capture_id: bool = False,
        effects: bool = True,
    ) -> Result:
        """Run one statement (once per parameter set when ``many``).

        With ``capture_id`` the result also says which id the database generated for the
        statement (see :class:`Result`); this costs a few more round trips on PostgreSQL.
        ``effects=False`` skips measuring what it wrote (``Result.effects`` stays ``None``).

        Raises:
            DatabaseError: the statement failed (flags say whether it is retryable).
        """
        try:
            if self._sqlite is not None:
                return self._run_sqlite(self._sqlite, sql, params, many, capture_id, effects)
            if self._pg is None:
                raise DatabaseError("the connection is closed", connection_lost=True)
            before = self._pg_lastval() if capture_id else None
            counts = self._pg_write_counts() if capture_id and effects else None
            with self._pg.cursor() as pg_cursor:
                if many:
                    pg_cursor.executemany(sql, [p if p is not None else () for p in params])
                    rows: list[tuple[Any, ...]] = []
                else:
                    pg_cursor.execute(sql, params)
                    rows = list(pg_cursor.fetchall()) if pg_cursor.description else []
                self.last_columns = [c.name for c in pg_cursor.description or []]
                rowcount = pg_cursor.rowcount
            after = self._pg_lastval() if capture_id else None
            written = None
            if counts is not None:
                written = _effects_json(_count_delta(counts, self._pg_write_counts()))
            return Result(rows, rowcount, after if after != before else None, written)
        except (sqlite3.Error, psycopg.Error) as exc:
            raise self._translate(exc) from exc

    def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one statement; rows it returns (``[]`` for statements without a result)."""
        return self.run(sql, params).rows

    def executemany(self, sql: str, seq_of_params: Iterable[Params]) -> None:
        """Run one statement once per parameter set."""
        self.run(sql, list(seq_of_params), many=True)

    def _run_sqlite(
        self,
        db: sqlite3.Connection,
        sql: str,
        params: Any,
        many: bool,
        capture_id: bool,
        effects_wanted: bool = True,
    ) -> Result:
        # Tables the statement itself inserts into (not its triggers: last_insert_rowid()
        # reverts after a trigger), reported by SQLite's authorizer while it prepares it.
        inserted: set[tuple[str, str]] = set()

        def authorizer(
            action: int, arg1: str | None, _arg2: str | None, schema: str | None, source: str | None
        ) -> int:
            if action == sqlite3.SQLITE_INSERT and arg1 and source is None:
                inserted.add((schema or "main", arg1))
            return sqlite3.SQLITE_OK

        # last_insert_rowid() keeps its value when a statement inserts nothing, and rowids of
        # different tables collide: a sentinel set just before tells "assigned one" for sure.
        # Not for a statement that reads last_insert_rowid() itself (it would see the sentinel).
        probe = capture_id and effects_wanted and "last_insert_rowid" not in sql.lower()
        armed = (
            probe
            and bool(_CAN_INSERT.search(sql))
            and self._arm_conflict_probe(db, sql, params, many)
        )
        self._conflicts = 0
        if probe:
            db.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_ROWID_PROBE} (x)")
            db.execute(
                f"INSERT OR REPLACE INTO temp.{_ROWID_PROBE}(rowid, x) VALUES (?, NULL)",  # noqa: S608 - constant
                (_ROWID_SENTINEL,),
            )
        if db.in_transaction and self._has_virtual_tables(db):
            # A full-text table (FTS3/4/5) writes its pending index to its shadow tables when
            # a savepoint opens (and at COMMIT), so whichever later statement opens one would
            # count those rows as its own. Flushed here, they count for no statement (case 52).
            db.execute(f"SAVEPOINT {_FLUSH_SAVEPOINT}")
            db.execute(f"RELEASE {_FLUSH_SAVEPOINT}")
        changes = db.total_changes
        if capture_id:
            db.set_authorizer(authorizer)
        try:
            if many:
                cursor = db.executemany(sql, [p if p is not None else () for p in params])
                rows: list[Any] = []
            else:
                cursor = db.execute(sql, params if params is not None else ())
                rows = cursor.fetchall() if cursor.description else []
            self.last_columns = [str(c[0]) for c in cursor.description or []]
            cursor.close()
        finally:
            if capture_id:
                db.set_authorizer(None)
        generated = None
        effects = None
        # A virtual table's own writes to its shadow tables are not the statement's (their
        # rowids are the virtual table's business, hidden from the actor; case 52).
        if _CREATES.search(sql):
            self._shadow_tables = None  # a virtual table made by this statement has new ones
        inserted = {t for t in inserted if not self._is_shadow(db, *t)}
        if inserted:
            rowid_after = int(db.execute("SELECT last_insert_rowid()").fetchone()[0])
            if probe:
                # An upsert that updated assigns no rowid; one that inserted does.
                assigned = rowid_after != _ROWID_SENTINEL
                effect: dict[str, Any] = {"rowid": assigned}
                if armed:
                    effect["conflicts"] = self._conflicts
                if assigned and len(inserted) == 1:
                    key = self._inserted_key(db, *next(iter(inserted)), rowid_after)
                    if key is not None:
                        effect["key"] = key
                effects = _effects_json(effect)
            if any(self._rowid_is_data(db, schema, table) for schema, table in inserted):
                generated = rowid_after if rowid_after not in (0, _ROWID_SENTINEL) else None
        return Result([tuple(row) for row in rows], db.total_changes - changes, generated, effects)

    def _arm_conflict_probe(
        self, db: sqlite3.Connection, sql: str, params: Any, many: bool
    ) -> bool:
        """Make sure every table ``sql`` inserts into has the conflict-counting trigger.

        The tables come from SQLite's authorizer while it prepares ``EXPLAIN <sql>`` (nothing
        runs). The triggers are ``TEMP`` (this connection only, never in the database file) and
        only read: each inserted row calls ``sandbox_conflicts(n)`` with the number of existing
        rows holding one of its unique keys, before the conflict resolution acts. That number is
        what tells an insert that created a row from one that replaced, updated or skipped an
        existing row, which neither the row count nor the rowid can on a ``WITHOUT ROWID`` table
        or for ``INSERT OR REPLACE``. Re-created after a rollback dropped them.

        Returns:
            True when every inserted table is probed (the count is then meaningful).
        """
        first = params[0] if many and params else params
        if many and not params:
            return False
        tables: set[tuple[str, str]] = set()

        def authorizer(
            action: int, arg1: str | None, _arg2: str | None, schema: str | None, source: str | None
        ) -> int:
            if action == sqlite3.SQLITE_INSERT and arg1 and source is None:
                tables.add((schema or "main", arg1))
            return sqlite3.SQLITE_OK

        db.set_authorizer(authorizer)
        try:
            db.execute(f"EXPLAIN {sql}", first if first is not None else ()).fetchall()
        except (sqlite3.Error, ValueError):
            return False  # the statement itself will fail, or cannot be explained alone
        finally:
            db.set_authorizer(None)
        tables.discard(("temp", _ROWID_PROBE))
        # A virtual table prepares its own statements on its shadow tables (an R*Tree's node
        # table is rewritten in place): those are not rows the statement inserts.
        tables = {t for t in tables if not self._is_shadow(db, *t)}
        if not tables:
            return False
        for schema, table in sorted(tables):
            trigger = self._conflict_trigger(db, schema, table)
            if trigger is None:
                return False
            if trigger:
                db.execute(trigger)
        return True

    def _count_conflicts(self, found: int | None) -> int:
        self._conflicts += int(found or 0)
        return 0

    def _conflict_trigger(self, db: sqlite3.Connection, schema: str, table: str) -> str | None:
        """``CREATE TEMP TRIGGER IF NOT EXISTS`` counting conflicts on ``table``; ``""`` for a
        table without a unique key, ``None`` for what takes no trigger (a view, a virtual or
        system table). Cached per connection."""
        key = (schema, table)
        if key in self._conflict_triggers:
            return self._conflict_triggers[key]
        keys: list[list[str]] = []
        if self._rowid_is_data(db, schema, table):
            found = db.execute(
                "SELECT name FROM pragma_table_info(?, ?) WHERE pk > 0", (table, schema)
            ).fetchall()
            keys.append([str(row[0]) for row in found])
        indexes = db.execute(
            'SELECT name FROM pragma_index_list(?, ?) WHERE "unique" AND NOT partial',
            (table, schema),
        ).fetchall()
        for (index,) in indexes:
            columns = db.execute(
                "SELECT cid, name FROM pragma_index_info(?, ?) ORDER BY seqno", (index, schema)
            ).fetchall()
            if columns and all(cid >= 0 and name for cid, name in columns):
                keys.append([str(name) for _, name in columns])
        target = f"{_quote(schema)}.{_quote(table)}"
        condition = " OR ".join(
            "(" + " AND ".join(f"{_quote(c)} = NEW.{_quote(c)}" for c in columns) + ")"
            for columns in keys
        )
        name = _quote(f"sandbox_conflicts_{schema}_{table}")
        trigger: str | None = (
            f"CREATE TEMP TRIGGER IF NOT EXISTS {name} BEFORE INSERT ON {target} BEGIN "  # noqa: S608 - quoted identifiers
            f"SELECT {_CONFLICT_FUNCTION}((SELECT count(*) FROM {target} WHERE {condition})); END"
            if keys
            else ""
        )
        try:
            if trigger:
                db.execute(trigger)
        except sqlite3.Error:
            trigger = None  # views, virtual and system tables take no such trigger
        self._conflict_triggers[key] = trigger
        return trigger

    def _is_shadow(self, db: sqlite3.Connection, schema: str, table: str) -> bool:
        """True when ``table`` is a shadow table of a virtual table (FTS3/4/5, R*Tree), as
        ``PRAGMA table_list`` says (SQLite 3.37+; older versions: never). Cached."""
        return (schema, table) in self._virtual_tables(db)[1]

    def _has_virtual_tables(self, db: sqlite3.Connection) -> bool:
        """True when the database holds a virtual table (``PRAGMA table_list``). Cached."""
        return self._virtual_tables(db)[0]

    def _virtual_tables(self, db: sqlite3.Connection) -> tuple[bool, set[tuple[str, str]]]:
        if self._shadow_tables is None:
            try:
                found = db.execute(
                    "SELECT schema, name, type FROM pragma_table_list "
                    "WHERE type IN ('shadow', 'virtual')"
                ).fetchall()
            except sqlite3.Error:  # before SQLite 3.37: flush every time, know no shadows
                found = [("", "", "virtual")]
            self._has_virtual = bool(found)
            self._shadow_tables = {(str(s), str(n)) for s, n, kind in found if kind == "shadow"}
        return self._has_virtual, self._shadow_tables

    def _rowid_is_data(self, db: sqlite3.Connection, schema: str, table: str) -> bool:
        """True when ``table`` has an ``INTEGER PRIMARY KEY``: its rowid is a column.

        A hidden rowid is not data (SQLite may renumber it, e.g. on VACUUM), so an id generated
        for it is not something an actor can rely on, and it is not compared on replay.
        Cached per connection (a connection lives for one transaction).
        """
        known = self._rowid_tables.get((schema, table))
        if known is None:
            keys = db.execute(
                "SELECT upper(type) FROM pragma_table_info(?, ?) WHERE pk > 0", (table, schema)
            ).fetchall()
            known = self._rowid_tables[(schema, table)] = len(keys) == 1 and keys[0][0] == "INTEGER"
        return known

    def _inserted_key(
        self, db: sqlite3.Connection, schema: str, table: str, rowid: int
    ) -> list[Any] | None:
        """The primary key of the row ``rowid`` of ``table``, when the key is not the rowid
        itself (``None`` for an ``INTEGER PRIMARY KEY``, whose value is the generated id, for a
        table without a primary key, and for what has no rowid: views, ``WITHOUT ROWID``)."""
        columns = self._key_columns.get((schema, table))
        if columns is None:
            found = db.execute(
                "SELECT name FROM pragma_table_info(?, ?) WHERE pk > 0 ORDER BY pk",
                (table, schema),
            ).fetchall()
            columns = [str(row[0]) for row in found]
            if self._rowid_is_data(db, schema, table):
                columns = []
            self._key_columns[(schema, table)] = columns
        if not columns:
            return None
        selected = ", ".join(_quote(c) for c in columns)
        try:
            row = db.execute(
                f"SELECT {selected} FROM {_quote(schema)}.{_quote(table)} WHERE rowid = ?",  # noqa: S608 - quoted identifiers
                (rowid,),
            ).fetchone()
        except sqlite3.Error:
            return None
        if row is None:
            return None
        return [value.hex() if isinstance(value, bytes) else value for value in row]

    def _pg_lastval(self) -> int | None:
        """``lastval()``: the value any sequence (``serial``, identity, ``nextval``) handed out
        last in this session, or ``None`` before any.

        Probed under a savepoint, because ``lastval()`` fails (and would abort the transaction)
        while no sequence has been used yet. Call it inside a transaction.
        """
        assert self._pg is not None
        with self._pg.cursor() as pg_cursor:
            pg_cursor.execute("SAVEPOINT sandbox_probe")
            try:
                pg_cursor.execute("SELECT lastval()")
                found = pg_cursor.fetchone()
            except psycopg.Error:
                if self._pg.broken:
                    raise
                pg_cursor.execute("ROLLBACK TO SAVEPOINT sandbox_probe")
                found = None
            pg_cursor.execute("RELEASE SAVEPOINT sandbox_probe")
        return None if found is None or found[0] is None else int(found[0])

    def _pg_write_counts(self) -> dict[str, tuple[int, int, int]]:
        """This transaction's inserted/updated/deleted row counts per user table so far."""
        assert self._pg is not None
        with self._pg.cursor() as pg_cursor:
            pg_cursor.execute(
                "SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_del "
                "FROM pg_stat_xact_user_tables WHERE n_tup_ins + n_tup_upd + n_tup_del > 0"
            )
            found = pg_cursor.fetchall()
        return {str(name): (int(i), int(u), int(d)) for name, i, u, d in found}

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
        constraint = primary = None
        if isinstance(exc, psycopg.Error):
            constraint = exc.diag.constraint_name
            if exc.diag.message_primary:
                primary = scrub(exc.diag.message_primary, self.target.secrets)
        return DatabaseError(
            _message(exc, self.target),
            connection_lost=self.broken,
            integrity=integrity,
            busy=_is_busy(exc),
            sqlstate=exc.sqlstate if isinstance(exc, psycopg.Error) else None,
            constraint=constraint,
            primary=primary,
        )


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _count_delta(
    before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]
) -> dict[str, list[int]]:
    """Per table, the rows inserted/updated/deleted between two ``_pg_write_counts``."""
    delta = {}
    for table, counts in after.items():
        old = before.get(table, (0, 0, 0))
        moved = [now - then for now, then in zip(counts, old, strict=True)]
        if any(moved):
            delta[table] = moved
    return delta


def _effects_json(effects: dict[str, Any]) -> str:
    return json.dumps(effects, sort_keys=True, separators=(",", ":"))


def _is_busy(exc: Exception) -> bool:
    """True for a lock held by another connection (retryable; nothing changed)."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return (code & 0xFF) in _SQLITE_BUSY_CODES
        return "locked" in str(exc) or "busy" in str(exc)  # pragma: no cover - SQLite < 3.11 API
    return isinstance(exc, psycopg.Error) and exc.sqlstate in _PG_BUSY_STATES


def _message(exc: Exception, target: DatabaseTarget) -> str:
    """The driver's message, with the DSN and its passwords never echoed."""
    text = str(exc).strip() or type(exc).__name__
    if target.backend == "postgresql" and target.location in text:
        text = text.replace(target.location, target.display)
    return scrub(text, target.secrets)
