"""The sandbox lifecycle state machine (seed 002, "Lifecycle" and "Status Transition Validation").

``PENDING -> CREATED -> ACTIVE -> COMMITTED -> CLEANED_UP``,
``ACTIVE -> ROLLED_BACK -> ACTIVE | CLEANED_UP``, ``CREATED -> ERRORED -> CLEANED_UP``.
Two edges the seed's scenarios rely on are added: ``COMMITTED -> ROLLED_BACK`` (rollback from
COMMITTED "where the strategy can"), and ``* -> ERRORED`` from every live state, because an
unexpected I/O failure in commit or rollback marks the sandbox errored (seed 003, "Commit wraps
OSError into SandboxCommitError").
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
            raise SandboxStateError(
                f"Invalid status transition: {current.value} -> {target.value}"
            )

    @property
    def is_terminal(self) -> bool:
        """True for states the manager treats as finished (``cleanup_abandoned`` candidates)."""
        return self in (
            SandboxStatus.COMMITTED,
            SandboxStatus.ROLLED_BACK,
            SandboxStatus.ERRORED,
        )


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
