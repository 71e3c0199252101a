"""Local executor: the core runs in the operator's process on paths it can reach.

For development, the local demo and the real-API-server test tier (DESIGN.md). Records live in a
:class:`~sandbox_core.SandboxStore` under ``settings.state_dir`` and are mirrored into
``status.coreRecord``, so a restarted operator re-opens sandboxes from either.

Idempotent provisioning (case 18): the core sandbox id is derived from the object's uid and the
core's :meth:`SandboxHost.provision <sandbox_core.host.host.SandboxHost.provision>` saves a
``pending`` record *before* any on-disk work. A retry that finds a complete record re-opens it;
one that finds a ``pending`` record (the first attempt died mid-create) cleans up what that
attempt may have left and creates again under the same id.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from datetime import UTC
from pathlib import Path
from typing import Any

from sandbox_core import (
    BaseSandbox,
    CommitResult,
    ForkSource,
    SandboxError,
    SandboxFactory,
    SandboxForkError,
    SandboxStateError,
    SandboxStatus,
    SandboxStore,
    dsn_secrets,
)
from sandbox_core.actor.checks import local_check_runner
from sandbox_core.actor.local import LocalActor
from sandbox_core.host.checkpoint import KIND_KEY, CheckpointManager, SandboxCheckpoint
from sandbox_core.host.host import SandboxHost
from sandbox_core.plan.validation import Check, CheckOutcome
from sandbox_core.protocol import ChangeSummary, PreparedCommit
from sandbox_operator.errors import FaultInjected
from sandbox_operator.executors.base import CheckpointInfo, SandboxState, SandboxTarget
from sandbox_operator.settings import Settings

logger = logging.getLogger("sandbox_operator.executors.local")

# Core checkpoint kinds (sandbox_core.host.checkpoint) -> Checkpoint.status.kind (CRD contract).
CHECKPOINT_KINDS = {
    "git_ref": "git-tag",
    "overlay_snapshot": "upper-snapshot",
    "directory": "directory-snapshot",
}
CHECKPOINT_UID_KEY = "k8s_checkpoint_uid"


def core_options(target: SandboxTarget, settings: Settings) -> dict[str, Any]:
    """Strategy options passed to the core for ``target`` (JSON-serialisable)."""
    options: dict[str, Any] = {"sandbox_root": str(settings.sandbox_root)}
    if target.strategy == "overlay" and target.options.overlay_mode != "auto":
        options["mode"] = target.options.overlay_mode
    return options


class FaultingSandbox:
    """Wraps a core sandbox so the settings' fault hooks can fail its commit or rollback.

    It is the local executor's handle: the saga drives ``commit``/``rollback``, the two-phase
    coordinator ``review``/``prepare``/``apply_prepared``/``abort_prepared``/``prepares_durably``,
    all the wrapped ``BaseSandbox``'s; ``fault_fail_commit`` also fails ``prepare``.

        Test-only fault injection (mocks are used only to inject faults); a pass-through when
        the resource id is not named in ``fault_fail_commit`` / ``fault_fail_rollback``.
    """

    def __init__(self, sandbox: BaseSandbox, settings: Settings) -> None:
        self.inner = sandbox
        self._settings = settings

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def sandbox_id(self) -> str:
        """The wrapped sandbox's id."""
        return self.inner.sandbox_id

    @property
    def status(self) -> SandboxStatus:
        """The wrapped sandbox's status."""
        return self.inner.status

    @property
    def rollbackable(self) -> bool:
        """The wrapped sandbox's ``rollbackable``."""
        return self.inner.rollbackable

    def commit(self, message: str | None = None) -> CommitResult:
        """Commit, unless a fault is injected for this resource."""
        if self._settings.fault_commit_delay_seconds:
            time.sleep(self._settings.fault_commit_delay_seconds)  # test-only slow commit
        if self.inner.resource_id in self._settings.fault_fail_commit:
            raise FaultInjected(f"injected commit failure for resource {self.inner.resource_id}")
        return self.inner.commit(message)

    @property
    def prepares_durably(self) -> bool:
        """The wrapped sandbox's ``prepares_durably`` (SQLite is a last resource)."""
        return bool(getattr(self.inner, "prepares_durably", True))

    def review(self) -> ChangeSummary:
        """The wrapped sandbox's change summary, for the plan's review."""
        return self.inner.review()

    def prepare(self, txid: str, message: str | None = None) -> PreparedCommit:
        """Prepare the two-phase commit, unless a commit fault is injected for this resource
        (the injected failure happens before anything is staged)."""
        if self._settings.fault_commit_delay_seconds:
            time.sleep(self._settings.fault_commit_delay_seconds)  # test-only slow prepare
        if self.inner.resource_id in self._settings.fault_fail_commit:
            raise FaultInjected(f"injected commit failure for resource {self.inner.resource_id}")
        return self.inner.prepare(txid, message)

    def apply_prepared(self, txid: str) -> CommitResult:
        """Apply what :meth:`prepare` staged under ``txid`` (idempotent)."""
        return self.inner.apply_prepared(txid)

    def abort_prepared(self, txid: str) -> None:
        """Drop what :meth:`prepare` staged under ``txid`` (idempotent)."""
        self.inner.abort_prepared(txid)

    def rollback(self) -> None:
        """Roll back, unless a fault is injected for this resource."""
        if self.inner.resource_id in self._settings.fault_fail_rollback:
            raise FaultInjected(f"injected rollback failure for resource {self.inner.resource_id}")
        self.inner.rollback()


