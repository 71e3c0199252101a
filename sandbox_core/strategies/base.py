"""``BaseSandbox``: the lifecycle shared by every strategy (seed 002, "Lifecycle").

A strategy subclasses it and fills in the ``_do_*`` hooks; the base class owns argument validation,
status transitions, error translation and persistence (``to_record`` / ``reopen``), so every
strategy behaves the same at its edges:

- ``create``: PENDING -> CREATED; any failure -> ERRORED and :class:`SandboxCreationError`.
- ``get_path``: CREATED/ROLLED_BACK -> ACTIVE; refuses traversal with
  ``ValueError("Path traversal not allowed")``.
- ``commit``: CREATED/ACTIVE -> COMMITTED. A :class:`SandboxCommitError` carrying ``conflicts``
  leaves the sandbox ACTIVE (nothing was touched, retry after resolving); any other failure ->
  ERRORED.
- ``rollback``: ACTIVE -> ROLLED_BACK; COMMITTED -> ROLLED_BACK when ``rollbackable``. A failed
  rollback of an ACTIVE sandbox -> ERRORED. A failed rollback from COMMITTED (a compensation)
  leaves the sandbox COMMITTED: the undo is still owed and is retried later (the saga's
  ``recover``, case 21), so strategies keep ``_do_rollback_committed`` safe to run again.
- ``cleanup``: any -> CLEANED_UP, idempotent.
- Interrupted operations (docs/two-phase-commit.md, "Interrupted, then rolled back or cleaned
  up"): ``rollback`` and ``cleanup`` first run :meth:`BaseSandbox.finish_interrupted`, which
  finishes or undoes whatever a commit or a two-phase apply killed part-way left in the
  original (a one-shot sync is finished or undone from its journal; a decided apply is rolled
  forward, the sandbox then COMMITTED), so the original is never left half-committed.
- ``cleanup_interrupted_create``: a sandbox reopened from a record saved before its create
  finished (no context) -> CLEANED_UP, removing what a create of this sandbox id makes
  (``cleanup`` alone removes only what a finished create recorded in its context).
- Two-phase plan commit (docs/two-phase-commit.md): ``review`` and ``prepare`` never touch the
  original and never change the status (a failed prepare leaves the sandbox as it was);
  ``apply_prepared`` moves CREATED/ACTIVE -> COMMITTED and is idempotent per transaction id (a
  failure keeps the status so the apply is retried: after the decision recovery rolls forward);
  ``abort_prepared`` removes what ``prepare`` staged and is idempotent.

Which statuses each operation accepts is asked of :class:`SandboxStatus` (``can_commit``,
``is_open``, ``can_activate``): the guards live in ``sandbox_core.status`` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, NoReturn, Self

from ulid import ULID

from sandbox_core._path_limits import too_long_refusal
from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxForkError,
    SandboxLockedError,
    SandboxRollbackError,
    SandboxRollbackLockedError,
    SandboxStateError,
    TwoPhaseUnavailableError,
)
from sandbox_core.paths import resolve_inside
from sandbox_core.protocol import (
    ChangeSummary,
    CommitResult,
    ForkSource,
    PreparedCommit,
    SandboxContext,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.resource_faults import resource_error, resource_fault
from sandbox_core.tree.guards import RefusedBeforeWriteError
from sandbox_core.tree.original_lock import (
    LONE_WAIT_SECONDS,
    OriginalLockedError,
    clear_if_free,
    held_by_process,
    held_here,
)

__all__ = [
    "SANDBOX_ROOT_ENV",
    "BaseSandbox",
    "default_sandbox_root",
    "logger",
    "require_non_empty",
]

logger = logging.getLogger("sandbox_core")

SANDBOX_ROOT_ENV = "SANDBOX_CORE_ROOT"


_FORK_REFUSALS = {
    "transaction_rollback": (
        ": its checkpoint is a savepoint inside the parent's open database transaction, which "
        "no other transaction can start from; create a new sandbox and replay the statements"
    ),
    "none": ": it writes to the original directly, so there is nothing to start from",
}


def default_sandbox_root() -> Path:
    """Directory under which sandboxes are made unless ``sandbox_root=`` is given.

    ``$SANDBOX_CORE_ROOT`` when set, else ``<tmp>/sandbox-core``.
    """
    configured = os.environ.get(SANDBOX_ROOT_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "sandbox-core"


def require_non_empty(name: str, value: object) -> None:
    """Raise ``ValueError("<name> cannot be empty")`` for ``None`` or blank strings (seed 000)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} cannot be empty")


