"""Strategy ``git_worktree``: a linked worktree on a fresh branch per sandbox (seed 002).

:class:`GitWorktreeSandbox` lives in :mod:`.sandbox`; :mod:`.git` runs git (:class:`GitCommand`,
:class:`GitFailure`), and is the only module of the core that imports GitPython.
"""

from sandbox_core.strategies.git_worktree.git import GitCommand, GitFailure
from sandbox_core.strategies.git_worktree.sandbox import GitWorktreeSandbox

__all__ = ["GitCommand", "GitFailure", "GitWorktreeSandbox"]
