"""``SandboxHost``: the one way to create or reopen a sandbox kept in a state directory.

Case 18 (idempotent provisioning), for every caller: the CLI's ``create``, the manager's lazy
creation, the workspace agent's ``POST /v1/sandboxes`` and the operator's local executor.
:meth:`SandboxHost.provision` may be called again after any crash and ends with one sandbox:

1. **Reopen.** When the id names a *complete* record (its create finished: it has a context),
   that sandbox is reopened and returned, whatever its status; nothing is created. Calling
   ``provision`` twice with one id gives the same sandbox.
2. **Clean up a half-made sandbox.** A record whose create never finished (status ``pending``,
   or ``errored`` without a context) is what an earlier attempt left when it died or failed
   between its pending record and the end of ``create``: whatever it made on disk under this
   id is removed (``BaseSandbox.cleanup_interrupted_create``: the original and other sandboxes
   are never touched) and the sandbox is created again under the same id.
3. **Create.** The sandbox is built, its ``pending`` record saved *before* any on-disk work,
   then ``create(plan_id)`` runs (and ``activate()`` when asked), then the complete record is
   saved: one write for create and activate. A crash anywhere in between leaves the pending
   record, which step 2 of the next call cleans up.

A ``create`` that fails (:class:`~sandbox_core.errors.SandboxError`: the strategy undid its
partial work) is cleaned up and its record deleted before the error propagates, so nothing of
it is left; when that cleanup fails too, the record is kept for the next call (step 2). Any
other exception (an interrupted process) leaves the pending record as it is. An ``activate``
that fails saves the created sandbox first: the next call reopens and activates it.

:meth:`SandboxHost.reopen` rebuilds a sandbox from its record by id. Without a store (an
in-memory manager) nothing is recorded and ``provision`` only creates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sandbox_core.errors import SandboxError
from sandbox_core.host.store import SandboxStore
from sandbox_core.plan.participants import TwoPhaseParticipant
from sandbox_core.protocol import ForkSource
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.factory import SandboxFactory

__all__ = ["SandboxHost", "is_half_made"]

logger = logging.getLogger(__name__)

Reopener = Callable[[dict[str, Any]], BaseSandbox]
"""Rebuilds a sandbox from its record (``SandboxFactory.reopen`` plus what the caller adds, such
as a database password from its secret environment)."""
Saver = Callable[[BaseSandbox], None]
"""Makes a sandbox's record durable (``SandboxStore.save`` plus what the caller adds)."""


def is_half_made(record: dict[str, Any]) -> bool:
    """Whether ``record`` is of a sandbox whose ``create`` never finished (no context yet:
    status ``pending``, or ``errored`` by a create whose cleanup failed)."""
    unfinished = (SandboxStatus.PENDING.value, SandboxStatus.ERRORED.value)
    return record.get("status") in unfinished and not record.get("context")


def _as_participant(sandbox: BaseSandbox) -> TwoPhaseParticipant:
    """``sandbox`` typed as a plan participant: mypy checks that every sandbox this host keeps
    is one (the plan itself never names a sandbox class)."""
    return sandbox


