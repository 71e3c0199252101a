"""The transaction that holds a sandbox's statements: run them, log them, replay them, verified.

The first layer of :class:`~sandbox_core.strategies.transaction.TransactionSandbox`: the
connections to the original database and the retries while it is busy or the connection was
lost; each statement run in a fresh SQLite transaction or in the held PostgreSQL one, and
logged with its outcome; the log replayed into a new transaction with every outcome checked
(a divergence names the statement); the commit marker that makes a commit land once; and the
refusals while a prepared commit holds the statements.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sandbox_core.errors import (
    SandboxBusyError,
    SandboxCommitError,
    SandboxConflictError,
    SandboxConnectionError,
    SandboxError,
    SandboxReplayDivergedError,
    SandboxStateError,
    SandboxStatementError,
)
from sandbox_core.protocol import CommitResult, utc_now
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox, logger
from sandbox_core.strategies.transaction import nontransactional, pragmas
from sandbox_core.strategies.transaction.db import Connection, DatabaseError, check_identifier
from sandbox_core.strategies.transaction.dsn import DatabaseTarget, parse_target
from sandbox_core.strategies.transaction.statement_log import LogEntry, Outcome, StatementLog

if TYPE_CHECKING:
    from sandbox_core.strategies.transaction.prepared import _Staged

STATEMENT_LOG = "statements.jsonl"
DEFAULT_BOOKKEEPING_TABLE = "sandbox_commits"
DEFAULT_TIMEOUT_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 1.0
_SAVEPOINT = "sandbox_statement"
_MARKER_SAVEPOINT = "sandbox_marker"
_DEFERRED_SAVEPOINT = "sandbox_deferred"
_SERIALIZATION_FAILURE = "40001"
_READ_KEYWORDS = frozenset({"SELECT", "VALUES", "SHOW", "TABLE"})
_TRANSACTION_KEYWORDS = frozenset(
    {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE"}
)
_LEADING_NOISE = re.compile(r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/|\()+", re.DOTALL)
_CREDENTIALS_HINT = (
    "the sandbox record keeps no password: supply it through PGPASSWORD, a password file "
    "(PGPASSFILE, ~/.pgpass) or TransactionSandbox.use_credentials()"
)

T = TypeVar("T")


def _marker_text(value: Any) -> str:
    """A marker column as text: a PostgreSQL database with encoding ``SQL_ASCII`` hands text
    columns back as ``bytes`` (psycopg cannot know their encoding); the marker was written as
    UTF-8, so that decodes it (undecodable bytes replaced: reading a marker never fails)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


class _AlreadyCommittedError(Exception):
    """The commit marker exists: another process (or a crashed one) committed this sandbox."""


class _StatementFailedError(Exception):
    """The database refused a statement for the statement's own reasons (not a lock, not a
    lost connection)."""

    def __init__(self, error: DatabaseError) -> None:
        super().__init__(str(error))
        self.error = error


class _PreparedPendingError(SandboxStateError):
    """A prepared commit of this sandbox waits for apply or abort: nothing else may run."""


class _DivergedError(Exception):
    """A replayed statement did not reproduce its recorded outcome."""

    def __init__(self, index: int, total: int, sql: str, detail: str) -> None:
        super().__init__(f"statement {index} of {total} ({sql!r}): {detail}")
        self.index = index
        self.sql = sql


