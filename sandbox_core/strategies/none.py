"""``NoSandbox``: pass-through, writes go straight to the original (seed 002, "NoSandbox").

It bypasses all isolation: writes are immediately permanent and cannot be rolled back, so
``rollbackable`` is False and a warning is logged at creation.
"""

from __future__ import annotations

from sandbox_core.base import BaseSandbox, logger
from sandbox_core.protocol import CommitResult, SandboxContext


class NoSandbox(BaseSandbox):
    """Pass-through strategy ``none``: ``get_path`` resolves inside the original itself."""

    strategy = "none"
    rollbackable = False

    def _do_create(self, plan_id: str) -> SandboxContext:
        logger.warning(
            "NoSandbox for resource %s: writes to %s are immediate and cannot be rolled back",
            self.resource_id,
            self.original_path,
        )
        return SandboxContext(
            sandbox_id=self.sandbox_id,
            sandbox_path=self.original_path,
            original_path=self.original_path,
            resource_id=self.resource_id,
            plan_id=plan_id,
            metadata={"strategy": self.strategy, "isolation": "none"},
        )

    def _do_commit(self, message: str | None) -> CommitResult:
        # Writes already landed; a commit only records that the plan accepted them.
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            metadata={"strategy": self.strategy, "message": message} if message else {},
        )

    def _do_rollback(self) -> None:
        # Seed 000 rolls back "none" sandboxes in batch without error: nothing was kept to undo,
        # so rollback of an ACTIVE pass-through is a recorded no-op.
        logger.warning(
            "NoSandbox %s rolled back: writes already made to %s are not undone",
            self.sandbox_id,
            self.original_path,
        )

    def _do_cleanup(self) -> None:
        """Nothing was created, and the original is never removed."""
