"""``SandboxManager``: sandbox lifecycles across plan executions (seed 002, "SandboxManager").

Seed 000 is the contract. The manager tracks one sandbox per (plan, resource), creates them
lazily, commits a plan's sandboxes all or nothing (:mod:`sandbox_core.plan.saga`), rolls back and
cleans up in batch, and cleans up on process exit.

Threading: one lock guards the tracking dicts and is held only for dictionary work; each plan has
its own lock around slow work (create, commit, rollback, cleanup), so plans do not wait for each
other.

Persistence: with a :class:`~sandbox_core.host.store.SandboxStore` every sandbox is saved after each
status change the manager makes, commit journals live in ``<state_dir>/journals/``, and
:meth:`SandboxManager.reopen_plan` / :meth:`SandboxManager.load` rebuild the sandboxes in another
process. A manager with a store usually wants ``cleanup_on_exit=False`` (the sandboxes outlive
the process on purpose).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sandbox_core.boundary import (
    ResourceLookup,
    resolve_boundary,
    resource_location,
    resource_strategy,
)
from sandbox_core.errors import SandboxError, SandboxForkError
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.store import SandboxStore
from sandbox_core.plan.commit import (
    PLAN_COMMIT_MODES,
    PlanCommitMode,
    check_mode,
    commit_plan,
    journal_results,
)
from sandbox_core.plan.journal import (
    CommitJournal,
    FileCommitJournal,
    JournalState,
    MemoryCommitJournal,
)
from sandbox_core.plan.original_lock import clear_if_free, held_by_process, local_original
from sandbox_core.plan.review import PlanReview, review_plan
from sandbox_core.plan.saga import FaultHook, PlanCommitSaga, refuse_partial_plan
from sandbox_core.plan.two_phase import TwoPhasePlanCommit
from sandbox_core.plan.validation import CheckResult
from sandbox_core.protocol import CommitResult
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import require_non_empty
from sandbox_core.strategies.catalogue import traits_of
from sandbox_core.strategies.factory import SandboxFactory

__all__ = [
    "PLAN_COMMIT_MODES",
    "PlanCommitMode",
    "SandboxManager",
    "drop_finished_journal",
    "state_dir_journal_path",
]

logger = logging.getLogger("sandbox_core.host.manager")


class SandboxManager:
    """Thread-safe manager of sandboxes per plan (seed 002, "SandboxManager").

    Args:
        factory: builds sandboxes by strategy name.
        cleanup_on_exit: register an ``atexit`` handler that cleans up every tracked sandbox.
        store: persist sandboxes and commit journals in this store (cross-process reopen,
            crash recovery).
        fault_hook: test-only fault injection for ``commit_all`` (see
            :mod:`sandbox_core.plan.saga`).
        checkpoints: the checkpoint manager the plans' checkpoints are taken with; default one
            over the store's state dir (``<state_dir>/checkpoints``), or an in-memory one
            without a store. :meth:`cleanup_all` deletes the plan's checkpoints from it.

    Raises:
        ValueError: ``"factory cannot be None"``.
    """

    def __init__(
        self,
        factory: SandboxFactory | None,
        cleanup_on_exit: bool = True,
        store: SandboxStore | None = None,
        fault_hook: FaultHook | None = None,
        checkpoints: CheckpointManager | None = None,
    ) -> None:
        if factory is None:
            raise ValueError("factory cannot be None")
        self._factory = factory
        self._host = SandboxHost(store, factory)
        self._cleanup_on_exit = cleanup_on_exit
        self._store = store
        self._fault_hook = fault_hook
        self._checkpoints = checkpoints
        self._lock = threading.RLock()
        self._sandboxes: dict[str, dict[str, Any]] = {}
        self._plan_locks: dict[str, threading.RLock] = {}
        self._memory_journals: dict[str, MemoryCommitJournal] = {}
        self._boundary_cache: dict[str, str] = {}
        self._exit_handler: Callable[[], None] | None = None
        if cleanup_on_exit:
            self._exit_handler = _weak_exit_handler(self)
            atexit.register(self._exit_handler)

    @classmethod
    def load(
        cls, store: SandboxStore, factory: SandboxFactory | None = None, **kwargs: Any
    ) -> SandboxManager:
        """A manager tracking every live sandbox recorded in ``store`` (another process's work).

        ``cleanup_on_exit`` defaults to False here. Unfinished commit journals are *not* recovered
        automatically; call :meth:`recover` (or :meth:`commit_all`, which recovers first).
        """
        kwargs.setdefault("cleanup_on_exit", False)
        manager = cls(factory or SandboxFactory(), store=store, **kwargs)
        plan_ids = {
            str((record.get("context") or {}).get("plan_id") or "") for record in store.records()
        }
        for plan_id in sorted(plan_ids - {""}):
            manager.reopen_plan(plan_id)
        return manager

    # -- properties -------------------------------------------------------------------------

    @property
    def cleanup_on_exit(self) -> bool:
        """Whether the atexit handler was registered."""
        return self._cleanup_on_exit

    @property
    def factory(self) -> SandboxFactory:
        """The factory sandboxes are built with."""
        return self._factory

    @property
    def store(self) -> SandboxStore | None:
        """The store sandboxes are persisted to, if any."""
        return self._store

    @property
    def checkpoints(self) -> CheckpointManager:
        """The checkpoint manager of this manager's plans (see the ``checkpoints`` argument)."""
        with self._lock:
            if self._checkpoints is None:
                state_dir = self._store.state_dir if self._store is not None else None
                self._checkpoints = CheckpointManager(
                    state_dir=state_dir, sandbox_resolver=self._resolve_for_checkpoint
                )
            return self._checkpoints

    # -- lookup and lazy creation -----------------------------------------------------------

    def get_or_create_sandbox(
        self,
        plan_id: str,
        resource_id: str,
        original_path: str,
        sandbox_strategy: str,
        **options: Any,
    ) -> Any:
        """The tracked sandbox of (plan, resource), or a new created one (seed 000).

        A tracked sandbox that is CREATED, ACTIVE or ROLLED_BACK is returned as is; one that is
        COMMITTED, CLEANED_UP or ERRORED is replaced by a fresh sandbox (the old one is cleaned
        up, best effort). A new sandbox is made by :meth:`SandboxHost.provision
        <sandbox_core.host.host.SandboxHost.provision>` (with a store: its pending record first,
        so a crash mid-create leaves nothing that a later reopen trusts): status CREATED.

        Raises:
            ValueError: ``"plan_id cannot be empty"``, ``"resource_id cannot be empty"``,
                ``"original_path cannot be empty"``, or an unknown strategy.
            SandboxCreationError: the strategy could not create the sandbox (nothing tracked).
        """
        require_non_empty("plan_id", plan_id)
        require_non_empty("resource_id", resource_id)
        require_non_empty("original_path", original_path)
        with self._plan_lock(plan_id):
            existing = self.get_sandbox(plan_id, resource_id)
            if existing is not None and existing.status.is_open:
                return existing
            sandbox = self._host.provision(
                plan_id, resource_id, original_path, str(sandbox_strategy), **options
            )
            with self._lock:
                self._sandboxes.setdefault(plan_id, {})[resource_id] = sandbox
            if existing is not None:
                self._discard_replaced(existing)
            return sandbox

    def fork_sandbox(
        self, plan_id: str, resource_id: str, checkpoint_id: str, **options: Any
    ) -> Any:
        """A new sandbox of (plan, resource) that starts from checkpoint ``checkpoint_id`` of
        another sandbox: same strategy, same original, the parent's change up to the checkpoint
        as its own uncommitted change (docs/forks.md). Siblings forked from one checkpoint are
        independent: each commits, rolls back or is cleaned up alone, and outlives its parent.

        Args:
            options: strategy options; default the parent's when it is tracked here
                (``sandbox_root``, ``mode``).

        Returns:
            The fork, CREATED; its context metadata names ``forked_from``.

        Raises:
            ValueError: an empty id, or (plan, resource) already has an open sandbox.
            SandboxForkError: no such checkpoint, a metadata-only one, a strategy that cannot
                fork (transaction_rollback, none), or an overlap with what the original changed
                since the parent was made (nothing of the fork is kept).
            SandboxCreationError: the strategy could not create it.
        """
        require_non_empty("plan_id", plan_id)
        require_non_empty("resource_id", resource_id)
        checkpoint = self.checkpoints.get_checkpoint(checkpoint_id)
        if checkpoint is None:
            raise SandboxForkError(f"checkpoint {checkpoint_id} not found")
        strategy = checkpoint.metadata.get("strategy", "")
        if strategy and not traits_of(strategy).forkable:
            raise SandboxForkError(
                f"strategy {strategy} cannot start a sandbox from a checkpoint (docs/forks.md)"
            )
        source = self.checkpoints.fork_source(checkpoint)
        parent = self.find_sandbox(checkpoint.sandbox_id)
        if parent is not None:
            options = {
                key: value
                for key, value in {**parent.options, **options}.items()
                if key != "sandbox_id"
            }
        with self._plan_lock(plan_id):
            existing = self.get_sandbox(plan_id, resource_id)
            if existing is not None and existing.status.is_open:
                raise ValueError(
                    f"plan {plan_id} already has an open sandbox for resource {resource_id}"
                )
            sandbox = self._host.provision(
                plan_id,
                resource_id,
                checkpoint.metadata["original_path"],
                strategy,
                fork=source,
                **options,
            )
            with self._lock:
                self._sandboxes.setdefault(plan_id, {})[resource_id] = sandbox
            if existing is not None:
                self._discard_replaced(existing)
            return sandbox

    def get_sandbox(self, plan_id: str, resource_id: str) -> Any:
        """The tracked sandbox of (plan, resource), or ``None``."""
        with self._lock:
            return self._sandboxes.get(plan_id, {}).get(resource_id)

    def list_sandboxes(self, plan_id: str) -> list[Any]:
        """Tracked sandboxes of ``plan_id`` in creation order (empty for an unknown plan)."""
        with self._lock:
            return list(self._sandboxes.get(plan_id, {}).values())

    def plan_ids(self) -> list[str]:
        """Ids of the plans that have tracked sandboxes."""
        with self._lock:
            return list(self._sandboxes)

    def find_sandbox(self, sandbox_id: str) -> Any:
        """The tracked sandbox with ``sandbox_id`` in any plan, or ``None``."""
        with self._lock:
            for sandboxes in self._sandboxes.values():
                for sandbox in sandboxes.values():
                    if sandbox.sandbox_id == sandbox_id:
                        return sandbox
        return None

    # -- batch operations -------------------------------------------------------------------

    def commit_all(
        self,
        plan_id: str,
        journal: CommitJournal | None = None,
        message: str | None = None,
    ) -> list[CommitResult]:
        """Commit every CREATED/ACTIVE sandbox of the plan, all or nothing (seed 002).

        Runs :class:`~sandbox_core.plan.saga.PlanCommitSaga` against ``journal`` (default: a file
        journal in the store's state dir, or an in-memory one without a store). When the
        journal holds an unfinished attempt (the process died mid-commit, or a compensation is
        owed: case 21), that attempt is recovered first and its outcome returned; no new attempt
        starts, so no sandbox is committed twice. Sandboxes already COMMITTED are skipped. A
        plan with a ROLLED_BACK or ERRORED sandbox beside committable ones is refused up front
        (case 38: committing the rest would land half the plan).

        Returns:
            ``[]`` when nothing is committable; one successful result per sandbox; or one
            ``CommitResult(success=False)`` (error ``"Atomic commit failed: ..."``, metadata
            ``failed_sandbox_id``, ``rolled_back_ids``, ``failed_rollback_ids``).

        Raises:
            ValueError: ``"plan_id cannot be empty"``.
            PlanRerunRequiredError: the plan can no longer be committed whole (case 38);
                nothing was touched.
            AtomicCommitError: a non-sandbox exception interrupted the commit (after
                compensation; ``__cause__`` is the original).
            OriginalLockedError: another plan or process holds one of the originals' locks
                (docs/concurrency.md); nothing was touched.
            SandboxError: the journal could not be read or written.
        """
        require_non_empty("plan_id", plan_id)
        journal = journal if journal is not None else self.journal_for(plan_id)
        with self._plan_lock(plan_id):
            started = self._begin_attempt(plan_id, journal)
            if isinstance(started, list):
                return started
            sandboxes, attempt = started
            saga = PlanCommitSaga(journal, on_change=self._persist, fault_hook=self._fault_hook)
            # The originals' locks for the whole run, commits and compensations, as in
            # commit_plan's saga (docs/concurrency.md).
            originals = [o for o in (local_original(s) for s in sandboxes) if o is not None]
            with held_by_process(originals, plan_id, f"saga:{plan_id}:{attempt}"):
                return saga.run(plan_id, sandboxes, attempt=attempt, message=message)

    def commit_plan(
        self,
        plan_id: str,
        mode: PlanCommitMode = "two_phase",
        journal: CommitJournal | None = None,
        message: str | None = None,
        approved_digest: str | None = None,
        sandbox_ids: Collection[str] | None = None,
        checks: Sequence[CheckResult] = (),
    ) -> list[CommitResult]:
        """Commit every CREATED/ACTIVE sandbox of the plan all or nothing (or the ones named
        by ``sandbox_ids``, discarding the others: forks, docs/forks.md).

        The policy - the mode, the fallback from two phases to the saga, the approval check -
        is :func:`sandbox_core.plan.commit.commit_plan`'s, run on the plan's sandboxes with
        ``journal`` and this manager's store (each sandbox is saved after each status change).
        Before it, under the plan lock: an unfinished attempt in the journal (either mode) is
        recovered and its outcome returned, as in :meth:`commit_all`, and a plan that could
        only land in part is refused (case 38).

        Args:
            plan_id: the plan.
            mode: ``"two_phase"`` (default), ``"saga"`` or ``"auto"`` (two phases, else the
                saga; every result's metadata then says ``mode: "saga"`` and
                ``fallback_reason``).
            journal: default: :meth:`journal_for`.
            message: commit message for every sandbox.
            approved_digest: the plan digest (``"sha256:<hex>"``, from :meth:`review_plan`)
                that was approved. Two phases compare it with the prepared changes; the saga
                with a review taken just before it starts. A mismatch returns one failed result
                with metadata ``reason: "ChangedSinceApproval"``; nothing is touched.
            sandbox_ids: commit only these sandboxes of the plan; once they are committed,
                every other open sandbox of the plan is cleaned up and no longer tracked (each
                result's metadata ``discarded_ids`` names them). A failed commit discards
                nothing.
            checks: the plan's validation results (:mod:`sandbox_core.plan.validation`); a
                failed one refuses before prepare (metadata ``reason: "ValidationFailed"``),
                and all of them are part of the digest ``approved_digest`` is compared with.

        Returns:
            ``[]`` when nothing is committable; one successful result per sandbox; or one
            failed result (shape: :meth:`TwoPhasePlanCommit.run` / :meth:`commit_all`).

        Raises:
            ValueError: ``"plan_id cannot be empty"``, an unknown ``mode``, or
                ``sandbox_ids`` naming a sandbox that is not an open one of the plan.
            TwoPhaseUnavailableError: ``mode="two_phase"`` and the plan cannot use two phases;
                nothing was touched.
            PlanRerunRequiredError: as :meth:`commit_all` (case 38).
            PlanReviewError: the saga's review before the approval check failed.
            SandboxError: the journal could not be read or written.
        """
        require_non_empty("plan_id", plan_id)
        check_mode(mode)
        journal = journal if journal is not None else self.journal_for(plan_id)
        with self._plan_lock(plan_id):
            started = self._begin_attempt(plan_id, journal)
            if isinstance(started, list):
                return started
            sandboxes, attempt = started
            others: list[Any] = []
            if sandbox_ids is not None:
                sandboxes, others = _select(plan_id, sandboxes, sandbox_ids)
            results = commit_plan(
                plan_id,
                sandboxes,
                journal,
                mode=mode,
                attempt=attempt,
                message=message,
                approved_digest=approved_digest,
                on_change=self._persist,
                fault_hook=self._fault_hook,
                checks=checks,
            )
            if not others or not results or not all(result.success for result in results):
                return results
            discarded = self._discard_others(plan_id, others)
            return [
                dataclasses.replace(
                    result, metadata={**result.metadata, "discarded_ids": discarded}
                )
                for result in results
            ]

    def _discard_others(self, plan_id: str, others: list[Any]) -> list[str]:
        """Clean up and stop tracking ``others`` (the plan's sandboxes a selective commit left
        out), their checkpoints first; the ids of those cleaned up."""
        try:
            self.checkpoints.delete_plan_checkpoints("", [sandbox.sandbox_id for sandbox in others])
        except Exception:  # seed 000: cleanup failures are contained
            logger.exception("cannot delete the checkpoints of plan %s's discarded", plan_id)
        discarded = []
        for sandbox in others:
            if self._cleanup_one(sandbox):
                discarded.append(sandbox.sandbox_id)
                with self._lock:
                    tracked = self._sandboxes.get(plan_id, {})
                    for key, value in list(tracked.items()):
                        if value is sandbox:
                            del tracked[key]
        return sorted(discarded)

    def review_plan(
        self,
        plan_id: str,
        sandbox_ids: Collection[str] | None = None,
        checks: Sequence[CheckResult] = (),
    ) -> PlanReview:
        """What committing the plan would change now; takes no locks on originals.

        Args:
            sandbox_ids: review only these sandboxes (a selective commit's); default all.
            checks: validation results to show and digest with the changes.

        Returns:
            The :class:`~sandbox_core.plan.review.PlanReview` of every CREATED/ACTIVE sandbox of the
            plan (empty, with the digest of nothing, when none is); its ``digest`` is what
            ``commit_plan(approved_digest=...)`` takes (with the same ``sandbox_ids`` and
            ``checks``).

        Raises:
            ValueError: ``"plan_id cannot be empty"``; ``sandbox_ids`` names a sandbox that is
                not an open one of the plan.
            SandboxError: a sandbox's changes could not be read.
        """
        require_non_empty("plan_id", plan_id)
        with self._plan_lock(plan_id):
            sandboxes = [sb for sb in self.list_sandboxes(plan_id) if sb.status.can_commit]
            if sandbox_ids is not None:
                sandboxes, _ = _select(plan_id, sandboxes, sandbox_ids)
            return review_plan(plan_id, sandboxes).with_checks(checks)

    def _begin_attempt(
        self, plan_id: str, journal: CommitJournal
    ) -> list[CommitResult] | tuple[list[Any], int]:
        """What both plan commits do first, under the plan lock: an unfinished attempt is
        recovered and its results returned; a plan that could only land in part is refused
        (case 38); ``[]`` when nothing is committable; else the committable sandboxes and the
        new attempt's number."""
        previous = journal.load()
        if previous is not None and not previous.phase.is_terminal:
            recovered = self.recover(plan_id, journal)
            assert recovered is not None  # it was loaded just above
            return journal_results(recovered)
        tracked = self.list_sandboxes(plan_id)
        refuse_partial_plan(plan_id, ((sb.sandbox_id, _label(sb), sb.status) for sb in tracked))
        sandboxes = [sb for sb in tracked if sb.status.can_commit]
        if not sandboxes:
            return []
        return sandboxes, previous.attempt + 1 if previous is not None else 1

    def recover(self, plan_id: str, journal: CommitJournal | None = None) -> JournalState | None:
        """Finish an interrupted ``commit_all`` or ``commit_plan`` of ``plan_id`` (cases 20 and 22).

        A two-phase journal is recovered by :meth:`TwoPhasePlanCommit.recover` (before its
        decision every participant is aborted, after it the apply rolls forward).

        Sandboxes named in the journal are taken from tracking or reopened from the store.
        Ends in all-committed or all-compensated. Compensations that failed earlier are retried
        (case 21); while one still fails for a cause that may go away, the journal stays open
        (phase ``compensating``, reason ``CompensationFailed``) and a later call retries again.
        Idempotent: a terminal journal is returned unchanged.

        Returns:
            The journal state, or ``None`` when the plan has no journal.

        Raises:
            ValueError: ``"plan_id cannot be empty"``.
            SandboxError: the journal could not be read or written.
        """
        require_non_empty("plan_id", plan_id)
        journal = journal if journal is not None else self.journal_for(plan_id)
        with self._plan_lock(plan_id):
            coordinator = TwoPhasePlanCommit(
                journal, on_change=self._persist, fault_hook=self._fault_hook
            )
            state = coordinator.recover(
                lambda step: self._sandbox_for_step(plan_id, step.sandbox_id)
            )
            for step in state.steps if state is not None else []:
                # The lock of a process that died in the attempt (a live hold is kept).
                with contextlib.suppress(Exception):
                    clear_if_free(local_original(self._sandbox_for_step(plan_id, step.sandbox_id)))
            return state

    def journal_for(self, plan_id: str) -> CommitJournal:
        """The default journal of ``plan_id``: a file in the store, else one kept in memory."""
        if self._store is not None:
            return FileCommitJournal(state_dir_journal_path(self._store.state_dir, plan_id))
        with self._lock:
            return self._memory_journals.setdefault(plan_id, MemoryCommitJournal())

    def rollback_all(self, plan_id: str) -> None:
        """Roll back every ACTIVE sandbox of the plan; one failure does not stop the others.

        An unfinished commit attempt of the plan (the process died in it) is recovered first
        (:meth:`recover`), and each sandbox finishes or undoes its own interrupted commit
        before it is rolled back, so no original is left half-committed.

        Raises:
            ValueError: ``"plan_id cannot be empty"``.
        """
        require_non_empty("plan_id", plan_id)
        with self._plan_lock(plan_id):
            self._finish_open_attempt(plan_id)
            for sandbox in self.list_sandboxes(plan_id):
                if sandbox.status is not SandboxStatus.ACTIVE:
                    continue
                try:
                    sandbox.rollback()
                except Exception:  # seed 000: a single failure does not abort the others
                    logger.exception("rollback of sandbox %s failed", sandbox.sandbox_id)
                self._persist(sandbox)

    def cleanup_all(self, plan_id: str) -> None:
        """Clean up every sandbox of the plan and stop tracking the plan (failures contained).

        An unfinished commit attempt is recovered first, as in :meth:`rollback_all`, and each
        sandbox finishes or undoes its own interrupted commit before it is removed.
        Nothing is left behind: the plan's checkpoints (records, snapshots
        and git refs, in :attr:`checkpoints`, deleted before the sandboxes so that a git ref is
        removed while its worktree still exists), each sandbox's artefacts and store record, and
        the plan's finished commit journal once no record of the plan is left. A journal that
        still owes a compensation is kept (see :func:`drop_finished_journal`). Idempotent.

        Raises:
            ValueError: ``"plan_id cannot be empty"``.
        """
        require_non_empty("plan_id", plan_id)
        with self._plan_lock(plan_id):
            self._finish_open_attempt(plan_id)
            sandboxes = self.list_sandboxes(plan_id)
            try:
                self.checkpoints.delete_plan_checkpoints(
                    plan_id, [sandbox.sandbox_id for sandbox in sandboxes]
                )
            except Exception:  # seed 000: cleanup failures are contained
                logger.exception("cannot delete the checkpoints of plan %s", plan_id)
            cleaned = [self._cleanup_one(sandbox) for sandbox in sandboxes]
            with self._lock:
                self._sandboxes.pop(plan_id, None)
            if all(cleaned):
                self._forget_journal(plan_id)

    def cleanup_abandoned(self) -> int:
        """Clean up COMMITTED, ROLLED_BACK and ERRORED sandboxes of every plan (seed 000).

        A sandbox whose cleanup fails stays tracked; a plan with no sandbox left is untracked.

        Returns:
            The number of sandboxes cleaned up.
        """
        cleaned = 0
        for plan_id in self.plan_ids():
            with self._plan_lock(plan_id):
                with self._lock:
                    tracked = dict(self._sandboxes.get(plan_id, {}))
                for resource_id, sandbox in tracked.items():
                    if not sandbox.status.is_terminal or not self._cleanup_one(sandbox):
                        continue
                    cleaned += 1
                    with self._lock:
                        self._sandboxes.get(plan_id, {}).pop(resource_id, None)
                with self._lock:
                    if not self._sandboxes.get(plan_id, True):
                        self._sandboxes.pop(plan_id, None)
        return cleaned

    # -- boundary algebra -------------------------------------------------------------------

    def resolve_sandbox_key(self, resource: Any, resource_registry: ResourceLookup) -> str:
        """The ``resource_id`` of the boundary governing ``resource`` (seed 002, cached).

        See :mod:`sandbox_core.boundary`: the top-most ancestor naming a sandbox strategy.

        Raises:
            ValueError: a broken parent chain, or no strategy anywhere on the chain.
        """
        resource_id = str(resource.resource_id)
        with self._lock:
            cached = self._boundary_cache.get(resource_id)
        if cached is not None:
            return cached
        key = str(resolve_boundary(resource, resource_registry).resource_id)
        with self._lock:
            self._boundary_cache[resource_id] = key
        return key

    def get_or_create_sandbox_for_resource(
        self, plan_id: str, resource: Any, resource_registry: ResourceLookup
    ) -> Any:
        """The sandbox of ``resource``'s boundary: resources sharing a boundary share a sandbox.

        Raises:
            ValueError: as :meth:`resolve_sandbox_key` and :meth:`get_or_create_sandbox`.
            SandboxCreationError: the boundary's sandbox could not be created.
        """
        key = self.resolve_sandbox_key(resource, resource_registry)
        boundary = resource if str(resource.resource_id) == key else resource_registry.get(key)
        if boundary is None:
            raise ValueError(f"boundary resource {key} is not registered")
        options = dict(getattr(boundary, "sandbox_options", None) or {})
        return self.get_or_create_sandbox(
            plan_id,
            key,
            resource_location(boundary),
            resource_strategy(boundary) or "",
            **options,
        )

    def clear_boundary_cache(self) -> None:
        """Forget cached boundary keys (call when the resource graph changes)."""
        with self._lock:
            self._boundary_cache.clear()

    # -- persistence ------------------------------------------------------------------------

    def reopen_plan(self, plan_id: str) -> list[Any]:
        """Track the plan's live sandboxes recorded in the store (after a process restart).

        For each resource the newest record wins; CLEANED_UP records are skipped; a sandbox
        already tracked is kept.

        Returns:
            The plan's tracked sandboxes.

        Raises:
            ValueError: ``"plan_id cannot be empty"``.
            SandboxError: the manager has no store, or a record cannot be reopened.
        """
        require_non_empty("plan_id", plan_id)
        store = self._require_store()
        with self._plan_lock(plan_id):
            newest: dict[str, dict[str, Any]] = {}
            for record in store.records(plan_id):
                newest[str(record["resource_id"])] = record
            for resource_id, record in newest.items():
                if record.get("status") == SandboxStatus.CLEANED_UP.value:
                    continue
                if self.get_sandbox(plan_id, resource_id) is not None:
                    continue
                sandbox = self._host.reopen(str(record["sandbox_id"]), record)
                with self._lock:
                    self._sandboxes.setdefault(plan_id, {})[resource_id] = sandbox
            return self.list_sandboxes(plan_id)

    def persist(self, plan_id: str) -> None:
        """Save every tracked sandbox of the plan to the store (e.g. after ``get_path`` calls).

        Raises:
            SandboxError: the manager has no store, or a record cannot be written.
        """
        store = self._require_store()
        for sandbox in self.list_sandboxes(plan_id):
            if hasattr(sandbox, "to_record"):
                store.save(sandbox)

    # -- exit --------------------------------------------------------------------------------

    def close(self) -> None:
        """Unregister the atexit handler (the sandboxes are left as they are)."""
        if self._exit_handler is not None:
            atexit.unregister(self._exit_handler)
            self._exit_handler = None

    def _atexit_cleanup(self) -> None:
        """Clean up every tracked sandbox; never raises (seed 000, "Graceful process exit")."""
        try:
            for plan_id in self.plan_ids():
                try:
                    self.cleanup_all(plan_id)
                except Exception:  # an exit handler must not raise
                    logger.exception("exit cleanup of plan %s failed", plan_id)
        except Exception:  # an exit handler must not raise
            logger.exception("exit cleanup failed")

    # -- internals ---------------------------------------------------------------------------

    def _plan_lock(self, plan_id: str) -> threading.RLock:
        with self._lock:
            lock = self._plan_locks.get(plan_id)
            if lock is None:
                lock = self._plan_locks[plan_id] = threading.RLock()
            return lock

    def _persist(self, sandbox: Any) -> None:
        """Save ``sandbox`` when there is a store (errors logged: the journal is the truth)."""
        if self._store is None or not hasattr(sandbox, "to_record"):
            return
        try:
            if sandbox.status is SandboxStatus.CLEANED_UP:
                self._store.delete(sandbox.sandbox_id)
            else:
                self._store.save(sandbox)
        except SandboxError:
            logger.exception("cannot persist sandbox %s", sandbox.sandbox_id)

    def _finish_open_attempt(self, plan_id: str) -> None:
        """Before a rollback or a cleanup of the plan: recover an unfinished commit attempt
        (:meth:`recover`: a saga is compensated or rolled forward, a two-phase attempt aborted
        before its decision and rolled forward after it), so the plan ends all or nothing
        before its sandboxes are rolled back or removed. A recovery that fails is logged
        (seed 000: rollback and cleanup failures are contained); each sandbox still finishes
        its own interrupted commit first (``BaseSandbox.finish_interrupted``)."""
        try:
            state = self.journal_for(plan_id).load()
            if state is not None and not state.phase.is_terminal:
                self.recover(plan_id)
        except Exception:  # seed 000: contained; the journal is kept for a later recover
            logger.exception("recovery of the unfinished commit of plan %s failed", plan_id)
        for sandbox in self.list_sandboxes(plan_id):
            clear_if_free(local_original(sandbox))  # the lock of a process that died in it

    def _cleanup_one(self, sandbox: Any) -> bool:
        try:
            sandbox.cleanup()
        except Exception:  # seed 000: cleanup failures are contained
            logger.exception("cleanup of sandbox %s failed", sandbox.sandbox_id)
            return False
        self._persist(sandbox)
        clear_if_free(local_original(sandbox), sandbox.sandbox_id)
        return True

    def _discard_replaced(self, sandbox: Any) -> None:
        if sandbox.status is not SandboxStatus.CLEANED_UP:
            self._cleanup_one(sandbox)

    def _sandbox_for_step(self, plan_id: str, sandbox_id: str) -> Any:
        tracked = self.find_sandbox(sandbox_id)
        if tracked is not None or self._store is None:
            return tracked
        try:
            sandbox = self._host.reopen(sandbox_id)
        except SandboxError:
            logger.exception("cannot reopen sandbox %s of plan %s", sandbox_id, plan_id)
            return None
        with self._lock:
            self._sandboxes.setdefault(plan_id, {})[sandbox.resource_id] = sandbox
        return sandbox

    def _resolve_for_checkpoint(self, sandbox_id: str) -> Any:
        tracked = self.find_sandbox(sandbox_id)
        if tracked is not None or self._store is None:
            return tracked
        try:
            return self._host.reopen(sandbox_id)
        except SandboxError:
            return None

    def _forget_journal(self, plan_id: str) -> None:
        if self._store is not None:
            drop_finished_journal(self._store, plan_id)
            return
        with self._lock:
            journal = self._memory_journals.get(plan_id)
            state = journal.load() if journal is not None else None
            if state is None or state.phase.is_terminal:
                self._memory_journals.pop(plan_id, None)

    def _require_store(self) -> SandboxStore:
        if self._store is None:
            raise SandboxError("this SandboxManager has no store")
        return self._store


def _weak_exit_handler(manager: SandboxManager) -> Callable[[], None]:
    """An atexit callable that does not keep ``manager`` alive."""
    ref = weakref.ref(manager)

    def handler() -> None:
        target = ref()
        if target is not None:
            target._atexit_cleanup()

    return handler


def state_dir_journal_path(state_dir: Path, plan_id: str) -> Path:
    """Where the default file journal of ``plan_id`` lives under ``state_dir``."""
    return state_dir / "journals" / f"{quote(plan_id, safe='')}.json"


def drop_finished_journal(store: SandboxStore, plan_id: str) -> bool:
    """Delete the plan's file journal once the plan has no sandbox record left (hygiene).

    A journal that is not terminal (an interrupted attempt, or a compensation still owed) is
    kept, with a warning: it is the only record of what must still be undone.

    Returns:
        True when no journal is left for the plan.

    Raises:
        SandboxError: the journal is unreadable.
    """
    if store.records(plan_id):
        return False
    journal = FileCommitJournal(state_dir_journal_path(store.state_dir, plan_id))
    state = journal.load()
    if state is not None and not state.phase.is_terminal:
        logger.warning(
            "plan %s: keeping its commit journal (%s, %s): run recover",
            plan_id,
            state.phase.value,
            state.reason.value,
        )
        return False
    journal.path.unlink(missing_ok=True)
    return True


def _select(
    plan_id: str, sandboxes: list[Any], sandbox_ids: Collection[str]
) -> tuple[list[Any], list[Any]]:
    """(the named sandboxes, the others) of ``sandboxes``.

    Raises:
        ValueError: an id is not among them, or none is named.
    """
    wanted = set(sandbox_ids)
    known = {sandbox.sandbox_id for sandbox in sandboxes}
    unknown = sorted(wanted - known)
    if unknown or not wanted:
        raise ValueError(
            f"plan {plan_id}: commit names {', '.join(unknown) or 'no sandbox'}; name one or "
            f"more of its open sandboxes: {', '.join(sorted(known))}"
        )
    chosen = [sandbox for sandbox in sandboxes if sandbox.sandbox_id in wanted]
    return chosen, [sandbox for sandbox in sandboxes if sandbox.sandbox_id not in wanted]


def _label(sandbox: Any) -> str:
    """How a sandbox is named in messages: its resource id, else its id."""
    return str(getattr(sandbox, "resource_id", "") or sandbox.sandbox_id)
