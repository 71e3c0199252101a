"""Paths at the kernel's limits in every strategy and mode (issue 7, docs/fidelity.md "Long
paths"): absolute paths of up to PATH_MAX - 1 bytes (4095) and names of NAME_MAX (255) bytes in
the original or the sandbox view are created, committed (one-shot and two-phase), rolled back,
checkpointed, restored and cleaned up like any other path, although the product's own working
paths beside them (stage mirrors, backups, staging areas) are longer. A tree the product cannot
name at all (a path of PATH_MAX bytes or more in the original or the view) is refused up front
naming it; never ERRORED with the edits stuck, never a half-written original.

The inputs come from the rsync report of temp paths past MAXPATHLEN under deep directories
(https://github.com/oferchen/rsync/pull/6905).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxCommitError, SandboxCreationError, SandboxError
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from tests.support.fidelity_tree import differences
from tests.support.gitrepo import GIT_ENV, git, make_repo
from tests.support.long_paths import (
    KINDS,
    PATH_MAX,
    _chain,
    deep_edit,
    deep_original,
    long_sandbox,
    long_state,
)

TXID = "long.1"


def _land(sandbox: BaseSandbox, two_phase: bool) -> None:
    if two_phase:
        sandbox.prepare(TXID)
        sandbox.apply_prepared(TXID)
    else:
        sandbox.commit()


def _leftovers(src: Path) -> list[str]:
    left = [n for n in os.listdir(src.parent) if n.startswith(f".{src.name}.")]
    return left + [n for n in os.listdir(src) if n.startswith(".sandbox-staging-")]


@pytest.fixture
def identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


two_phase_or_not = pytest.mark.parametrize("two_phase", [False, True], ids=["one-shot", "2pc"])


@pytest.fixture
def made() -> Iterator[list[BaseSandbox]]:
    sandboxes: list[BaseSandbox] = []
    yield sandboxes
    for sandbox in sandboxes:
        sandbox.cleanup()


@pytest.mark.parametrize("kind", KINDS)
@two_phase_or_not
@pytest.mark.parametrize("longer", ["view", "original"])
def test_commit_and_rollback_of_paths_at_path_max(
    tmp_path: Path,
    kind: str,
    two_phase: bool,
    longer: str,
    identity: None,
    made: list[BaseSandbox],
) -> None:
    """A file of a 4095-byte path changed, one added and one removed under NAME_MAX names:
    commit lands exactly the view, rollback restores exactly the tree before; the sandbox never
    ends ERRORED and leaves nothing beside the original. (Found: the overlay kernel one-shot
    commit failed with ENAMETOOLONG in its stage mirror, a longer path than the view's, and
    left the sandbox ERRORED.)"""
    src, root, parts = deep_original(kind, tmp_path, longer)
    sandbox = long_sandbox(kind, src, root)
    made.append(sandbox)
    sandbox.create("long")
    view = Path(sandbox.get_path(""))
    deep_edit(view, parts)
    exclude = {b".git"} if kind == "git_worktree" else set()
    before = long_state(src, exclude)
    intended = long_state(view, exclude)
    _land(sandbox, two_phase)
    assert sandbox.status is SandboxStatus.COMMITTED
    assert differences(long_state(src, exclude), intended) == []
    assert _leftovers(src) == []
    sandbox.rollback()
    assert differences(long_state(src, exclude), before) == []
    assert _leftovers(src) == []
    sandbox.cleanup()
    assert not root.exists() or not any(root.rglob("*"))


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_and_restore_of_paths_at_path_max(
    tmp_path: Path, kind: str, identity: None, made: list[BaseSandbox]
) -> None:
    """A checkpoint taken with a 4095-byte path in the view is restored exactly and the restored
    view commits."""
    src, root, parts = deep_original(kind, tmp_path)
    sandbox = long_sandbox(kind, src, root)
    made.append(sandbox)
    sandbox.create("long")
    view = Path(sandbox.get_path(""))
    deep_edit(view, parts)
    exclude = {b".git"} if kind == "git_worktree" else set()
    intended = long_state(view, exclude)
    checkpoints = CheckpointManager(state_dir=tmp_path / "s")
    try:
        checkpoint = checkpoints.create_checkpoint(sandbox, "long", "pre")  # type: ignore[arg-type]
    except SandboxError as exc:
        # The snapshot's own path is longer than the view's: refused, nothing recorded, the
        # sandbox keeps its status and edits and still commits (docs/fidelity.md).
        assert kind != "git_worktree" and "too long" in str(exc)
        assert checkpoints.list_checkpoints(sandbox.sandbox_id) == []
        assert not any((tmp_path / "s").rglob("*snapshot*"))
        assert sandbox.status is SandboxStatus.ACTIVE
        assert differences(long_state(view, exclude), intended) == []
        sandbox.commit()
        assert differences(long_state(src, exclude), intended) == []
        return
    (view.joinpath(*parts) / "f").write_text("lost\n")
    (view / "later.txt").write_text("lost\n")
    assert checkpoints.rollback_to(checkpoint)
    assert differences(long_state(view, exclude), intended) == []
    sandbox.commit()
    assert differences(long_state(src, exclude), intended) == []
    checkpoints.delete_checkpoint(checkpoint.checkpoint_id)


def _make_beyond(top: Path, parts: list[str], name: str) -> None:
    """Make ``top/parts.../name`` (a path that may be longer than PATH_MAX) walking by dir fd."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            os.mkdir(part, dir_fd=fd)
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        file_fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(file_fd, b"deep\n")
        os.close(file_fd)
    finally:
        os.close(fd)


