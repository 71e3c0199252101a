"""The two-phase side of a ``transaction_rollback`` sandbox: review, prepare, apply, abort.

The second layer of :class:`~sandbox_core.strategies.transaction.TransactionSandbox`
(``docs/transaction-strategy.md``). ``prepare(txid)`` replays the log (verified) and writes the
marker, then PostgreSQL ``PREPARE TRANSACTION '<txid>.<sandbox_id>'`` (durable) or, on SQLite,
keeps the ``BEGIN IMMEDIATE`` transaction open in this process (not durable: the plan's last
resource). ``apply_prepared`` is ``COMMIT PREPARED`` / ``COMMIT``, settled by the marker when
repeated; ``abort_prepared`` is ``ROLLBACK PREPARED`` / ``ROLLBACK``. ``review()`` summarises
the log and dry-replays it for conflicts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from sandbox_core.errors import (
    SandboxCommitError,
    SandboxConflictError,
    SandboxStateError,
    TwoPhaseUnavailableError,
)
from sandbox_core.protocol import ChangeSummary, CommitResult, PreparedCommit
from sandbox_core.strategies.base import logger
from sandbox_core.strategies.transaction import nontransactional
from sandbox_core.strategies.transaction.db import Connection, DatabaseError
from sandbox_core.strategies.transaction.replay import (
    _MARKER_SAVEPOINT,
    LoggedTransaction,
    _AlreadyCommittedError,
    _connection_pragmas,
    _DivergedError,
    _finish,
    _PreparedPendingError,
)
from sandbox_core.strategies.transaction.statement_log import LogEntry, log_digest, tables_written

_TXID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# A gid is quoted into PREPARE/COMMIT PREPARED: only characters that need no quoting.
_GID = re.compile(r"^[A-Za-z0-9._-]{1,199}$")
# PostgreSQL SQLSTATE undefined_object: COMMIT/ROLLBACK PREPARED of a gid that is not prepared.
_NO_SUCH_PREPARED = "42704"
# PostgreSQL SQLSTATE feature_not_supported: PREPARE of a transaction it cannot prepare.
_FEATURE_NOT_SUPPORTED = "0A000"


@dataclass
class _Staged:
    """SQLite's prepared commit: the open ``BEGIN IMMEDIATE`` transaction holding the replayed
    statements and the marker row, kept in this process until apply or abort."""

    txid: str
    connection: Connection
    marker: dict[str, Any]
    digest: str
    statements: int


class PreparedTransaction(LoggedTransaction):
    """The two-phase layer of :class:`TransactionSandbox`: review, prepare, apply, abort."""

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
        """Conflicts a commit would meet now: ``["statement <n>: <sql> (<what differs>)"]``,
        or the constraints checked at COMMIT that the statements violate (case 47:
        ``"<constraint>: <message>"``; SQLite with foreign keys on: ``"table row N ->
        parent"``), checked in the held PostgreSQL transaction itself when it is alive."""
        if not entries or self._staged is not None:
            return []
        held = self._held
        if held is not None and not held.broken:
            try:
                self._check_deferred_constraints(held, "review")
            except SandboxConflictError as exc:
                return list(exc.conflicts)
            except DatabaseError as exc:
                if exc.connection_lost:
                    self._drop_connection()  # the next statement or commit replays the log
                return []  # busy or gone: the commit finds out; a review does not fail for it
            return []
        sqlite = self._target().backend == "sqlite"

        def attempt() -> list[str]:
            connection = self._connect()
            try:
                fks = _connection_pragmas(connection, entries) if sqlite else False
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
                try:
                    if sqlite:
                        self._check_foreign_keys(connection, fks, "review")
                    else:
                        self._check_deferred_constraints(connection, "review")
                except SandboxConflictError as exc:
                    return list(exc.conflicts)
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
        except DatabaseError as exc:
            if exc.integrity and not (exc.busy or exc.connection_lost):
                raise self._constraint_refusal(exc, "prepare") from exc
            raise self._unavailable(exc, doing, commit=True) from exc
        except ValueError as exc:
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
            self._refuse_unpreparable(connection, entries)
            self._check_deferred_constraints(connection, "prepare")
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
                if exc.sqlstate == _FEATURE_NOT_SUPPORTED:
                    raise TwoPhaseUnavailableError(
                        nontransactional.two_phase_refusal(self.sandbox_id, exc.primary)
                    ) from exc
                raise
            # The session holds no transaction now: the prepared one belongs to the server.
            self._drop_connection()

        self._retrying(attempt)
        return self._prepared_commit(txid, entries, {"backend": "postgresql", "gid": gid})

    def _refuse_unpreparable(self, connection: Connection, entries: list[LogEntry]) -> None:
        """PostgreSQL cannot ``PREPARE`` a transaction that used temporary objects or
        ``NOTIFY``/``LISTEN``: say so before trying, while the held transaction (and the
        sequence values it drew) is still alive.

        Raises:
            TwoPhaseUnavailableError: naming what the transaction did.
            DatabaseError: busy or connection lost (retryable).
        """
        why = None
        if any(nontransactional.notifies(entry.sql) for entry in entries):
            why = "its statements use NOTIFY, LISTEN or pg_notify()"
        elif connection.execute(nontransactional.TEMPORARY_OBJECTS_SQL)[0][0]:
            why = "its session made temporary tables or other temporary objects"
        if why is not None:
            raise TwoPhaseUnavailableError(nontransactional.two_phase_refusal(self.sandbox_id, why))

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
