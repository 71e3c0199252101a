"""The one small interface between the handlers and the core (DESIGN.md, "executors").

Two implementations: :mod:`.local` (the core in the operator's process) and :mod:`.pod` (the
core in a workspace Pod, called through its workspace agent). Handlers only see this module's types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ulid import ULID

from sandbox_api.models import SandboxOptions, SandboxSource, WorkspaceSpec
from sandbox_core import CommitResult, SandboxStatus
from sandbox_core.plan.validation import Check, CheckOutcome
from sandbox_core.protocol import ChangeSummary, PreparedCommit

DEFAULT_MODES = {
    "git_worktree": "worktree",
    "copy_on_write": "copy",
    "overlay": "auto",
    "transaction_rollback": "transaction",
    "none": "passthrough",
}


def sandbox_id_for_uid(uid: str) -> str:
    """Deterministic core sandbox id (a ULID) of the Sandbox object with ``uid``.

    A retried or restarted create therefore meets the artefacts of its first attempt under the
    same id instead of making a second set (case 18).

    Raises:
        ValueError: ``uid`` is not a UUID.
    """
    import uuid

    return str(ULID.from_uuid(uuid.UUID(uid)))


@dataclass(frozen=True)
class ForkRef:
    """The checkpoint a new Sandbox starts from, checked by ``resources.targets.resolve_fork``:
    ``parent_sandbox_id`` (the parent's core id, from its uid) and ``checkpoint_id`` (the core's
    checkpoint id, from the Ready Checkpoint's status); ``parent_name`` and ``parent_uid`` (the
    parent Sandbox in the fork's namespace: the pod executor asks its workspace agent for the
    checkpoint, found by the uid as its owner)."""

    parent_sandbox_id: str
    checkpoint_id: str
    parent_name: str = ""
    parent_uid: str = ""


@dataclass(frozen=True)
class SandboxTarget:
    """Everything an executor needs to know about one Sandbox object.

    ``original`` is the resolved original: a node path (local), the mount path of the source
    volume (pod), or a DSN read from the Secret (transaction_rollback).
    ``core_record`` is ``status.coreRecord`` (the core's ``to_record()``) when it describes this
    Sandbox (``resources.targets.trusted_core_record``), used to re-open after an operator
    restart when the state directory lost it. Nothing else here comes from the status: the
    workspace Pod is found by its owner, the sandbox id derived from the uid.
    """

    name: str
    namespace: str
    uid: str
    sandbox_id: str
    plan_id: str
    resource_id: str
    strategy: str
    original: str
    source: SandboxSource = field(default_factory=SandboxSource)
    options: SandboxOptions = field(default_factory=SandboxOptions)
    core_record: dict[str, Any] | None = None
    workspace: WorkspaceSpec = field(default_factory=WorkspaceSpec)
    fork: ForkRef | None = None
    """Set while a Sandbox with ``spec.source.fromCheckpoint`` is still to be made: the parent's
    core sandbox id and the core's checkpoint id (docs/forks.md)."""


class WorkspaceNotReady(Exception):  # noqa: N818 - a state, not a failure
    """The workspace Pod is not Ready yet: a normal wait, not an error.

    Handlers record it as ``Ready=False`` with reason ``WorkspacePodStarting`` and no Warning;
    the Pod's own events resume the work (no fixed sleep).
    """

    reason = "WorkspacePodStarting"


class WorkspaceUnschedulable(WorkspaceNotReady):
    """The workspace Pod cannot be placed on any node now; the message is the scheduler's
    (the Pod's ``PodScheduled=False`` condition). Still a wait: the scheduler retries when the
    cluster changes. Recorded as ``Ready=False`` with reason ``WorkspacePodUnschedulable``."""

    reason = "WorkspacePodUnschedulable"


@dataclass(frozen=True)
class SandboxState:
    """What the core says about a sandbox; mirrored into ``Sandbox.status``."""

    sandbox_id: str
    status: SandboxStatus
    sandbox_path: str = ""
    effective_strategy: str = ""
    strategy_mode: str = ""
    workspace_pod: str = ""
    record: dict[str, Any] = field(default_factory=dict)
    last_commit: CommitResult | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any], workspace_pod: str = "") -> SandboxState:
        """Build from a core ``to_record()`` dict (strategy mode from the context metadata)."""
        context = record.get("context") or {}
        metadata = context.get("metadata") or {}
        strategy = str(record.get("strategy") or "")
        mode = metadata.get("mode") or metadata.get("overlay_mode") or DEFAULT_MODES.get(strategy)
        effective = metadata.get("effective_strategy") or strategy
        last = record.get("last_commit")
        return cls(
            sandbox_id=str(record.get("sandbox_id") or ""),
            status=SandboxStatus(str(record.get("status") or "pending")),
            sandbox_path=str(context.get("sandbox_path") or ""),
            effective_strategy=str(effective),
            strategy_mode=str(mode or ""),
            workspace_pod=workspace_pod,
            record=dict(record),
            last_commit=CommitResult.from_dict(last) if last else None,
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """A snapshot of one sandbox, as kept in ``Checkpoint.status``.

    ``kind``: ``git-tag`` | ``upper-snapshot`` | ``directory-snapshot`` | ``metadata-only``.
    ``created_at``: RFC 3339. ``extra``: what the core needs to restore (plan id, phase, metadata).
    """

    checkpoint_id: str
    sandbox_id: str
    snapshot_location: str
    kind: str
    created_at: str
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class SandboxHandle(Protocol):
    """The duck type the core's ``PlanCommitSaga`` and ``TwoPhasePlanCommit`` drive: one
    sandbox, local (the core's ``BaseSandbox``) or remote (the pod executor's agent handle).

    The two-phase members follow ``sandbox_core.strategies.base``: ``review`` and ``prepare``
    never touch the original nor change the status; ``apply_prepared`` and ``abort_prepared``
    are idempotent per transaction id; ``prepares_durably`` is False for a participant that
    can only be the last resource (SQLite). Errors are the core's (``SandboxCommitError`` with
    ``conflicts``, ``TwoPhaseUnavailableError``, ``SandboxStateError``); a remote handle adds
    retryable ``ExecutorError`` for an unreachable agent.
    """

    @property
    def sandbox_id(self) -> str: ...

    @property
    def status(self) -> SandboxStatus: ...

    @property
    def rollbackable(self) -> bool: ...

    def commit(self, message: str | None = None) -> CommitResult: ...

    def rollback(self) -> None: ...

    @property
    def prepares_durably(self) -> bool: ...

    def review(self) -> ChangeSummary: ...

    def prepare(self, txid: str, message: str | None = None) -> PreparedCommit: ...

    def apply_prepared(self, txid: str) -> CommitResult: ...

    def abort_prepared(self, txid: str) -> None: ...


class Executor(Protocol):
    """Provision, drive and clean up sandboxes. Every method is idempotent where it says so.

    Errors: core errors (``SandboxError`` and subclasses) pass through; transport problems are
    :class:`~sandbox_operator.errors.ExecutorError`. ``errors.classify`` maps both.
    """

    kind: str

    def provision(self, target: SandboxTarget) -> SandboxState:
        """Create (or re-open what an earlier attempt made) and activate. Idempotent (case 18)."""
        ...

    def describe(self, target: SandboxTarget) -> SandboxState | None:
        """Current core state, or None when nothing was ever made for ``target``."""
        ...

    def open(self, target: SandboxTarget) -> SandboxHandle:
        """A handle for the saga; its changes are persisted by :meth:`persist`."""
        ...

    def persist(self, target: SandboxTarget, handle: SandboxHandle) -> SandboxState:
        """Save the handle's state durably and return it."""
        ...

    def rollback(self, target: SandboxTarget, reactivate: bool = True) -> SandboxState:
        """Discard all changes (ACTIVE -> ROLLED_BACK, then -> ACTIVE when ``reactivate``)."""
        ...

    def cleanup(self, target: SandboxTarget) -> None:
        """Remove every artefact (worktree, branch, tags, copies, pod, volumes, state).

        Never touches the original. Idempotent: nothing made is fine.
        """
        ...

    def create_checkpoint(
        self, target: SandboxTarget, phase: str, metadata: dict[str, str], uid: str = ""
    ) -> CheckpointInfo:
        """Snapshot the sandbox now; a retry with the same ``uid`` returns the first snapshot."""
        ...

    def restore_checkpoint(self, target: SandboxTarget, checkpoint: CheckpointInfo) -> SandboxState:
        """Put the sandbox back to ``checkpoint``."""
        ...

    def delete_checkpoint(self, checkpoint: CheckpointInfo) -> None:
        """Remove the snapshot. Idempotent. ``checkpoint.extra["uid"]``, when given, is the
        Checkpoint object's uid: only snapshots taken for it are removed, the id may be empty."""
        ...

    def renew_token(self, target: SandboxTarget) -> None:
        """Write a new workspace-agent token for ``target`` when its renewal window changed
        (pod executor; the local executor has none)."""
        ...

    def run_check(self, target: SandboxTarget, check: Check) -> CheckOutcome:
        """Run a PlanCommit's pre-commit check through the actor's door and wait for it.

        Raises:
            SandboxError: the door refused it (the check then fails with the refusal).
        """
        ...

    def suspend(self, target: SandboxTarget) -> None:
        """Stop the workspace (delete its Pod) and keep every change (``spec.suspend``)."""
        ...

    def resume(self, target: SandboxTarget) -> None:
        """Bring the workspace back after :meth:`suspend` (the Pod is made again)."""
        ...
