"""sandbox_core: isolated, reviewable, all-or-nothing writes for plan executions.

The public API (seed 002). Everything importable from here is stable; modules whose name starts
with an underscore are private.

The names are resolved lazily (PEP 562): ``from sandbox_core import SandboxStatus`` loads the
status module alone, not every strategy with GitPython and psycopg behind it. A name's module is
imported on first access, then the name is cached in this module's namespace.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox_core.boundary import Resource, ResourceRegistry
    from sandbox_core.errors import (
        AtomicCommitError,
        ChangedSinceApprovalError,
        PlanRerunRequiredError,
        SandboxCommitError,
        SandboxCreationError,
        SandboxError,
        SandboxForkError,
        SandboxRollbackError,
        SandboxStateError,
        SandboxStatementError,
        TwoPhaseUnavailableError,
    )
    from sandbox_core.host.manager import SandboxManager
    from sandbox_core.host.store import SandboxStore
    from sandbox_core.paths import resolve_inside
    from sandbox_core.plan.journal import CommitJournal, FileCommitJournal, JournalState
    from sandbox_core.plan.review import PlanReview, plan_digest, review_plan
    from sandbox_core.plan.two_phase import TwoPhasePlanCommit
    from sandbox_core.protocol import (
        ChangeSummary,
        CommitResult,
        ForkSource,
        PreparedCommit,
        Sandbox,
        SandboxContext,
    )
    from sandbox_core.redaction import redact as redact_dsn
    from sandbox_core.redaction import secrets_of as dsn_secrets
    from sandbox_core.status import SandboxStatus
    from sandbox_core.strategies.base import BaseSandbox
    from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
    from sandbox_core.strategies.factory import SandboxFactory, SandboxStrategy
    from sandbox_core.strategies.git_worktree import GitWorktreeSandbox
    from sandbox_core.strategies.none import NoSandbox
    from sandbox_core.strategies.overlay import OverlaySandbox
    from sandbox_core.strategies.transaction import TransactionSandbox
    from sandbox_core.tree.ops import backup_directory, safe_restore
    from sandbox_core.tree.textdiff import compute_diff

# Public name -> (module, attribute in that module).
_EXPORTS: dict[str, tuple[str, str]] = {
    "AtomicCommitError": ("sandbox_core.errors", "AtomicCommitError"),
    "backup_directory": ("sandbox_core.tree.ops", "backup_directory"),
    "BaseSandbox": ("sandbox_core.strategies.base", "BaseSandbox"),
    "ChangedSinceApprovalError": ("sandbox_core.errors", "ChangedSinceApprovalError"),
    "ChangeSummary": ("sandbox_core.protocol", "ChangeSummary"),
    "Checkpointable": ("sandbox_core.host.checkpoint", "Checkpointable"),
    "CheckpointManager": ("sandbox_core.host.checkpoint", "CheckpointManager"),
    "CommitJournal": ("sandbox_core.plan.journal", "CommitJournal"),
    "CommitResult": ("sandbox_core.protocol", "CommitResult"),
    "compute_diff": ("sandbox_core.tree.textdiff", "compute_diff"),
    "CopyOnWriteSandbox": ("sandbox_core.strategies.copy_on_write", "CopyOnWriteSandbox"),
    "dsn_secrets": ("sandbox_core.redaction", "secrets_of"),
    "FileCommitJournal": ("sandbox_core.plan.journal", "FileCommitJournal"),
    "ForkSource": ("sandbox_core.protocol", "ForkSource"),
    "GitWorktreeSandbox": ("sandbox_core.strategies.git_worktree", "GitWorktreeSandbox"),
    "JournalState": ("sandbox_core.plan.journal", "JournalState"),
    "NoSandbox": ("sandbox_core.strategies.none", "NoSandbox"),
    "OverlaySandbox": ("sandbox_core.strategies.overlay", "OverlaySandbox"),
    "plan_digest": ("sandbox_core.plan.review", "plan_digest"),
    "PlanRerunRequiredError": ("sandbox_core.errors", "PlanRerunRequiredError"),
    "PlanReview": ("sandbox_core.plan.review", "PlanReview"),
    "PreparedCommit": ("sandbox_core.protocol", "PreparedCommit"),
    "redact_dsn": ("sandbox_core.redaction", "redact"),
    "resolve_inside": ("sandbox_core.paths", "resolve_inside"),
    "Resource": ("sandbox_core.boundary", "Resource"),
    "ResourceRegistry": ("sandbox_core.boundary", "ResourceRegistry"),
    "review_plan": ("sandbox_core.plan.review", "review_plan"),
    "safe_restore": ("sandbox_core.tree.ops", "safe_restore"),
    "Sandbox": ("sandbox_core.protocol", "Sandbox"),
    "SandboxCheckpoint": ("sandbox_core.host.checkpoint", "SandboxCheckpoint"),
    "SandboxCommitError": ("sandbox_core.errors", "SandboxCommitError"),
    "SandboxContext": ("sandbox_core.protocol", "SandboxContext"),
    "SandboxCreationError": ("sandbox_core.errors", "SandboxCreationError"),
    "SandboxError": ("sandbox_core.errors", "SandboxError"),
    "SandboxFactory": ("sandbox_core.strategies.factory", "SandboxFactory"),
    "SandboxForkError": ("sandbox_core.errors", "SandboxForkError"),
    "SandboxManager": ("sandbox_core.host.manager", "SandboxManager"),
    "SandboxRollbackError": ("sandbox_core.errors", "SandboxRollbackError"),
    "SandboxStateError": ("sandbox_core.errors", "SandboxStateError"),
    "SandboxStatementError": ("sandbox_core.errors", "SandboxStatementError"),
    "SandboxStatus": ("sandbox_core.status", "SandboxStatus"),
    "SandboxStore": ("sandbox_core.host.store", "SandboxStore"),
    "SandboxStrategy": ("sandbox_core.strategies.factory", "SandboxStrategy"),
    "TransactionSandbox": ("sandbox_core.strategies.transaction", "TransactionSandbox"),
    "TwoPhasePlanCommit": ("sandbox_core.plan.two_phase", "TwoPhasePlanCommit"),
    "TwoPhaseUnavailableError": ("sandbox_core.errors", "TwoPhaseUnavailableError"),
}

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
    "ForkSource",
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
    "SandboxForkError",
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


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'sandbox_core' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
