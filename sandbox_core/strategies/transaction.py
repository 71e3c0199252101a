"""``TransactionSandbox``: database writes held in one transaction (seed 002, "TransactionSandbox").

"Wraps database writes in a transaction. ``commit()`` issues ``COMMIT``; ``rollback()`` issues
``ROLLBACK``. Cannot be rolled back after ``COMMIT``." The original is a SQLite file (the embedded
default; a path or ``sqlite:///abs/path``) or a PostgreSQL server (a ``postgresql://`` /
``postgres://`` URL or a libpq ``key=value`` DSN, driven through psycopg 3).

Every write statement that succeeds is appended (fsynced) to
``<sandbox_root>/txn/<sandbox_id>/statements.jsonl`` together with what it produced (row count,
generated id, a digest of the rows it returned; ``_statement_log``). The log is the sandbox's
transaction: commit is replay (when needed) + a marker row + ``COMMIT``, in one transaction.

Lock policy, per backend (issue 7, case 31):

- SQLite: no transaction is held between statements. Each ``execute`` opens a fresh connection,
  ``BEGIN IMMEDIATE`` (``BEGIN`` for a read with an empty log), replays the log, runs the
  statement, records it and rolls back; ``commit`` does the same and ends with ``COMMIT``. So the
  application is never blocked between the sandbox's statements (in WAL and in rollback-journal
  mode), a stale snapshot cannot exist, and ``BEGIN IMMEDIATE`` waits for other writers with the
  busy timeout instead of failing at once on a read-to-write upgrade.
- PostgreSQL: one transaction is held open between statements (replaying it would consume new
  sequence values every time). Reads take no locks that block writers; rows the sandbox wrote
  stay locked until commit, rollback or ``close()``, as in any transaction. ``lock_timeout``
  bounds each wait for a lock.
- A lock held by someone else (SQLite busy/locked; PostgreSQL lock timeout, deadlock) is retried
  with backoff for ``timeout_seconds``, then raised as :class:`SandboxBusyError`: nothing changed
  and the sandbox keeps its status. It never becomes ERRORED for a lock.

Replay is verified (issue 7, case 32): every replayed statement must produce the outcome the log
recorded, else nothing is applied and :class:`SandboxReplayDivergedError` names the statement;
the sandbox stays ACTIVE. A connection the server closed (idle-in-transaction timeout,
``pg_terminate_backend``, restart) is replaced and replayed transparently; a server that stays
unreachable for ``timeout_seconds`` is a :class:`SandboxConnectionError` (status kept).

Never applied twice: the marker row ``(sandbox_id, ...)`` goes into the bookkeeping table
(``sandbox_commits`` unless ``bookkeeping_table=`` says otherwise) in the same transaction as the
writes. :meth:`TransactionSandbox.commit_landed` reports whether it exists; ``commit()`` looks for
it first and, when found, returns the recorded result instead of applying the statements again.

Two-phase plan commit (issue 9; docs/transaction-strategy.md): ``prepare(txid)`` replays (verified)
and writes the marker, then PostgreSQL ``PREPARE TRANSACTION '<txid>.<sandbox_id>'`` (durable;
``max_prepared_transactions = 0`` is a :class:`TwoPhaseUnavailableError` found before replaying)
or, on SQLite, keeps the ``BEGIN IMMEDIATE`` transaction open in this process (not durable: the
plan's last resource). ``apply_prepared`` is ``COMMIT PREPARED`` / ``COMMIT``, settled by the
marker when repeated; ``abort_prepared`` is ``ROLLBACK PREPARED`` / ``ROLLBACK``. After a crash a
SQLite apply refuses unless the marker says the commit landed (it never replays silently).
``review()`` summarises the log (write statements, tables, digest) and dry-replays it for
conflicts.

Passwords are never stored (``_dsn``): the record, context and messages hold the redacted DSN; the
password lives in this process's memory, or comes from libpq's ``PGPASSWORD`` / password file, or
from :meth:`TransactionSandbox.use_credentials` after a reopen.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sandbox_core._db import (
    Connection,
    DatabaseError,
    DatabaseTarget,
    Params,
    check_identifier,
    parse_target,
)
from sandbox_core._dsn import redact, same_database, secrets_of
from sandbox_core.base import BaseSandbox, logger
from sandbox_core.errors import (
    SandboxBusyError,
    SandboxCommitError,
    SandboxConnectionError,
    SandboxCreationError,
    SandboxError,
    SandboxReplayDivergedError,
    SandboxRetryableError,
    SandboxStateError,
    SandboxStatementError,
    TwoPhaseUnavailableError,
)
from sandbox_core.protocol import (
    ChangeSummary,
    CommitResult,
    PreparedCommit,
    SandboxContext,
    utc_now,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies import _sqlite_pragmas as pragmas
from sandbox_core.strategies._statement_log import (
    LogEntry,
    Outcome,
    StatementLog,
    log_digest,
    tables_written,
)

STATEMENT_LOG = "statements.jsonl"
DEFAULT_BOOKKEEPING_TABLE = "sandbox_commits"
DEFAULT_TIMEOUT_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 1.0
_SAVEPOINT = "sandbox_statement"
_MARKER_SAVEPOINT = "sandbox_marker"
_READ_KEYWORDS = frozenset({"SELECT", "VALUES", "SHOW", "TABLE"})
_TRANSACTION_KEYWORDS = frozenset(
    {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE"}
)
_LEADING_NOISE = re.compile(r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/|\()+", re.DOTALL)
_TXID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# A gid is quoted into PREPARE/COMMIT PREPARED: only characters that need no quoting.
_GID = re.compile(r"^[A-Za-z0-9._-]{1,199}$")
# PostgreSQL SQLSTATE undefined_object: COMMIT/ROLLBACK PREPARED of a gid that is not prepared.
_NO_SUCH_PREPARED = "42704"
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


@dataclass
class _Staged:
    """SQLite's prepared commit: the open ``BEGIN IMMEDIATE`` transaction holding the replayed
    statements and the marker row, kept in this process until apply or abort."""

    txid: str
    connection: Connection
    marker: dict[str, Any]
    digest: str
    statements: int


class _DivergedError(Exception):
    """A replayed statement did not reproduce its recorded outcome."""

    def __init__(self, index: int, total: int, sql: str, detail: str) -> None:
        super().__init__(f"statement {index} of {total} ({sql!r}): {detail}")
        self.index = index
        self.sql = sql


class TransactionSandbox(BaseSandbox):
    """Strategy ``transaction_rollback``: writes held in one database transaction until commit.

    Args:
        resource_id: id of the sandboxed resource.
        original_path: SQLite file path, ``sqlite:///abs/path``, or a PostgreSQL DSN (URL or
            ``key=value``). A password in it is kept in this process's memory only:
            ``original_path``, the context and :meth:`to_record` hold the redacted DSN
            (``password=***``), so another process needs ``PGPASSWORD`` / a password file or
            :meth:`use_credentials`.
        **options: ``sandbox_root`` (str, parent of the scratch dir), ``bookkeeping_table``
            (str, default ``"sandbox_commits"``), ``timeout_seconds`` (float, default 10: the
            connect timeout, each wait for a lock, and the budget of retries).

    ``get_path`` resolves inside the sandbox's scratch dir (``<sandbox_root>/txn/<sandbox_id>``),
    a private working area for the actor; it never returns the database file, which would bypass
    the transaction. Traversal is refused with ``ValueError("Path traversal not allowed")``.
    """

    strategy = "transaction_rollback"
    layout_folder = "txn"
    rollbackable = False

    def __init__(self, resource_id: str, original_path: str, **options: Any) -> None:
        super().__init__(resource_id, redact(str(original_path or "")), **options)
        # The password-bearing DSN lives in memory only, never in the record.
        self._dsn: str | None = str(original_path) if secrets_of(str(original_path)) else None
        self._held: Connection | None = None
        self._last_outcome: Outcome | None = None
        self._staged: _Staged | None = None
        try:
            # PostgreSQL's PREPARE TRANSACTION survives a crash; SQLite's held transaction does
            # not, so a SQLite sandbox can only be the last resource of a two-phase plan.
            backend = parse_target(self._dsn or self.original_path).backend
            self.prepares_durably = backend != "sqlite"
        except ValueError:
            self.prepares_durably = False  # create() refuses such an original anyway

    # -- public API beyond the protocol -------------------------------------------------------

    def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one SQL statement inside the sandbox's transaction; activates the sandbox.

        ``sql`` and ``params`` go to the driver unchanged: ``?`` / ``:name`` placeholders for
        SQLite, ``%s`` / ``%(name)s`` for PostgreSQL. Parameter values must be ``None``, bool,
        int, float, str or bytes (they are recorded in the statement log). Statements other than
        plain reads (``SELECT`` without ``INTO``, ``VALUES``, ``SHOW``, ``TABLE``) are logged
        with their outcome.

        Returns:
            The rows the statement returned, as tuples (``[]`` when it returns none).

        Raises:
            SandboxStateError: the sandbox is not CREATED, ACTIVE or ROLLED_BACK, or it was
                already committed by another process.
            SandboxStatementError: the database refused the statement, it is a transaction
                control statement (use commit/rollback), or a parameter cannot be logged. The
                sandbox stays usable.
            SandboxBusyError: another connection kept the lock for ``timeout_seconds``.
            SandboxConnectionError: the database stayed unreachable for ``timeout_seconds``.
            SandboxReplayDivergedError: the log had to be replayed and did not reproduce what
                the sandbox saw (status stays ACTIVE; roll back to start over).
            SandboxError: the statement log cannot be read or written.
        """
        return self._run(sql, params, many=False)

    def executemany(self, sql: str, seq_of_params: Iterable[Params]) -> None:
        """Run one write statement once per parameter set (one log entry). See :meth:`execute`.

        Raises:
            The same errors as :meth:`execute`.
        """
        self._run(sql, list(seq_of_params), many=True)

    @property
    def last_outcome(self) -> dict[str, Any] | None:
        """What the last successful :meth:`execute` in this process produced, or ``None``.

        ``{"rowcount": int, "last_id": int | None, "rows": int, ...}``: rows changed (``-1``
        when not applicable), the id the database generated for it (write statements only:
        SQLite ``lastrowid`` of a table with an ``INTEGER PRIMARY KEY``, PostgreSQL
        ``lastval()``), rows returned. The same values are recorded in the log and checked on
        replay.
        """
        return self._last_outcome.to_json() if self._last_outcome else None

    def statements(self) -> list[dict[str, Any]]:
        """The logged write statements, oldest first, for review before commit.

        Each entry is ``{"sql": str, "params": list | dict | None, "many": bool,
        "outcome": {...}}`` (bytes parameters appear as ``{"$bytes": "<base64>"}``; ``outcome``
        holds ``rowcount``, ``last_id``, ``rows``, ``rows_sha256`` and ``preview``).

        Raises:
            SandboxStateError: the sandbox has not been created.
            SandboxError: the log cannot be read.
        """
        with self._lock:
            try:
                return [entry.to_json() for entry in self._log().read()]
            except OSError as exc:
                raise SandboxError(
                    f"cannot read statement log of {self.sandbox_id}: {exc}"
                ) from exc

    def commit_landed(self) -> bool:
        """True when this sandbox's commit marker is in the original database.

        Answers "did COMMIT land?" after a crash, from any process: the marker row is written in
        the same transaction as the sandbox's statements, so it exists if and only if they were
        committed. Uses its own short connection; works in every status.

        Raises:
            SandboxConnectionError: the database stayed unreachable for ``timeout_seconds``.
            SandboxError: the database cannot be queried.
        """
        with self._lock:
            try:
                return self._retrying(self._read_marker) is not None
            except (DatabaseError, ValueError) as exc:
                raise self._unavailable(
                    exc, f"cannot check commit of sandbox {self.sandbox_id}"
                ) from exc

    def close(self) -> None:
        """Roll back and close this process's connection; status and statement log are kept.

        The next :meth:`execute` or :meth:`commit` (here or in another process, after
        :meth:`reopen`) replays the log into a fresh transaction. SQLite holds nothing between
        statements anyway; on PostgreSQL this releases the rows the sandbox locked. A SQLite
        commit prepared in this process is rolled back too (it lives in this process only); a
        PostgreSQL prepared commit is the server's and stays. Idempotent.
        """
        with self._lock:
            staged, self._staged = self._staged, None
            if staged is not None:
                _finish(staged.connection)
            self._drop_connection()

    def use_credentials(self, dsn: str) -> None:
        """Give this process the password-bearing DSN of the original (after :meth:`reopen`).

        The record keeps only the redacted DSN; the password given here stays in memory.

        Raises:
            ValueError: ``dsn`` names another database than this sandbox's original.
        """
        with self._lock:
            if not same_database(dsn, self.original_path):
                raise ValueError(
                    f"{redact(dsn)} is not the original of sandbox {self.sandbox_id} "
                    f"({self.original_path})"
                )
            self._drop_connection()
            self._dsn = dsn if secrets_of(dsn) else None

    def commit(self, message: str | None = None) -> CommitResult:
        """Commit the logged statements (see :meth:`BaseSandbox.commit`).

        Raises:
            SandboxStateError: the sandbox is not CREATED or ACTIVE.
            SandboxReplayDivergedError: the replay did not reproduce what the sandbox saw; the
                database is unchanged and the sandbox stays ACTIVE.
            SandboxBusyError, SandboxConnectionError: retry later; the sandbox stays ACTIVE (a
                commit whose outcome was unknown is settled by the marker on the next call).
            SandboxCommitError: any other failure (status becomes ERRORED).
        """
        with self._lock:
            if self._staged is not None and self._status.can_commit:
                raise _PreparedPendingError(self._pending_message(self._staged.txid))
            try:
                return super().commit(message)
            except _PreparedPendingError:
                # Refused before anything ran: the prepared commit decides, not this call.
                if self._status is SandboxStatus.ERRORED:
                    self._status = SandboxStatus.ACTIVE
                raise
            except SandboxRetryableError:
                # Nothing was applied, or the marker settles it next time: stay usable.
                if self._status is SandboxStatus.ERRORED:
                    self._status = SandboxStatus.ACTIVE
                raise

    # -- lifecycle hooks ------------------------------------------------------------------------

    def _do_create(self, plan_id: str) -> SandboxContext:
        try:
            target = self._target()
            table = check_identifier(self._bookkeeping_table)
        except ValueError as exc:
            raise SandboxCreationError(f"cannot create {self.strategy} sandbox: {exc}") from exc
        try:
            probe = self._connect(target)
            try:
                # Reading the schema proves the file is a database (not just any file).
                probe.execute(
                    "SELECT count(*) FROM sqlite_master"
                    if target.backend == "sqlite"
                    else "SELECT 1"
                )
            finally:
                probe.close()
        except DatabaseError as exc:
            # The message names the database by its display form: a DSN password never leaks.
            raise SandboxCreationError(
                f"cannot create {self.strategy} sandbox for {target.display}: {exc}"
            ) from exc
        scratch = self.sandbox_root / "txn" / self.sandbox_id
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / STATEMENT_LOG).touch()
        return SandboxContext(
            sandbox_id=self.sandbox_id,
            sandbox_path=str(scratch),
            original_path=self.original_path,
            resource_id=self.resource_id,
            plan_id=plan_id,
            metadata={
                "strategy": self.strategy,
                "backend": target.backend,
                "database": target.display,
                "statement_log": str(scratch / STATEMENT_LOG),
                "bookkeeping_table": table,
            },
        )

    def _do_commit(self, message: str | None) -> CommitResult:
        doing = f"commit of sandbox {self.sandbox_id} failed"
        try:
            if self._target().backend == "sqlite":
                return self._retrying(lambda: self._commit_fresh(message))
            return self._commit_held(message)
        except _DivergedError as exc:
            raise self._diverged(exc, "nothing was committed") from exc
        except (DatabaseError, ValueError) as exc:
            self._drop_connection()
            raise self._unavailable(exc, doing, commit=True) from exc
        except OSError as exc:
            self._drop_connection()
            raise SandboxCommitError(f"{doing}: statement log: {exc}") from exc

    def _do_rollback(self) -> None:
        # Discard the log first: after that, no process can bring these statements back.
        self._log().replace([])
        self._release_prepared()
        held = self._held
        if held is not None and not held.broken:
            try:
                held.execute("ROLLBACK")
            except DatabaseError as exc:
                # The server discards the transaction when the connection closes anyway.
                logger.warning("ROLLBACK of sandbox %s failed: %s", self.sandbox_id, exc)
        self._drop_connection()

    def _do_cleanup(self) -> None:
        self._release_prepared()  # a prepared transaction left behind would hold its locks
        self._drop_connection()
        scratch = self._scratch_dir()
        if scratch is not None and scratch.exists():
            shutil.rmtree(scratch)

    # -- two-phase plan commit (issue 9) --------------------------------------------------------

    def prepared_gid(self, txid: str) -> str:
        """The PostgreSQL global transaction id of this sandbox's prepared commit under ``txid``:
        ``"<txid>.<sandbox_id>"`` (at most 91 characters; PostgreSQL allows 199). Derived from
        the two ids alone, so apply and abort find it in a fresh process; never a secret.

        Raises:
            ValueError: ``txid`` is not 1-64 characters of ``[A-Za-z0-9._-]``.
        """
        if not _TXID.match(txid):
            raise ValueError(
                f"invalid transaction id {txid!r}: 1-64 characters of letters, digits, "
                "'.', '_', '-'"
            )
        gid = f"{txid}.{self.sandbox_id}"
        if not _GID.match(gid):
            raise ValueError(f"sandbox id {self.sandbox_id!r} cannot name a prepared transaction")
        return gid

    def _do_review(self) -> ChangeSummary:
        """The logged statements as a change summary, with a dry replay for conflicts.

        ``changed`` holds the tables the statements' text writes (:func:`tables_written`), and
        ``"statement <n>"`` for a write whose text names no table (a function called from a
        ``SELECT``). The dry replay runs the log in a transaction that is rolled back, so it
        holds locks only while it runs (SQLite: the write lock, like one ``execute``). It is
        skipped when this sandbox already holds its statements in a live transaction (the held
        PostgreSQL transaction, or a prepared commit): they ran there, and replaying them in a
        second connection would wait for that transaction's own locks.
        """
        entries = self._log().read()
        changed: list[str] = []
        for number, entry in enumerate(entries, start=1):
            named = tables_written(entry.sql)
            changed.extend(t for t in named or [f"statement {number}"] if t not in changed)
        return ChangeSummary(
            sandbox_id=self.sandbox_id,
            resource_id=self.resource_id,
            strategy=self.strategy,
            digest=log_digest(entries),
            changed=sorted(changed),
            statements=len(entries),
            conflicts=self._dry_replay(entries),
        )

    def _dry_replay(self, entries: list[LogEntry]) -> list[str]:
        """Conflicts a commit would meet now: ``["statement <n>: <sql> (<what differs>)"]``."""
        if not entries or self._staged is not None:
            return []
        if self._held is not None and not self._held.broken:
            return []
        sqlite = self._target().backend == "sqlite"

        def attempt() -> list[str]:
            connection = self._connect()
            try:
                connection.execute("BEGIN IMMEDIATE" if sqlite else "BEGIN")
                if not sqlite and self._pending_gids(connection):
                    return []  # a prepared commit holds the statements (and their locks)
                if self._read_marker(connection) is not None:
                    return ["the commit marker exists: the sandbox was already committed"]
                try:
                    self._replay(connection, entries)
                except _DivergedError as exc:
                    detail = str(exc).split(": ", 1)[-1]
                    return [f"statement {exc.index}: {exc.sql} ({detail})"]
                return []
            finally:
                _finish(connection)

        try:
            return self._retrying(attempt)
        except (DatabaseError, ValueError) as exc:
            raise self._unavailable(exc, f"review of sandbox {self.sandbox_id} failed") from exc

    def _do_prepare(self, txid: str, message: str | None) -> PreparedCommit:
        """Replay (verified) + marker row in one transaction, kept open for the decision.

        PostgreSQL: ``SHOW max_prepared_transactions`` first (0 raises
        :class:`TwoPhaseUnavailableError` before anything runs), then the held transaction
        (replayed when it died) gets the marker row and ``PREPARE TRANSACTION
        '<txid>.<sandbox_id>'``; the session is then free and closed. SQLite: a new connection,
        ``BEGIN IMMEDIATE``, verified replay and the marker, held in this process (not durable:
        the plan's last resource). The statement log is kept in both cases, so a crash before
        the prepare finished loses nothing. Preparing the same ``txid`` again returns the same
        answer.

        Raises:
            TwoPhaseUnavailableError: the PostgreSQL server has ``max_prepared_transactions = 0``.
            SandboxReplayDivergedError: the replay did not reproduce the log (nothing prepared).
            SandboxStateError: the sandbox was already committed, or a commit prepared under
                another txid waits for apply or abort.
            SandboxBusyError, SandboxConnectionError: retry later; nothing was prepared.
            SandboxCommitError: any other failure; nothing was prepared.
        """
        gid = self.prepared_gid(txid)
        doing = f"prepare of sandbox {self.sandbox_id} under {txid} failed"
        try:
            if self._target().backend == "sqlite":
                return self._prepare_sqlite(txid, message)
            return self._prepare_postgres(txid, gid, message)
        except _DivergedError as exc:
            raise self._diverged(exc, "nothing was prepared") from exc
        except _AlreadyCommittedError as exc:
            raise SandboxStateError(
                f"sandbox {self.sandbox_id} was already committed (commit marker found); "
                "nothing was prepared"
            ) from exc
        except (DatabaseError, ValueError) as exc:
            raise self._unavailable(exc, doing, commit=True) from exc

    def _prepare_postgres(self, txid: str, gid: str, message: str | None) -> PreparedCommit:
        def check() -> tuple[int, bool, list[str]]:
            connection = self._connect()
            try:
                setting = int(connection.execute("SHOW max_prepared_transactions")[0][0])
                if setting:
                    # Created (empty) in its own autocommit transaction: made inside a prepared
                    # one, its catalog lock would block every other sandbox of the database
                    # preparing in the same plan until COMMIT PREPARED.
                    self._ensure_bookkeeping_table(connection)
                committed = self._read_marker(connection) is not None
                return setting, committed, self._pending_gids(connection)
            finally:
                connection.close()

        setting, committed, pending = self._retrying(check)
        if setting == 0:
            raise TwoPhaseUnavailableError(
                f"database {self._target().display} has max_prepared_transactions = 0: "
                f"sandbox {self.sandbox_id} cannot prepare a two-phase commit (set it above "
                "zero, or commit the plan as a saga); nothing was prepared"
            )
        entries = self._log().read()
        if gid in pending:
            return self._prepared_commit(txid, entries, {"backend": "postgresql", "gid": gid})
        if committed:
            raise _AlreadyCommittedError(self.sandbox_id)
        if pending:
            raise _PreparedPendingError(self._pending_message(pending[0]))

        def attempt() -> None:
            try:
                connection = self._open_held()
            except _PreparedPendingError:
                if gid in self._pending_gids():
                    return  # an earlier attempt's PREPARE landed although its reply was lost
                raise
            marker = self._new_marker(message, len(entries))
            try:
                connection.execute(f"SAVEPOINT {_MARKER_SAVEPOINT}")
                self._write_marker(connection, marker)
                connection.execute(f"RELEASE SAVEPOINT {_MARKER_SAVEPOINT}")
            except DatabaseError as exc:
                if exc.connection_lost:
                    raise
                # The statements stay in the held transaction; only the marker is undone.
                try:
                    connection.execute(f"ROLLBACK TO SAVEPOINT {_MARKER_SAVEPOINT}")
                except DatabaseError:
                    self._drop_connection()
                raise
            try:
                connection.execute(f"PREPARE TRANSACTION '{gid}'")
            except DatabaseError as exc:
                # A failed PREPARE rolls the transaction back; the log replays it next time.
                self._drop_connection()
                if exc.connection_lost and gid in self._pending_gids():
                    return  # the reply was lost, PREPARE was not
                raise
            # The session holds no transaction now: the prepared one belongs to the server.
            self._drop_connection()

        self._retrying(attempt)
        return self._prepared_commit(txid, entries, {"backend": "postgresql", "gid": gid})

    def _prepare_sqlite(self, txid: str, message: str | None) -> PreparedCommit:
        staged = self._staged
        if staged is not None:
            if staged.txid == txid:
                return self._prepared_commit_of(staged)
            raise _PreparedPendingError(self._pending_message(staged.txid))
        entries = self._log().read()

        def attempt() -> _Staged:
            connection = self._connect()
            try:
                fks = _connection_pragmas(connection, entries)
                # Held until apply or abort: other writers wait (busy timeout), readers do not.
                connection.execute("BEGIN IMMEDIATE")
                self._refuse_if_committed(connection)
                self._replay(connection, entries)
                self._check_foreign_keys(connection, fks, "prepare")
                marker = self._new_marker(message, len(entries))
                self._write_marker(connection, marker)
            except BaseException:
                _finish(connection)
                raise
            return _Staged(txid, connection, marker, log_digest(entries), len(entries))

        self._staged = self._retrying(attempt)
        return self._prepared_commit_of(self._staged)

    def _prepared_commit(
        self, txid: str, entries: list[LogEntry], details: dict[str, Any]
    ) -> PreparedCommit:
        digest = log_digest(entries)
        summary = ChangeSummary(
            sandbox_id=self.sandbox_id,
            resource_id=self.resource_id,
            strategy=self.strategy,
            digest=digest,
            changed=sorted({t for e in entries for t in tables_written(e.sql)}),
            statements=len(entries),
        )
        return PreparedCommit(
            sandbox_id=self.sandbox_id,
            txid=txid,
            digest=digest,
            summary=summary,
            details={**details, "statements": len(entries)},
        )

    def _prepared_commit_of(self, staged: _Staged) -> PreparedCommit:
        return self._prepared_commit(
            staged.txid, self._log().read(), {"backend": "sqlite", "held_in_process": True}
        )

    def _do_apply_prepared(self, txid: str) -> CommitResult:
        """``COMMIT PREPARED`` (PostgreSQL) or ``COMMIT`` of the held transaction (SQLite).

        Idempotent through the marker row: when nothing is prepared under ``txid`` but the
        marker exists, the commit landed (an earlier apply whose reply or process was lost) and
        its recorded result is returned. SQLite holds a prepared commit in the memory of the
        process that prepared it: in another process (after a crash) nothing is held, and
        ``apply_prepared`` refuses rather than replaying the log again, unless the marker says
        the commit landed (:meth:`commit_landed`).

        Raises:
            SandboxCommitError: nothing is prepared under ``txid`` and the marker is absent
                (nothing landed; the status is unchanged).
            SandboxBusyError, SandboxConnectionError: retry later (the status is unchanged).
        """
        gid = self.prepared_gid(txid)
        doing = f"apply of the prepared commit of sandbox {self.sandbox_id} under {txid} failed"
        try:
            if self._target().backend == "sqlite":
                result = self._apply_sqlite(txid)
            else:
                result = self._retrying(lambda: self._apply_postgres(gid))
        except (DatabaseError, ValueError) as exc:
            raise self._unavailable(exc, doing, commit=True) from exc
        if result is None:
            raise SandboxCommitError(
                f"{doing}: no commit of this sandbox is prepared under {txid} and its commit "
                "marker is absent, so nothing landed"
                + (
                    " (SQLite holds a prepared commit only in the memory of the process that "
                    "prepared it: prepare it again)"
                    if self._target().backend == "sqlite"
                    else " (prepare it again)"
                )
            )
        return result

    def _apply_postgres(self, gid: str) -> CommitResult | None:
        connection = self._connect()
        try:
            try:
                connection.execute(f"COMMIT PREPARED '{gid}'")
                committed = True
            except DatabaseError as exc:
                if exc.sqlstate != _NO_SUCH_PREPARED:
                    raise
                committed = False
            marker = self._read_marker(connection)
        finally:
            connection.close()
        if marker is None:
            return None
        result = self._result(marker, already_committed=not committed)
        return replace(result, metadata={**result.metadata, "gid": gid})

    def _apply_sqlite(self, txid: str) -> CommitResult | None:
        staged = self._staged
        if staged is None or staged.txid != txid:
            landed = self._retrying(self._read_marker)
            return None if landed is None else self._result(landed, already_committed=True)
        # Busy at COMMIT (rollback-journal readers) leaves the transaction open: retried.
        try:
            self._retrying(lambda: staged.connection.execute("COMMIT"))
        except DatabaseError as exc:
            if exc.busy and not staged.connection.broken:
                raise  # still prepared: the caller may retry or abort
            self._staged = None
            _finish(staged.connection)
            return self._settle(staged.marker, exc)
        self._staged = None
        staged.connection.close()
        return self._result(staged.marker, already_committed=False)

    def _do_abort_prepared(self, txid: str) -> None:
        """``ROLLBACK PREPARED`` when the gid is in ``pg_prepared_xacts`` (PostgreSQL), or roll
        back the held transaction (SQLite); else nothing. The sandbox keeps its status and log,
        so the plan can be retried (PostgreSQL: a new transaction replays the log, which
        diverges when the statements used sequences, as after ``close()``).

        Raises:
            SandboxBusyError, SandboxConnectionError, SandboxError: retry later.
        """
        gid = self.prepared_gid(txid)
        staged = self._staged
        if staged is not None and staged.txid == txid:
            self._staged = None
            _finish(staged.connection)
        if self._target().backend == "sqlite":
            return
        try:
            self._retrying(lambda: self._rollback_prepared([gid]))
        except (DatabaseError, ValueError) as exc:
            raise self._unavailable(
                exc, f"abort of the prepared commit of sandbox {self.sandbox_id} failed"
            ) from exc

    def _rollback_prepared(self, gids: list[str] | None = None) -> None:
        """``ROLLBACK PREPARED`` each of ``gids`` that is prepared (every one of this sandbox's
        when ``None``)."""
        connection = self._connect()
        try:
            for gid in self._pending_gids(connection):
                if gids is not None and gid not in gids:
                    continue
                try:
                    connection.execute(f"ROLLBACK PREPARED '{gid}'")
                except DatabaseError as exc:
                    if exc.sqlstate != _NO_SUCH_PREPARED:  # gone meanwhile: fine
                        raise
        finally:
            connection.close()

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

    def _release_prepared(self) -> None:
        """Drop whatever this sandbox prepared (rollback, cleanup). Best effort for PostgreSQL:
        an unreachable server keeps it, and ``abort_prepared`` can be called later."""
        staged, self._staged = self._staged, None
        if staged is not None:
            _finish(staged.connection)
        try:
            if self._context is None or self._target().backend == "sqlite":
                return
            self._rollback_prepared()
        except (DatabaseError, ValueError) as exc:
            logger.warning(
                "sandbox %s: cannot release its prepared transactions: %s", self.sandbox_id, exc
            )

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
                if exc.connection_lost:
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
            refused = pragmas.refusal(sql) if fresh and keyword == "PRAGMA" else None
            if refused is not None:
                raise SandboxStatementError(refused)
            try:
                entry = LogEntry.make(sql, params, many=many)
            except ValueError as exc:
                raise SandboxStatementError(str(exc)) from exc
            logged = many or not _is_read_only(keyword, sql)
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
        ``SELECT``) is logged like any write (issue 7: its write would be lost on replay).
        """
        connection = self._open_held()
        self.activate()
        connection.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            rows, outcome = _run_statement(connection, entry.sql, params, entry.many, True)
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

    # -- commit ---------------------------------------------------------------------------------

    def _commit_fresh(self, message: str | None) -> CommitResult:
        """SQLite: replay, marker and COMMIT in one ``BEGIN IMMEDIATE`` transaction."""
        connection = self._connect()
        try:
            entries = self._log().read()
            fks = _connection_pragmas(connection, entries)
            connection.execute("BEGIN IMMEDIATE")
            recorded = self._read_marker(connection)
            if recorded is not None:
                # COMMIT already landed (an earlier process crashed before saving the status).
                return self._result(recorded, already_committed=True)
            self._replay(connection, entries)
            self._check_foreign_keys(connection, fks, "commit")
            marker = self._new_marker(message, len(entries))
            self._write_marker(connection, marker)
            try:
                connection.execute("COMMIT")
            except DatabaseError as exc:
                if exc.busy:
                    raise  # the transaction is still open: rolled back below, then retried
                return self._settle(marker, exc)
            return self._result(marker, already_committed=False)
        finally:
            _finish(connection)

    def _check_foreign_keys(self, connection: Connection, on: bool, action: str) -> None:
        """SQLite with ``PRAGMA foreign_keys`` turned on in the sandbox: the violations its
        ``COMMIT`` would refuse (deferred keys included) refuse ``action`` first, naming them as
        conflicts; nothing is written and the sandbox stays ACTIVE.

        Raises:
            SandboxCommitError: with ``conflicts`` = ``table row N -> parent`` texts.
        """
        if not on:
            return
        violations = pragmas.describe_violations(connection.execute("PRAGMA foreign_key_check"))
        if violations:
            shown = ", ".join(violations[:10])
            raise SandboxCommitError(
                f"{action} of sandbox {self.sandbox_id} refused: PRAGMA foreign_keys is on and "
                f"{len(violations)} row(s) violate a foreign key: {shown}",
                violations,
            )

    def _commit_held(self, message: str | None) -> CommitResult:
        """PostgreSQL: marker and COMMIT in the held transaction (replayed if it died)."""
        recorded = self._retrying(self._read_marker)
        if recorded is not None:
            # COMMIT already landed (an earlier process crashed before saving the status).
            self._drop_connection()
            return self._result(recorded, already_committed=True)

        def attempt() -> CommitResult:
            try:
                connection = self._open_held()
            except _AlreadyCommittedError:
                # Committed by another process (or by our own COMMIT whose reply was lost).
                found = self._read_marker()
                assert found is not None  # markers are never deleted by sandbox_core
                return self._result(found, already_committed=True)
            marker = self._new_marker(message, len(self._log().read()))
            try:
                connection.execute(f"SAVEPOINT {_MARKER_SAVEPOINT}")
                self._write_marker(connection, marker)
                connection.execute(f"RELEASE SAVEPOINT {_MARKER_SAVEPOINT}")
            except DatabaseError as exc:
                if exc.busy and not exc.connection_lost:
                    connection.execute(f"ROLLBACK TO SAVEPOINT {_MARKER_SAVEPOINT}")
                    raise
                if exc.connection_lost:
                    raise
                # For example a concurrent commit of this same sandbox inserted the marker.
                self._drop_connection()
                landed = self._read_marker()
                if landed is not None:
                    return self._result(landed, already_committed=True)
                raise
            try:
                connection.execute("COMMIT")
            except DatabaseError as exc:
                self._drop_connection()
                return self._settle(marker, exc)
            self._drop_connection()
            return self._result(marker, already_committed=False)

        return self._retrying(attempt)

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
