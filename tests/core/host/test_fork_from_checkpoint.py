"""A sandbox starts from another sandbox's checkpoint (docs/forks.md), in every strategy that
can fork: the fork holds the parent's change up to the checkpoint as its own, its diff is
against the original, what the original changed since the parent was made stays, siblings are
independent and outlive their parent; transaction_rollback and none refuse with nothing kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox_core import SandboxFactory, SandboxForkError, SandboxStatus, SandboxStore
from sandbox_core.host.manager import SandboxManager
from sandbox_core.strategies.catalogue import forkable_strategies
from tests.support.gitrepo import git, make_repo
from tests.support.hygiene import leftovers, make_original

pytestmark = pytest.mark.usefixtures("git_identity")

FORKABLE = [
    ("git_worktree", {}),
    ("copy_on_write", {}),
    ("overlay", {"mode": "fallback"}),
    ("overlay", {"mode": "auto"}),
]
FORKABLE_IDS = ["git_worktree", "copy_on_write", "overlay-fallback", "overlay-auto"]


def _manager(tmp_path: Path) -> SandboxManager:
    store = SandboxStore(tmp_path / "state")
    return SandboxManager(SandboxFactory(), cleanup_on_exit=False, store=store)


def _original(tmp_path: Path, strategy: str) -> Path:
    if strategy == "git_worktree":
        return make_repo(tmp_path / "orig", {"v": "0\n", "keep": "k\n", "gone": "g\n"})
    path = make_original(tmp_path, strategy)
    (path / "keep").write_text("k\n")
    (path / "gone").write_text("g\n")
    return path


def _parent(tmp_path: Path, strategy: str, options: dict[str, Any]) -> tuple[Any, Any, Path]:
    original = _original(tmp_path, strategy)
    manager = _manager(tmp_path)
    parent = manager.get_or_create_sandbox(
        "plan", "parent", str(original), strategy, sandbox_root=str(tmp_path / "sbx"), **options
    )
    parent.activate()
    Path(parent.get_path("v")).write_text("parent\n")
    Path(parent.get_path("gone")).unlink()
    Path(parent.get_path("new")).write_text("added\n")
    return manager, parent, original


@pytest.mark.parametrize(("strategy", "options"), FORKABLE, ids=FORKABLE_IDS)
def test_three_forks_start_from_the_checkpoint_and_diff_against_the_original(
    tmp_path: Path, strategy: str, options: dict[str, Any]
) -> None:
    manager, parent, original = _parent(tmp_path, strategy, options)
    checkpoint = manager.checkpoints.create_checkpoint(parent, "plan", "explore")
    Path(parent.get_path("v")).write_text("after the checkpoint\n")

    forks = [manager.fork_sandbox("plan", f"try-{n}", checkpoint.checkpoint_id) for n in range(3)]

    for n, fork in enumerate(forks):
        assert fork.status is SandboxStatus.CREATED
        assert fork.context.metadata["forked_from"] == {
            "sandbox_id": parent.sandbox_id,
            "checkpoint_id": checkpoint.checkpoint_id,
        }
        fork.activate()
        assert Path(fork.get_path("v")).read_text() == "parent\n"
        assert Path(fork.get_path("new")).read_text() == "added\n"
        assert not Path(fork.get_path("gone")).exists()
        Path(fork.get_path(f"only-{n}")).write_text(f"{n}\n")
        review = fork.review()
        assert set(review.changed) == {"v"}
        assert set(review.added) == {"new", f"only-{n}"}
        assert set(review.deleted) == {"gone"}
    assert (original / "v").read_text() == "0\n"  # the original untouched by forking

    # Siblings are independent: committing one lands exactly its change.
    result = forks[1].commit()
    assert result.success
    assert (original / "v").read_text() == "parent\n"
    assert (original / "only-1").read_text() == "1\n"
    assert not (original / "only-0").exists()
    assert not (original / "gone").exists()


@pytest.mark.parametrize(("strategy", "options"), FORKABLE, ids=FORKABLE_IDS)
def test_a_fork_keeps_working_after_its_parent_is_cleaned_up(
    tmp_path: Path, strategy: str, options: dict[str, Any]
) -> None:
    manager, parent, original = _parent(tmp_path, strategy, options)
    checkpoint = manager.checkpoints.create_checkpoint(parent, "plan", "explore")
    fork = manager.fork_sandbox("plan", "try", checkpoint.checkpoint_id)
    parent.cleanup()
    manager.checkpoints.delete_checkpoint(checkpoint.checkpoint_id)

    fork.activate()
    assert fork.commit().success
    assert (original / "v").read_text() == "parent\n"
    assert (original / "new").read_text() == "added\n"

    manager.cleanup_all("plan")
    assert leftovers(tmp_path, original) == {}


@pytest.mark.parametrize(("strategy", "options"), FORKABLE, ids=FORKABLE_IDS)
def test_what_the_original_changed_since_the_parent_stays_in_the_fork(
    tmp_path: Path, strategy: str, options: dict[str, Any]
) -> None:
    manager, parent, original = _parent(tmp_path, strategy, options)
    checkpoint = manager.checkpoints.create_checkpoint(parent, "plan", "explore")
    (original / "keep").write_text("changed in the original\n")
    if strategy == "git_worktree":
        git(original, "commit", "-qam", "someone else's change")

    fork = manager.fork_sandbox("plan", "try", checkpoint.checkpoint_id)
    fork.activate()

    assert Path(fork.get_path("keep")).read_text() == "changed in the original\n"
    assert Path(fork.get_path("v")).read_text() == "parent\n"
    review = fork.review()
    assert "keep" not in review.changed
    assert fork.commit().success
    assert (original / "keep").read_text() == "changed in the original\n"
    assert (original / "v").read_text() == "parent\n"


@pytest.mark.parametrize(
    ("strategy", "options"),
    [("git_worktree", {}), ("copy_on_write", {}), ("overlay", {"mode": "fallback"})],
    ids=["git_worktree", "copy_on_write", "overlay-fallback"],
)
def test_a_fork_overlapping_a_change_of_the_original_is_refused_naming_the_path(
    tmp_path: Path, strategy: str, options: dict[str, Any]
) -> None:
    manager, parent, original = _parent(tmp_path, strategy, options)
    checkpoint = manager.checkpoints.create_checkpoint(parent, "plan", "explore")
    (original / "v").write_text("the original's own\n")
    if strategy == "git_worktree":
        git(original, "commit", "-qam", "someone else's change")

    with pytest.raises(SandboxForkError) as refused:
        manager.fork_sandbox("plan", "try", checkpoint.checkpoint_id)

    assert refused.value.conflicts == ["v"]
    assert manager.get_sandbox("plan", "try") is None
    assert (original / "v").read_text() == "the original's own\n"
    assert sorted(p.name for p in (tmp_path / "state" / "sandboxes").iterdir()) == [
        f"{parent.sandbox_id}.json"
    ]


@pytest.mark.parametrize("strategy", ["transaction_rollback", "none"])
def test_strategies_that_cannot_fork_refuse_with_nothing_kept(
    tmp_path: Path, strategy: str
) -> None:
    original = make_original(tmp_path, strategy)
    manager = _manager(tmp_path)
    parent = manager.get_or_create_sandbox(
        "plan", "parent", str(original), strategy, sandbox_root=str(tmp_path / "sbx")
    )
    parent.activate()
    checkpoint = manager.checkpoints.create_checkpoint(parent, "plan", "explore")

    with pytest.raises(SandboxForkError, match=f"strategy {strategy} cannot start"):
        manager.fork_sandbox("plan", "try", checkpoint.checkpoint_id)

    assert manager.get_sandbox("plan", "try") is None
    assert strategy not in forkable_strategies()


def test_an_unknown_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxForkError, match="checkpoint nope not found"):
        _manager(tmp_path).fork_sandbox("plan", "try", "nope")


def test_a_fork_is_refused_for_a_resource_that_has_an_open_sandbox(tmp_path: Path) -> None:
    manager, parent, _ = _parent(tmp_path, "copy_on_write", {})
    checkpoint = manager.checkpoints.create_checkpoint(parent, "plan", "explore")
    with pytest.raises(ValueError, match="already has an open sandbox for resource parent"):
        manager.fork_sandbox("plan", "parent", checkpoint.checkpoint_id)
