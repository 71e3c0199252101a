"""Helpers of the actor's file and SQL tests: one sandbox of every strategy made locally (real
git repository, real directories, a real OverlayFS mount, a real SQLite file), opened through
:class:`~sandbox_core.actor.door.ActorDoor` with its audit log in the test's directory
(:func:`opened_sandbox`; ``tests/core/actor/test_files.py`` makes it its ``opened`` fixture)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_core.actor.door import ActorDoor
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.factory import SandboxFactory
from tests.support.gitrepo import make_repo

# Every strategy, with the overlay in both of its modes.
KINDS = [
    pytest.param("git_worktree", id="git_worktree"),
    pytest.param("copy_on_write", id="copy_on_write"),
    pytest.param("overlay-kernel", id="overlay-kernel", marks=pytest.mark.overlay_kernel),
    pytest.param("overlay-fallback", id="overlay-fallback"),
    pytest.param("none", id="none"),
    pytest.param("transaction_rollback", id="transaction_rollback"),
]
# The strategies whose root is a tree the original's files are in.
TREE_KINDS = [p for p in KINDS if p.id != "transaction_rollback"]
BASE_FILES = {"f.txt": "base\n", "d/g.txt": "g one\ng two\n"}


@dataclass
class Opened:
    """A sandbox of one strategy, its door, its original and the test's outside directory."""

    kind: str
    sandbox: BaseSandbox
    door: ActorDoor
    original: Path
    outside: Path
    audit: Path


def make_sandbox(kind: str, work: Path) -> tuple[BaseSandbox, Path]:
    """An ACTIVE sandbox of ``kind`` over a new original in ``work``."""
    root = work / "sandboxes"
    if kind == "transaction_rollback":
        original = work / "db.sqlite"
        with sqlite3.connect(original) as connection:
            connection.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)")
        sandbox = SandboxFactory().create(kind, "res", str(original), sandbox_root=str(root))
    elif kind == "git_worktree":
        original = make_repo(work / "orig", BASE_FILES)
        sandbox = SandboxFactory().create(kind, "res", str(original), sandbox_root=str(root))
    else:
        original = work / "orig"
        for name, text in BASE_FILES.items():
            (original / name).parent.mkdir(parents=True, exist_ok=True)
            (original / name).write_text(text)
        strategy, _, mode = kind.partition("-")
        options = {"mode": mode} if mode else {}
        sandbox = SandboxFactory().create(
            strategy, "res", str(original), sandbox_root=str(root), **options
        )
    sandbox.create("plan-actor")
    sandbox.activate()
    return sandbox, original


@contextmanager
def opened_sandbox(kind: str, work: Path) -> Iterator[Opened]:
    """:class:`Opened` for the strategy id ``kind`` in ``work``; cleaned up on exit."""
    sandbox, original = make_sandbox(kind, work)
    outside = work / "outside"
    outside.mkdir()
    (outside / "secret").write_text("OUTSIDE\n")
    audit = work / "audit"
    try:
        yield Opened(kind, sandbox, ActorDoor(sandbox, audit), original, outside, audit)
    finally:
        sandbox.cleanup()