class LocalExecutor:
    """Executor running ``sandbox_core`` in-process. Thread-safe per sandbox id."""

    kind = "local"

    def __init__(self, settings: Settings, factory: SandboxFactory | None = None) -> None:
        self.settings = settings
        self.factory = factory or SandboxFactory()
        self.store = SandboxStore(settings.state_dir)
        # A lock lives while a caller holds it (weak values): none is kept per idle sandbox.
        self._locks: weakref.WeakValueDictionary[str, threading.RLock] = (
            weakref.WeakValueDictionary()
        )
        self._locks_guard = threading.Lock()
        self._checkpoints: CheckpointManager | None = None

    # -- helpers ------------------------------------------------------------------------------

    def _lock(self, sandbox_id: str) -> threading.RLock:
        """The lock of ``sandbox_id``: the same object for every caller while any holds it."""
        with self._locks_guard:
            lock = self._locks.get(sandbox_id)
            if lock is None:
                lock = threading.RLock()
                self._locks[sandbox_id] = lock
            return lock

    def _record(self, target: SandboxTarget) -> dict[str, Any] | None:
        try:
            return self.store.load(target.sandbox_id)
        except SandboxError:
            record = target.core_record
            if record and record.get("sandbox_id") == target.sandbox_id:
                # status.coreRecord holds a redacted DSN: the resolved original
                # (read from the Secret again) is what the core must reconnect with.
                restored = dict(record)
                restored["original_path"] = target.original
                if isinstance(restored.get("context"), dict):
                    restored["context"] = {**restored["context"], "original_path": target.original}
                return restored
            return None

    def _state(self, sandbox: BaseSandbox) -> SandboxState:
        return SandboxState.from_record(sandbox.to_record())

    def _host(self, target: SandboxTarget) -> SandboxHost:
        """The core's create-or-reopen over this executor's store, reopening with ``target``'s
        database credentials."""
        return SandboxHost(
            self.store, self.factory, reopen=lambda record: self._credentials(record, target)
        )

    def _credentials(self, record: dict[str, Any], target: SandboxTarget) -> BaseSandbox:
        sandbox = self.factory.reopen(record)
        # The core stores DSNs redacted: the password comes from the Secret again.
        use_credentials = getattr(sandbox, "use_credentials", None)
        if use_credentials is not None and dsn_secrets(target.original):
            use_credentials(target.original)
        return sandbox

    def _reopen(self, target: SandboxTarget) -> BaseSandbox | None:
        record = self._record(target)
        return None if record is None else self._credentials(record, target)

    def _slow_create(self, sandbox: BaseSandbox) -> None:
        # Test-only fault injection (case 16): a slow create the user deletes.
        time.sleep(self.settings.fault_provision_delay_seconds)

    # -- Executor -----------------------------------------------------------------------------

    def provision(self, target: SandboxTarget) -> SandboxState:
        """Create and activate, or re-open what an earlier attempt made (case 18): the core's
        :meth:`SandboxHost.provision <sandbox_core.host.host.SandboxHost.provision>`, with the
        record from the store or else from ``status.coreRecord``.

        Raises:
            SandboxCreationError: the source is missing or unusable (permanent).
            SandboxError: the record or an artefact could not be written.
        """
        with self._lock(target.sandbox_id):
            record = self._record(target)
            sandbox = self._host(target).provision(
                target.plan_id,
                target.resource_id,
                target.original,
                target.strategy,
                sandbox_id=target.sandbox_id,
                record=record,
                activate=True,
                fork=self._fork_source(target) if record is None else None,
                after_create=self._slow_create
                if self.settings.fault_provision_delay_seconds
                else None,
                **core_options(target, self.settings),
            )
            return self._state(sandbox)

    def _fork_source(self, target: SandboxTarget) -> ForkSource | None:
        """The core's start of a fork (docs/forks.md): the checkpoint named by ``target.fork``,
        which must be one of the parent's (its sandbox id derived from the parent's uid).

        Raises:
            SandboxForkError: no such checkpoint here, or it is another sandbox's.
        """
        if target.fork is None:
            return None
        manager = self._checkpoint_manager()
        checkpoint = manager.get_checkpoint(target.fork.checkpoint_id)
        if checkpoint is None or checkpoint.sandbox_id != target.fork.parent_sandbox_id:
            raise SandboxForkError(
                f"checkpoint {target.fork.checkpoint_id} of sandbox "
                f"{target.fork.parent_sandbox_id} is not kept by this operator"
            )
        return manager.fork_source(checkpoint)

    def run_check(self, target: SandboxTarget, check: Check) -> CheckOutcome:
        """The local door's run of ``check`` in ``target``'s sandbox (jailed, audited, killed at
        its timeout; :func:`sandbox_core.actor.checks.local_check_runner`)."""
        runner = local_check_runner(LocalActor(self.settings.state_dir, host=self._host(target)))
        return runner(dataclasses.replace(check, sandbox_id=target.sandbox_id))

    def describe(self, target: SandboxTarget) -> SandboxState | None:
        """The stored state of ``target``'s sandbox, or None."""
        record = self._record(target)
        return None if record is None else SandboxState.from_record(record)

    def open(self, target: SandboxTarget) -> FaultingSandbox:
        """Re-open ``target`` for the saga.

        Raises:
            SandboxError: there is no record of it.
        """
        sandbox = self._reopen(target)
        if sandbox is None:
            raise SandboxError(f"sandbox {target.sandbox_id} ({target.name}) was never created")
        return FaultingSandbox(sandbox, self.settings)

    def persist(self, target: SandboxTarget, handle: Any) -> SandboxState:
        """Save the (possibly wrapped) sandbox's record."""
        sandbox = handle.inner if isinstance(handle, FaultingSandbox) else handle
        with self._lock(target.sandbox_id):
            self.store.save(sandbox)
        return self._state(sandbox)

    def rollback(self, target: SandboxTarget, reactivate: bool = True) -> SandboxState:
        """Discard all changes; re-activate for reuse when ``reactivate`` (rollbackRequest).

        Raises:
            SandboxStateError: the sandbox is not ACTIVE.
            SandboxRollbackError: the rollback failed.
        """
        with self._lock(target.sandbox_id):
            handle = self.open(target)
            if not handle.status.is_open:
                # Undoing one committed sandbox would break its plan's atomic commit.
                raise SandboxStateError(
                    f"cannot discard the changes of sandbox {target.sandbox_id} in status "
                    f"{handle.status.value}"
                )
            if handle.status is SandboxStatus.CREATED:
                handle.inner.activate()
            if handle.status is SandboxStatus.ACTIVE:
                try:
                    handle.rollback()
                finally:
                    self.store.save(handle.inner)
            if reactivate and handle.status is SandboxStatus.ROLLED_BACK:
                handle.inner.activate()
                self.store.save(handle.inner)
            return self._state(handle.inner)

    def cleanup(self, target: SandboxTarget) -> None:
        """Remove all artefacts and the record; nothing made is fine.

        Never waits for the Secret of a ``secretRef`` source: when it now names another
        database than the record's original (the user pointed it elsewhere), the sandbox is
        reopened from the record alone, without credentials, and cleaned up; releasing a
        PostgreSQL prepared transaction it left is then best effort (logged by the core), as
        when the Secret is gone.
        """
        with self._lock(target.sandbox_id):
            record = self._record(target)
            if record is None:
                return
            try:
                sandbox = self._credentials(record, target)
            except ValueError as exc:  # use_credentials: another database than the original
                logger.warning(
                    "sandbox %s: cleaning up without the source's credentials: %s",
                    target.sandbox_id,
                    exc,
                )
                sandbox = self.factory.reopen(record)
            sandbox.cleanup()
            self.store.delete(target.sandbox_id)

    # -- checkpoints (seed 004) ----------------------------------------------------------------

    def _resolve_by_id(self, sandbox_id: str) -> BaseSandbox | None:
        try:
            return self.factory.reopen(self.store.load(sandbox_id))
        except SandboxError:
            return None

    def _checkpoint_manager(self) -> CheckpointManager:
        # Records and snapshots live under the state dir, so a restarted operator restores and
        # deletes checkpoints made by its predecessor.
        if self._checkpoints is None:
            self._checkpoints = CheckpointManager(
                state_dir=self.settings.state_dir, sandbox_resolver=self._resolve_by_id
            )
        return self._checkpoints

    @staticmethod
    def _info(checkpoint: SandboxCheckpoint) -> CheckpointInfo:
        kind = checkpoint.metadata.get(KIND_KEY)
        return CheckpointInfo(
            checkpoint_id=checkpoint.checkpoint_id,
            sandbox_id=checkpoint.sandbox_id,
            snapshot_location=checkpoint.snapshot_path or checkpoint.metadata.get("commit", ""),
            kind=CHECKPOINT_KINDS.get(kind or "", "metadata-only"),
            created_at=checkpoint.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            extra=checkpoint.model_dump(mode="json"),
        )

    def create_checkpoint(
        self, target: SandboxTarget, phase: str, metadata: dict[str, str], uid: str = ""
    ) -> CheckpointInfo:
        """Snapshot ``target`` through the core's CheckpointManager.

        ``uid`` (the Checkpoint object's) is recorded in the checkpoint metadata; a retry finds
        the snapshot its first attempt made instead of taking a second one (case 18).

        Raises:
            SandboxError: the sandbox was never created, or the snapshot failed.
        """
        manager = self._checkpoint_manager()
        with self._lock(target.sandbox_id):
            if uid:
                for existing in manager.list_checkpoints(target.sandbox_id):
                    if existing.metadata.get(CHECKPOINT_UID_KEY) == uid:
                        return self._info(existing)
            sandbox = self.open(target).inner
            values = dict(metadata)
            if uid:
                values[CHECKPOINT_UID_KEY] = uid
            checkpoint = manager.create_checkpoint(sandbox, target.plan_id, phase, values)
        return self._info(checkpoint)

    def restore_checkpoint(self, target: SandboxTarget, checkpoint: CheckpointInfo) -> SandboxState:
        """Restore ``target`` to ``checkpoint``.

        Raises:
            SandboxError: the core reported that the restore did not happen.
        """
        manager = self._checkpoint_manager()
        with self._lock(target.sandbox_id):
            model = manager.get_checkpoint(checkpoint.checkpoint_id)
            if model is None:
                model = SandboxCheckpoint.model_validate(checkpoint.extra)
            self._check_own_checkpoint(target, model)
            if not manager.rollback_to(model):
                raise SandboxError(
                    f"restore of sandbox {target.sandbox_id} to checkpoint "
                    f"{checkpoint.checkpoint_id} failed"
                )
            sandbox = self.open(target).inner
            if sandbox.status.can_activate:
                sandbox.activate()
            self.store.save(sandbox)
            return self._state(sandbox)

    def _check_own_checkpoint(self, target: SandboxTarget, model: SandboxCheckpoint) -> None:
        """Refuse a checkpoint that is not ``target``'s own: another sandbox's id, a
        ``sandbox_path`` other than the sandbox's, or a snapshot outside this executor's
        checkpoint directory. The Checkpoint object's status and spec metadata are input a
        writer could forge; a restore swaps the directory they name.

        Raises:
            SandboxError: the checkpoint is refused (nothing was changed).
        """
        record = self._record(target) or {}
        own_path = str((record.get("context") or {}).get("sandbox_path") or "")
        named = str(model.metadata.get("sandbox_path") or "")
        snapshot = Path(model.snapshot_path).resolve() if model.snapshot_path else None
        store = (Path(self.settings.state_dir) / "checkpoints").resolve()
        if (
            model.sandbox_id != target.sandbox_id
            or (named and named != own_path)
            or (snapshot is not None and not snapshot.is_relative_to(store))
        ):
            raise SandboxError(
                f"checkpoint {model.checkpoint_id} is not a checkpoint of sandbox "
                f"{target.sandbox_id}; nothing was restored"
            )

    def delete_checkpoint(self, checkpoint: CheckpointInfo) -> None:
        """Delete the snapshot (or git ref); an unknown id is fine (idempotent).

        With the Checkpoint object's uid (``checkpoint.extra["uid"]``) the snapshots are found
        by the uid recorded when they were taken, not by the status's id: a status that lost the
        id still deletes its snapshot, and an id naming another Checkpoint's snapshot is kept
        (logged), never deleted.
        """
        manager = self._checkpoint_manager()
        uid = str(checkpoint.extra.get("uid") or "")
        doomed = {checkpoint.checkpoint_id} - {""}
        if uid:
            named = manager.get_checkpoint(checkpoint.checkpoint_id)
            if named is not None and named.metadata.get(CHECKPOINT_UID_KEY, uid) != uid:
                logger.warning(
                    "checkpoint %s was taken for another Checkpoint object; kept",
                    checkpoint.checkpoint_id,
                )
                doomed.clear()
            doomed |= {
                cp.checkpoint_id
                for cp in manager.all_checkpoints()
                if cp.metadata.get(CHECKPOINT_UID_KEY) == uid
            }
        for checkpoint_id in sorted(doomed):
            manager.delete_checkpoint(checkpoint_id)

    # -- suspend -------------------------------------------------------------------------------

    def renew_token(self, target: SandboxTarget) -> None:
        """No workspace agent, no token: nothing to renew."""

    def suspend(self, target: SandboxTarget) -> None:
        """Nothing runs per sandbox in-process: the record and artefacts simply stay."""

    def resume(self, target: SandboxTarget) -> None:
        """Nothing to start again; the next provision re-opens the record."""
