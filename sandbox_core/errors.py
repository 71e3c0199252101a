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


class SandboxForkError(SandboxCreationError):
    """A sandbox cannot start from the checkpoint it names (docs/forks.md).

    Raised before anything of the fork is kept: the strategy cannot fork (transaction_rollback,
    none), the checkpoint is of another strategy or original, or its changes overlap what the
    original changed since its sandbox was made (``conflicts``, resource-relative paths).
    """

    def __init__(self, message: str, conflicts: list[str] | None = None) -> None:
        super().__init__(message)
        self.conflicts: list[str] = list(conflicts or [])


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


class PlanRerunRequiredError(SandboxStateError):
    """A plan commit was refused up front because it could only land part of the plan (case 38).

    Some sandboxes of the plan are ROLLED_BACK (a compensation or a rollback discarded their
    changes) or ERRORED while others could still be committed. Nothing was touched.

    Attributes:
        plan_id: the plan.
        sandbox_ids: the sandboxes whose changes were discarded or are in doubt.
    """

    def __init__(self, message: str, *, plan_id: str, sandbox_ids: list[str]) -> None:
        super().__init__(message)
        self.plan_id = plan_id
        self.sandbox_ids: list[str] = list(sandbox_ids)


# -- classified failures (a leftover lock, a permission problem and a real conflict are
# different errors with different CLI exit codes). Each kind is a mixin-free base class; the
# phase-specific subclasses also derive from the phase's error, so ``except SandboxCommitError``
# keeps catching every commit failure.


class SandboxConflictError(SandboxCommitError):
    """A real conflict: the sandbox's changes overlap changes made in the original.

    ``conflicts`` is non-empty; the original is untouched and the sandbox stays ACTIVE.
    What to do: resolve (commit, stash or drop) the overlapping changes, then retry the commit.
    CLI exit code 5.
    """


class SandboxLockedError(SandboxError):
    """A lock file left by another process blocks the operation; nothing was changed.

    ``lock_path`` names the lock file (for git: ``index.lock`` or a ref's ``.lock``) when known.
    What to do: wait for the other git command to finish and retry; if none is running (a crashed
    git left it), remove ``lock_path`` and retry. CLI exit code 8.
    """

    lock_path: str | None = None


class SandboxPermissionError(SandboxError):
    """The operating system refused access (permissions, owner, read-only file system), or the
    resource belongs to another user who was not trusted. Nothing was changed.

    ``path`` names the file or directory when known. What to do: give this process's user write
    access (owner, group or mode), or trust the owner explicitly (git_worktree option
    ``trust_repository_owner=true``). CLI exit code 9.
    """

    path: str | None = None


class SandboxCreationLockedError(SandboxCreationError, SandboxLockedError):
    """Create blocked by a leftover lock (see :class:`SandboxLockedError`)."""


class SandboxCommitLockedError(SandboxCommitError, SandboxLockedError):
    """Commit blocked by a leftover lock; the original is untouched, the sandbox stays ACTIVE."""


class SandboxRollbackLockedError(SandboxRollbackError, SandboxLockedError):
    """Rollback blocked by a leftover lock; refused before touching anything."""


class SandboxCreationPermissionError(SandboxCreationError, SandboxPermissionError):
    """Create refused for permissions or an untrusted owner (:class:`SandboxPermissionError`)."""


class SandboxCommitPermissionError(SandboxCommitError, SandboxPermissionError):
    """Commit refused for permissions; the original is untouched, the sandbox stays ACTIVE."""


class SandboxRollbackPermissionError(SandboxRollbackError, SandboxPermissionError):
    """Rollback refused for permissions before touching anything."""


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
    statement or commit did not happen; the sandbox stays ACTIVE (case 31).
    """


class SandboxConnectionError(SandboxRetryableError):
    """The database server cannot be reached (or refused the login).

    Raised by ``TransactionSandbox`` when reconnecting failed for ``timeout_seconds``. The
    sandbox keeps its status and statement log: the next call reconnects and replays the log.
    A commit whose outcome could not be checked is settled by the next ``commit()``, which looks
    for the commit marker first.
    """


class SandboxReplayDivergedError(SandboxCommitError):
    """Replaying the statement log did not reproduce what the sandbox saw (case 32).

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


