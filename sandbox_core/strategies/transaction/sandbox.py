"""``TransactionSandbox``: database writes held in one transaction (seed 002, "TransactionSandbox").

"Wraps database writes in a transaction. ``commit()`` issues ``COMMIT``; ``rollback()`` issues
``ROLLBACK``. Cannot be rolled back after ``COMMIT``." The original is a SQLite file (the embedded
default; a path or ``sqlite:///abs/path``) or a PostgreSQL server (a ``postgresql://`` /
``postgres://`` URL or a libpq ``key=value`` DSN, driven through psycopg 3).

Every write statement that succeeds is appended (fsynced) to
``<sandbox_root>/txn/<sandbox_id>/statements.jsonl`` together with what it produced (row count,
generated id, a digest of the rows it returned; :mod:`.statement_log`). The log is the sandbox's
transaction: commit is replay (when needed) + a marker row + ``COMMIT``, in one transaction.

Lock policy, per backend (case 31):

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

Replay is verified (case 32): every replayed statement must produce the outcome the log
recorded, else nothing is applied and :class:`SandboxReplayDivergedError` names the statement;
the sandbox stays ACTIVE. A connection the server closed (idle-in-transaction timeout,
``pg_terminate_backend``, restart) is replaced and replayed transparently; a server that stays
unreachable for ``timeout_seconds`` is a :class:`SandboxConnectionError` (status kept).

Never applied twice: the marker row ``(sandbox_id, ...)`` goes into the bookkeeping table
(``sandbox_commits`` unless ``bookkeeping_table=`` says otherwise) in the same transaction as the
writes. :meth:`TransactionSandbox.commit_landed` reports whether it exists; ``commit()`` looks for
it first and, when found, returns the recorded result instead of applying the statements again.

Two-phase plan commit (docs/transaction-strategy.md): ``prepare(txid)`` replays (verified)
and writes the marker, then PostgreSQL ``PREPARE TRANSACTION '<txid>.<sandbox_id>'`` (durable;
``max_prepared_transactions = 0`` is a :class:`TwoPhaseUnavailableError` found before replaying)
or, on SQLite, keeps the ``BEGIN IMMEDIATE`` transaction open in this process (not durable: the
plan's last resource). ``apply_prepared`` is ``COMMIT PREPARED`` / ``COMMIT``, settled by the
marker when repeated; ``abort_prepared`` is ``ROLLBACK PREPARED`` / ``ROLLBACK``. After a crash a
SQLite apply refuses unless the marker says the commit landed (it never replays silently).
``review()`` summarises the log (write statements, tables, digest) and dry-replays it for
conflicts.

Passwords are never stored (:mod:`sandbox_core.redaction`): the record, context and messages
hold the redacted DSN; the password lives in this process's memory, or comes from libpq's
``PGPASSWORD`` / password file, or from :meth:`TransactionSandbox.use_credentials` after a
reopen.

The class is built in layers, one module each, every layer a base class of the next:
:mod:`.replay` (connections and retries, statements run, logged and replayed, the commit
marker), :mod:`.prepared` (the two-phase side) and this module (the class: its public API, its
lifecycle and its commit). :mod:`.db` is the connection over sqlite3 and psycopg (psycopg is
imported there alone), :mod:`.dsn` says where the original database is, :mod:`.statement_log`
is the log file, :mod:`.pragmas` the SQLite pragmas a transaction would drop and
:mod:`.nontransactional` the PostgreSQL calls a transaction cannot hold (``setval``, refused) or
that write where the row counts do not look (large objects, ``pg_notify``, logged).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxRetryableError,
)
from sandbox_core.protocol import CommitResult, SandboxContext
from sandbox_core.redaction import redact, same_database, secrets_of
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import logger
from sandbox_core.strategies.transaction.db import (
    Connection,
    DatabaseError,
    Params,
    check_identifier,
)
from sandbox_core.strategies.transaction.dsn import parse_target
from sandbox_core.strategies.transaction.prepared import PreparedTransaction, _Staged
from sandbox_core.strategies.transaction.replay import (
    _MARKER_SAVEPOINT,
    STATEMENT_LOG,
    _AlreadyCommittedError,
    _connection_pragmas,
    _DivergedError,
    _finish,
    _PreparedPendingError,
)
from sandbox_core.strategies.transaction.statement_log import Outcome

# The server's system identifier (set at initdb), the database's oid and name.
_POSTGRES_IDENTITY = (
    "SELECT system_identifier::text, "
    "(SELECT oid::text FROM pg_database WHERE datname = current_database()), "
    "current_database() FROM pg_control_system()"
)


class TransactionSandbox(PreparedTransaction):
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
    locks_original = False  # the database serialises its own sessions

    def __init__(self, resource_id: str, original_path: str, **options: Any) -> None:
        super().__init__(resource_id, redact(str(original_path or "")), **options)
        # The password-bearing DSN lives in memory only, never in the record.
        self._dsn: str | None = str(original_path) if secrets_of(str(original_path)) else None
        self._held: Connection | None = None
        self._last_outcome: Outcome | None = None
        self._last_columns: list[str] = []
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

    @property
    def last_columns(self) -> list[str]:
        """The column names of the rows the last successful :meth:`execute` in this process
        returned (``[]`` when it returned none, or for :meth:`executemany`)."""
        return list(self._last_columns)

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

    def target_identity(self) -> str:
        """What the original database *is*, never how to reach it: approvals are bound to it
        (docs/approvals.md, "What the digest binds"), so a digest approved for one database is
        refused on another that a DSN or path names later.

        Returns:
            PostgreSQL: ``"database=postgresql:<system identifier>/<database oid>/<name>"``
            (another server, or a database dropped and created again under the same name,
            gives another value); SQLite: ``"database=sqlite:<real path>:<device>:<inode>"``.
            Never a password or DSN.

        Raises:
            SandboxConnectionError: the database stayed unreachable for ``timeout_seconds``.
            SandboxError: the database cannot be queried, or the SQLite file cannot be read.
        """
        target = self._target()
        if target.backend == "sqlite":
            try:
                real = Path(target.location).resolve()
                found = real.stat()
            except OSError as exc:
                raise SandboxError(f"cannot read database of {self.sandbox_id}: {exc}") from exc
            return f"database=sqlite:{real}:{found.st_dev}:{found.st_ino}"

        def attempt() -> str:
            connection = self._connect(target)
            try:
                row = connection.execute(_POSTGRES_IDENTITY)[0]
            finally:
                _finish(connection)
            return f"database=postgresql:{row[0]}/{row[1]}/{row[2]}"

        try:
            return self._retrying(attempt)
        except DatabaseError as exc:
            raise self._unavailable(
                exc, f"cannot read the identity of the database of {self.sandbox_id}"
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
            SandboxConflictError: a constraint checked at COMMIT is violated (``conflicts``
                names it; case 47); nothing was committed and the sandbox stays ACTIVE.
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
        isolation = None
        try:
            probe = self._connect(target)
            try:
                # Reading the schema proves the file is a database (not just any file).
                if target.backend == "sqlite":
                    probe.execute("SELECT count(*) FROM sqlite_master")
                else:
                    isolation, refused = _session_defaults(probe)
                    if refused is not None:
                        raise SandboxCreationError(
                            f"cannot create {self.strategy} sandbox for {target.display}: "
                            f"{refused}: the sandbox could run no write and never commit"
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
                **({"isolation": isolation} if isolation else {}),
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
        except DatabaseError as exc:
            self._drop_connection()
            if exc.integrity and not (exc.busy or exc.connection_lost):
                # Refused at COMMIT itself: the server rolled back, the log replays it.
                raise self._constraint_refusal(exc, "commit") from exc
            raise self._unavailable(exc, doing, commit=True) from exc
        except ValueError as exc:
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

    def _do_cleanup_interrupted_create(self) -> None:
        """Without a context the scratch directory is found by id: ``<root>/txn/<id>``."""
        self._drop_connection()
        scratch = self.sandbox_root / "txn" / self.sandbox_id
        if scratch.exists():
            shutil.rmtree(scratch)

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
            self._check_deferred_constraints(connection, "commit")
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


def _session_defaults(connection: Connection) -> tuple[str, str | None]:
    """PostgreSQL: the isolation level the sandbox's transactions will run at (the database's,
    the role's or the DSN's default, used as is), and why no transaction of this session could
    write (``None`` when one can): ``default_transaction_read_only`` on, or a standby server.
    """
    level, read_only, standby = connection.execute(
        "SELECT current_setting('default_transaction_isolation'), "
        "current_setting('default_transaction_read_only'), pg_is_in_recovery()"
    )[0]
    if standby:
        return str(level), "the server is a standby (in recovery), which accepts no writes"
    if str(read_only).lower() in ("on", "true", "1"):
        return str(
            level
        ), "its transactions are read-only by default (default_transaction_read_only = on)"
    return str(level), None
