"""Value objects and the runtime-checkable ``Sandbox`` protocol (seed 002, "Core Classes")."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from sandbox_core.status import SandboxStatus


def utc_now() -> datetime:
    """Current time as an aware UTC datetime (every timestamp in sandbox_core is UTC)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class SandboxContext:
    """Immutable description of an initialised sandbox.

    ``metadata`` holds strategy-specific data that must survive a process restart (git branch,
    base commit, overlay mode, ...): it is what :meth:`BaseSandbox.reopen` rebuilds from, so every
    value in it must be JSON-serialisable.
    """

    sandbox_id: str
    sandbox_path: str
    original_path: str
    resource_id: str
    plan_id: str
    created_at: datetime = field(default_factory=utc_now)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``created_at`` as ISO 8601."""
        return {
            "sandbox_id": self.sandbox_id,
            "sandbox_path": self.sandbox_path,
            "original_path": self.original_path,
            "resource_id": self.resource_id,
            "plan_id": self.plan_id,
            "created_at": self.created_at.isoformat(),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SandboxContext:
        """Inverse of :meth:`to_dict`."""
        return cls(
            sandbox_id=str(data["sandbox_id"]),
            sandbox_path=str(data["sandbox_path"]),
            original_path=str(data["original_path"]),
            resource_id=str(data["resource_id"]),
            plan_id=str(data["plan_id"]),
            created_at=datetime.fromisoformat(str(data["created_at"])),
            metadata=dict(data.get("metadata") or {}),
        )


@dataclass(frozen=True)
class ForkSource:
    """Where a forked sandbox starts: a checkpoint of another sandbox over the same original
    (docs/forks.md).

    Attributes:
        sandbox_id: the checkpointed (parent) sandbox.
        checkpoint_id: the checkpoint.
        kind: the checkpoint's kind (``git_ref``, ``overlay_snapshot``, ``directory``; see
            :mod:`sandbox_core.host.checkpoint`).
        snapshot_path: the snapshot directory (empty for ``git_ref``).
        commit: the checkpoint's commit (``git_ref`` only, else empty).
        parent_metadata: the parent's context metadata (its ``base_commit``): what the
            parent started from, so that only the parent's own change is carried.
        baseline_path: a copy of the parent's baseline (directory strategies' ``manifest``:
            the original as the parent was made from it), kept beside the snapshot; empty when
            the parent had none (then every differing path is carried).
    """

    sandbox_id: str
    checkpoint_id: str
    kind: str
    snapshot_path: str = ""
    commit: str = ""
    parent_metadata: dict[str, Any] = field(default_factory=dict)
    baseline_path: str = ""


@dataclass(frozen=True)
class CommitResult:
    """Outcome of one ``commit()`` call. File lists are resource-relative POSIX paths, sorted."""

    sandbox_id: str
    success: bool
    commit_ref: str | None = None
    changed_files: list[str] = field(default_factory=list)
    added_files: list[str] = field(default_factory=list)
    deleted_files: list[str] = field(default_factory=list)
    error: str | None = None
    timestamp: datetime = field(default_factory=utc_now)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``timestamp`` as ISO 8601."""
        return {
            "sandbox_id": self.sandbox_id,
            "success": self.success,
            "commit_ref": self.commit_ref,
            "changed_files": list(self.changed_files),
            "added_files": list(self.added_files),
            "deleted_files": list(self.deleted_files),
            "error": self.error,
            "timestamp": self.timestamp.isoformat(),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommitResult:
        """Inverse of :meth:`to_dict`."""
        return cls(
            sandbox_id=str(data["sandbox_id"]),
            success=bool(data["success"]),
            commit_ref=data.get("commit_ref"),
            changed_files=list(data.get("changed_files") or []),
            added_files=list(data.get("added_files") or []),
            deleted_files=list(data.get("deleted_files") or []),
            error=data.get("error"),
            timestamp=datetime.fromisoformat(str(data["timestamp"])),
            metadata=dict(data.get("metadata") or {}),
        )


@dataclass(frozen=True)
class ChangeSummary:
    """What one sandbox would change in its original, computed without locks (for a plan's review).

    File lists are resource-relative POSIX paths, sorted. ``lines_added``/``lines_removed``
    count text lines (binary files count 0); ``bytes_changed`` is the size in bytes of the new
    content of added and changed files; ``statements`` counts a database sandbox's write
    statements. ``conflicts`` are paths (or, for a database, statements) that would refuse the
    commit now. ``digest`` is ``"sha256:<hex>"`` over the exact changes (content, metadata and
    deletions; for a database the logged statements and their parameters): equal digests mean
    the same changes would be applied.
    """

    sandbox_id: str
    resource_id: str
    strategy: str
    digest: str
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    lines_added: int = 0
    lines_removed: int = 0
    bytes_changed: int = 0
    statements: int = 0
    conflicts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "sandbox_id": self.sandbox_id,
            "resource_id": self.resource_id,
            "strategy": self.strategy,
            "digest": self.digest,
            "added": list(self.added),
            "changed": list(self.changed),
            "deleted": list(self.deleted),
            "lines_added": self.lines_added,
            "lines_removed": self.lines_removed,
            "bytes_changed": self.bytes_changed,
            "statements": self.statements,
            "conflicts": list(self.conflicts),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChangeSummary:
        """Inverse of :meth:`to_dict`."""
        return cls(
            sandbox_id=str(data["sandbox_id"]),
            resource_id=str(data.get("resource_id") or ""),
            strategy=str(data.get("strategy") or ""),
            digest=str(data["digest"]),
            added=list(data.get("added") or []),
            changed=list(data.get("changed") or []),
            deleted=list(data.get("deleted") or []),
            lines_added=int(data.get("lines_added") or 0),
            lines_removed=int(data.get("lines_removed") or 0),
            bytes_changed=int(data.get("bytes_changed") or 0),
            statements=int(data.get("statements") or 0),
            conflicts=list(data.get("conflicts") or []),
        )


@dataclass(frozen=True)
class PreparedCommit:
    """A participant's answer to ``prepare`` in a two-phase plan commit.

    ``txid`` is the plan commit's transaction id the participant prepared under; everything it
    staged is named after it, so ``apply_prepared(txid)`` and ``abort_prepared(txid)`` work from
    the id alone after a crash. ``digest`` is the digest of exactly what was staged (it equals
    the :class:`ChangeSummary` digest when nothing changed in between); ``summary`` its change
    summary (the directory strategies leave its line counts at 0: those are the review's);
    ``details`` strategy data for people and tests (staging directory, merge commit,
    prepared transaction's global id), never a secret.
    """

    sandbox_id: str
    txid: str
    digest: str
    summary: ChangeSummary | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "sandbox_id": self.sandbox_id,
            "txid": self.txid,
            "digest": self.digest,
            "summary": self.summary.to_dict() if self.summary else None,
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedCommit:
        """Inverse of :meth:`to_dict`."""
        summary = data.get("summary")
        return cls(
            sandbox_id=str(data["sandbox_id"]),
            txid=str(data["txid"]),
            digest=str(data["digest"]),
            summary=ChangeSummary.from_dict(summary) if summary else None,
            details=dict(data.get("details") or {}),
        )


@runtime_checkable
class Sandbox(Protocol):
    """What every sandbox implementation provides (seed 002, "Sandbox (Protocol)").

    ``rollbackable`` says whether a COMMITTED sandbox can be undone; ``commit_all`` commits
    rollbackable sandboxes first so that the others (transaction, none) run only when nothing
    after them can fail.
    """

    @property
    def sandbox_id(self) -> str: ...

    @property
    def status(self) -> SandboxStatus: ...

    @property
    def context(self) -> SandboxContext | None: ...

    @property
    def rollbackable(self) -> bool: ...

    def create(self, plan_id: str) -> SandboxContext: ...

    def get_path(self, resource_path: str) -> str: ...

    def commit(self, message: str | None = None) -> CommitResult: ...

    def rollback(self) -> None: ...

    def cleanup(self) -> None: ...