class LoggedTransaction(BaseSandbox):
    """The statement layer of :class:`TransactionSandbox`: connections and retries, statements
    run and logged, the log replayed (verified), the commit marker."""

    # Set by TransactionSandbox.__init__: the password-bearing DSN (in memory only), the held
    # PostgreSQL transaction, what the last statement produced, SQLite's prepared commit.
    _dsn: str | None
    _held: Connection | None
    _last_outcome: Outcome | None
    _last_columns: list[str]
    _staged: _Staged | None

    # -- connections and retries ----------------------------------------------------------------

    @property
    def _bookkeeping_table(self) -> str:
        return str(self._options.get("bookkeeping_table") or DEFAULT_BOOKKEEPING_TABLE)

    @property
    def _timeout(self) -> float:
        return float(self._options.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)

    def _target(self) -> DatabaseTarget:
        return parse_target(self._dsn or self.original_path)

    def _connect(self, target: DatabaseTarget | None = None) -> Connection:
        return Connection(target or self._target(), timeout_seconds=self._timeout)

    def _retrying(self, action: Callable[[], T]) -> T:
        """``action()``, retried with backoff for ``timeout_seconds`` while the database is
        busy or the connection was lost (each retry reconnects and replays).

        Raises:
            DatabaseError: the last error, once the time is up or it is not retryable.
        """
        deadline = time.monotonic() + self._timeout
        delay = FIRST_BACKOFF_SECONDS
        while True:
            try:
                return action()
            except DatabaseError as exc:
                if exc.permanent or not (exc.busy or exc.connection_lost):
                    raise
                if exc.connection_lost or exc.sqlstate == _SERIALIZATION_FAILURE:
                    # A serialization failure under REPEATABLE READ / SERIALIZABLE (the
                    # database's default isolation) means the held transaction's snapshot is
                    # stale: the retry replays the log into a new one (verified).
                    self._drop_connection()
                if time.monotonic() + delay > deadline:
                    raise
                logger.info(
                    "sandbox %s: %s; retrying in %.2fs",
                    self.sandbox_id,
                    "database busy" if exc.busy else "connection lost",
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)

    def _unavailable(
        self, exc: DatabaseError | ValueError, doing: str, *, commit: bool = False
    ) -> SandboxError:
        """The sandbox error for a database error that retrying did not cure."""
        if isinstance(exc, DatabaseError) and exc.connection_lost:
            hint = (
                f"; {_CREDENTIALS_HINT}"
                if exc.permanent and self._dsn is None and "***" in self.original_path
                else ""
            )
            return SandboxConnectionError(
                f"{doing}: cannot reach database {self._target().display}: {exc}{hint} "
                "(the sandbox and its statement log are kept; retry later)"
            )
        if isinstance(exc, DatabaseError) and exc.busy:
            return SandboxBusyError(
                f"{doing}: database {self._target().display} stayed locked by another "
                f"connection for {self._timeout:g}s: {exc} (nothing changed; retry later)"
            )
        return SandboxCommitError(f"{doing}: {exc}") if commit else SandboxError(f"{doing}: {exc}")

    def _diverged(self, exc: _DivergedError, consequence: str) -> SandboxReplayDivergedError:
        return SandboxReplayDivergedError(
            f"replay of sandbox {self.sandbox_id} diverged at {exc}; {consequence} and the "
            "database is unchanged (roll the sandbox back and redo its work)",
            statement=exc.index,
            sql=exc.sql,
        )

    def _drop_connection(self) -> None:
        connection, self._held = self._held, None
        if connection is not None:
            _finish(connection)

    # -- statements -----------------------------------------------------------------------------

    def _run(self, sql: str, params: Any, *, many: bool) -> list[tuple[Any, ...]]:
        with self._lock:
            if self._status not in (
                SandboxStatus.CREATED,
                SandboxStatus.ACTIVE,
                SandboxStatus.ROLLED_BACK,
            ):
                raise SandboxStateError(
                    f"cannot execute statements in sandbox {self.sandbox_id} "
                    f"in status {self._status.value}"
                )
            if self._staged is not None:
                raise _PreparedPendingError(self._pending_message(self._staged.txid))
            keyword = _leading_keyword(sql)
            if keyword in _TRANSACTION_KEYWORDS:
                raise SandboxStatementError(
                    f"{keyword} is managed by the sandbox: use commit() or rollback()"
                )
            fresh = self._target().backend == "sqlite"
            if fresh:
                if keyword == "PRAGMA":
                    refused = pragmas.refusal(sql)
                else:
                    refused = nontransactional.sqlite_refusal(keyword)
            else:
                refused = nontransactional.refusal(sql)
            if refused is not None:
                raise SandboxStatementError(refused)
            try:
                entry = LogEntry.make(sql, params, many=many)
            except ValueError as exc:
                raise SandboxStatementError(str(exc)) from exc
            logged = many or not _is_read_only(keyword, sql)
            logged = logged or (not fresh and nontransactional.acts_beyond_rows(sql))
            statement = self._fresh_statement if fresh else self._held_statement
            try:
                rows, outcome = self._retrying(lambda: statement(entry, params, logged))
            except _StatementFailedError as exc:
                raise SandboxStatementError(
                    f"statement failed in sandbox {self.sandbox_id}: {exc.error}",
                    integrity=exc.error.integrity,
                ) from exc.error
            except _AlreadyCommittedError as exc:
                raise SandboxStateError(
                    f"sandbox {self.sandbox_id} was already committed (commit marker found); "
                    "call commit() to record the result"
                ) from exc
            except _DivergedError as exc:
                raise self._diverged(exc, "the statement did not run") from exc
            except OSError as exc:
                raise SandboxError(
                    f"statement in sandbox {self.sandbox_id} could not be recorded in its "
                    f"statement log: {exc}"
                ) from exc
            except DatabaseError as exc:
                raise self._unavailable(
                    exc, f"statement in sandbox {self.sandbox_id} did not run"
                ) from exc
            self._last_outcome = outcome
            return rows

    def _fresh_statement(
        self, entry: LogEntry, params: Any, logged: bool
    ) -> tuple[list[tuple[Any, ...]], Outcome]:
        """SQLite: one short transaction that replays the log, runs the statement, rolls back."""
        log = self._log()
        immediate = logged or (log.path.exists() and log.path.stat().st_size > 0)
        connection = self._connect()
        try:
            entries = log.read()
            _connection_pragmas(connection, [*entries, entry])
            # IMMEDIATE takes the write lock up front (waiting with the busy timeout), so the
            # transaction never has to upgrade a read snapshot that another writer made stale.
            connection.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            self._refuse_if_committed(connection)
            # Effects are compared at commit, prepare and review; not on every statement's
            # replay (it would double the cost of a long log's replay for no earlier safety).
            self._replay(connection, entries, effects=False)
            self.activate()
            rows, outcome = _run_statement(connection, entry.sql, params, entry.many, logged)
            self._last_columns = list(connection.last_columns)
            if logged:
                log.append(entry.with_outcome(outcome))
            return rows, outcome
        finally:
            _finish(connection)

    def _held_statement(
        self, entry: LogEntry, params: Any, logged: bool
    ) -> tuple[list[tuple[Any, ...]], Outcome]:
        """PostgreSQL: the statement runs under a savepoint in the held transaction.

        Every statement's effects are measured, so a read that wrote (a function called from a
        ``SELECT``) is logged like any write (else its write would be lost on replay).
        """
        connection = self._open_held()
        self.activate()
        connection.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            rows, outcome = _run_statement(connection, entry.sql, params, entry.many, True)
            self._last_columns = list(connection.last_columns)
            if logged or outcome.wrote:
                self._log().append(entry.with_outcome(outcome))
        except BaseException as exc:
            self._undo_statement(connection, exc)
            raise
        try:
            connection.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        except DatabaseError:
            # The statement is logged: the next use replays it into a new transaction.
            self._drop_connection()
        return rows, outcome

    def _open_held(self) -> Connection:
        """The live PostgreSQL transaction holding every logged statement; replays when new.

        Raises:
            DatabaseError: the database cannot be reached or is busy.
            _AlreadyCommittedError: the commit marker exists; replaying would apply the log twice.
            _DivergedError: the replay did not reproduce the log's outcomes.
        """
        if self._held is not None and not self._held.broken:
            return self._held
        self._drop_connection()
        connection = self._connect()
        try:
            self._refuse_if_committed(connection)
            self._refuse_if_prepared(connection)
            connection.execute("BEGIN")
            self._replay(connection, self._log().read())
        except BaseException:
            connection.close()
            raise
        self._held = connection
        return connection

    def _replay(
        self, connection: Connection, entries: list[LogEntry], *, effects: bool = True
    ) -> None:
        """Run the logged statements again, checking each against its recorded outcome.

        Raises:
            _DivergedError: a statement failed, or produced another outcome.
            DatabaseError: busy or connection lost (retryable).
        """
        total = len(entries)
        for index, entry in enumerate(entries, start=1):
            try:
                _, outcome = _run_statement(
                    connection, entry.sql, entry.driver_params(), entry.many, True, effects
                )
            except _StatementFailedError as exc:
                raise _DivergedError(
                    index, total, entry.sql, f"failed on replay: {exc.error}"
                ) from exc
            difference = entry.outcome.difference(outcome) if entry.outcome else None
            if difference is not None:
                raise _DivergedError(index, total, entry.sql, f"on replay it {difference}")

    def _refuse_if_prepared(self, connection: Connection) -> None:
        pending = self._pending_gids(connection)
        if pending:
            # Replaying would wait for the prepared transaction's own row locks.
            raise _PreparedPendingError(self._pending_message(pending[0]))

    def _refuse_if_committed(self, connection: Connection) -> None:
        if self._read_marker(connection) is not None:
            raise _AlreadyCommittedError(self.sandbox_id)

    def _undo_statement(self, connection: Connection, exc: BaseException) -> None:
        """Return the held transaction to the state before the failed statement."""
        if isinstance(exc, DatabaseError) and exc.connection_lost:
            # The transaction died; the log still has every good statement for the next replay.
            self._drop_connection()
            return
        try:
            connection.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            connection.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        except DatabaseError:
            self._drop_connection()

    # -- shared by commit and prepare -----------------------------------------------------------

    def _check_foreign_keys(self, connection: Connection, on: bool, action: str) -> None:
        """SQLite with ``PRAGMA foreign_keys`` turned on in the sandbox: the violations its
        ``COMMIT`` would refuse (deferred keys included) refuse ``action`` first, naming them as
        conflicts; nothing is written and the sandbox stays ACTIVE.

        Raises:
            SandboxConflictError: with ``conflicts`` = ``table row N -> parent`` texts.
        """
        if not on:
            return
        violations = pragmas.describe_violations(connection.execute("PRAGMA foreign_key_check"))
        if violations:
            shown = ", ".join(violations[:10])
            raise SandboxConflictError(
                f"{action} of sandbox {self.sandbox_id} refused: PRAGMA foreign_keys is on and "
                f"{len(violations)} row(s) violate a foreign key: {shown}",
                violations,
            )

    def _check_deferred_constraints(self, connection: Connection, action: str) -> None:
        """PostgreSQL: the constraints the held transaction's ``COMMIT`` would check (deferred
        foreign keys, deferred unique keys, deferred constraint triggers) are checked now, so a
        violation refuses ``action`` while the transaction is still alive (case 47).

        ``SET CONSTRAINTS ALL IMMEDIATE`` under a savepoint fires every pending deferred check;
        the savepoint is rolled back either way, so each constraint keeps its mode (a statement
        run after a refusal is checked as before) and nothing the sandbox wrote is undone.

        Raises:
            SandboxConflictError: ``conflicts`` = ``["<constraint>: <message>"]``; the held
                transaction and the log are kept, the sandbox stays ACTIVE.
            DatabaseError: busy or connection lost (retryable).
        """
        connection.execute(f"SAVEPOINT {_DEFERRED_SAVEPOINT}")
        refused: DatabaseError | None = None
        try:
            connection.execute("SET CONSTRAINTS ALL IMMEDIATE")
        except DatabaseError as exc:
            if exc.connection_lost or exc.busy:
                raise
            refused = exc
        connection.execute(f"ROLLBACK TO SAVEPOINT {_DEFERRED_SAVEPOINT}")
        connection.execute(f"RELEASE SAVEPOINT {_DEFERRED_SAVEPOINT}")
        if refused is not None:
            raise self._constraint_refusal(refused, action)

    def _constraint_refusal(self, exc: DatabaseError, action: str) -> SandboxConflictError:
        """The refusal of ``action`` for a constraint the database checks at ``COMMIT``."""
        conflict = f"{exc.constraint}: {exc.primary}" if exc.constraint else exc.primary
        return SandboxConflictError(
            f"{action} of sandbox {self.sandbox_id} refused: a constraint checked at COMMIT is "
            f"violated: {exc} (nothing was committed; the sandbox keeps its statements: fix the "
            "data through it and commit again, or roll it back)",
            [conflict],
        )

    def _settle(self, marker: dict[str, Any], exc: DatabaseError) -> CommitResult:
        """After an error at COMMIT, the marker decides whether the commit landed.

        Raises:
            DatabaseError: ``exc`` when the marker is absent (nothing landed), or the error of
                reading the marker (outcome unknown: the next ``commit()`` checks first).
        """
        landed = self._read_marker()
        if landed is None:
            raise exc
        return self._result(landed, already_committed=landed != marker)

    # -- a prepared commit holds the statements -------------------------------------------------

    def _pending_gids(self, connection: Connection | None = None) -> list[str]:
        """Prepared transactions of this sandbox in its PostgreSQL database (gid order)."""
        own = connection is None
        connection = connection or self._connect()
        try:
            found = connection.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                "AND gid LIKE %s ORDER BY gid",
                (f"%.{self.sandbox_id}",),
            )
        finally:
            if own:
                connection.close()
        # LIKE wildcards in a caller-chosen sandbox id must not match another sandbox's gid.
        return [str(g) for (g,) in found if str(g).endswith(f".{self.sandbox_id}")]

    def _pending_message(self, txid_or_gid: str) -> str:
        txid = txid_or_gid.removesuffix(f".{self.sandbox_id}")
        return (
            f"sandbox {self.sandbox_id} has a commit prepared under {txid}: apply or abort it "
            "before running statements or committing again"
        )

    # -- commit marker --------------------------------------------------------------------------

    def _new_marker(self, message: str | None, statement_count: int) -> dict[str, Any]:
        return {
            "committed_at": utc_now().isoformat(),
            "statement_count": statement_count,
            "message": message,
        }

    def _read_marker(self, connection: Connection | None = None) -> dict[str, Any] | None:
        """The marker row of this sandbox (over a separate short connection unless given)."""
        own = connection is None
        connection = connection or self._connect()
        try:
            table = check_identifier(self._bookkeeping_table)
            if not connection.table_exists(table):
                return None
            p = connection.placeholder
            rows = connection.execute(
                f"SELECT committed_at, statement_count, message FROM {table} "  # noqa: S608 - identifier checked
                f"WHERE sandbox_id = {p}",
                (self.sandbox_id,),
            )
        finally:
            if own:
                connection.close()
        if not rows:
            return None
        committed_at, statement_count, message = rows[0]
        return {
            "committed_at": _marker_text(committed_at),
            "statement_count": int(statement_count),
            "message": None if message is None else _marker_text(message),
        }

    def _ensure_bookkeeping_table(self, connection: Connection) -> str:
        """Create the bookkeeping table when missing; returns its (checked) name."""
        table = check_identifier(self._bookkeeping_table)
        if not connection.table_exists(table):
            connection.execute(
                f"CREATE TABLE IF NOT EXISTS {table} ("
                "sandbox_id TEXT PRIMARY KEY, resource_id TEXT NOT NULL, plan_id TEXT NOT NULL, "
                "committed_at TEXT NOT NULL, statement_count INTEGER NOT NULL, message TEXT)"
            )
        return table

    def _write_marker(self, connection: Connection, marker: dict[str, Any]) -> None:
        table = self._ensure_bookkeeping_table(connection)
        p = connection.placeholder
        connection.execute(
            f"INSERT INTO {table} (sandbox_id, resource_id, plan_id, committed_at, "  # noqa: S608 - identifier checked
            f"statement_count, message) VALUES ({p}, {p}, {p}, {p}, {p}, {p})",
            (
                self.sandbox_id,
                self.resource_id,
                self._require_context().plan_id,
                marker["committed_at"],
                marker["statement_count"],
                marker["message"],
            ),
        )

    def _result(self, marker: dict[str, Any], *, already_committed: bool) -> CommitResult:
        metadata: dict[str, Any] = {
            "strategy": self.strategy,
            "backend": self._target().backend,
            "statements": marker["statement_count"],
            "already_committed": already_committed,
        }
        if marker.get("message"):
            metadata["message"] = marker["message"]
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            timestamp=datetime.fromisoformat(marker["committed_at"]),
            metadata=metadata,
        )

    # -- statement log --------------------------------------------------------------------------

    def _scratch_dir(self) -> Path | None:
        return Path(self._context.sandbox_path) if self._context else None

    def _log(self) -> StatementLog:
        return StatementLog(Path(self._require_context().sandbox_path) / STATEMENT_LOG)


