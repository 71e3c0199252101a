"""Placeholder until the git_worktree strategy lands (being written now)."""

from __future__ import annotations

from sandbox_core.base import BaseSandbox


class GitWorktreeSandbox(BaseSandbox):
    """git_worktree strategy (in progress)."""

    strategy = "git_worktree"
