"""What the plan code calls on a sandbox of a plan: the participants of its commit.

The plan (saga, two-phase coordinator, review) knows no strategy and no sandbox class. It drives
anything shaped like these Protocols: an in-process ``BaseSandbox``, an executor's handle to a
sandbox in a workspace Pod, or a wrapper around either (the operator's deletion guard).

- :class:`Participant`: what the saga calls (seed 002, "Atomic Commit").
- :class:`ReviewedParticipant`: adds ``review()`` (the plan review and its digest).
- :class:`TwoPhaseParticipant`: adds ``prepare`` / ``apply_prepared`` / ``abort_prepared`` and
  ``prepares_durably`` (the two-phase coordinator).

Optional traits, read with ``getattr`` and a default, so a participant may lack them:

========================  ===================================================================
``resource_id``           what the journal names the step by (else ``context.resource_id``)
``context``               a ``SandboxContext`` (its ``resource_id``)
``strategy``              a strategy name, recorded in the journal and used to group work
``commit_landed()``       recovery probe: did an interrupted commit reach the original?
``adopt_landed_commit()`` recovery: record a commit that landed unrecorded
``last_commit``           the ``CommitResult`` of a commit that landed (two-phase recovery)
``original_path``         where an in-process participant's prepare and apply write
``source_root``           an executor handle's identity of its original across Pods
========================  ===================================================================

:func:`commit_order` is the order every plan commit runs its participants in; :func:`in_process`
tells an in-process sandbox from a handle or a wrapper (only the former may run beside others).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from sandbox_core.protocol import ChangeSummary, CommitResult, PreparedCommit
from sandbox_core.status import SandboxStatus

__all__ = [
    "Participant",
    "ReviewedParticipant",
    "TwoPhaseParticipant",
    "commit_order",
    "in_process",
]

P = TypeVar("P")


class Participant(Protocol):
    """A sandbox as the saga drives it: commit it, or undo its commit (seed 002).

    ``rollbackable`` says whether a COMMITTED participant can be rolled back; the plan commits
    those first (:func:`commit_order`).
    """

    @property
    def sandbox_id(self) -> str: ...

    @property
    def status(self) -> SandboxStatus: ...

    @property
    def rollbackable(self) -> bool: ...

    def commit(self, message: str | None = None) -> CommitResult: ...

    def rollback(self) -> None: ...


class ReviewedParticipant(Participant, Protocol):
    """A participant that can say what committing it would change, without locks."""

    def review(self) -> ChangeSummary: ...


class TwoPhaseParticipant(ReviewedParticipant, Protocol):
    """A participant of a two-phase plan commit.

    ``prepares_durably`` False makes it the plan's last resource (at most one per plan);
    ``apply_prepared`` and ``abort_prepared`` are idempotent per ``txid``.
    """

    @property
    def prepares_durably(self) -> bool: ...

    def prepare(self, txid: str, message: str | None = None) -> PreparedCommit: ...

    def apply_prepared(self, txid: str) -> CommitResult: ...

    def abort_prepared(self, txid: str) -> None: ...


def commit_order(sandboxes: Iterable[P]) -> list[P]:
    """Rollbackable sandboxes first, then the others; stable within each group (seed 002)."""
    items = list(sandboxes)
    first = [sb for sb in items if bool(getattr(sb, "rollbackable", True))]
    last = [sb for sb in items if not bool(getattr(sb, "rollbackable", True))]
    return first + last


def in_process(participant: object) -> bool:
    """Whether ``participant`` is a sandbox object of this interpreter, not a handle to one.

    Only such a participant's ``original_path`` is a path (or database address) this process
    writes itself, so only it may be prepared and applied beside the others
    (:func:`~sandbox_core.plan.two_phase.independent_chains`). Told by its class: a sandbox kept
    by this host defines ``to_record`` and ``reopen`` (its record in the state directory). An
    executor's handle to a sandbox in another process does not, nor does a wrapper around an
    in-process sandbox (the operator's deletion guard, the local executor's fault-injecting
    handle): a wrapper's ``__getattr__`` is never asked here, because such a wrapper must keep
    the plan in commit order (it checks its Sandbox object right before each step).
    """
    cls = type(participant)
    return callable(getattr(cls, "to_record", None)) and hasattr(cls, "reopen")
