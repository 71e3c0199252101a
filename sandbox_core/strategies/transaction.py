"""``TransactionSandbox``: database writes held in one transaction (seed 002, "TransactionSandbox").

"Wraps database writes in a transaction. ``commit()`` issues ``COMMIT``; ``rollback()`` issues
``ROLLBACK``. Cannot be rolled back after ``COMMIT``." The original is a SQLite file (the embedded
default; a path or ``sqlite:///abs/path``) or a PostgreSQL server (``postgresql://`` /
``postgres://`` URI, driven through psycopg 3).

Writes go through :meth:`TransactionSandbox.execute` / :meth:`TransactionSandbox.executemany`,
which run inside the sandbox's open transaction, so reads see the sandbox's own writes and other
connections see nothing until commit.

Surviving a process restart (DESIGN.md: "A sandbox must be re-openable from its persisted
context"): an open transaction dies with its connection, so every write statement is also
appended (fsynced) to ``<sandbox_root>/txn/<sandbox_id>/statements.jsonl``. A sandbox reopened
in another process replays the log into a fresh transaction on first use, which restores its view;
commit is replay (when needed) + a marker row + ``COMMIT``, all in one transaction.

Never applied twice: the marker row ``(sandbox_id, ...)`` goes into the bookkeeping table
(``sandbox_commits`` unless ``bookkeeping_table=`` says otherwise) in the same transaction as the
writes. :meth:`TransactionSandbox.commit_landed` reports whether it exists; ``commit()`` looks for
it first and, when found (a crash after ``COMMIT`` but before the caller saved the new status),
returns the recorded result instead of applying the statements again.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from sandbox_core._db import (
    Connection,
    DatabaseError,
    DatabaseTarget,
    Params,
    check_identifier,
    parse_target,
)
from sandbox_core.base import BaseSandbox, logger
from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxStateError,
    SandboxStatementError,
)
from sandbox_core.protocol import CommitResult, SandboxContext, utc_now
from sandbox_core.status import SandboxStatus

STATEMENT_LOG = "statements.jsonl"
DEFAULT_BOOKKEEPING_TABLE = "sandbox_commits"
DEFAULT_TIMEOUT_SECONDS = 10.0
_SAVEPOINT = "sandbox_statement"
_READ_KEYWORDS = frozenset({"SELECT", "VALUES", "SHOW", "TABLE"})
_TRANSACTION_KEYWORDS = frozenset(
    {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE"}
)
_LEADING_NOISE = re.compile(r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/|\()+", re.DOTALL)


class _ReplayError(Exception):
    """A logged statement failed when replayed into a fresh transaction."""


class _AlreadyCommittedError(Exception):
    """The commit marker exists: another process (or a crashed one) committed this sandbox."""


class TransactionSandbox(BaseSandbox):
    """Strategy ``transaction_rollback``: writes held in one database transaction until commit.

    Args:
        resource_id: id of the sandboxed resource.
        original_path: SQLite file path, ``sqlite:///abs/path``, or a PostgreSQL URI. Prefer a URI
            without a password (libpq reads ``PGPASSWORD`` / ``~/.pgpass``): the value is
            persisted in the sandbox record.
        **options: ``sandbox_root`` (str, parent of the scratch dir), ``bookkeeping_table``
            (str, default ``"sandbox_commits"``), ``timeout_seconds`` (float, connect and SQLite
            busy timeout, default 10).

    ``get_path`` resolves inside the sandbox's scratch dir (``<sandbox_root>/txn/<sandbox_id>``),
    a private working area for the actor; it never returns the database file, which would bypass
    the transaction. Traversal is refused with ``ValueError("Path traversal not allowed")``.
    """

    strategy = "transaction_rollback"
    rollbackable = False

    def __init__(self, resource_id: str, original_path: str, **options: Any) -> None:
        super().__init__(resource_id, original_path, **options)
        self._connection: Connection | None = None

    # -- public API beyond the protocol -------------------------------------------------------

    def execute(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one SQL statement inside the sandbox's transaction; activates the sandbox.

        ``sql`` and ``params`` go to the driver unchanged: ``?`` / ``:name`` placeholders for
        SQLite, ``%s`` / ``%(name)s`` for PostgreSQL. Parameter values must be ``None``, bool,
        int, float, str or bytes (they are recorded in the statement log). Statements other than
        plain reads (``SELECT`` without ``INTO``, ``VALUES``, ``SHOW``, ``TABLE``) are logged.

        Returns:
            The rows the statement returned, as tuples (``[]`` when it returns none).

        Raises:
            SandboxStateError: the sandbox is not CREATED, ACTIVE or ROLLED_BACK.
            SandboxStatementError: the database refused the statement, it is a transaction
                control statement (use commit/rollback), or a parameter cannot be logged. The
                sandbox stays usable.
            SandboxError: the database is unreachable (retry later), or the sandbox's view could
                not be restored by replaying its log (status becomes ERRORED).
        """
        return self._run(sql, params, many=False)

    def executemany(self, sql: str, seq_of_params: Iterable[Params]) -> None:
        """Run one write statement once per parameter set (one log entry). See :meth:`execute`.

        Raises:
            The same errors as :meth:`execute`.
        """
        self._run(sql, list(seq_of_params), many=True)

    def statements(self) -> list[dict[str, Any]]:
        """The logged write statements, oldest first, for review before commit.

        Each entry is ``{"sql": str, "params": list | dict | None, "many": bool}`` (bytes
        parameters appear as ``{"$bytes": "<base64>"}``).

        Raises:
            SandboxStateError: the sandbox has not been created.
            SandboxError: the log cannot be read.
        """
        with self._lock:
            try:
                return self._read_log()
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
            SandboxError: the database cannot be reached or queried.
        """
        with self._lock:
            try:
                return self._read_marker() is not None
            except (DatabaseError, ValueError) as exc:
                raise SandboxError(
                    f"cannot check commit of sandbox {self.sandbox_id}: {exc}"
                ) from exc

    def close(self) -> None:
        """Roll back and close this process's connection; status and statement log are kept.

        The next :meth:`execute` or :meth:`commit` (here or in another process, after
        :meth:`reopen`) replays the log into a fresh transaction. Use it before handing the
        sandbox to another process: an open SQLite write transaction blocks other writers.
        Idempotent.
        """
        with self._lock:
            self._drop_connection()

    # -- lifecycle hooks ------------------------------------------------------------------------

    def _do_create(self, plan_id: str) -> SandboxContext:
        try:
            target = parse_target(self.original_path)
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
        try:
            recorded = self._read_marker()
            if recorded is not None:
                # COMMIT already landed (an earlier process crashed before saving the status).
                self._drop_connection()
                return self._result(recorded, already_committed=True)
            connection = self._open_transaction()
        except _AlreadyCommittedError:
            # Committed by another process between the two checks.
            recorded = self._read_marker()
            assert recorded is not None  # markers are never deleted by sandbox_core
            return self._result(recorded, already_committed=True)
        except (DatabaseError, _ReplayError) as exc:
            self._drop_connection()
            raise SandboxCommitError(f"commit of sandbox {self.sandbox_id} failed: {exc}") from exc
        marker = {
            "committed_at": utc_now().isoformat(),
            "statement_count": len(self._read_log()),
            "message": message,
        }
        try:
            self._write_marker(connection, marker)
            connection.execute("COMMIT")
        except DatabaseError as exc:
            self._drop_connection()
            # An error at or after COMMIT (connection lost, or a concurrent commit of the same
            # sandbox) leaves the outcome to the marker: if it is there, the commit landed.
            landed = self._marker_after_failure()
            if landed is not None:
                return self._result(landed, already_committed=landed != marker)
            raise SandboxCommitError(f"commit of sandbox {self.sandbox_id} failed: {exc}") from exc
        self._drop_connection()
        return self._result(marker, already_committed=False)

    def _do_rollback(self) -> None:
        # Discard the log first: after that, no process can bring these statements back.
        self._write_log_atomically([])
        if self._connection is not None and not self._connection.broken:
            try:
                self._connection.execute("ROLLBACK")
            except DatabaseError as exc:
                # The server discards the transaction when the connection closes anyway.
                logger.warning("ROLLBACK of sandbox %s failed: %s", self.sandbox_id, exc)
        self._drop_connection()

    def _do_cleanup(self) -> None:
        self._drop_connection()
        scratch = self._scratch_dir()
        if scratch is not None and scratch.exists():
            shutil.rmtree(scratch)

    # -- transaction handling -------------------------------------------------------------------

    @property
    def _bookkeeping_table(self) -> str:
        return str(self._options.get("bookkeeping_table") or DEFAULT_BOOKKEEPING_TABLE)

    def _target(self) -> DatabaseTarget:
        return parse_target(self.original_path)

    def _connect(self, target: DatabaseTarget | None = None) -> Connection:
        timeout = float(self._options.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)
        return Connection(target or self._target(), timeout_seconds=timeout)

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
            keyword = _leading_keyword(sql)
            if keyword in _TRANSACTION_KEYWORDS:
                raise SandboxStatementError(
                    f"{keyword} is managed by the sandbox: use commit() or rollback()"
                )
            try:
                entry = {"sql": sql, "params": _encode(params, many=many), "many": many}
            except ValueError as exc:
                raise SandboxStatementError(str(exc)) from exc
            connection = self._open_for_statement()
            self.activate()
            try:
                connection.execute(f"SAVEPOINT {_SAVEPOINT}")
                rows = _apply(connection, sql, params, many=many)
            except DatabaseError as exc:
                self._undo_statement(connection, exc)
                raise SandboxStatementError(
                    f"statement failed in sandbox {self.sandbox_id}: {exc}",
                    integrity=exc.integrity,
                ) from exc
            try:
                if many or not _is_read_only(keyword, sql):
                    self._append_log(entry)
                connection.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            except (OSError, DatabaseError) as exc:
                self._undo_statement(connection, exc)
                raise SandboxError(
                    f"statement in sandbox {self.sandbox_id} could not be recorded: {exc}"
                ) from exc
            return rows

    def _open_for_statement(self) -> Connection:
        try:
            return self._open_transaction()
        except _AlreadyCommittedError as exc:
            raise SandboxStateError(
                f"sandbox {self.sandbox_id} was already committed (commit marker found); "
                "call commit() to record the result"
            ) from exc
        except _ReplayError as exc:
            self._status = SandboxStatus.ERRORED
            raise SandboxError(f"cannot restore sandbox {self.sandbox_id}: {exc}") from exc
        except DatabaseError as exc:
            raise SandboxError(
                f"cannot reach database {self._target().display} for sandbox "
                f"{self.sandbox_id}: {exc}"
            ) from exc

    def _open_transaction(self) -> Connection:
        """The live transaction holding every logged statement; replays the log when new.

        Raises:
            DatabaseError: the database cannot be reached.
            _AlreadyCommittedError: the commit marker exists; replaying would apply the log twice.
            _ReplayError: a logged statement fails on replay (the original changed under it).
        """
        if self._connection is not None and not self._connection.broken:
            return self._connection
        self._drop_connection()
        connection = self._connect()
        try:
            self._refuse_if_committed(connection)
            connection.execute("BEGIN")
            for index, entry in enumerate(self._read_log(), start=1):
                try:
                    _apply(connection, entry["sql"], _decode(entry), many=bool(entry["many"]))
                except DatabaseError as exc:
                    if exc.connection_lost:
                        raise
                    raise _ReplayError(
                        f"replaying logged statement {index} ({entry['sql']!r}) failed: {exc}"
                    ) from exc
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        return connection

    def _refuse_if_committed(self, connection: Connection) -> None:
        if self._read_marker(connection) is not None:
            raise _AlreadyCommittedError(self.sandbox_id)

    def _undo_statement(self, connection: Connection, exc: Exception) -> None:
        """Return the transaction to the state before the failed statement."""
        if isinstance(exc, DatabaseError) and exc.connection_lost:
            # The transaction died; the log still has every good statement for the next replay.
            self._drop_connection()
            return
        try:
            connection.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            connection.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        except DatabaseError:
            self._drop_connection()

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if not connection.broken:
            # No transaction open, or the server is gone: closing discards it either way.
            with contextlib.suppress(DatabaseError):
                connection.execute("ROLLBACK")
        connection.close()

    # -- commit marker --------------------------------------------------------------------------

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
            "committed_at": str(committed_at),
            "statement_count": int(statement_count),
            "message": message,
        }

    def _marker_after_failure(self) -> dict[str, Any] | None:
        try:
            return self._read_marker()
        except DatabaseError:
            return None

    def _write_marker(self, connection: Connection, marker: dict[str, Any]) -> None:
        table = check_identifier(self._bookkeeping_table)
        if not connection.table_exists(table):
            connection.execute(
                f"CREATE TABLE IF NOT EXISTS {table} ("
                "sandbox_id TEXT PRIMARY KEY, resource_id TEXT NOT NULL, plan_id TEXT NOT NULL, "
                "committed_at TEXT NOT NULL, statement_count INTEGER NOT NULL, message TEXT)"
            )
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

    def _log_path(self) -> Path:
        return Path(self._require_context().sandbox_path) / STATEMENT_LOG

    def _read_log(self) -> list[dict[str, Any]]:
        path = self._log_path()
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        entries = []
        for number, line in enumerate(lines, start=1):
            try:
                entries.append(json.loads(line))
            except ValueError:
                # A torn last line is a statement whose process died before execute() returned:
                # its transaction died too, so it never happened.
                if number == len(lines):
                    break
                raise
        return entries

    def _append_log(self, entry: dict[str, Any]) -> None:
        with open(self._log_path(), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _write_log_atomically(self, entries: list[dict[str, Any]]) -> None:
        path = self._log_path()
        tmp = path.with_name(f".{STATEMENT_LOG}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in entries)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)


# -- helpers --------------------------------------------------------------------------------------


def _apply(connection: Connection, sql: str, params: Any, *, many: bool) -> list[tuple[Any, ...]]:
    if many:
        connection.executemany(sql, params)
        return []
    return connection.execute(sql, params)


def _leading_keyword(sql: str) -> str:
    """First SQL keyword, upper-case, after comments, whitespace and opening parentheses."""
    stripped = _LEADING_NOISE.sub("", sql, count=1)
    match = re.match(r"[A-Za-z]+", stripped)
    return match.group(0).upper() if match else ""


def _is_read_only(keyword: str, sql: str) -> bool:
    """Plain reads need no replay; anything else (including ``SELECT ... INTO``) is logged."""
    return keyword in _READ_KEYWORDS and not re.search(r"\bINTO\b", sql, re.IGNORECASE)


def _encode(params: Any, *, many: bool) -> Any:
    """JSON form of ``params`` for the statement log.

    Raises:
        ValueError: a value of another type than None, bool, int, float, str, bytes.
    """
    if many:
        return [_encode(p, many=False) for p in params]
    if params is None:
        return None
    if isinstance(params, dict):
        return {str(k): _encode_value(v) for k, v in params.items()}
    if isinstance(params, str | bytes):
        raise ValueError("params must be a sequence or a mapping, not a string")  # noqa: TRY004 - callers map ValueError to SandboxStatementError
    return [_encode_value(v) for v in params]


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise ValueError(
        f"parameter of type {type(value).__name__} cannot be recorded in the statement log "
        "(use None, bool, int, float, str or bytes)"
    )


def _decode(entry: dict[str, Any]) -> Any:
    if entry.get("many"):
        return [_decode_params(p) for p in entry["params"]]
    return _decode_params(entry.get("params"))


def _decode_params(params: Any) -> Any:
    if params is None:
        return None
    if isinstance(params, dict):
        return {k: _decode_value(v) for k, v in params.items()}
    return tuple(_decode_value(v) for v in params)


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict) and "$bytes" in value:
        return base64.b64decode(value["$bytes"])
    return value
