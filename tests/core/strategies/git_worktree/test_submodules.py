"""git_worktree with submodules (issue 7, section 2).

A sandbox of a superproject has its submodules populated at their pinned commits, offline, as
linked worktrees of the original's module store (``.git/modules/<name>``); commit keeps the
gitlinks (and carries a new pinned commit made inside the sandbox); cleanup removes only our
registrations in the module stores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_core import GitWorktreeSandbox
from sandbox_core.errors import SandboxConflictError
from tests.support.gitrepo import GIT_ENV, git, make_repo

ALLOW_FILE = ("-c", "protocol.file.allow=always")


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def superproject(tmp_path: Path) -> Path:
    """main -> libs/sub (pinned at its first commit) -> deep/leaf (nested submodule)."""
    leaf = make_repo(tmp_path / "leaf", {"leaf.txt": "leaf 1\n"})
    sub = make_repo(tmp_path / "sub", {"s.txt": "sub 1\n"})
    git(sub, *ALLOW_FILE, "submodule", "add", "-q", str(leaf), "deep/leaf")
    git(sub, "commit", "-qm", "leaf")
    sup = make_repo(tmp_path / "sup", {"a.txt": "a\n"})
    git(sup, *ALLOW_FILE, "submodule", "add", "-q", str(sub), "libs/sub")
    git(sup, *ALLOW_FILE, "submodule", "update", "-q", "--init", "--recursive")
    git(sup, "commit", "-qm", "add sub")
    # The upstream moves on; the superproject stays pinned to the old commit.
    (sub / "s.txt").write_text("sub 2 upstream\n")
    git(sub, "commit", "-qam", "upstream")
    return sup


def pinned(repo: Path, path: str) -> str:
    return git(repo, "ls-tree", "HEAD", path).split()[2]


def registrations(store: Path) -> list[str]:
    admin = store / "worktrees"
    return sorted(p.name for p in admin.iterdir()) if admin.is_dir() else []


def test_submodules_are_populated_at_their_pinned_commits_offline(
    superproject: Path, tmp_path: Path
) -> None:
    # Offline: the upstream repositories are gone; only the module store is left.
    for name in ("sub", "leaf"):
        (tmp_path / name).rename(tmp_path / f"{name}.gone")
    sandbox = GitWorktreeSandbox("r", str(superproject), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    sub = Path(sandbox.get_path("libs/sub"))
    assert (sub / "s.txt").read_text() == "sub 1\n"
    assert git(sub, "rev-parse", "HEAD") == pinned(superproject, "libs/sub")
    leaf = Path(sandbox.get_path("libs/sub/deep/leaf"))
    assert (leaf / "leaf.txt").read_text() == "leaf 1\n"
    assert git(Path(sandbox.get_path("")), "status", "--porcelain") == ""
    store = superproject / ".git" / "modules" / "libs" / "sub"
    assert len(registrations(store)) == 1
    assert len(registrations(store / "modules" / "deep" / "leaf")) == 1

    # An edit in the superproject only: the gitlink is kept as it was.
    Path(sandbox.get_path("a.txt")).write_text("a 2\n")
    before = pinned(superproject, "libs/sub")
    result = sandbox.commit()
    assert result.changed_files == ["a.txt"]
    assert pinned(superproject, "libs/sub") == before
    sandbox.cleanup()
    assert registrations(store) == []
    assert registrations(store / "modules" / "deep" / "leaf") == []
    assert (superproject / "libs" / "sub" / "s.txt").read_text() == "sub 1\n"


def test_a_commit_made_inside_a_sandbox_submodule_lands_as_the_new_gitlink(
    superproject: Path, tmp_path: Path
) -> None:
    sandbox = GitWorktreeSandbox("r", str(superproject), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    sub = Path(sandbox.get_path("libs/sub"))
    (sub / "s.txt").write_text("sub changed in the sandbox\n")
    git(sub, "commit", "-qam", "in sandbox")
    new = git(sub, "rev-parse", "HEAD")
    result = sandbox.commit()
    assert result.changed_files == ["libs/sub"]
    assert pinned(superproject, "libs/sub") == new
    # The commit is in the shared module store, and the original's clean submodule checkout
    # follows its new pinned commit, as `git submodule update` would.
    store = superproject / ".git" / "modules" / "libs" / "sub"
    assert git(superproject, f"--git-dir={store}", "cat-file", "-t", new) == "commit"
    original_sub = superproject / "libs" / "sub"
    assert git(original_sub, "rev-parse", "HEAD") == new
    assert (original_sub / "s.txt").read_text() == "sub changed in the sandbox\n"
    assert git(superproject, "status", "--porcelain") == ""
    sandbox.rollback()
    assert pinned(superproject, "libs/sub") != new
    assert (original_sub / "s.txt").read_text() == "sub 1\n"
    assert git(superproject, "status", "--porcelain") == ""
    sandbox.cleanup()
    assert registrations(store) == []


def test_local_work_in_the_originals_submodule_is_a_conflict(
    superproject: Path, tmp_path: Path
) -> None:
    sandbox = GitWorktreeSandbox("r", str(superproject), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    sub = Path(sandbox.get_path("libs/sub"))
    (sub / "s.txt").write_text("sandbox\n")
    git(sub, "commit", "-qam", "in sandbox")
    original_sub = superproject / "libs" / "sub"
    before = git(original_sub, "rev-parse", "HEAD")
    (original_sub / "other.txt").write_text("user's work\n")
    git(original_sub, "add", "other.txt")
    with pytest.raises(SandboxConflictError) as err:
        sandbox.commit()
    assert err.value.conflicts == ["libs/sub"]
    assert git(original_sub, "rev-parse", "HEAD") == before
    assert (original_sub / "other.txt").read_text() == "user's work\n"
    assert pinned(superproject, "libs/sub") == before


def test_an_uninitialised_submodule_stays_empty_and_its_gitlink_is_kept(
    superproject: Path, tmp_path: Path
) -> None:
    clone = tmp_path / "clone"
    git(tmp_path, *ALLOW_FILE, "clone", "-q", str(superproject), str(clone))
    sandbox = GitWorktreeSandbox("r", str(clone), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    assert list(Path(sandbox.get_path("libs/sub")).iterdir()) == []
    Path(sandbox.get_path("a.txt")).write_text("a 3\n")
    before = pinned(clone, "libs/sub")
    assert sandbox.commit().changed_files == ["a.txt"]
    assert pinned(clone, "libs/sub") == before
    sandbox.cleanup()


def test_a_submodule_name_escaping_the_module_store_is_refused(
    superproject: Path, tmp_path: Path
) -> None:
    """As git does since CVE-2018-11235: a name with ``..`` never picks a module store."""
    gitmodules = (superproject / ".gitmodules").read_text()
    (superproject / ".gitmodules").write_text(
        gitmodules.replace('[submodule "libs/sub"]', '[submodule "../../../outside"]')
    )
    git(superproject, "commit", "-qam", "hostile name")
    outside = superproject / ".git" / "modules" / ".." / ".." / ".." / "outside"
    git(tmp_path, *ALLOW_FILE, "clone", "-q", "--bare", str(tmp_path / "sub"), str(outside))
    sandbox = GitWorktreeSandbox("r", str(superproject), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    assert list(Path(sandbox.get_path("libs/sub")).iterdir()) == []
    assert registrations(outside.resolve()) == []
    sandbox.cleanup()