def _remove_beyond(top: Path) -> None:
    """``shutil.rmtree`` walks by dir fd, so it removes paths longer than PATH_MAX."""
    shutil.rmtree(top)


def _read_beyond(top: Path, parts: list[str], name: str) -> bytes:
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        file_fd = os.open(name, os.O_RDONLY, dir_fd=fd)
        try:
            return os.read(file_fd, 100)
        finally:
            os.close(file_fd)
    finally:
        os.close(fd)


def _new_original(kind: str, src: Path) -> None:
    if kind == "git_worktree":
        make_repo(src, {"a.txt": "a\n"})
    else:
        src.mkdir()
        (src / "a.txt").write_text("a\n")


@pytest.mark.parametrize("kind", KINDS)
def test_an_original_holding_a_path_beyond_path_max(
    tmp_path: Path, kind: str, identity: None
) -> None:
    """An original holding a path no string can name (longer than PATH_MAX, made by dir fd).
    git cannot track it, so in a repository it is an untracked path that commit and rollback
    keep; the directory strategies refuse it at create, naming it: original untouched, nothing left
    behind (a sandbox could not show it)."""
    src = tmp_path / "src"
    _new_original(kind, src)
    parts = _chain(PATH_MAX + 100)
    _make_beyond(src, parts, "f")  # git cannot track it: untracked in a repository
    root = tmp_path / "r"
    sandbox = long_sandbox(kind, src, root)
    try:
        if kind == "git_worktree":
            sandbox.create("long")
            view = Path(sandbox.get_path(""))
            (view / "a.txt").write_text("A\n")
            sandbox.commit()
            assert (src / "a.txt").read_text() == "A\n"
            assert _read_beyond(src, parts, "f") == b"deep\n"
            sandbox.rollback()
            assert (src / "a.txt").read_text() == "a\n"
        else:
            with pytest.raises(SandboxCreationError, match="too long") as refused:
                sandbox.create("long")
            assert "D00" in str(refused.value)
            assert (src / "a.txt").read_text() == "a\n"
            assert _read_beyond(src, parts, "f") == b"deep\n"
            assert _leftovers(src) == []
    finally:
        sandbox.cleanup()
        assert [p for p in root.rglob("*") if not p.is_dir()] == []
        _remove_beyond(src)


@pytest.mark.parametrize("kind", KINDS)
@two_phase_or_not
def test_a_path_beyond_path_max_made_in_the_view(
    tmp_path: Path, kind: str, two_phase: bool, identity: None, made: list[BaseSandbox]
) -> None:
    """A path longer than PATH_MAX made inside the view (by dir fd): every strategy refuses
    ``commit`` and ``prepare`` before anything is written, naming it (``conflicts``); the
    sandbox stays ACTIVE with its edits and commits once the path is gone. (Found: the
    directory strategies' one-shot commit left the sandbox ERRORED; git_worktree's ``add -A``
    only warned, and the commit left the path out silently.)"""
    src = tmp_path / "src"
    _new_original(kind, src)
    sandbox = long_sandbox(kind, src, tmp_path / "r")
    made.append(sandbox)
    sandbox.create("long")
    view = Path(sandbox.get_path(""))
    (view / "a.txt").write_text("A\n")
    parts = _chain(PATH_MAX + 100)
    _make_beyond(view, parts, "f")
    keep = {b".git"} if kind == "git_worktree" else set()
    head = git(src, "rev-parse", "HEAD") if kind == "git_worktree" else None
    before = long_state(src, keep)
    with pytest.raises(SandboxCommitError, match="PATH_MAX") as refused:
        _land(sandbox, two_phase)
    assert refused.value.conflicts and refused.value.conflicts[0].startswith("D00")
    assert sandbox.status is SandboxStatus.ACTIVE
    assert long_state(src, keep) == before
    if head is not None:
        assert git(src, "rev-parse", "HEAD") == head
    assert _leftovers(src) == []
    _remove_beyond(view / parts[0])
    _land(sandbox, two_phase)
    assert (src / "a.txt").read_text() == "A\n"
