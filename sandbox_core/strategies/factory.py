"""``SandboxFactory``: strategy name -> class (seed 002, "Sandbox Strategies")."""

from __future__ import annotations

import threading
from typing import Any

from sandbox_core.errors import SandboxError
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.catalogue import (
    SandboxStrategy,
    is_rollbackable,
    rollbackable_strategies,
)

__all__ = ["SandboxFactory", "SandboxStrategy", "is_rollbackable", "rollbackable_strategies"]


def _builtin_strategies() -> dict[str, type[BaseSandbox]]:
    # Imported here so that importing the factory stays cheap and cycle-free.
    from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
    from sandbox_core.strategies.git_worktree import GitWorktreeSandbox
    from sandbox_core.strategies.none import NoSandbox
    from sandbox_core.strategies.overlay import OverlaySandbox
    from sandbox_core.strategies.transaction import TransactionSandbox

    return {
        SandboxStrategy.GIT_WORKTREE.value: GitWorktreeSandbox,
        SandboxStrategy.COPY_ON_WRITE.value: CopyOnWriteSandbox,
        SandboxStrategy.OVERLAY.value: OverlaySandbox,
        SandboxStrategy.TRANSACTION_ROLLBACK.value: TransactionSandbox,
        SandboxStrategy.NONE.value: NoSandbox,
    }


class SandboxFactory:
    """Instantiates sandboxes by strategy name; users add their own with :meth:`register`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registry: dict[str, type[BaseSandbox]] = _builtin_strategies()

    def register(self, strategy: str, cls: type[BaseSandbox]) -> None:
        """Register (or replace) the class used for ``strategy``.

        Raises:
            ValueError: ``"strategy cannot be empty"``.
        """
        if not strategy:
            raise ValueError("strategy cannot be empty")
        with self._lock:
            self._registry[str(strategy)] = cls

    @property
    def strategies(self) -> list[str]:
        """Registered strategy names, sorted."""
        with self._lock:
            return sorted(self._registry)

    def strategy_class(self, strategy: str) -> type[BaseSandbox]:
        """Class registered for ``strategy``.

        Raises:
            ValueError: ``"Unknown sandbox strategy: <name>"``.
        """
        with self._lock:
            cls = self._registry.get(str(strategy))
        if cls is None:
            raise ValueError(f"Unknown sandbox strategy: {strategy}")
        return cls

    def create(
        self, strategy: str, resource_id: str, original_path: str, **options: Any
    ) -> BaseSandbox:
        """Build a PENDING sandbox; call ``.create(plan_id)`` on it to initialise it.

        Raises:
            ValueError: unknown strategy, or empty ``resource_id`` / ``original_path``.
        """
        return self.strategy_class(strategy)(resource_id, original_path, **options)

    def reopen(self, record: dict[str, Any]) -> BaseSandbox:
        """Rebuild a sandbox from ``BaseSandbox.to_record()`` output (operator restarts).

        Raises:
            SandboxError: the record names an unknown strategy or is malformed.
        """
        try:
            cls = self.strategy_class(str(record.get("strategy")))
        except ValueError as exc:
            raise SandboxError(str(exc)) from exc
        return cls.reopen(record)
