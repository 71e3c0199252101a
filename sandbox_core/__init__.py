"""sandbox_core: isolated, reviewable, all-or-nothing writes for plan executions.

The public API (seed 002). Everything importable from here is stable; modules whose name starts
with an underscore are private.
"""

from sandbox_core.base import BaseSandbox
from sandbox_core.errors import (
    AtomicCommitError,
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxRollbackError,
    SandboxStateError,
)
from sandbox_core.factory import SandboxFactory, SandboxStrategy
from sandbox_core.paths import resolve_inside
from sandbox_core.protocol import CommitResult, Sandbox, SandboxContext
from sandbox_core.status import SandboxStatus
from sandbox_core.store import SandboxStore
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.strategies.git_worktree import GitWorktreeSandbox
from sandbox_core.strategies.none import NoSandbox
from sandbox_core.strategies.overlay import OverlaySandbox
from sandbox_core.strategies.transaction import TransactionSandbox

__all__ = [
    "AtomicCommitError",
    "BaseSandbox",
    "CommitResult",
    "CopyOnWriteSandbox",
    "GitWorktreeSandbox",
    "NoSandbox",
    "OverlaySandbox",
    "Sandbox",
    "SandboxCommitError",
    "SandboxContext",
    "SandboxCreationError",
    "SandboxError",
    "SandboxFactory",
    "SandboxRollbackError",
    "SandboxStateError",
    "SandboxStatus",
    "SandboxStore",
    "SandboxStrategy",
    "TransactionSandbox",
    "resolve_inside",
]
