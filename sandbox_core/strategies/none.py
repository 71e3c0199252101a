"""``NoSandbox``: pass-through, writes go straight to the original (seed 002, "NoSandbox").

It bypasses all isolation: writes are immediately permanent and cannot be rolled back, so
``rollbackable`` is False and a warning is logged at creation.

Two-phase plan commit: review, prepare and apply are trivial, since the writes
already went to the original. ``prepares_durably`` is True: ``prepare`` stages nothing and holds
nothing in this process, so a crash loses nothing and a fresh process can apply or abort from
the txid alone; the sandbox therefore never takes the last-resource slot (which stays free for a
SQLite participant). What two phases cannot do for it: its writes are visible before the
decision and stay when the plan is aborted (the plan's review shows it with no paths).

Control paths: the actor's file routes refuse ``.git`` here as everywhere; a command may still
write one straight into the original. A commit (and a prepare) of an original that had no
``.git`` at create and has one now is refused (``SandboxCommitError`` naming it), so the plan
never accepts a repository it did not start with.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from sandbox_core.errors import SandboxCommitError
from sandbox_core.protocol import ChangeSummary, CommitResult, PreparedCommit, SandboxContext
from sandbox_core.strategies.base import BaseSandbox, logger


class NoSandbox(BaseSandbox):
    """Pass-through strategy ``none``: ``get_path`` resolves inside the original itself."""

    strategy = "none"
    rollbackable = False
    prepares_durably = True
    undoes_resource_faults = True  # it writes nothing of its own
    locks_original = False  # its commit writes nothing: the writes already landed

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
            metadata={
                "strategy": self.strategy,
                "isolation": "none",
                "had_git": _has_git(self.original_path),
            },
        )

    def _refuse_new_repository(self) -> None:
        """A ``.git`` the original did not have at create is never accepted by a commit.

        Raises:
            SandboxCommitError: naming the path (``conflicts``: ``[".git"]``).
        """
        metadata = self.context.metadata if self.context is not None else {}
        had = metadata.get("had_git", True)  # a record of an older version: not known
        if not had and _has_git(self.original_path):
            raise SandboxCommitError(
                f"commit of sandbox {self.sandbox_id} refused: the original "
                f"{self.original_path} gained a control path .git since the sandbox was "
                "created; remove it and commit again",
                conflicts=[".git"],
            )

    def _do_commit(self, message: str | None) -> CommitResult:
        self._refuse_new_repository()
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

    # -- two-phase plan commit: nothing to stage, the writes already landed --------------------

    def _do_review(self) -> ChangeSummary:
        """No change set is kept: the digest names the pass-through itself (stable)."""
        return ChangeSummary(
            sandbox_id=self.sandbox_id,
            resource_id=self.resource_id,
            strategy=self.strategy,
            digest=self._digest(),
        )

    def _do_prepare(self, txid: str, message: str | None) -> PreparedCommit:
        self._refuse_new_repository()
        return PreparedCommit(
            sandbox_id=self.sandbox_id,
            txid=txid,
            digest=self._digest(),
            summary=self._do_review(),
            details={"isolation": "none"},
        )

    def _do_apply_prepared(self, txid: str) -> CommitResult:
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            metadata={"strategy": self.strategy, "txid": txid},
        )

    def _do_abort_prepared(self, txid: str) -> None:
        """Nothing was staged; writes already made are not undone (see the module docstring)."""

    def _digest(self) -> str:
        text = f"none:{self.resource_id}:{self.original_path}"
        return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _has_git(original: str) -> bool:
    """Whether ``original`` holds a ``.git`` entry (any type; a symlink not followed)."""
    return os.path.lexists(Path(original) / ".git")