# -- helpers --------------------------------------------------------------------------------------


def _run_statement(
    connection: Connection,
    sql: str,
    params: Any,
    many: bool,
    capture: bool,
    effects: bool = True,
) -> tuple[list[tuple[Any, ...]], Outcome]:
    """Run one statement and capture its outcome (the generated id only when ``capture``, what
    it wrote only when ``effects`` too; unmeasured effects are not compared).

    Raises:
        _StatementFailedError: the database refused the statement itself.
        DatabaseError: busy or connection lost (retryable).
    """
    try:
        result = connection.run(sql, params, many=many, capture_id=capture, effects=effects)
    except DatabaseError as exc:
        if exc.busy or exc.connection_lost:
            raise
        raise _StatementFailedError(exc) from exc
    return result.rows, Outcome.of(
        result.rows, result.rowcount, result.generated_id, result.effects
    )


def _connection_pragmas(connection: Connection, entries: list[LogEntry]) -> bool:
    """Set the connection-scoped pragmas the log turned on, before ``BEGIN`` (SQLite ignores
    ``PRAGMA foreign_keys`` inside a transaction); True when foreign keys are on."""
    on = pragmas.foreign_keys_on(entry.sql for entry in entries)
    if on:
        connection.execute("PRAGMA foreign_keys = ON")
    return on


def _finish(connection: Connection) -> None:
    """Roll back whatever is open and close; the server discards it on close anyway."""
    if not connection.broken:
        with contextlib.suppress(DatabaseError):
            connection.execute("ROLLBACK")
    connection.close()


def _leading_keyword(sql: str) -> str:
    """First SQL keyword, upper-case, after comments, whitespace and opening parentheses."""
    stripped = _LEADING_NOISE.sub("", sql, count=1)
    match = re.match(r"[A-Za-z]+", stripped)
    return match.group(0).upper() if match else ""


def _is_read_only(keyword: str, sql: str) -> bool:
    """Plain reads need no replay; anything else (including ``SELECT ... INTO``) is logged."""
    return keyword in _READ_KEYWORDS and not re.search(r"\bINTO\b", sql, re.IGNORECASE)
