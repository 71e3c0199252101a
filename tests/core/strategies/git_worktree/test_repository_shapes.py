"""git_worktree on repository shapes taken from public fault reports of comparable tools (issue
7; each report is named in the test's docstring): GIT_DIR, GIT_WORK_TREE and GIT_INDEX_FILE
inherited from the environment, eol/autocrlf attributes, a detached HEAD, sparse checkout, a FIFO
in the work tree, a branch checked out in another worktree, repository-controlled programs
(filter drivers, core.fsmonitor, core.hooksPath), a linked worktree of a bare repository and a
repository with a separate git dir. Commit lands the edit, rollback restores it, no program the
repository controls runs, and bystanders are kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_core import GitWorktreeSandbox
from tests.support.fidelity_tree import differences, tree_state
from tests.support.gitrepo import git, make_repo

# -- git: the repository's environment and attributes ----------------------------------------------


def test_git_dir_in_the_environment_does_not_redirect_the_product(
    tmp_path: Path, git_identity: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inherited GIT_DIR/GIT_WORK_TREE/GIT_INDEX_FILE point git at another repository
    (https://github.com/2389-research/tracker/issues/399, "gitSafeEnv leaks GIT_DIR ... can
    corrupt an outer repo's index"; https://github.com/max-sixty/worktrunk/issues/3373). The
    decoy repository stays untouched and the right one gets the commit."""
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    decoy = make_repo(tmp_path / "decoy", {"x": "x\n"})
    decoy_head, decoy_state = git(decoy, "rev-parse", "HEAD"), tree_state(decoy / ".git")
    sandbox = GitWorktreeSandbox("repo", str(repo), sandbox_root=str(tmp_path / "root"))
    monkeypatch.setenv("GIT_DIR", str(decoy / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(decoy))
    monkeypatch.setenv("GIT_INDEX_FILE", str(decoy / ".git" / "index"))
    try:
        sandbox.create("s14")
        Path(sandbox.get_path("a.txt")).write_text("A\n")
        sandbox.commit()
        assert (repo / "a.txt").read_text() == "A\n"
        sandbox.rollback()
        assert (repo / "a.txt").read_text() == "a\n"
    finally:
        sandbox.cleanup()
        for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
            monkeypatch.delenv(key)
    assert git(decoy, "rev-parse", "HEAD") == decoy_head
    assert differences(tree_state(decoy / ".git"), decoy_state) == []


def _eol_crlf(repo: Path) -> None:
    (repo / ".gitattributes").write_text("*.txt text eol=crlf\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "attrs")
    git(repo, "rm", "-q", "--cached", "-r", ".")
    git(repo, "reset", "-q", "--hard")


def _filter_and_hooks(repo: Path) -> None:
    marks = repo.parent
    (repo / ".gitattributes").write_text("*.txt filter=evil\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "attrs")
    git(repo, "config", "filter.evil.clean", f"sh -c 'touch {marks}/RAN-clean; cat'")
    git(repo, "config", "filter.evil.smudge", f"sh -c 'touch {marks}/RAN-smudge; cat'")
    git(repo, "config", "core.fsmonitor", f"sh -c 'touch {marks}/RAN-fsmonitor'")
    hooks = marks / "hooks"
    hooks.mkdir()
    git(repo, "config", "core.hooksPath", str(hooks))
    for name in ("post-merge", "reference-transaction", "post-checkout", "pre-commit"):
        (hooks / name).write_text(f"#!/bin/sh\ntouch {marks}/RAN-{name}\n")
        (hooks / name).chmod(0o755)
    for ran in marks.glob("RAN-*"):
        ran.unlink()


GIT_SETUPS: dict[str, Callable[[Path], None]] = {
    "eol-crlf-attributes": _eol_crlf,
    "autocrlf": lambda r: git(r, "config", "core.autocrlf", "true") and None,
    "detached-head": lambda r: git(r, "checkout", "-q", "--detach") and None,
    "sparse-checkout": lambda r: git(r, "sparse-checkout", "set", "--no-cone", "/a.txt") and None,
    "filter-fsmonitor-hookspath": _filter_and_hooks,
    "fifo-in-the-work-tree": lambda r: os.mkfifo(r / "fifo"),
    "branch-in-another-worktree": lambda r: (
        git(r, "worktree", "add", "-q", "-b", "other", str(r.parent / "wt2")) and None
    ),
}


def quiet_status(repo: Path) -> str:
    """``git status`` of the tracked files without running the repository's programs (the
    test's own git must not trip the markers the product is checked against)."""
    return git(
        repo, "-c", "core.fsmonitor=false", "-c", "filter.evil.clean=cat",
        "-c", "filter.evil.smudge=cat", "-c", "core.hooksPath=/dev/null",
        "status", "--porcelain", "--untracked-files=no",
    )  # fmt: skip


@pytest.mark.parametrize("setup", sorted(GIT_SETUPS))
def test_git_repository_shapes_commit_and_roll_back(
    tmp_path: Path, git_identity: None, setup: str
) -> None:
    """CRLF/eol attributes (a false "modified" after checkout is the classic autocrlf report),
    detached HEAD, sparse checkout, a FIFO in the work tree, a bystander worktree, and
    repository-controlled code (filter drivers, core.fsmonitor, core.hooksPath: lefthook #1265,
    https://github.com/evilmartians/lefthook/issues/1265). Commit lands the edit with a clean
    status, rollback restores it, no repository-controlled program ran. All pass."""
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "-rf": "dash\n", "sub/s.txt": "s\n"})
    GIT_SETUPS[setup](repo)
    before = tree_state(repo, top=False)
    before.pop(b".git", None)
    sandbox = GitWorktreeSandbox("repo", str(repo), sandbox_root=str(tmp_path / "root"))
    try:
        sandbox.create("s14")
        Path(sandbox.get_path("a.txt")).write_text("A\n")
        Path(sandbox.get_path("-rf")).write_text("DASH\n")
        sandbox.commit()
        assert sorted(p.name for p in tmp_path.glob("RAN-*")) == []
        assert (repo / "a.txt").read_text().replace("\r", "") == "A\n"
        if setup != "sparse-checkout":
            assert (repo / "-rf").read_text().replace("\r", "") == "DASH\n"
        assert quiet_status(repo) == ""
        sandbox.rollback()
        assert sorted(p.name for p in tmp_path.glob("RAN-*")) == []
        assert quiet_status(repo) == ""
        assert (repo / "a.txt").read_text().replace("\r", "") == "a\n"
        if setup == "fifo-in-the-work-tree":
            assert (repo / "fifo").is_fifo()
    finally:
        sandbox.cleanup()
    assert sorted(p.name for p in tmp_path.glob("RAN-*")) == []  # cleanup ran none either
    if setup == "branch-in-another-worktree":
        assert str(tmp_path / "wt2") in git(repo, "worktree", "list")


# -- more git shapes: worktree of a bare repository, separate git dir -----------------------------


def test_git_worktree_of_a_bare_repository_and_a_separate_git_dir(
    tmp_path: Path, git_identity: None
) -> None:
    """The original is a linked worktree of a bare repository (git worktree + bare clone
    reports), or a repository made with ``--separate-git-dir``: commit, rollback and cleanup
    work, and the bystander registration of the bare repository's worktree is kept. Passes."""
    seed = make_repo(tmp_path / "seed", {"a.txt": "a\n"})
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(tmp_path / "bare.git"))
    git(tmp_path / "bare.git", "worktree", "add", "-q", str(tmp_path / "wt"), "main")
    separate = tmp_path / "sep"
    separate.mkdir()
    git(separate, "init", "-q", "-b", "main", "--separate-git-dir", str(tmp_path / "sep.git"))
    (separate / "a.txt").write_text("a\n")
    git(separate, "add", "-A")
    git(separate, "commit", "-qm", "base")
    for index, original in enumerate([tmp_path / "wt", separate]):
        sandbox = GitWorktreeSandbox(
            "r", str(original), sandbox_root=str(tmp_path / f"root{index}")
        )
        try:
            sandbox.create("s14")
            Path(sandbox.get_path("a.txt")).write_text("A\n")
            sandbox.commit()
            assert (original / "a.txt").read_text() == "A\n"
            assert git(original, "status", "--porcelain") == ""
            sandbox.rollback()
            assert (original / "a.txt").read_text() == "a\n"
        finally:
            sandbox.cleanup()
    assert str(tmp_path / "wt") in git(tmp_path / "bare.git", "worktree", "list")
