"""The one exception hierarchy of sandbox_core (seed 002, "Exception Hierarchy").

Third-party errors (GitPython, OSError, psycopg, sqlite3) are converted to these at the strategy
boundary; callers never see them untranslated. The operator maps each class to kopf's
``TemporaryError`` / ``PermanentError`` in one place.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every error raised by sandbox_core."""


class SandboxCreationError(SandboxError):
    """The sandbox environment cannot be initialised (missing source, git failure, I/O error)."""


class SandboxCommitError(SandboxError):
    """Applying the sandbox's changes to the original failed.

    ``conflicts`` lists the resource-relative paths that conflict with changes made to the original
    since the sandbox was created (git_worktree merge-back); it is empty for other failures.
    When ``conflicts`` is non-empty the original is untouched and the sandbox stays ACTIVE, so the
    commit can be retried after the conflict is resolved.
    """

    def __init__(self, message: str, conflicts: list[str] | None = None) -> None:
        super().__init__(message)
        self.conflicts: list[str] = list(conflicts or [])


class SandboxRollbackError(SandboxError):
    """Discarding the sandbox's changes (or undoing a commit) failed.

    ``refused`` is True when the rollback was refused before anything was touched (for example
    the original moved on since the commit): the sandbox keeps its status, so the rollback can be
    retried once the cause is resolved. Otherwise the sandbox becomes ERRORED.
    """

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class SandboxStateError(SandboxError):
    """The operation is not valid in the sandbox's current lifecycle status."""


class SandboxStatementError(SandboxError):
    """A statement run through ``TransactionSandbox.execute`` failed.

    The failed statement was undone to a savepoint and not logged: the sandbox's transaction
    holds exactly the statements that succeeded before it, and the sandbox stays usable.

    Attributes:
        integrity: the database refused it for a constraint (unique, foreign key, not null, check).
    """

    def __init__(self, message: str, *, integrity: bool = False) -> None:
        super().__init__(message)
        self.integrity = integrity


class AtomicCommitError(SandboxError):
    """A non-sandbox exception interrupted ``commit_all``; compensation was attempted.

    Attributes:
        rolled_back_ids: sandbox ids whose commit was undone, in LIFO order.
        failed_rollback_ids: sandbox ids whose compensation itself failed (their original
            resource may hold the committed change).
    """

    def __init__(
        self,
        message: str,
        rolled_back_ids: list[str] | None = None,
        failed_rollback_ids: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.rolled_back_ids: list[str] = list(rolled_back_ids or [])
        self.failed_rollback_ids: list[str] = list(failed_rollback_ids or [])


class SandboxRetryableError(SandboxError):
    """A temporary failure: nothing changed, the sandbox keeps its status; try again later.

    ``retryable`` is always True, so that callers (the operator's error mapping, the CLI) can
    tell "not now" from "never" without knowing every subclass.
    """

    retryable = True


class SandboxBusyError(SandboxRetryableError):
    """The database stayed locked by another connection for the whole bounded wait.

    Raised by ``TransactionSandbox`` after retrying with backoff for ``timeout_seconds``
    (SQLite ``SQLITE_BUSY`` / ``SQLITE_LOCKED``; PostgreSQL lock timeout or deadlock). The
    statement or commit did not happen; the sandbox stays ACTIVE (issue 7, case 31).
    """


class SandboxConnectionError(SandboxRetryableError):
    """The database server cannot be reached (or refused the login).

    Raised by ``TransactionSandbox`` when reconnecting failed for ``timeout_seconds``. The
    sandbox keeps its status and statement log: the next call reconnects and replays the log.
    A commit whose outcome could not be checked is settled by the next ``commit()``, which looks
    for the commit marker first.
    """


class SandboxReplayDivergedError(SandboxCommitError):
    """Replaying the statement log did not reproduce what the sandbox saw (issue 7, case 32).

    A logged statement failed on replay, or returned other rows, another row count or another
    generated id (``lastrowid``, a sequence value) than when the sandbox ran it, so applying the
    log would commit something else than what the actor saw. Nothing was applied: the database
    is unchanged, and the sandbox stays ACTIVE (roll it back and redo the work).
    ``TransactionSandbox.execute`` raises it too when it has to replay the log.

    Attributes:
        statement: 1-based position of the diverging statement in the log.
        sql: its SQL text.
        conflicts: ``["statement <n>: <sql>"]`` (so every caller treats it as a conflict).
    """

    def __init__(self, message: str, *, statement: int, sql: str) -> None:
        super().__init__(message, conflicts=[f"statement {statement}: {sql}"])
        self.statement = statement
        self.sql = sql