# -- two-phase plan commit and review/approval -----------------------------------------------


class ChangedSinceApprovalError(SandboxCommitError):
    """A plan's changes no longer hash to the digest that was approved.

    Raised before the decision of a two-phase plan commit: every prepared participant is
    aborted and no original is touched.

    Attributes:
        approved_digest: the digest the approval named.
        actual_digest: the digest of the changes found when the commit was prepared.
    """

    def __init__(self, message: str, *, approved_digest: str, actual_digest: str) -> None:
        super().__init__(message)
        self.approved_digest = approved_digest
        self.actual_digest = actual_digest


class PlanReviewError(SandboxError):
    """A plan could not be reviewed again right before its commit, so its approval cannot be
    checked; nothing was touched. ``__cause__`` is the review's own error."""


class TwoPhaseUnavailableError(SandboxError):
    """A plan cannot be committed in two phases; nothing was touched.

    For example the PostgreSQL server has ``max_prepared_transactions = 0``, or more than one
    participant cannot prepare durably (only one may be the last resource). Callers that asked
    for ``auto`` fall back to the saga and say so; callers that insisted get this error.
    """


# -- resource faults (docs/fidelity.md, "Resource faults"): a full or read-only file system is
# transient; the directory strategies undo what they did and keep the sandbox's status.


class SandboxNoSpaceError(SandboxRetryableError):
    """The file system ran out of space (ENOSPC) or quota (EDQUOT); nothing changed.

    The directory strategies undo their writes and remove their staging, so the original is
    exactly as before and the sandbox keeps its status (and its edits). ``path`` names the file
    system's file or directory when known. What to do: free space on that volume (or grow it),
    then retry the same operation.
    """

    path: str | None = None


class SandboxCommitNoSpaceError(SandboxCommitError, SandboxNoSpaceError):
    """Commit (or prepare, or apply) stopped by a full file system; the sandbox stays ACTIVE.

    One-shot commit and prepare: the original is exactly as before. A two-phase apply (the
    decision was taken) is rolled forward by the retry.
    """


class SandboxRollbackNoSpaceError(SandboxRollbackError, SandboxNoSpaceError):
    """Rollback stopped by a full file system; what it had done was undone, status unchanged."""


class SandboxRollbackConflictError(SandboxRollbackError):
    """A rollback from COMMITTED refused because the original changed since the commit, at
    paths the rollback would put back: undoing the commit would discard a write the product
    did not make (case 43). ``conflicts`` names them (resource-relative); nothing was changed
    and the sandbox stays COMMITTED. What to do: keep or undo that later write yourself, then
    retry (or leave the commit in place). See docs/concurrency.md.
    """

    def __init__(self, message: str, conflicts: list[str]) -> None:
        super().__init__(message, refused=True)
        self.conflicts: list[str] = list(conflicts)


class CommitOutcomeUnknownError(SandboxError):
    """A commit was sent but whether it landed cannot be told now: its reply was lost (a
    timeout, a broken connection) and the participant cannot be asked yet.

    A plan commit never compensates on this error: it asks the participant
    (``commit_outcome()``, ``commit_landed()``) and, while no answer comes, keeps the attempt
    open (reason ``OutcomeUnknown``) for ``recover`` to ask again.
    ``retryable`` is True.
    """

    retryable = True


class SandboxPathError(SandboxError, ValueError):
    """An actor's path was refused before anything was touched: absolute, ``..``, a NUL byte,
    a symlink on the way (never followed), or a write under a control path (``.git``).

    A ``ValueError`` too, so callers of ``get_path`` that catch the traversal refusal catch it;
    its message starts with ``"Path traversal not allowed"`` (seed 003).
    """


class SandboxFileNotFoundError(SandboxError):
    """An actor's file operation named a file or directory that does not exist in the sandbox."""


class SandboxFileOperationError(SandboxError):
    """An actor's file operation cannot be done as asked (the target exists, is not a regular
    file, is a directory that is not empty, an ``edit`` whose old text is absent or not unique,
    ...); nothing was changed. The message says what to do instead."""
