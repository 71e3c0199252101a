"""The built-in strategies and their traits, as one static table.

Callers that know only a strategy's name (the CRD schema's models, the operator's PlanCommit
journal, the client) ask here instead of importing the strategy classes, so they load no git,
no database driver and no mount code. Each strategy class states the same traits as class
attributes; a test holds the two equal.

Traits (seed 002, "Sandbox Strategies"):

- ``rollbackable``: a COMMITTED sandbox can be undone (git_worktree, copy_on_write, overlay);
  the saga commits these first and compensates them last-in first-out.
- ``directory``: the original is a directory tree (copy_on_write, overlay; the two-phase side
  they share stages a tree beside the original).
- ``forkable``: a new sandbox can start from another sandbox's checkpoint (docs/forks.md):
  git_worktree (the checkpoint's change applied onto the original's HEAD), copy_on_write and
  overlay (the checkpoint's changed paths applied onto a fresh copy or upper layer). Refused for
  transaction_rollback (its checkpoint is a savepoint inside one open database transaction,
  which no other connection can start from) and none (there is nothing to start from).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SandboxStrategy(StrEnum):
    """The built-in strategy names, as used in ``sandbox_strategy`` and the CRD's ``strategy``."""

    GIT_WORKTREE = "git_worktree"
    COPY_ON_WRITE = "copy_on_write"
    OVERLAY = "overlay"
    TRANSACTION_ROLLBACK = "transaction_rollback"
    NONE = "none"


@dataclass(frozen=True)
class StrategyTraits:
    """What a strategy can do, known without importing it."""

    rollbackable: bool
    directory: bool
    forkable: bool = False


CATALOGUE: dict[str, StrategyTraits] = {
    SandboxStrategy.GIT_WORKTREE.value: StrategyTraits(
        rollbackable=True, directory=False, forkable=True
    ),
    SandboxStrategy.COPY_ON_WRITE.value: StrategyTraits(
        rollbackable=True, directory=True, forkable=True
    ),
    SandboxStrategy.OVERLAY.value: StrategyTraits(rollbackable=True, directory=True, forkable=True),
    SandboxStrategy.TRANSACTION_ROLLBACK.value: StrategyTraits(rollbackable=False, directory=False),
    SandboxStrategy.NONE.value: StrategyTraits(rollbackable=False, directory=False),
}


def traits_of(strategy: str) -> StrategyTraits:
    """The traits of built-in ``strategy``.

    Raises:
        ValueError: ``"Unknown sandbox strategy: <name>"``.
    """
    traits = CATALOGUE.get(str(strategy))
    if traits is None:
        raise ValueError(f"Unknown sandbox strategy: {strategy}")
    return traits


def is_rollbackable(strategy: str) -> bool:
    """Whether a COMMITTED sandbox of built-in ``strategy`` can be rolled back (seed 002).

    Raises:
        ValueError: ``"Unknown sandbox strategy: <name>"``.
    """
    return traits_of(strategy).rollbackable


def rollbackable_strategies() -> frozenset[str]:
    """Names of the built-in strategies that :func:`is_rollbackable`."""
    return frozenset(name for name, traits in CATALOGUE.items() if traits.rollbackable)


def forkable_strategies() -> frozenset[str]:
    """Names of the built-in strategies a sandbox can be forked in (``forkable``)."""
    return frozenset(name for name, traits in CATALOGUE.items() if traits.forkable)