class BaseSandbox:
    """Common lifecycle of all strategies. See the module docstring for the status rules.

    Args:
        resource_id: id of the resource being sandboxed (non-empty).
        original_path: where the original lives: a directory, a repository, or a DSN (non-empty).
        **options: strategy options, kept JSON-serialisable so that :meth:`to_record` can persist
            them. ``sandbox_root`` (str) is understood by every file-based strategy.

    Raises:
        ValueError: ``"resource_id cannot be empty"`` / ``"original_path cannot be empty"``.
    """

    strategy: ClassVar[str] = ""
    rollbackable: ClassVar[bool] = True
    layout_folder: ClassVar[str | None] = None
    """The per-strategy folder under the sandbox root (``cow``, ``git``, ``overlay``, ``txn``)
    that holds ``<folder>/<sandbox_id>/``; None when the strategy makes none."""
    undoes_resource_faults: ClassVar[bool] = False
    """Whether every failing write of commit, apply and rollback is undone (the original as
    before, staging removed), so that a full or read-only file system keeps the status
    (:meth:`_resource_refusal`)."""
    locks_original: ClassVar[bool] = True
    """Whether a lone ``commit`` and a rollback from COMMITTED take the original's lock
    (:mod:`sandbox_core.tree.original_lock`, docs/concurrency.md), as a plan does. False where
    a commit writes nothing of its own (``none``) or the original serialises its own sessions
    (a database)."""
    forkable: ClassVar[bool] = False
    """Whether a new sandbox of this strategy can start from another's checkpoint
    (:meth:`start_from`, docs/forks.md)."""
    prepares_durably: bool = True
    """Whether ``prepare`` survives a crash of this process. A participant that cannot
    (SQLite holds its prepared writes in an open connection) can only be the last resource of
    a two-phase plan commit: its commit is the decision."""

    def __init__(self, resource_id: str, original_path: str, **options: Any) -> None:
        require_non_empty("resource_id", resource_id)
        require_non_empty("original_path", original_path)
        self._resource_id = resource_id
        self._original_path = str(original_path)
        sandbox_id = options.pop("sandbox_id", None)
        self._options: dict[str, Any] = dict(options)
        self._sandbox_id = str(sandbox_id or ULID())
        self._status = SandboxStatus.PENDING
        self._context: SandboxContext | None = None
        self._last_commit: CommitResult | None = None
        # One sandbox is driven by one caller at a time; the lock makes concurrent misuse safe.
        self._lock = threading.RLock()

    # -- properties -------------------------------------------------------------------------

    @property
    def sandbox_id(self) -> str:
        """Unique ULID of this sandbox (26 characters, Crockford base32)."""
        return self._sandbox_id

    @property
    def status(self) -> SandboxStatus:
        """Current lifecycle status."""
        return self._status

    @property
    def context(self) -> SandboxContext | None:
        """Context after :meth:`create`; ``None`` before."""
        return self._context

    @property
    def resource_id(self) -> str:
        """Id of the sandboxed resource."""
        return self._resource_id

    @property
    def original_path(self) -> str:
        """Location of the original resource as given."""
        return self._original_path

    @property
    def options(self) -> dict[str, Any]:
        """A copy of the strategy options this sandbox was built with."""
        return dict(self._options)

    @property
    def last_commit(self) -> CommitResult | None:
        """Result of the last successful :meth:`commit`, if any."""
        return self._last_commit

    @property
    def sandbox_root(self) -> Path:
        """Parent directory for this sandbox's on-disk artefacts."""
        root = self._options.get("sandbox_root")
        return Path(root) if root else default_sandbox_root()

    # -- lifecycle --------------------------------------------------------------------------

    def create(self, plan_id: str) -> SandboxContext:
        """Initialise the sandbox environment for ``plan_id``.

        Returns:
            The new :class:`SandboxContext`.

        Raises:
            ValueError: ``"plan_id cannot be empty"``.
            SandboxStateError: the sandbox is not PENDING.
            SandboxCreationError: the environment could not be made (status becomes ERRORED).
        """
        require_non_empty("plan_id", plan_id)
        with self._lock:
            self._require(SandboxStatus.PENDING, "create")
            try:
                context = self._do_create(plan_id)
            except SandboxError:
                self._status = SandboxStatus.ERRORED
                self._prune_layout_dir()
                raise
            except (OSError, ValueError) as exc:
                self._status = SandboxStatus.ERRORED
                self._prune_layout_dir()
                raise SandboxCreationError(
                    f"cannot create {self.strategy} sandbox for {self._original_path}: {exc}"
                ) from exc
            self._context = context
            self._set_status(SandboxStatus.CREATED)
            return context

    def activate(self) -> None:
        """Open the sandbox for writes: CREATED or ROLLED_BACK -> ACTIVE; no-op when ACTIVE.

        Raises:
            SandboxStateError: in any other status.
        """
        with self._lock:
            if self._status is SandboxStatus.ACTIVE:
                return
            if not self._status.can_activate:
                raise SandboxStateError(
                    f"cannot activate sandbox {self._sandbox_id} in status {self._status.value}"
                )
            self._do_activate()
            self._set_status(SandboxStatus.ACTIVE)

    def start_from(self, source: ForkSource) -> None:
        """Make this fresh sandbox hold what ``source`` (another sandbox's checkpoint over the
        same original) held, as its own uncommitted change: a fork (docs/forks.md).

        Only the parent's own change up to the checkpoint is carried; the fork's diff is
        against the original, and what the original changed since the parent was made stays.

        Raises:
            SandboxStateError: the sandbox is not CREATED.
            SandboxForkError: the strategy cannot fork, the checkpoint is of another kind, or
                the parent's change overlaps what the original changed since (``conflicts``);
                the fork's files are as its create left them.
        """
        with self._lock:
            self._require(SandboxStatus.CREATED, "start from a checkpoint")
            if not self.forkable:
                raise SandboxForkError(
                    f"strategy {self.strategy} cannot start a sandbox from a checkpoint"
                    f"{_FORK_REFUSALS.get(self.strategy, '')}"
                )
            try:
                self._do_start_from(source)
            except SandboxError:
                raise
            except (OSError, ValueError) as exc:
                raise SandboxForkError(
                    f"cannot start sandbox {self._sandbox_id} from checkpoint "
                    f"{source.checkpoint_id} of sandbox {source.sandbox_id}: {exc}"
                ) from exc
            context = self._require_context()
            forked = {"sandbox_id": source.sandbox_id, "checkpoint_id": source.checkpoint_id}
            self._context = dataclasses.replace(
                context, metadata={**context.metadata, "forked_from": forked}
            )

    def _path_roots(self) -> list[str]:
        """The view and the original, to name a refused path relative to them."""
        context = self._context
        roots = [context.sandbox_path] if context is not None else []
        return [*roots, self._original_path]

    def get_path(self, resource_path: str) -> str:
        """Translate a resource-relative path into the absolute path inside the sandbox.

        Activates a CREATED or ROLLED_BACK sandbox. The path need not exist yet.

        Raises:
            ValueError: ``"Path traversal not allowed"`` for ``..``, absolute paths, or symlinks
                resolving outside the sandbox.
            SandboxStateError: the sandbox is PENDING, COMMITTED, ERRORED or CLEANED_UP.
        """
        with self._lock:
            if not self._status.is_open:
                raise SandboxStateError(
                    f"cannot resolve paths in sandbox {self._sandbox_id} "
                    f"in status {self._status.value}"
                )
            resolved = resolve_inside(self._path_root(), resource_path)
            self.activate()
            return resolved

    def commit(self, message: str | None = None) -> CommitResult:
        """Apply the sandbox's changes to the original resource.

        Returns:
            A successful :class:`CommitResult` with resource-relative file lists.

        Raises:
            SandboxStateError: the sandbox is not CREATED or ACTIVE.
            SandboxCommitError: the commit failed. With ``conflicts`` set the original is
                untouched and the sandbox stays ACTIVE; otherwise the status becomes ERRORED.
        """
        with self._lock:
            if not self._status.can_commit:
                raise SandboxStateError(
                    f"cannot commit sandbox {self._sandbox_id} in status {self._status.value}"
                )
            with self._original_held("commit"):
                self.activate()
                try:
                    result = self._do_commit(message)
                except Exception as exc:
                    kept = self._resource_refusal("commit", exc)
                    if kept is not None:  # undone by the strategy: stays ACTIVE, retry later
                        raise kept from exc
                    self._commit_failed(exc)
                self._last_commit = result
                self._set_status(SandboxStatus.COMMITTED)
                return result

    def rollback(self) -> None:
        """Discard the sandbox's changes (ACTIVE) or undo its commit (COMMITTED).

        Raises:
            SandboxStateError: not ACTIVE/COMMITTED, or COMMITTED on a strategy that cannot
                undo a commit (``rollbackable`` is False).
            SandboxRollbackError: the rollback failed, or was refused before touching anything
                (``refused``; status unchanged). A failed rollback of an ACTIVE sandbox makes it
                ERRORED; one from COMMITTED leaves it COMMITTED so that it can be retried
                (case 21: a compensation is retried once its cause is gone).
        """
        with self._lock:
            self._finish_interrupted("rollback")  # the status it leaves decides what is undone
            undoing_commit = self._status is SandboxStatus.COMMITTED
            if self._status is SandboxStatus.ACTIVE:
                action = self._do_rollback
            elif undoing_commit:
                if not self.rollbackable:
                    raise SandboxStateError(
                        f"{self.strategy} sandbox {self._sandbox_id} cannot be rolled back "
                        "after commit"
                    )
                action = self._do_rollback_committed
            else:
                raise SandboxStateError(
                    f"cannot roll back sandbox {self._sandbox_id} in status {self._status.value}"
                )
            held = (
                self._original_held("rollback")
                if undoing_commit  # writes the original: its lock, as a plan's compensation
                else contextlib.nullcontext()
            )
            with held:
                try:
                    action()
                except Exception as exc:
                    kept = self._resource_refusal("rollback", exc)
                    if kept is not None:  # undone by the strategy: the status is kept
                        raise kept from exc
                    self._rollback_failed(exc, undoing_commit=undoing_commit)
                self._set_status(SandboxStatus.ROLLED_BACK)

    def cleanup(self) -> None:
        """Remove every artefact of the sandbox; the original is never touched. Idempotent.

        Idempotent also across processes: a sandbox another process already cleaned up (its
        artefacts gone) cleans up without error. Nothing is left behind: the per-strategy folder
        under the sandbox root (``cow/``, ``git/``, ``overlay/``, ``txn/``) goes too once it is
        empty.

        Raises:
            SandboxError: an artefact could not be removed (status unchanged, safe to retry).
        """
        with self._lock:
            if self._status is SandboxStatus.CLEANED_UP:
                return
            self._finish_interrupted("cleanup")
            try:
                self._do_cleanup()
            except SandboxError:
                raise
            except OSError as exc:
                raise SandboxError(f"cleanup of sandbox {self._sandbox_id} failed: {exc}") from exc
            self._status = SandboxStatus.CLEANED_UP
            self._prune_layout_dir()
            if self.locks_original:
                # A lock file a full or read-only volume kept from being released, or one left
                # by a process that died, goes with the sandbox (docs/concurrency.md).
                clear_if_free(self._original_path, self._sandbox_id)

    def finish_interrupted(self) -> None:
        """Finish or undo what a commit or a two-phase apply of this sandbox, cut short by a
        crash or an error, left in the original; a no-op when nothing was left.

        Run first by :meth:`rollback` and :meth:`cleanup` (and safe to call any time): a
        one-shot commit is finished or undone as its journal says (the original ends exactly
        old or exactly new), a two-phase apply whose renames began is rolled forward (the
        plan's decision was taken; the sandbox becomes COMMITTED). The strategy's
        ``_do_finish_interrupted`` hook does the work; strategies whose commit is one atomic
        step have nothing to do.

        It writes the original, so it holds the original's lock as a lone commit does
        (docs/concurrency.md): while another process's commit or rollback holds it, it waits
        (up to ``LONE_WAIT_SECONDS``); another plan's prepared hold, or a longer wait, refuses
        it with nothing written. The one hold it goes on under is a prepared hold of its own
        plan that names this sandbox: the apply it rolls forward is that plan's decided work.
        Nothing is taken when nothing was left (``_has_interrupted``: a few ``stat`` calls).

        Raises:
            OriginalLockedError: another plan or process holds the original (nothing written;
                :class:`SandboxRollbackLockedError` when run by ``rollback``).
            SandboxError: the interrupted operation could not be finished nor undone (the
                original is as the interrupted operation left it; retry).
        """
        self._finish_interrupted("finish")

    def _finish_interrupted(self, action: str) -> None:
        """:meth:`finish_interrupted` for ``action`` (``"rollback"``, ``"cleanup"``,
        ``"finish"``: which lock error a refusal is)."""
        with self._lock:
            if self._context is None or self._status in (
                SandboxStatus.PENDING,
                SandboxStatus.CLEANED_UP,
            ):
                return
            try:
                if not self._has_interrupted():
                    return
                with self._finishing_held(action):
                    self._do_finish_interrupted()
            except SandboxError:
                raise
            except (OSError, ValueError) as exc:
                raise SandboxError(
                    f"sandbox {self._sandbox_id}: cannot finish the interrupted commit: {exc}"
                ) from exc

    @contextlib.contextmanager
    def _finishing_held(self, action: str) -> Iterator[None]:
        """The original's lock for finishing an interrupted operation (see
        :meth:`finish_interrupted`).

        Raises:
            OriginalLockedError: refused (``SandboxRollbackLockedError`` for ``"rollback"``).
        """
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._original_held("finish"))
            except OriginalLockedError as exc:
                holder = exc.holder
                own_plan = holder.get("kind") == "prepared" and self._sandbox_id in (
                    holder.get("sandboxes") or []
                )
                if not own_plan:
                    if action != "rollback":
                        raise
                    refused = SandboxRollbackLockedError(str(exc), refused=True)
                    refused.lock_path = exc.lock_path
                    raise refused from exc
                logger.info(
                    "sandbox %s: finishing the apply of its own plan %s under its prepared hold",
                    self._sandbox_id,
                    holder.get("plan_id"),
                )
            yield

    def cleanup_interrupted_create(self) -> None:
        """Remove what a create of this sandbox id left when it never finished (case 18).

        For a sandbox reopened from a record saved *before* its create (status ``pending``, or
        ``errored`` without a context): the process died, or the create failed and its own undo
        failed, somewhere inside ``create``. :meth:`cleanup` removes only what a finished create
        recorded in its context; this removes what the strategy makes under this sandbox id
        (its ``<sandbox_root>/<layout_folder>/<sandbox_id>`` and whatever the strategy names
        after the id), never the original nor another sandbox's artefacts. Then CLEANED_UP, so a
        new sandbox can be created under the same id. Do not call it on a sandbox whose create
        failed in this process because the id was taken: the artefacts then are the other's.

        Raises:
            SandboxStateError: the sandbox has a context (its create finished: use cleanup).
            SandboxError: an artefact could not be removed (status unchanged, safe to retry).
        """
        with self._lock:
            if self._context is not None:
                raise SandboxStateError(
                    f"sandbox {self._sandbox_id} was created; cleanup() removes its artefacts"
                )
            try:
                self._do_cleanup_interrupted_create()
            except SandboxError:
                raise
            except OSError as exc:
                raise SandboxError(
                    f"cleanup of the interrupted create of sandbox {self._sandbox_id} failed: {exc}"
                ) from exc
            self._status = SandboxStatus.CLEANED_UP
            self._prune_layout_dir()
            if self.locks_original:
                # A lock file a full or read-only volume kept from being released, or one left
                # by a process that died, goes with the sandbox (docs/concurrency.md).
                clear_if_free(self._original_path, self._sandbox_id)

    def _prune_layout_dir(self) -> None:
        """Remove ``<root>/<kind>/`` once this sandbox's ``<kind>/<id>/`` was its last entry.

        Found from the context's ``sandbox_path`` (the ``<id>`` component) or, after a create
        that failed (it removed its own ``<kind>/<id>/``), from ``layout_folder``; so nothing
        outside the sandbox's own layout is ever looked at: the ``none`` strategy, whose path is
        the original, has no such component. ``rmdir`` only removes an empty directory, so a
        folder another sandbox still uses stays.
        """
        if self._context is not None:
            path = Path(self._context.sandbox_path)
            own = next((p for p in (path, *path.parents) if p.name == self._sandbox_id), None)
        elif self.layout_folder is not None:  # a create that failed: no context was made
            own = self.sandbox_root / self.layout_folder / self._sandbox_id
        else:
            return
        if own is None or os.path.lexists(own):
            return
        with contextlib.suppress(OSError):  # not empty (other sandboxes), or already gone
            own.parent.rmdir()

    def adopt_landed_commit(self) -> None:
        """Record a commit that landed although the process died before recording it.

        Crash recovery only (``sandbox_core.plan.saga``, case 20): the original already holds the
        change, so the sandbox moves to COMMITTED (via ACTIVE) and ``last_commit`` is rebuilt by
        the strategy's ``_rebuild_landed_commit`` hook where it can, so that compensation can
        undo it. No-op when already COMMITTED.

        Raises:
            SandboxStateError: the sandbox is not CREATED, ACTIVE or COMMITTED.
        """
        with self._lock:
            if self._status is SandboxStatus.COMMITTED:
                return
            if not self._status.can_commit:
                raise SandboxStateError(
                    f"cannot adopt a landed commit for sandbox {self._sandbox_id} "
                    f"in status {self._status.value}"
                )
            self._last_commit = self._rebuild_landed_commit() or self._last_commit
            if self._status is SandboxStatus.CREATED:
                self._set_status(SandboxStatus.ACTIVE)
            self._set_status(SandboxStatus.COMMITTED)

    # -- the original's lock ----------------------------------------------------------------

    @contextlib.contextmanager
    def _original_held(self, action: str) -> Iterator[None]:
        """Hold the original's lock (docs/concurrency.md) for a lone ``action`` (``"commit"``
        or ``"rollback"`` from COMMITTED): the same durable lock a plan holds from prepare to
        apply, so a lone commit and a plan (or two processes) over one original run one after
        the other. Nothing is taken when this call stack already holds it (a plan's saga, the
        agent's commit) or the strategy does not lock (:attr:`locks_original`).

        Raises:
            SandboxCommitLockedError: (``OriginalLockedError``; ``SandboxRollbackLockedError``
                for a rollback) another plan or process holds the original: nothing changed,
                the status is kept; the message names the original and the holder.
            SandboxNoSpaceError / SandboxPermissionError: the phase's resource error, when the
                lock file cannot be written (a full or read-only volume); nothing changed.
            SandboxError: the lock file cannot be opened for another reason.
        """
        if not self.locks_original or held_here(self._original_path):
            yield
            return
        error = SandboxRollbackLockedError if action == "rollback" else None
        plan_id = self._context.plan_id if self._context is not None else ""
        held = held_by_process(
            [self._original_path],
            plan_id,
            f"{action}:{self._sandbox_id}",
            error=error,
            process_wait_seconds=LONE_WAIT_SECONDS,
        )
        try:
            held.__enter__()
        except SandboxLockedError:
            raise
        except (SandboxError, OSError) as exc:
            fault = resource_fault(exc)
            if fault is None:
                raise
            raise resource_error(action, self._sandbox_id, fault) from exc
        with contextlib.ExitStack() as stack:
            stack.push(held)
            yield

    # -- failures ---------------------------------------------------------------------------

    def _commit_failed(self, exc: Exception) -> NoReturn:
        """Raise what a failed ``_do_commit`` means: conflicts and refusals found before any
        write keep the status, any other failure makes the sandbox ERRORED."""
        if isinstance(exc, SandboxCommitError):
            if not exc.conflicts:
                self._status = SandboxStatus.ERRORED
            raise exc
        if isinstance(exc, SandboxError):
            self._status = SandboxStatus.ERRORED
            raise exc
        if isinstance(exc, RefusedBeforeWriteError):
            # Refused before anything was written (docs/fidelity.md): stays ACTIVE.
            raise _mount_refusal("commit", self._sandbox_id, exc) from exc
        if isinstance(exc, OSError | ValueError):
            refusal = too_long_refusal("commit", self._sandbox_id, exc, self._path_roots())
            if refusal is not None:  # found before writing, or undone: stays ACTIVE
                raise refusal from exc
            self._status = SandboxStatus.ERRORED
            raise SandboxCommitError(f"commit of sandbox {self._sandbox_id} failed: {exc}") from exc
        raise exc

    def _rollback_failed(self, exc: Exception, *, undoing_commit: bool) -> NoReturn:
        """Raise what a failed rollback means (see :meth:`rollback` for the statuses)."""
        if isinstance(exc, SandboxRollbackError):
            if not (exc.refused or undoing_commit):
                self._status = SandboxStatus.ERRORED
            raise exc
        if isinstance(exc, SandboxError):
            if not undoing_commit:
                self._status = SandboxStatus.ERRORED
            raise exc
        if isinstance(exc, OSError | ValueError):
            if not undoing_commit:
                self._status = SandboxStatus.ERRORED
            raise SandboxRollbackError(
                f"rollback of sandbox {self._sandbox_id} failed: {exc}"
            ) from exc
        raise exc

    def _resource_refusal(self, action: str, exc: BaseException) -> SandboxError | None:
        """The error to raise for a full or read-only file system met by ``action``
        (``"commit"``, ``"prepare"``, ``"apply"``, ``"rollback"``, ``"abort"``), or None.

        Only for strategies whose ``undoes_resource_faults`` is True: they undo their writes
        and remove their staging when one fails, so the original is as before and the status
        is kept (docs/fidelity.md, "Resource faults"). ENOSPC and EDQUOT give the phase's
        :class:`SandboxNoSpaceError` (retryable); EROFS the phase's
        :class:`SandboxPermissionError` (as git_worktree answers it). A conflict is never one.
        """
        if not self.undoes_resource_faults:
            return None
        if isinstance(exc, SandboxCommitError) and exc.conflicts:
            return None
        fault = resource_fault(exc)
        if fault is None:
            return None
        return resource_error(action, self._sandbox_id, fault)

    # -- two-phase plan commit --------------------------------------------------------------

    def review(self) -> ChangeSummary:
        """What a commit would change now, and what would refuse it; takes no locks.

        Returns:
            The :class:`ChangeSummary` (its ``digest`` names the exact changes).

        Raises:
            SandboxStateError: the sandbox is not CREATED or ACTIVE.
            SandboxError: the changes could not be read.
        """
        with self._lock:
            if not self._status.can_commit:
                raise SandboxStateError(
                    f"cannot review sandbox {self._sandbox_id} in status {self._status.value}"
                )
            try:
                return self._do_review()
            except (OSError, ValueError) as exc:
                raise SandboxError(f"review of sandbox {self._sandbox_id} failed: {exc}") from exc

    def prepare(self, txid: str, message: str | None = None) -> PreparedCommit:
        """Do every part of a commit that can fail, without touching the original.

        Everything staged is named after ``txid`` so that :meth:`apply_prepared` and
        :meth:`abort_prepared` work from the id alone after a crash. The status is unchanged
        whatever happens; on failure nothing stays staged.

        Args:
            txid: the plan commit's transaction id (``[A-Za-z0-9._-]``, at most 64 characters).
            message: the commit message.

        Raises:
            SandboxStateError: the sandbox is not CREATED or ACTIVE.
            SandboxCommitError: the commit would fail (``conflicts`` set for a conflict).
            TwoPhaseUnavailableError: this sandbox cannot prepare (for example PostgreSQL with
                ``max_prepared_transactions = 0``).
        """
        require_non_empty("txid", txid)
        with self._lock:
            if not self._status.can_commit:
                raise SandboxStateError(
                    f"cannot prepare sandbox {self._sandbox_id} in status {self._status.value}"
                )
            self.activate()
            try:
                return self._do_prepare(txid, message)
            except SandboxError as exc:
                kept = self._resource_refusal("prepare", exc)
                if kept is not None:
                    raise kept from exc
                raise
            except RefusedBeforeWriteError as exc:
                raise _mount_refusal("prepare", self._sandbox_id, exc) from exc
            except (OSError, ValueError) as exc:
                kept = self._resource_refusal("prepare", exc)
                if kept is not None:  # nothing is left staged
                    raise kept from exc
                refusal = too_long_refusal("prepare", self._sandbox_id, exc, self._path_roots())
                if refusal is not None:
                    raise refusal from exc
                raise SandboxCommitError(
                    f"prepare of sandbox {self._sandbox_id} failed: {exc}"
                ) from exc

    def apply_prepared(self, txid: str) -> CommitResult:
        """Apply what :meth:`prepare` staged under ``txid``: renames, ref updates, COMMIT PREPARED.

        Idempotent: after a crash mid-apply it finishes the apply; on a sandbox already
        COMMITTED by this ``txid`` it returns the recorded result.

        Returns:
            The successful :class:`CommitResult` (``metadata["txid"]`` is ``txid``).

        Raises:
            SandboxStateError: not CREATED/ACTIVE (nor COMMITTED by ``txid``).
            SandboxCommitError: the apply failed; the status is unchanged and the call can be
                retried (the decision was taken: recovery rolls forward).
        """
        require_non_empty("txid", txid)
        with self._lock:
            last = self._last_commit
            if (
                self._status is SandboxStatus.COMMITTED
                and last
                and last.metadata.get("txid") == txid
            ):
                return last
            if not self._status.can_commit:
                raise SandboxStateError(
                    f"cannot apply a prepared commit to sandbox {self._sandbox_id} "
                    f"in status {self._status.value}"
                )
            try:
                result = self._do_apply_prepared(txid)
            except SandboxError as exc:
                kept = self._resource_refusal("apply", exc)
                if kept is not None:
                    raise kept from exc
                raise
            except (OSError, ValueError) as exc:
                kept = self._resource_refusal("apply", exc)
                if kept is not None:  # the decision stands: the retry rolls forward
                    raise kept from exc
                raise SandboxCommitError(
                    f"apply of the prepared commit of sandbox {self._sandbox_id} failed: {exc}"
                ) from exc
            if result.metadata.get("txid") != txid:
                result = dataclasses.replace(result, metadata={**result.metadata, "txid": txid})
            self._last_commit = result
            if self._status is SandboxStatus.CREATED:
                self._set_status(SandboxStatus.ACTIVE)
            self._set_status(SandboxStatus.COMMITTED)
            return result

    def abort_prepared(self, txid: str) -> None:
        """Drop what :meth:`prepare` staged under ``txid``; the original is untouched.

        Idempotent, and safe when nothing was prepared (a crash before or during prepare).
        The status is unchanged.

        Raises:
            SandboxError: the staged state could not be removed (safe to retry).
        """
        require_non_empty("txid", txid)
        with self._lock:
            if self._status is SandboxStatus.CLEANED_UP:
                return
            try:
                self._do_abort_prepared(txid)
            except SandboxError:
                raise
            except (OSError, ValueError) as exc:
                kept = self._resource_refusal("abort", exc)
                if kept is not None:
                    raise kept from exc
                raise SandboxError(
                    f"abort of the prepared commit of sandbox {self._sandbox_id} failed: {exc}"
                ) from exc

    # -- persistence ------------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """JSON-ready record from which :meth:`reopen` rebuilds this sandbox in another process."""
        return {
            "strategy": self.strategy,
            "sandbox_id": self._sandbox_id,
            "resource_id": self._resource_id,
            "original_path": self._original_path,
            "options": dict(self._options),
            "status": self._status.value,
            "context": self._context.to_dict() if self._context else None,
            "last_commit": self._last_commit.to_dict() if self._last_commit else None,
        }

    @classmethod
    def reopen(cls, record: dict[str, Any]) -> Self:
        """Rebuild a sandbox from :meth:`to_record` output (after a process restart).

        The strategy's ``_on_reopen`` hook re-attaches what a restart loses (for example an
        OverlayFS mount). No artefact is created or removed.

        Raises:
            SandboxError: the record belongs to another strategy or is malformed.
        """
        if record.get("strategy") != cls.strategy:
            raise SandboxError(
                f"record of strategy {record.get('strategy')!r} cannot reopen as {cls.strategy!r}"
            )
        sandbox = cls(
            str(record["resource_id"]),
            str(record["original_path"]),
            sandbox_id=str(record["sandbox_id"]),
            **dict(record.get("options") or {}),
        )
        sandbox._status = SandboxStatus(record["status"])
        context = record.get("context")
        sandbox._context = SandboxContext.from_dict(context) if context else None
        last_commit = record.get("last_commit")
        sandbox._last_commit = CommitResult.from_dict(last_commit) if last_commit else None
        if sandbox._status not in (SandboxStatus.PENDING, SandboxStatus.CLEANED_UP):
            sandbox._on_reopen()
        return sandbox

    # -- helpers for subclasses -------------------------------------------------------------

    def _require(self, expected: SandboxStatus, operation: str) -> None:
        if self._status is not expected:
            raise SandboxStateError(
                f"cannot {operation} sandbox {self._sandbox_id} in status {self._status.value}"
            )

    def _set_status(self, target: SandboxStatus) -> None:
        SandboxStatus.assert_transition(self._status, target)
        self._status = target

    def _require_context(self) -> SandboxContext:
        if self._context is None:
            raise SandboxStateError(f"sandbox {self._sandbox_id} has not been created")
        return self._context

    def _path_root(self) -> str:
        """Directory that ``get_path`` resolves against (default: the context's sandbox_path)."""
        return self._require_context().sandbox_path

    # -- hooks for strategies ---------------------------------------------------------------

    def _do_create(self, plan_id: str) -> SandboxContext:
        raise NotImplementedError

    def _do_start_from(self, source: ForkSource) -> None:
        raise SandboxForkError(f"strategy {self.strategy} cannot start from a checkpoint")

    def _do_activate(self) -> None:
        """Called on CREATED/ROLLED_BACK -> ACTIVE; default does nothing."""

    def _do_commit(self, message: str | None) -> CommitResult:
        raise NotImplementedError

    def _do_rollback(self) -> None:
        raise NotImplementedError

    def _do_rollback_committed(self) -> None:
        raise SandboxStateError(f"{self.strategy} sandbox cannot be rolled back after commit")

    def _do_cleanup(self) -> None:
        raise NotImplementedError

    def _do_finish_interrupted(self) -> None:
        """Finish or undo an interrupted commit/apply (see :meth:`finish_interrupted`);
        default: nothing (a commit that is one atomic step leaves nothing half done)."""

    def _has_interrupted(self) -> bool:
        """Whether ``_do_finish_interrupted`` may have something to do (cheap: a few ``stat``
        calls); a strategy that finishes something overrides it. Default: True."""
        return True

    def _roll_forward_apply(self, txid: str) -> None:
        """For ``_do_finish_interrupted``: finish the decided apply of ``txid`` (COMMITTED when
        the status allows it; in any other status only the original is rolled forward)."""
        if self._status.can_commit:
            self.apply_prepared(txid)
        else:
            self._do_apply_prepared(txid)

    def _do_cleanup_interrupted_create(self) -> None:
        """Remove what a create of this id may have made, without a context. Default: the
        strategy's ``_do_cleanup``, for strategies that find their artefacts by id alone."""
        self._do_cleanup()

    def _rebuild_landed_commit(self) -> CommitResult | None:
        """Rebuild the result of a commit that landed unrecorded; default: unknown (None)."""
        return None

    def _on_reopen(self) -> None:
        """Re-attach process-bound state after :meth:`reopen`; default does nothing."""

    def _do_review(self) -> ChangeSummary:
        raise SandboxError(f"{self.strategy or type(self).__name__} sandboxes cannot be reviewed")

    def _do_prepare(self, txid: str, message: str | None) -> PreparedCommit:
        raise TwoPhaseUnavailableError(
            f"{self.strategy or type(self).__name__} sandboxes cannot prepare a commit"
        )

    def _do_apply_prepared(self, txid: str) -> CommitResult:
        raise TwoPhaseUnavailableError(
            f"{self.strategy or type(self).__name__} sandboxes cannot apply a prepared commit"
        )

    def _do_abort_prepared(self, txid: str) -> None:
        """Default: nothing was staged, nothing to drop."""


def _mount_refusal(
    action: str, sandbox_id: str, exc: RefusedBeforeWriteError
) -> SandboxCommitError:
    """A commit refused before anything was written (file systems mounted inside the original,
    immutable or append-only entries): the blocking paths are its ``conflicts`` (the sandbox
    keeps its status)."""
    return SandboxCommitError(f"{action} of sandbox {sandbox_id} refused: {exc}", exc.paths)
