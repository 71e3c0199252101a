"""Every strategy's original, the edit made in a sandbox of it, and everything a cleaned-up plan
could leave behind (sandbox root, state directory, git refs and worktrees), for the tests that
check that cleanup leaves nothing and that a plan never lands half.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tests.support.gitrepo import git, make_repo

# (strategy, options): overlay in both modes (kernel only where the process may mount).
CASES = [
    ("git_worktree", {}),
    ("copy_on_write", {}),
    ("overlay", {"mode": "fallback"}),
    ("overlay", {"mode": "auto"}),
    ("transaction_rollback", {}),
    ("none", {}),
]
IDS = ["git_worktree", "copy_on_write", "overlay-fallback", "overlay-auto", "sqlite", "none"]


def make_original(tmp_path: Path, strategy: str) -> Path:
    if strategy == "git_worktree":
        return make_repo(tmp_path / "orig", {"v": "0\n"})
    if strategy == "transaction_rollback":
        path = tmp_path / "orig.db"
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE notes (body TEXT)")
        connection.close()
        return path
    path = tmp_path / "orig"
    path.mkdir()
    (path / "v").write_text("0\n")
    return path


def edit(strategy: str, sandbox: Any) -> None:
    if strategy == "transaction_rollback":
        sandbox.execute("INSERT INTO notes VALUES ('1')")
    else:
        Path(sandbox.get_path("v")).write_text("1\n")


def leftovers(tmp_path: Path, original: Path) -> dict[str, Any]:
    """Everything a cleaned-up plan could have left behind; all empty when clean."""
    root, state = tmp_path / "sbx", tmp_path / "state"
    found: dict[str, Any] = {
        "sandbox root": sorted(p.name for p in root.iterdir()) if root.is_dir() else [],
        "records": sorted(p.name for p in (state / "sandboxes").glob("*")),
        "journals": sorted(p.name for p in (state / "journals").glob("*")),
        "checkpoints": sorted(p.name for p in (state / "checkpoints").glob("*/*")),
    }
    if (original / ".git").exists():
        found["branches"] = git(original, "branch", "--list", "sandbox/*")
        found["tags"] = git(original, "tag", "--list", "sandbox/*")
        found["worktrees"] = git(original, "worktree", "list", "--porcelain").count("worktree ")
        found["worktrees"] -= 1  # the main worktree
    return {key: value for key, value in found.items() if value}
