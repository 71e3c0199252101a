"""The sandbox lifecycle state machine (seed 002, "Lifecycle" and "Status Transition Validation").

``PENDING -> CREATED -> ACTIVE -> COMMITTED -> CLEANED_UP``,
``ACTIVE -> ROLLED_BACK -> ACTIVE | CLEANED_UP``, ``CREATED -> ERRORED -> CLEANED_UP``.
Two edges the seed's scenarios rely on are added: ``COMMITTED -> ROLLED_BACK`` (rollback from
COMMITTED "where the strategy can"), and ``* -> ERRORED`` from every live state, because an
unexpected I/O failure in commit or rollback marks the sandbox errored (seed 003, "Commit wraps
OSError into SandboxCommitError").

The lifecycle guards live here and nowhere else: which statuses may be committed
(:attr:`SandboxStatus.can_commit`), written to / reused / restored (:attr:`SandboxStatus.is_open`),
activated (:attr:`SandboxStatus.can_activate`), are finished (:attr:`SandboxStatus.is_terminal`),
and which break a plan's all-or-nothing commit (:attr:`SandboxStatus.blocks_plan_commit`, case
38). The base class, the manager, the CLI and the operator ask these properties instead of
listing statuses themselves.
"""

from __future__ import annotations

from enum import StrEnum

from sandbox_core.errors import SandboxStateError


class SandboxStatus(StrEnum):
    """Lifecycle status of one sandbox. Values are the lower-case names used in seeds and CLI."""

    PENDING = "pending"
    CREATED = "created"
    ACTIVE = "active"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    CLEANED_UP = "cleaned_up"
    ERRORED = "errored"

    @staticmethod
    def can_transition(current: SandboxStatus, target: SandboxStatus) -> bool:
        """Return True when ``current -> target`` is an edge of the lifecycle graph."""
        return target in _TRANSITIONS[current]

    @staticmethod
    def assert_transition(current: SandboxStatus, target: SandboxStatus) -> None:
        """Raise :class:`SandboxStateError` unless ``current -> target`` is allowed."""
        if not SandboxStatus.can_transition(current, target):
            raise SandboxStateError(f"Invalid status transition: {current.value} -> {target.value}")

    @property
    def is_terminal(self) -> bool:
        """COMMITTED, ROLLED_BACK, ERRORED: finished (``cleanup_abandoned`` candidates, TTL)."""
        return self in _TERMINAL

    @property
    def can_commit(self) -> bool:
        """CREATED or ACTIVE: ``commit()`` and ``commit_all`` accept it (seed 002, step 1)."""
        return self in _COMMITTABLE

    @property
    def is_open(self) -> bool:
        """CREATED, ACTIVE or ROLLED_BACK: paths resolve, the manager reuses it, a checkpoint
        can be taken or restored (seed 000, "A rolled-back sandbox is still usable")."""
        return self in _OPEN

    @property
    def can_activate(self) -> bool:
        """CREATED or ROLLED_BACK: ``activate()`` moves it to ACTIVE."""
        return self in _ACTIVATABLE

    @property
    def blocks_plan_commit(self) -> bool:
        """ROLLED_BACK or ERRORED: its changes were discarded or are in doubt, so committing the
        plan's other sandboxes would land half the plan (case 38). A plan commit is refused
        while one of its sandboxes is in such a status."""
        return self in _BLOCKS_PLAN_COMMIT


_TERMINAL = frozenset({SandboxStatus.COMMITTED, SandboxStatus.ROLLED_BACK, SandboxStatus.ERRORED})
_COMMITTABLE = frozenset({SandboxStatus.CREATED, SandboxStatus.ACTIVE})
_OPEN = frozenset({SandboxStatus.CREATED, SandboxStatus.ACTIVE, SandboxStatus.ROLLED_BACK})
_ACTIVATABLE = frozenset({SandboxStatus.CREATED, SandboxStatus.ROLLED_BACK})
_BLOCKS_PLAN_COMMIT = frozenset({SandboxStatus.ROLLED_BACK, SandboxStatus.ERRORED})


_TRANSITIONS: dict[SandboxStatus, frozenset[SandboxStatus]] = {
    SandboxStatus.PENDING: frozenset(
        {SandboxStatus.CREATED, SandboxStatus.ERRORED, SandboxStatus.CLEANED_UP}
    ),
    SandboxStatus.CREATED: frozenset(
        {SandboxStatus.ACTIVE, SandboxStatus.ERRORED, SandboxStatus.CLEANED_UP}
    ),
    SandboxStatus.ACTIVE: frozenset(
        {
            SandboxStatus.COMMITTED,
            SandboxStatus.ROLLED_BACK,
            SandboxStatus.ERRORED,
            SandboxStatus.CLEANED_UP,
        }
    ),
    SandboxStatus.COMMITTED: frozenset(
        {SandboxStatus.CLEANED_UP, SandboxStatus.ROLLED_BACK, SandboxStatus.ERRORED}
    ),
    SandboxStatus.ROLLED_BACK: frozenset(
        {SandboxStatus.ACTIVE, SandboxStatus.CLEANED_UP, SandboxStatus.ERRORED}
    ),
    SandboxStatus.ERRORED: frozenset({SandboxStatus.CLEANED_UP}),
    SandboxStatus.CLEANED_UP: frozenset(),
}
