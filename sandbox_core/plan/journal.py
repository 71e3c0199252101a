"""Commit journal: the durable record that makes a plan's atomic commit crash-safe.

DESIGN.md, "PlanCommit: atomic commit as a saga"; cases 20 and 22. A plan commit is N separate side
effects (git merge, directory swap, database COMMIT).
:class:`~sandbox_core.plan.saga.PlanCommitSaga` records every step in a :class:`CommitJournal`
*before* and *after* it happens, so a process killed at any point can be resumed by
:meth:`~sandbox_core.plan.saga.PlanCommitSaga.recover`.

The protocol is deliberately two methods (``load``/``save`` of one :class:`JournalState`) so that
the operator can implement it on a PlanCommit's ``.status`` and the CLI on a JSON file
(:class:`FileCommitJournal`). ``save`` must be durable when it returns.

Phases of one attempt::

    pending -> committing -> committed
                          -> compensating -> failed        (a step failed; compensation ran)
                          -> (crash) ... recovery -> rolled_back | committed | failed
               compensating (reason CompensationFailed) -> recovery retries -> failed | rolled_back

Terminal phases are ``committed``, ``rolled_back`` (an interrupted attempt was compensated by
recovery) and ``failed`` (a commit step failed; ``rolled_back_ids`` / ``failed_rollback_ids`` say
what compensation did). An attempt whose compensation failed for a cause that may go away stays
``compensating`` with reason ``CompensationFailed`` until recovery succeeds (case 21; see
:mod:`sandbox_core.plan.saga`). ``reason`` is a CamelCase word fit for a Kubernetes condition.
"""

from __future__ import annotations

import copy
import json
import threading
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from sandbox_core.durable import write_json_atomic
from sandbox_core.errors import SandboxError
from sandbox_core.protocol import utc_now

__all__ = [
    "CommitJournal",
    "FileCommitJournal",
    "JournalPhase",
    "JournalReason",
    "JournalState",
    "JournalStep",
    "MemoryCommitJournal",
    "StepState",
]


class JournalPhase(StrEnum):
    """Phase of one plan commit attempt."""

    PENDING = "pending"
    PREPARING = "preparing"
    """Two-phase: participants are being prepared; no original touched; recovery aborts."""
    APPLYING = "applying"
    """Two-phase: the decision to commit is recorded; recovery rolls forward."""
    ABORTING = "aborting"
    """Two-phase: prepared participants are being aborted (no original was touched)."""
    COMMITTING = "committing"
    COMMITTED = "committed"
    COMPENSATING = "compensating"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        """True when the attempt is over: recovery has nothing left to do."""
        return self in (JournalPhase.COMMITTED, JournalPhase.ROLLED_BACK, JournalPhase.FAILED)


class StepState(StrEnum):
    """State of one sandbox's step within an attempt."""

    PENDING = "pending"
    PREPARING = "preparing"
    PREPARED = "prepared"
    ABORTED = "aborted"
    COMMITTING = "committing"
    COMMITTED = "committed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    FAILED = "failed"


class JournalReason(StrEnum):
    """Why an attempt ended where it did (CamelCase, for conditions and events)."""

    IN_PROGRESS = "InProgress"
    COMMITTED = "Committed"
    COMMIT_FAILED = "CommitFailed"
    COMPENSATION_FAILED = "CompensationFailed"
    INTERRUPTED = "Interrupted"
    CHANGED_SINCE_APPROVAL = "ChangedSinceApproval"
    VALIDATION_FAILED = "ValidationFailed"
    """A pre-commit check failed (:mod:`sandbox_core.plan.validation`); nothing was prepared."""
    OUTCOME_UNKNOWN = "OutcomeUnknown"
    """A step's commit outcome cannot be learnt yet (its reply was lost); nothing was
    compensated; the attempt stays open and ``recover`` asks again."""


class JournalStep(BaseModel):
    """One sandbox of the attempt, in commit order.

    ``result`` is the step's ``CommitResult.to_dict()`` once committed; ``error`` the message of
    the failed commit or compensation; ``conflicts`` the resource-relative paths of a conflicting
    commit (``SandboxCommitError.conflicts``). Timestamps are UTC.
    """

    sandbox_id: str
    resource_id: str = ""
    strategy: str = ""
    rollbackable: bool = True
    state: StepState = StepState.PENDING
    result: dict[str, Any] | None = None
    error: str | None = None
    conflicts: list[str] = Field(default_factory=list)
    prepared: dict[str, Any] | None = None
    """Two-phase: the step's ``PreparedCommit.to_dict()`` once prepared."""
    last_resource: bool = False
    """Two-phase: this step cannot prepare durably; its commit is the decision."""
    started_at: datetime | None = None
    updated_at: datetime = Field(default_factory=utc_now)