class SandboxHost:
    """Creates and reopens sandboxes whose records live in ``store``.

    Args:
        store: where records live; ``None`` keeps none (``provision`` then only creates).
        factory: builds sandboxes by strategy name; default :class:`SandboxFactory`.
        reopen: rebuilds a sandbox from its record; default ``factory.reopen``.
        save: makes a record durable; default ``store.save`` (the workspace agent also counts
            a revision per save).
    """

    def __init__(
        self,
        store: SandboxStore | None,
        factory: SandboxFactory | None = None,
        *,
        reopen: Reopener | None = None,
        save: Saver | None = None,
    ) -> None:
        self.store = store
        self.factory = factory or SandboxFactory()
        self._reopen = reopen or self.factory.reopen
        self._save = save

    # -- records -----------------------------------------------------------------------------

    def record(self, sandbox_id: str) -> dict[str, Any] | None:
        """The stored record of ``sandbox_id``, or ``None`` (no store, or no such record).

        Raises:
            SandboxError: the record exists but cannot be read.
        """
        return None if self.store is None else self.store.find(sandbox_id)

    def reopen(self, sandbox_id: str, record: dict[str, Any] | None = None) -> BaseSandbox:
        """The sandbox ``sandbox_id``, rebuilt from ``record`` or else its stored record.

        Raises:
            SandboxError: there is no record of it, or the record cannot be reopened.
        """
        found = record if record is not None else self.record(sandbox_id)
        if found is None:
            where = self.store.state_dir if self.store is not None else "memory"
            raise SandboxError(f"no sandbox with id {sandbox_id} in {where}")
        return self._reopen(found)

    def save(self, sandbox: BaseSandbox) -> None:
        """Make ``sandbox``'s record durable (nothing without a store).

        Raises:
            SandboxError: the record could not be written.
        """
        if self._save is not None:
            self._save(sandbox)
        elif self.store is not None:
            self.store.save(sandbox)

    def forget(self, sandbox_id: str) -> None:
        """Delete the record of ``sandbox_id`` (nothing when there is none)."""
        if self.store is not None:
            self.store.delete(sandbox_id)

    # -- provision ---------------------------------------------------------------------------

    def provision(
        self,
        plan_id: str,
        resource_id: str,
        original_path: str,
        strategy: str,
        *,
        sandbox_id: str | None = None,
        record: dict[str, Any] | None = None,
        activate: bool = False,
        after_create: Callable[[BaseSandbox], None] | None = None,
        fork: ForkSource | None = None,
        **options: Any,
    ) -> BaseSandbox:
        """Create the sandbox, or reopen the one an earlier call made (module docstring).

        Args:
            plan_id / resource_id / original_path / strategy: what to sandbox, for which plan.
            sandbox_id: the id to create under (a retry passes the same one); default a new ULID.
            record: the sandbox's record when the caller already has it (the operator keeps a
                copy in the Sandbox's status); default the store's record of ``sandbox_id``.
            activate: also make it ACTIVE (a reopened CREATED or ROLLED_BACK sandbox too).
            after_create: called right after a successful ``create``, before the complete
                record is saved (test-only fault injection: a slow create).
            fork: start the new sandbox from this checkpoint of another sandbox
                (:meth:`BaseSandbox.start_from`, docs/forks.md); a refusal discards it like
                a failed create.
            **options: strategy options (``sandbox_root``, ``mode``, ...).

        Returns:
            The sandbox: CREATED (ACTIVE with ``activate``), or a reopened one in its status.

        Raises:
            ValueError: an unknown strategy, or an empty ``plan_id``, ``resource_id`` or
                ``original_path``.
            SandboxCreationError: the strategy could not create it (nothing is left of it);
                ``SandboxForkError`` when it cannot start from ``fork``.
            SandboxError: a record could not be written, or a half-made sandbox could not be
                cleaned up.
        """
        if sandbox_id and record is None:
            record = self.record(sandbox_id)
        if record is not None and is_half_made(record):
            # An earlier attempt died (or failed) between its pending record and the end of its
            # create: remove what it made, then create again under the same id.
            logger.warning("sandbox %s: cleaning up an interrupted create", record["sandbox_id"])
            self._reopen(record).cleanup_interrupted_create()
            record = None
        if record is not None:
            sandbox = self._reopen(record)
            if activate and sandbox.status.can_activate:
                self._activate(sandbox)
                self.save(sandbox)
            return sandbox
        if sandbox_id:
            options["sandbox_id"] = sandbox_id
        sandbox = self.factory.create(strategy, resource_id, original_path, **options)
        self.save(sandbox)  # the pending record first: a retry finds and cleans up what follows
        try:
            sandbox.create(plan_id)
            if fork is not None:
                sandbox.start_from(fork)
        except SandboxError:
            self._discard_failed(sandbox)
            raise
        if after_create is not None:
            after_create(sandbox)
        if activate:
            self._activate(sandbox)
        self.save(sandbox)
        return sandbox

    def _activate(self, sandbox: BaseSandbox) -> None:
        """``activate()``; when it fails the created sandbox is saved (the retry activates it)."""
        try:
            sandbox.activate()
        except BaseException:
            self.save(sandbox)
            raise

    def _discard_failed(self, sandbox: BaseSandbox) -> None:
        """After a failed create: clean up and forget it, or keep its record when the cleanup
        fails too (the next ``provision`` of its id cleans up again)."""
        try:
            sandbox.cleanup()
        except SandboxError:
            logger.exception("sandbox %s: cleanup after a failed create", sandbox.sandbox_id)
            self.save(sandbox)
            return
        self.forget(sandbox.sandbox_id)
