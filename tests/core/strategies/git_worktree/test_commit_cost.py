"""git_worktree: what a commit costs in git processes, and that the cheap path keeps every check.

Issue 7 ("Done means": the commit of 10 files within 1.1x the raw ``git add`` + ``git commit`` +
``git merge --ff-only``). A fast-forward commit runs seven git processes; the overlap check
(``git status`` limited to the changed paths) runs only when ``read-tree -m -u`` refuses, or when
read-tree alone could not see the user's work. Every kind of local work on a path the commit
writes must still refuse the commit with the original untouched, whichever path found it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_core import GitWorktreeSandbox, SandboxStatus
from sandbox_core.errors import SandboxConflictError
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.strategies.git_worktree import GitCommand
from tests.support.gitrepo import GIT_ENV, git, make_repo

BASE = {
    "a.txt": "a\n",
    "b.txt": "b\n",
    "dir/c.txt": "c\n",
    "dir/d.txt": "d\n",
    ".gitignore": "*.o\nbuild/\n",
}


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The git subcommand of every process the product starts, in order."""
    seen: list[str] = []
    real_run = GitCommand.run

    def counting(self: GitCommand, *args: str, **kwargs: object) -> object:
        seen.append(next(arg for arg in args if not arg.startswith("--")))
        return real_run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GitCommand, "run", counting)
    yield seen


def new_sandbox(tmp_path: Path) -> tuple[Path, GitWorktreeSandbox]:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    return repo, sandbox


def edit(sandbox: GitWorktreeSandbox) -> None:
    Path(sandbox.get_path("a.txt")).write_text("A from the sandbox\n")
    Path(sandbox.get_path("dir/c.txt")).unlink()
    Path(sandbox.get_path("new/e.txt")).parent.mkdir()
    Path(sandbox.get_path("new/e.txt")).write_text("e\n")


