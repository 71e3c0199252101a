"""Trees at the kernel's path limits, for every strategy and mode: an original whose deepest
path is exactly PATH_MAX - 1 bytes (4095) in the longer of the original and the sandbox view,
with names of NAME_MAX (255) bytes, the edit made deep in it, and the state compared after
commit and rollback (what git_worktree keeps, for it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_core import GitWorktreeSandbox
from sandbox_core.strategies.base import BaseSandbox
from tests.support.directory_sandboxes import STRATEGIES, new_sandbox
from tests.support.fidelity_tree import tree_state
from tests.support.gitrepo import git, make_repo

PATH_MAX = 4096  # bytes with the terminating NUL (linux/limits.h)
NAME_MAX = 255


def _chain(room: int) -> list[str]:
    """Directory names (of up to NAME_MAX bytes) whose joined length with separators is exactly
    ``room`` bytes, counting a leading ``/``."""
    parts: list[str] = []
    while room > 0:
        size = min(NAME_MAX, room - 1)
        if room - 1 - size == 1:  # a last part of 0 bytes is impossible: leave 2 for it
            size -= 1
        parts.append(f"D{len(parts):02d}".ljust(size, "x")[:size])
        room -= size + 1
    return parts


def _view_length(kind: str, src: Path, root: Path) -> int:
    """Length of the view path a sandbox of ``src`` gets under ``root`` (ids are fixed length)."""
    probe = long_sandbox(kind, src, root)
    probe.create("long")
    try:
        return len(os.fsencode(probe.get_path("")))
    finally:
        probe.cleanup()


def long_sandbox(kind: str, src: Path, root: Path) -> BaseSandbox:
    if kind == "git_worktree":
        return GitWorktreeSandbox("res", str(src), sandbox_root=str(root))
    return new_sandbox(kind, src, root)


def deep_original(kind: str, tmp_path: Path, longer: str = "view") -> tuple[Path, Path, list[str]]:
    """``(src, root, parts)``: an original whose directory ``parts`` leave exactly room for a
    NAME_MAX name below them in the longer of the original and the view (the deepest path is
    4095 bytes), holding ``f`` there. ``longer``: which of the two is the longer path."""
    src, root = tmp_path / "src", tmp_path / "r"
    if longer == "original":
        src = tmp_path / ("o" * 200) / ("o" * 200) / "src"
        src.parent.mkdir(parents=True)
    if kind == "git_worktree":
        make_repo(src, {"a.txt": "a\n"})
    else:
        src.mkdir()
        (src / "a.txt").write_text("a\n")
    longest = max(len(os.fsencode(src)), _view_length(kind, src, root))
    parts = _chain(PATH_MAX - 1 - longest - 1 - NAME_MAX)
    deep = src.joinpath(*parts)
    deep.mkdir(parents=True)
    (deep / "f").write_text("old\n")
    (deep / ("n" * NAME_MAX)).write_text("long name\n")
    if kind == "git_worktree":
        git(src, "add", "-A")
        git(src, "commit", "-qm", "deep")
    return src, root, parts


def deep_edit(view: Path, parts: list[str]) -> None:
    deep = view.joinpath(*parts)
    (deep / "f").write_text("new\n")
    (deep / ("g" * NAME_MAX)).write_text("added\n")
    (deep / ("n" * NAME_MAX)).unlink()
    assert len(os.fsencode(deep / ("g" * NAME_MAX))) <= PATH_MAX - 1


KINDS = [*STRATEGIES, pytest.param("git_worktree", id="git_worktree")]


def long_state(root: Path, exclude: set[bytes]) -> dict[bytes, object]:
    if not exclude:
        return dict(tree_state(root, top=True))
    # git_worktree keeps content, links and the executable bit only (docs/fidelity.md).
    state = tree_state(root)
    return {
        rel: {k: v for k, v in entry.items() if k in ("kind", "content", "target")}
        for rel, entry in state.items()
        if rel.split(b"/")[0] not in exclude
    }
