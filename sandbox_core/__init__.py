"""sandbox_core: isolated, reviewable, all-or-nothing writes for plan executions.

The public API (seed 002). Everything importable from here is stable; modules whose name starts
with an underscore are private.
"""

from sandbox_core._dsn import redact as redact_dsn
from sandbox_core._dsn import secrets_of as dsn_secrets
from sandbox_core._fs_utils import backup_directory, compute_diff, safe_restore
from sandbox_core.base import BaseSandbox
from sandbox_core.boundary import Resource, ResourceRegistry
from sandbox_core.checkpoint import Checkpointable, CheckpointManager, SandboxCheckpoint
from sandbox_core.errors import (
    AtomicCommitError,
    ChangedSinceApprovalError,
    PlanRerunRequiredError,
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxRollbackError,
    SandboxStateError,
    SandboxStatementError,
    TwoPhaseUnavailableError,
)
from sandbox_core.factory import SandboxFactory, SandboxStrategy
from sandbox_core.journal import CommitJournal, FileCommitJournal, JournalState
from sandbox_core.manager import SandboxManager
from sandbox_core.paths import resolve_inside
from sandbox_core.protocol import (
    ChangeSummary,
    CommitResult,
    PreparedCommit,
    Sandbox,
    SandboxContext,
)
from sandbox_core.review import PlanReview, plan_digest, review_plan
from sandbox_core.status import SandboxStatus
from sandbox_core.store import SandboxStore
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.strategies.git_worktree import GitWorktreeSandbox
from sandbox_core.strategies.none import NoSandbox
from sandbox_core.strategies.overlay import OverlaySandbox
from sandbox_core.strategies.transaction import TransactionSandbox
from sandbox_core.two_phase import TwoPhasePlanCommit

__all__ = [
    "AtomicCommitError",
    "BaseSandbox",
    "ChangeSummary",
    "ChangedSinceApprovalError",
    "CheckpointManager",
    "Checkpointable",
    "CommitJournal",
    "CommitResult",
    "CopyOnWriteSandbox",
    "FileCommitJournal",
    "GitWorktreeSandbox",
    "JournalState",
    "NoSandbox",
    "OverlaySandbox",
    "PlanRerunRequiredError",
    "PlanReview",
    "PreparedCommit",
    "Resource",
    "ResourceRegistry",
    "Sandbox",
    "SandboxCheckpoint",
    "SandboxCommitError",
    "SandboxContext",
    "SandboxCreationError",
    "SandboxError",
    "SandboxFactory",
    "SandboxManager",
    "SandboxRollbackError",
    "SandboxStateError",
    "SandboxStatementError",
    "SandboxStatus",
    "SandboxStore",
    "SandboxStrategy",
    "TransactionSandbox",
    "TwoPhasePlanCommit",
    "TwoPhaseUnavailableError",
    "backup_directory",
    "compute_diff",
    "dsn_secrets",
    "plan_digest",
    "redact_dsn",
    "resolve_inside",
    "review_plan",
    "safe_restore",
]