def tree_state(repo: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every path of the original's working tree and git dir (its index, refs and logs): mode,
    mtime and content. Objects (shared with the sandbox, freshened by git when written again)
    and the sandbox's own worktree admin dir are left out."""
    state: dict[str, tuple[int, int, bytes]] = {}
    for folder, dirs, files in os.walk(repo):
        if Path(folder) == repo / ".git":
            dirs[:] = [d for d in dirs if d not in ("objects", "worktrees")]
        for name in files:
            path = Path(folder) / name
            if path.name.endswith(".lock") or path.name == "sandbox-core.lock":
                continue
            info = path.lstat()
            data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            state[str(path.relative_to(repo))] = (info.st_mode, info.st_mtime_ns, data)
    return state


# -- processes ---------------------------------------------------------------------------------


def test_fast_forward_commit_runs_seven_git_processes(tmp_path: Path, calls: list[str]) -> None:
    repo, sandbox = new_sandbox(tmp_path)
    edit(sandbox)
    calls.clear()
    result = sandbox.commit()
    assert calls == [
        "add",
        "write-tree",
        "diff-tree",
        "rev-parse",
        "commit-tree",
        "read-tree",
        "update-ref",
    ]
    assert result.metadata["landed_as"] == "fast-forward"
    assert git(repo, "rev-parse", "HEAD") == result.commit_ref
    assert git(repo, "status", "--porcelain") == ""
    # One ref transaction moved the sandbox branch, both tags and the target together.
    branch = f"refs/heads/{sandbox.context.metadata['branch']}"  # type: ignore[union-attr]
    assert git(repo, "rev-parse", branch) == result.commit_ref
    tags = f"refs/tags/sandbox/{sandbox.sandbox_id}/"
    assert git(repo, "rev-parse", f"{tags}committed") == result.commit_ref
    assert git(repo, "rev-parse", f"{tags}pre-commit") == result.metadata["pre_commit_sha"]
    assert sandbox.commit_landed() is True


def test_rollback_after_commit_and_checkpoint_process_counts(
    tmp_path: Path, calls: list[str]
) -> None:
    repo, sandbox = new_sandbox(tmp_path)
    pre = git(repo, "rev-parse", "HEAD")
    edit(sandbox)
    calls.clear()
    CheckpointManager().create_checkpoint(sandbox, "c1", "pre_apply")
    assert calls == ["add", "write-tree", "commit-tree", "update-ref"]
    sandbox.commit()
    calls.clear()
    sandbox.rollback()
    assert calls == ["rev-parse", "diff-tree", "read-tree", "update-ref", "reset", "clean"]
    assert git(repo, "rev-parse", "HEAD") == pre
    assert (repo / "dir" / "c.txt").read_text() == "c\n"
    assert not (repo / "new").exists()


def test_nothing_changed_commit_moves_only_tags(tmp_path: Path, calls: list[str]) -> None:
    repo, sandbox = new_sandbox(tmp_path)
    pre = git(repo, "rev-parse", "HEAD")
    calls.clear()
    result = sandbox.commit()
    assert result.metadata["landed_as"] == "no-op"
    assert "read-tree" not in calls and "status" not in calls
    assert git(repo, "rev-parse", "HEAD") == pre == result.commit_ref


# -- every kind of local work still refuses the cheap path's commit ---------------------------


def _modified(repo: Path) -> None:
    (repo / "a.txt").write_text("the user's edit\n")


def _staged(repo: Path) -> None:
    (repo / "a.txt").write_text("the user's staged edit\n")
    git(repo, "add", "a.txt")


def _staged_then_reverted(repo: Path) -> None:
    (repo / "a.txt").write_text("staged\n")
    git(repo, "add", "a.txt")
    (repo / "a.txt").write_text("a\n")  # the file is the base again; the index is not


def _deleted(repo: Path) -> None:
    (repo / "a.txt").unlink()  # read-tree alone would write the new version over the deletion


def _mode(repo: Path) -> None:
    (repo / "a.txt").chmod(0o755)


def _symlink(repo: Path) -> None:
    (repo / "a.txt").unlink()
    (repo / "a.txt").symlink_to("b.txt")


def _untracked_in_the_way(repo: Path) -> None:
    (repo / "new").mkdir()
    (repo / "new" / "e.txt").write_text("the user's own e\n")


def _ignored_in_the_way(repo: Path) -> None:
    (repo / ".gitignore").write_text("*.o\nbuild/\nnew/\n")
    git(repo, "commit", "-qam", "ignore new/")
    (repo / "new").mkdir()
    (repo / "new" / "e.txt").write_text("ignored, but the user's\n")


def _file_in_place_of_a_folder(repo: Path) -> None:
    (repo / "new").write_text("a file where the commit needs a folder\n")


LOCAL_WORK: dict[str, tuple[Callable[[Path], None], str]] = {
    "modified": (_modified, "a.txt"),
    "staged": (_staged, "a.txt"),
    "staged-then-reverted": (_staged_then_reverted, "a.txt"),
    "deleted": (_deleted, "a.txt"),
    "mode": (_mode, "a.txt"),
    "symlink": (_symlink, "a.txt"),
    "untracked-in-the-way": (_untracked_in_the_way, "new/e.txt"),
    "ignored-in-the-way": (_ignored_in_the_way, "new/e.txt"),
    "file-in-place-of-a-folder": (_file_in_place_of_a_folder, "new/e.txt"),
}


@pytest.mark.parametrize("kind", sorted(LOCAL_WORK))
def test_local_work_on_a_written_path_is_a_conflict_and_nothing_is_touched(
    tmp_path: Path, kind: str
) -> None:
    repo, sandbox = new_sandbox(tmp_path)
    edit(sandbox)
    make_work, path = LOCAL_WORK[kind]
    time.sleep(1.05)  # the user's work is not "racily clean": read-tree trusts the stat data
    make_work(repo)
    before = tree_state(repo)
    head = git(repo, "rev-parse", "HEAD")
    with pytest.raises(SandboxConflictError) as err:
        sandbox.commit()
    assert path in err.value.conflicts
    assert sandbox.status is SandboxStatus.ACTIVE
    assert git(repo, "rev-parse", "HEAD") == head
    assert tree_state(repo) == before, "the original is exactly as it was"


def test_local_work_on_other_paths_is_kept_and_not_a_conflict(tmp_path: Path) -> None:
    repo, sandbox = new_sandbox(tmp_path)
    edit(sandbox)
    (repo / "b.txt").write_text("the user's edit elsewhere\n")
    (repo / "dir" / "d.txt").unlink()
    (repo / "x.o").write_text("ignored build output\n")
    (repo / "notes.txt").write_text("untracked\n")
    result = sandbox.commit()
    assert result.added_files == ["new/e.txt"]
    status = sorted(git(repo, "status", "--porcelain", "--ignored").splitlines())
    assert status == [" D dir/d.txt", " M b.txt", "!! x.o", "?? notes.txt"]
    assert (repo / "a.txt").read_text() == "A from the sandbox\n"


def test_prepare_and_apply_prepared_process_counts(tmp_path: Path, calls: list[str]) -> None:
    repo, sandbox = new_sandbox(tmp_path)
    edit(sandbox)
    calls.clear()
    prepared = sandbox.prepare("tx-cost")
    assert calls == [
        "add",
        "write-tree",
        "diff-tree",
        "cat-file",
        "rev-parse",
        "for-each-ref",
        "commit-tree",
        "status",
        "ls-files",  # index flags that hide local work from status (case 40)
        "update-ref",
    ]
    calls.clear()
    result = sandbox.apply_prepared("tx-cost")
    assert calls == ["for-each-ref", "diff-tree", "rev-parse", "read-tree", "update-ref"]
    assert result.commit_ref == prepared.details["merge_commit"] == git(repo, "rev-parse", "HEAD")
    assert git(repo, "status", "--porcelain") == ""