class JournalState(BaseModel):
    """The whole journal of one plan's latest commit attempt.

    Attributes:
        plan_id: the plan.
        attempt: 1 for the first attempt; each new ``commit_all`` after a terminal attempt adds 1.
        phase / reason: see the module docstring.
        steps: commit order (rollbackable first, seed 002).
        failed_sandbox_id: the sandbox whose commit failed, if any.
        error: human-readable summary of the failure.
        rolled_back_ids: compensated sandboxes, in the LIFO order compensation ran.
        failed_rollback_ids: sandboxes whose compensation failed (their original may still hold
            the committed change); a retried compensation that succeeds moves its id to
            ``rolled_back_ids``.
    """

    plan_id: str
    attempt: int = 1
    phase: JournalPhase = JournalPhase.PENDING
    reason: JournalReason = JournalReason.IN_PROGRESS
    steps: list[JournalStep] = Field(default_factory=list)
    failed_sandbox_id: str | None = None
    error: str | None = None
    rolled_back_ids: list[str] = Field(default_factory=list)
    failed_rollback_ids: list[str] = Field(default_factory=list)
    mode: Literal["saga", "two_phase"] = "saga"
    txid: str | None = None
    """Two-phase: the transaction id every participant prepared under."""
    digest: str | None = None
    """Two-phase: the plan digest of what was prepared (see ``sandbox_core.plan.review``)."""
    approved_digest: str | None = None
    """Two-phase: the digest the approval named, when one was required."""
    decided_at: datetime | None = None
    """Two-phase: when the decision to commit was recorded (the point of no return)."""
    fallback_reason: str | None = None
    """Saga attempt of a ``mode="auto"`` plan commit: why two phases could not be used."""
    started_at: datetime = Field(default_factory=utc_now)
    updated_at: datetime = Field(default_factory=utc_now)
    finished_at: datetime | None = None

    def step(self, sandbox_id: str) -> JournalStep:
        """The step of ``sandbox_id``.

        Raises:
            KeyError: no such step.
        """
        for step in self.steps:
            if step.sandbox_id == sandbox_id:
                return step
        raise KeyError(sandbox_id)


@runtime_checkable
class CommitJournal(Protocol):
    """Durable storage for one plan's :class:`JournalState`.

    ``load`` returns the last saved state or ``None``; ``save`` replaces it and must be durable
    (survive SIGKILL) when it returns. Errors are raised as :class:`SandboxError`.
    """

    def load(self) -> JournalState | None: ...

    def save(self, state: JournalState) -> None: ...


class MemoryCommitJournal:
    """Journal kept in process memory (no crash safety; the default without a store)."""

    def __init__(self) -> None:
        self._state: JournalState | None = None
        self._lock = threading.Lock()

    def load(self) -> JournalState | None:
        """A copy of the last saved state, or ``None``."""
        with self._lock:
            return None if self._state is None else self._state.model_copy(deep=True)

    def save(self, state: JournalState) -> None:
        """Keep a copy of ``state`` (later changes to ``state`` do not leak in)."""
        with self._lock:
            self._state = copy.deepcopy(state)


class FileCommitJournal:
    """Journal in one JSON file, replaced atomically and fsynced on every save.

    Args:
        path: the file (its directory is created on first save).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> JournalState | None:
        """The saved state, or ``None`` when the file does not exist.

        Raises:
            SandboxError: the file is unreadable or not a journal.
        """
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SandboxError(f"cannot read commit journal {self.path}: {exc}") from exc
        try:
            return JournalState.model_validate(json.loads(raw))
        except ValueError as exc:
            raise SandboxError(f"commit journal {self.path} is corrupt: {exc}") from exc

    def save(self, state: JournalState) -> None:
        """Write ``state`` atomically (temp file, fsync, rename).

        Raises:
            SandboxError: the file could not be written.
        """
        try:
            write_json_atomic(self.path, state.model_dump(mode="json"))
        except OSError as exc:
            raise SandboxError(f"cannot write commit journal {self.path}: {exc}") from exc
