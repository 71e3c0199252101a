"""``CheckpointManager``: snapshots of a sandbox that it can be restored to (seed 004; seed 002).

Three kinds of checkpoint, recorded in ``metadata["checkpoint_kind"]``:

- ``git_ref``: the sandbox offers ``create_checkpoint_ref(name)`` / ``restore_checkpoint_ref`` /
  ``delete_checkpoint_ref`` (git_worktree: a commit + tag, O(changed files)). ``snapshot_path``
  is empty; ``metadata["checkpoint_ref"]`` names the ref.
- ``overlay_snapshot``: the sandbox offers ``create_checkpoint_snapshot(destination)`` /
  ``restore_checkpoint_snapshot(source)`` (overlay: a copy of the upper layer).
- ``directory``: anything else with a ``context.sandbox_path`` - the directory is copied with
  :func:`~sandbox_core.tree.ops.backup_directory` (symlinks kept as links) and restored with
  :func:`~sandbox_core.tree.ops.safe_restore` (rename-based swap).

A sandbox without a context gets a metadata-only checkpoint (an empty snapshot directory, seed
004). Snapshot directories are ``<root>/sandbox-checkpoint-<id>/snapshot``; ``root`` is
``<state_dir>/checkpoints`` when a state dir is given (checkpoints are then also recorded there
as JSON and survive the process, for the CLI), else the system temp dir.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field
from ulid import ULID

from sandbox_core.durable import write_json_atomic
from sandbox_core.errors import (
    SandboxError,
    SandboxForkError,
    SandboxLockedError,
    SandboxPermissionError,
    SandboxRollbackLockedError,
)
from sandbox_core.protocol import ForkSource, SandboxContext, utc_now
from sandbox_core.strategies._directory import users_of
from sandbox_core.tree.ops import backup_directory, safe_restore

__all__ = [
    "KIND_DIRECTORY",
    "KIND_GIT_REF",
    "KIND_KEY",
    "KIND_OVERLAY",
    "SNAPSHOT_PREFIX",
    "CheckpointManager",
    "Checkpointable",
    "RefCheckpointable",
    "SandboxCheckpoint",
    "SandboxResolver",
    "SnapshotCheckpointable",
    "native_kind",
]

logger = logging.getLogger("sandbox_core.host.checkpoint")

SNAPSHOT_PREFIX = "sandbox-checkpoint-"
KIND_KEY = "checkpoint_kind"
KIND_DIRECTORY = "directory"
KIND_GIT_REF = "git_ref"
KIND_OVERLAY = "overlay_snapshot"


class SandboxCheckpoint(BaseModel):
    """An immutable checkpoint record (seed 004).

    Attributes:
        checkpoint_id: ULID.
        sandbox_id / plan_id: what was checkpointed.
        phase: the plan phase it was taken in (e.g. ``"pre_execute"``).
        snapshot_path: directory holding the snapshot (empty for ``git_ref`` checkpoints).
        created_at: UTC.
        metadata: string values only; ``sandbox_path`` and ``checkpoint_kind`` are added for
            sandboxes with a context.
    """

    model_config = ConfigDict(frozen=True)

    checkpoint_id: str = Field(default_factory=lambda: str(ULID()))
    sandbox_id: str
    plan_id: str
    phase: str
    snapshot_path: str
    created_at: datetime = Field(default_factory=utc_now)
    metadata: dict[str, str] = Field(default_factory=dict)


@runtime_checkable
class Checkpointable(Protocol):
    """What :meth:`CheckpointManager.create_checkpoint` needs from a sandbox."""

    @property
    def sandbox_id(self) -> str: ...

    @property
    def context(self) -> SandboxContext | None: ...


class RefCheckpointable(Protocol):
    """Strategy-native checkpoints as refs (git_worktree)."""

    def create_checkpoint_ref(self, name: str) -> str: ...

    def restore_checkpoint_ref(self, name: str) -> None: ...

    def delete_checkpoint_ref(self, name: str) -> None: ...


class SnapshotCheckpointable(Protocol):
    """Strategy-native checkpoints as a snapshot directory (overlay)."""

    def create_checkpoint_snapshot(self, destination: str) -> dict[str, Any]: ...

    def restore_checkpoint_snapshot(self, source: str) -> None: ...


SandboxResolver = Callable[[str], Any]
"""``sandbox_id -> sandbox or None``: finds the sandbox of a native checkpoint to restore."""


def native_kind(sandbox: Any) -> str:
    """The checkpoint kind a sandbox supports natively (looked up on its class, not mocks)."""
    cls = type(sandbox)
    if all(
        callable(getattr(cls, name, None))
        for name in ("create_checkpoint_ref", "restore_checkpoint_ref", "delete_checkpoint_ref")
    ):
        return KIND_GIT_REF
    if all(
        callable(getattr(cls, name, None))
        for name in ("create_checkpoint_snapshot", "restore_checkpoint_snapshot")
    ):
        return KIND_OVERLAY
    return KIND_DIRECTORY


class CheckpointManager:
    """Creates, lists, restores and deletes sandbox checkpoints; thread-safe (seed 004).

    Args:
        state_dir: keep snapshots and checkpoint records under ``<state_dir>/checkpoints`` so
            that another process can list and restore them.
        sandbox_resolver: finds a sandbox by id when restoring a native checkpoint of a sandbox
            this manager has not seen (another process); sandboxes passed to
            :meth:`create_checkpoint` are remembered.
    """

    def __init__(
        self,
        state_dir: str | Path | None = None,
        sandbox_resolver: SandboxResolver | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._checkpoints: dict[str, SandboxCheckpoint] = {}
        self._sandboxes: dict[str, Any] = {}
        self._resolver = sandbox_resolver
        self._state_dir = Path(state_dir) if state_dir else None
        self._root = (
            self._state_dir / "checkpoints"
            if self._state_dir
            else Path(tempfile.gettempdir()) / "sandbox-core-checkpoints"
        )
        if self._state_dir is not None:
            self._load_records()

    # -- public API ---------------------------------------------------------------------------

    def create_checkpoint(
        self,
        sandbox: Checkpointable,
        plan_id: str,
        phase: str,
        metadata: dict[str, Any] | None = None,
    ) -> SandboxCheckpoint:
        """Snapshot ``sandbox`` now.

        Args:
            metadata: extra values, converted to strings (seed 004).

        Raises:
            SandboxError: the snapshot could not be taken (nothing is recorded).
        """
        checkpoint_id = str(ULID())
        values = {str(key): str(value) for key, value in (metadata or {}).items()}
        context = sandbox.context
        kind = native_kind(sandbox) if context is not None else KIND_DIRECTORY
        if kind == KIND_GIT_REF:
            sha = sandbox.create_checkpoint_ref(checkpoint_id)  # type: ignore[attr-defined]
            snapshot_path = ""
            values.update({"checkpoint_ref": checkpoint_id, "commit": str(sha)})
        elif kind == KIND_OVERLAY:
            snapshot_path = str(self._allocate(checkpoint_id) / "snapshot")
            try:
                sandbox.create_checkpoint_snapshot(snapshot_path)  # type: ignore[attr-defined]
            except BaseException:
                self._cleanup_snapshot(snapshot_path)
                raise
        else:
            sandbox_path = context.sandbox_path if context is not None else None
            snapshot_path = self._snapshot_directory(sandbox_path, checkpoint_id)
        if context is not None:
            values.setdefault("sandbox_path", context.sandbox_path)
            values[KIND_KEY] = kind
            values.update(self._fork_facts(sandbox, context, snapshot_path))
        checkpoint = SandboxCheckpoint(
            checkpoint_id=checkpoint_id,
            sandbox_id=sandbox.sandbox_id,
            plan_id=plan_id,
            phase=phase,
            snapshot_path=snapshot_path,
            metadata=values,
        )
        with self._lock:
            self._checkpoints[checkpoint_id] = checkpoint
            self._sandboxes[sandbox.sandbox_id] = sandbox
        self._save_record(checkpoint)
        return checkpoint

    def fork_source(self, checkpoint: SandboxCheckpoint) -> ForkSource:
        """What a new sandbox needs to start from ``checkpoint`` (a fork, docs/forks.md).

        Raises:
            SandboxForkError: a metadata-only checkpoint (no snapshot, no commit).
        """
        values = checkpoint.metadata
        kind = values.get(KIND_KEY, "")
        if not kind or not values.get("original_path"):
            raise SandboxForkError(
                f"checkpoint {checkpoint.checkpoint_id} of sandbox {checkpoint.sandbox_id} "
                "holds no snapshot (taken of a sandbox without a context); nothing can start "
                "from it"
            )
        base = values.get("base_commit", "")
        return ForkSource(
            sandbox_id=checkpoint.sandbox_id,
            checkpoint_id=checkpoint.checkpoint_id,
            kind=kind,
            snapshot_path=checkpoint.snapshot_path,
            commit=values.get("commit", ""),
            parent_metadata={"base_commit": base} if base else {},
            baseline_path=values.get("baseline", ""),
        )

    def rollback_to(self, checkpoint: SandboxCheckpoint) -> bool:
        """Restore the sandbox to ``checkpoint``. Never raises for expected failures.

        Returns:
            True when restored; False when the snapshot or the sandbox is missing, the
            checkpoint lacks ``sandbox_path``, or the restore failed (logged).

        Raises:
            SandboxLockedError, SandboxPermissionError: a native git restore was refused by a
                leftover lock or for permissions (nothing changed; the caller can say what to do);
                a directory restore was refused as busy (``SandboxRollbackLockedError``: a
                process uses the sandbox, named in the message; nothing changed).
        """
        kind = checkpoint.metadata.get(KIND_KEY, KIND_DIRECTORY)
        if kind in (KIND_GIT_REF, KIND_OVERLAY):
            return self._rollback_native(checkpoint, kind)
        snapshot = checkpoint.snapshot_path
        if not snapshot or not Path(snapshot).is_dir():
            return False
        sandbox_path = checkpoint.metadata.get("sandbox_path")
        if not sandbox_path or not Path(sandbox_path).is_dir():
            return False
        # The directory is swapped whole: a process inside it would go on in a thrown-away
        # copy. Refused as busy, naming it (docs/concurrency.md, sandboxes in use).
        busy = users_of(Path(sandbox_path))
        if busy:
            raise SandboxRollbackLockedError(
                f"restore of checkpoint {checkpoint.checkpoint_id} refused: busy: "
                f"{'; '.join(busy)} uses {sandbox_path}, which the restore would replace. "
                "Nothing was changed; stop or move those processes out of it, then retry",
                refused=True,
            )
        try:
            self._restore_directory(Path(snapshot), Path(sandbox_path))
        except OSError:
            logger.exception("restore of checkpoint %s failed", checkpoint.checkpoint_id)
            return False
        return True

    def restore(self, sandbox: Checkpointable, checkpoint: SandboxCheckpoint) -> bool:
        """:meth:`rollback_to` with the sandbox given (e.g. reopened in another process).

        Returns:
            As :meth:`rollback_to`; False as well when ``sandbox`` is not the checkpoint's.
        """
        if sandbox.sandbox_id != checkpoint.sandbox_id:
            return False
        with self._lock:
            self._sandboxes[sandbox.sandbox_id] = sandbox
        return self.rollback_to(checkpoint)

    def list_checkpoints(self, sandbox_id: str) -> list[SandboxCheckpoint]:
        """Checkpoints of ``sandbox_id`` in creation order (empty when none)."""
        with self._lock:
            return [cp for cp in self._checkpoints.values() if cp.sandbox_id == sandbox_id]

    def all_checkpoints(self) -> list[SandboxCheckpoint]:
        """Every checkpoint this manager keeps, of every sandbox, in creation order."""
        with self._lock:
            return list(self._checkpoints.values())

    def get_checkpoint(self, checkpoint_id: str) -> SandboxCheckpoint | None:
        """The checkpoint with ``checkpoint_id``, or ``None``."""
        with self._lock:
            return self._checkpoints.get(checkpoint_id)

    def delete_checkpoint(self, checkpoint_id: str) -> bool:
        """Forget the checkpoint and remove its snapshot (or ref).

        Returns:
            True when it existed; False for an unknown id.
        """
        with self._lock:
            checkpoint = self._checkpoints.pop(checkpoint_id, None)
        if checkpoint is None:
            return False
        if checkpoint.metadata.get(KIND_KEY) == KIND_GIT_REF:
            sandbox = self._resolve(checkpoint.sandbox_id)
            try:
                if sandbox is not None:
                    sandbox.delete_checkpoint_ref(checkpoint.metadata["checkpoint_ref"])
            except (SandboxError, ValueError):
                logger.exception("cannot delete ref of checkpoint %s", checkpoint_id)
        self._cleanup_snapshot(checkpoint.snapshot_path)
        if self._state_dir is not None:
            self._record_path(checkpoint_id).unlink(missing_ok=True)
        return True

    def delete_plan_checkpoints(self, plan_id: str, sandbox_ids: Iterable[str] = ()) -> int:
        """Delete every checkpoint taken for ``plan_id`` or of one of ``sandbox_ids``.

        With a state dir the records are re-read first, so checkpoints another process (the CLI,
        another manager) recorded there are deleted too. Idempotent: deleting again finds
        nothing (cleanup leaves nothing behind).

        Returns:
            How many checkpoints were deleted.
        """
        if self._state_dir is not None:
            with self._lock:
                self._load_records()
        wanted = set(sandbox_ids)
        with self._lock:
            doomed = [
                cp.checkpoint_id
                for cp in self._checkpoints.values()
                if cp.plan_id == plan_id or cp.sandbox_id in wanted
            ]
        return sum(self.delete_checkpoint(checkpoint_id) for checkpoint_id in doomed)

    # -- snapshots (seed 004 names these helpers) ---------------------------------------------

    def _snapshot_directory(
        self, sandbox_path: str | None, checkpoint_id: str | None = None
    ) -> str:
        """Copy ``sandbox_path`` into a new snapshot directory and return its path.

        A missing or ``None`` path gives an empty snapshot directory.

        Raises:
            SandboxError: the copy failed (the partial snapshot is removed).
        """
        parent = self._allocate(checkpoint_id or str(ULID()))
        snapshot = parent / "snapshot"
        if not sandbox_path or not Path(sandbox_path).is_dir():
            snapshot.mkdir()
            return str(snapshot)
        try:
            backup_directory(sandbox_path, snapshot)
        except OSError as exc:
            shutil.rmtree(parent, ignore_errors=True)
            raise SandboxError(f"cannot snapshot {sandbox_path}: {exc}") from exc
        return str(snapshot)

    def _cleanup_snapshot(self, snapshot_path: str) -> None:
        """Remove the ``sandbox-checkpoint-*`` directory holding ``snapshot_path``.

        No-op for an empty path, a missing directory, or a directory this manager did not
        make (never deletes an arbitrary parent).
        """
        if not snapshot_path:
            return
        parent = Path(snapshot_path).parent
        if not parent.name.startswith(SNAPSHOT_PREFIX) or not parent.is_dir():
            return
        shutil.rmtree(parent, ignore_errors=True)

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _fork_facts(
        sandbox: Checkpointable, context: SandboxContext, snapshot_path: str
    ) -> dict[str, str]:
        """What a fork of this checkpoint needs beside the snapshot: the strategy and the
        original, the parent's base commit (git) and a copy of its baseline (directories), so
        that a fork still starts after the parent is gone."""
        facts = {
            "original_path": context.original_path,
            "strategy": str(context.metadata.get("strategy") or getattr(sandbox, "strategy", "")),
        }
        base = context.metadata.get("base_commit")
        if base:
            facts["base_commit"] = str(base)
        manifest = getattr(sandbox, "baseline_manifest", None)
        if snapshot_path and callable(manifest):
            found = manifest()
            if found is not None:
                kept = Path(snapshot_path).parent / "baseline"
                try:
                    shutil.copyfile(found, kept)
                except OSError as exc:
                    raise SandboxError(
                        f"cannot keep the baseline of {snapshot_path}: {exc}"
                    ) from exc
                facts["baseline"] = str(kept)
        return facts

    def _allocate(self, checkpoint_id: str) -> Path:
        self._root.mkdir(parents=True, exist_ok=True)
        if self._state_dir is None:
            return Path(
                tempfile.mkdtemp(prefix=f"{SNAPSHOT_PREFIX}{checkpoint_id}-", dir=self._root)
            )
        parent = self._root / f"{SNAPSHOT_PREFIX}{checkpoint_id}"
        parent.mkdir()
        return parent

    @staticmethod
    def _restore_directory(snapshot: Path, sandbox_path: Path) -> None:
        # Copy next to the target first (the snapshot stays reusable), then swap by rename.
        staging = sandbox_path.parent / f".{sandbox_path.name}.checkpoint-{ULID()}"
        try:
            backup_directory(snapshot, staging)
            safe_restore(staging, sandbox_path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _rollback_native(self, checkpoint: SandboxCheckpoint, kind: str) -> bool:
        sandbox = self._resolve(checkpoint.sandbox_id)
        if sandbox is None:
            return False
        try:
            if kind == KIND_GIT_REF:
                sandbox.restore_checkpoint_ref(checkpoint.metadata["checkpoint_ref"])
            else:
                if not checkpoint.snapshot_path or not Path(checkpoint.snapshot_path).is_dir():
                    return False
                sandbox.restore_checkpoint_snapshot(checkpoint.snapshot_path)
        except (SandboxLockedError, SandboxPermissionError):
            raise  # classified: the CLI maps them to their own exit codes
        except (SandboxError, ValueError, OSError, KeyError):
            logger.exception("restore of checkpoint %s failed", checkpoint.checkpoint_id)
            return False
        return True

    def _resolve(self, sandbox_id: str) -> Any:
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None and self._resolver is not None:
            sandbox = self._resolver(sandbox_id)
        return sandbox

    def _record_path(self, checkpoint_id: str) -> Path:
        return self._root / "records" / f"{checkpoint_id}.json"

    def _save_record(self, checkpoint: SandboxCheckpoint) -> None:
        if self._state_dir is None:
            return
        try:
            write_json_atomic(
                self._record_path(checkpoint.checkpoint_id), checkpoint.model_dump(mode="json")
            )
        except OSError as exc:
            raise SandboxError(
                f"cannot record checkpoint {checkpoint.checkpoint_id}: {exc}"
            ) from exc

    def _load_records(self) -> None:
        records = self._root / "records"
        if not records.is_dir():
            return
        loaded = []
        for path in records.glob("*.json"):
            try:
                loaded.append(SandboxCheckpoint.model_validate(json.loads(path.read_text("utf-8"))))
            except (OSError, ValueError):
                logger.exception("skipping unreadable checkpoint record %s", path)
        for checkpoint in sorted(loaded, key=lambda cp: (cp.created_at, cp.checkpoint_id)):
            self._checkpoints.setdefault(checkpoint.checkpoint_id, checkpoint)
