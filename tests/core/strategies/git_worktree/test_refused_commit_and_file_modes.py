"""verify7: new inputs against the git_worktree promises of issue 7 (docs/git-worktree.md).

- A commit refused part-way by a file the merge cannot replace (an immutable file: chattr +i,
  as a backup tool or an admin sets it) must leave the original exactly as it was and the
  sandbox ACTIVE (exit 9 class), so it can be retried once the cause is gone.
- A file's local permission bits that git does not track (``core.fileMode=false``) are kept
  when the commit rewrites the file without changing its git mode.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core import GitWorktreeSandbox, SandboxStatus
from sandbox_core.errors import SandboxCommitPermissionError
from tests.support.fidelity_tree import tree_state
from tests.support.gitrepo import GIT_ENV, git, make_repo

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chattr +i needs root")


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """Paths made immutable by a test; made mutable again at teardown so tmp_path can go."""
    made: list[Path] = []
    yield made
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def _chattr_immutable(path: Path, made: list[Path]) -> None:
    if shutil.which("chattr") is None:
        pytest.fail("chattr is needed (e2fsprogs)")
    subprocess.run(["chattr", "+i", str(path)], check=True)
    made.append(path)


@needs_root
def test_commit_blocked_by_an_immutable_file_leaves_the_original_as_it_was(
    tmp_path: Path, immutable: list[Path]
) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "m.txt": "m\n", "z.txt": "z\n",
                                         "gone.txt": "g\n"})  # fmt: skip
    sandbox = GitWorktreeSandbox("repo", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan-imm")
    for name in ("a.txt", "m.txt", "z.txt"):
        Path(sandbox.get_path(name)).write_text(name + " from the sandbox\n")
    Path(sandbox.get_path("gone.txt")).unlink()
    Path(sandbox.get_path("new/deep")).mkdir(parents=True)
    Path(sandbox.get_path("new/deep/file.txt")).write_text("new\n")
    _chattr_immutable(repo / "m.txt", immutable)
    before = tree_state(repo)
    head = git(repo, "rev-parse", "HEAD")

    with pytest.raises(SandboxCommitPermissionError):
        sandbox.commit("blocked")

    subprocess.run(["chattr", "-i", str(repo / "m.txt")], check=True)
    state = tree_state(repo)
    state.pop(b".git", None)
    expected = {k: v for k, v in before.items() if k != b".git"}
    # no file written, none created, none deleted (the index is checked by `git status`)
    assert {k: v for k, v in state.items() if not k.startswith(b".git/")} == {
        k: v for k, v in expected.items() if not k.startswith(b".git/")
    }
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "rev-parse", "HEAD") == head
    assert sandbox.status is SandboxStatus.ACTIVE

    sandbox.commit("retried")  # the cause is gone: the retry lands everything
    assert (repo / "m.txt").read_text() == "m.txt from the sandbox\n"
    assert (repo / "new/deep/file.txt").read_text() == "new\n"
    assert not (repo / "gone.txt").exists()
    assert git(repo, "status", "--porcelain") == ""


def test_untracked_permission_bits_survive_commit_with_filemode_false(tmp_path: Path) -> None:
    """core.fileMode=false: git ignores the local chmod +x; the commit does not change the
    file's git mode (100644 both sides), so the original keeps its 0755 (docs: permission bits
    of a file written back are kept; the executable bit follows the commit only when the commit
    changes it)."""
    repo = make_repo(tmp_path / "repo", {"run.sh": "echo 1\n", "other": "o\n"})
    git(repo, "config", "core.fileMode", "false")
    (repo / "run.sh").chmod(0o755)
    sandbox = GitWorktreeSandbox("repo", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan-mode")
    Path(sandbox.get_path("run.sh")).write_text("echo 2\n")

    sandbox.commit("edit")

    assert (repo / "run.sh").read_text() == "echo 2\n"
    assert oct((repo / "run.sh").stat().st_mode & 0o7777) == "0o755"


def test_executable_bit_the_commit_adds_still_lands(tmp_path: Path) -> None:
    """The other side of the rule above: a commit that changes the git mode wins."""
    repo = make_repo(tmp_path / "repo", {"run.sh": "echo 1\n"})
    (repo / "run.sh").chmod(0o640)
    git(repo, "update-index", "--refresh")
    sandbox = GitWorktreeSandbox("repo", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan-x")
    Path(sandbox.get_path("run.sh")).chmod(0o755)

    sandbox.commit("make it executable")

    assert git(repo, "ls-files", "-s", "run.sh").startswith("100755")
    assert (repo / "run.sh").stat().st_mode & 0o100
