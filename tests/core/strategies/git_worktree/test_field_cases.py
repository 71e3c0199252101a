"""git_worktree on real repositories: field cases 01, 03, 05 and the policies of the module.

Each test builds its own repository with ``git init`` in ``tmp_path``; nothing is mocked except the
faults injected on purpose (marked as such).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_core import (
    GitWorktreeSandbox,
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxFactory,
    SandboxRollbackError,
    SandboxStatus,
)
from sandbox_core.strategies.git_worktree import GitCommand, GitFailure
from tests.support.gitrepo import GIT_ENV as IDENTITY
from tests.support.gitrepo import git, make_repo, moves_ref


def worktree_count(repo: Path) -> int:
    return git(repo, "worktree", "list", "--porcelain").count("worktree ")


def branches(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in IDENTITY.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """``repo`` on branch main with one commit holding ``f`` = "line1"."""
    return make_repo(tmp_path / "repo", {"f": "line1\n", "other": "other\n"})


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "sandboxes"


def make(repo: Path, root: Path, **options: str) -> GitWorktreeSandbox:
    return GitWorktreeSandbox("res-1", str(repo), sandbox_root=str(root), **options)


# -- case 01: branch collision and residue -----------------------------------------------------


def test_case01_create_uses_new_branch_never_main(repo: Path, root: Path) -> None:
    sandbox = make(repo, root, sandbox_id="s1")
    context = sandbox.create("p1")
    assert context.metadata["branch"] == "sandbox/p1/s1"
    assert context.sandbox_path == str((root / "git" / "s1").absolute())
    assert git(Path(context.sandbox_path), "symbolic-ref", "HEAD") == "refs/heads/sandbox/p1/s1"
    assert git(repo, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert worktree_count(repo) == 2
    assert context.metadata["base_commit"] == git(repo, "rev-parse", "HEAD")
    json.dumps(context.to_dict())  # metadata survives persistence


def test_case01_duplicate_id_is_refused_and_leaves_the_live_sandbox(repo: Path, root: Path) -> None:
    first = make(repo, root, sandbox_id="s1")
    first.create("p1")
    before = branches(repo)
    duplicate = make(repo, root, sandbox_id="s1")
    with pytest.raises(SandboxCreationError, match="already exists"):
        duplicate.create("p1")
    assert duplicate.status is SandboxStatus.ERRORED
    assert worktree_count(repo) == 2
    assert branches(repo) == before
    duplicate.cleanup()  # must not remove the first sandbox's artefacts
    assert Path(first.get_path("f")).read_text() == "line1\n"
    assert worktree_count(repo) == 2


def test_case01_crash_residue_gets_a_fresh_branch(repo: Path, root: Path) -> None:
    first = make(repo, root, sandbox_id="s1")
    context = first.create("p1")
    subprocess.run(["rm", "-rf", context.sandbox_path], check=True)
    git(repo, "worktree", "prune")
    again = make(repo, root, sandbox_id="s1")
    new_context = again.create("p1")
    assert new_context.metadata["branch"] == "sandbox/p1/s1-2"
    assert git(repo, "rev-parse", "sandbox/p1/s1") == context.metadata["base_commit"]
    assert worktree_count(repo) == 2
    again.cleanup()
    assert branches(repo) == {"main", "sandbox/p1/s1"}  # residue is not ours to delete


def test_case01_foreign_branch_is_never_adopted(repo: Path, root: Path) -> None:
    first = make(repo, root, sandbox_id="s1")
    first.create("p1")
    first.cleanup()
    assert branches(repo) == {"main"}
    git(repo, "checkout", "-q", "-b", "tmp")
    (repo / "z").write_text("z\n")
    git(repo, "add", "z")
    git(repo, "commit", "-qm", "foreign")
    git(repo, "checkout", "-q", "main")
    git(repo, "branch", "-f", "sandbox/p1/s1", "tmp")
    foreign = git(repo, "rev-parse", "sandbox/p1/s1")
    again = make(repo, root, sandbox_id="s1")
    context = again.create("p1")
    assert context.metadata["branch"] != "sandbox/p1/s1"
    assert not Path(again.get_path("z")).exists()
    assert Path(again.get_path("f")).read_text() == "line1\n"
    assert git(repo, "rev-parse", "sandbox/p1/s1") == foreign


def _assert_nothing_left(repo: Path, root: Path, before: set[str]) -> None:
    assert not (root / "git" / "s1").exists()
    assert not (repo / ".git" / "worktrees").exists() or not list(
        (repo / ".git" / "worktrees").iterdir()
    )
    assert branches(repo) == before
    assert worktree_count(repo) == 1


def test_case01_failure_after_worktree_add_leaves_nothing(
    repo: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = branches(repo)
    real_run = GitCommand.run

    def run_then_fail(self: GitCommand, *args: str, **kwargs: object) -> object:
        result = real_run(self, *args, **kwargs)  # type: ignore[arg-type]
        if args[:2] == ("worktree", "add"):  # injected fault: the step after add fails
            raise GitFailure(args, 1, "injected failure after worktree add")
        return result

    monkeypatch.setattr(GitCommand, "run", run_then_fail)
    sandbox = make(repo, root, sandbox_id="s1")
    with pytest.raises(SandboxCreationError, match="injected"):
        sandbox.create("p1")
    monkeypatch.undo()
    assert sandbox.status is SandboxStatus.ERRORED
    _assert_nothing_left(repo, root, before)
    sandbox.cleanup()
    assert sandbox.status is SandboxStatus.CLEANED_UP


def test_case01_git_refusing_the_path_leaves_no_branch(
    repo: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git 2.39 creates the -b branch before its path check fails; the product deletes it."""
    before = branches(repo)
    real_free = GitWorktreeSandbox._free_branch

    def free_then_occupy(original: GitCommand, wanted: str) -> str:
        # injected race: something writes into the claimed directory before git runs
        (root / "git" / "s1" / "intruder").write_text("x")
        return real_free(original, wanted)

    monkeypatch.setattr(GitWorktreeSandbox, "_free_branch", staticmethod(free_then_occupy))
    sandbox = make(repo, root, sandbox_id="s1")
    with pytest.raises(SandboxCreationError, match="already exists"):
        sandbox.create("p1")
    _assert_nothing_left(repo, root, before)


# -- case 03: conflicting merge-back --------------------------------------------------------------


def _user_work(repo: Path) -> None:
    """The user's own uncommitted work: an untracked file and an unstaged edit."""
    (repo / "note.txt").write_text("mine\n")
    (repo / "other").write_text("other, edited by the user\n")


def test_case03_conflict_leaves_the_original_exactly_as_it_was(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    (repo / "f").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    _user_work(repo)
    pre = git(repo, "rev-parse", "HEAD")
    status_before = git(repo, "status", "--porcelain")

    for _attempt in range(2):  # step 4: the same error again, not "unresolved conflict"
        with pytest.raises(SandboxCommitError, match=r"conflicts with the original in: f") as err:
            sandbox.commit()
        assert err.value.conflicts == ["f"]
        assert git(repo, "rev-parse", "HEAD") == pre
        assert not Path(git(repo, "rev-parse", "--absolute-git-dir"), "MERGE_HEAD").exists()
        assert git(repo, "status", "--porcelain") == status_before
        assert (repo / "f").read_text() == "main\n"
        assert "<<<<<<<" not in (repo / "f").read_text()
        assert sandbox.status is SandboxStatus.ACTIVE
        assert Path(sandbox.get_path("f")).read_text() == "sandbox\n"
    assert status_before.splitlines() == [" M other", "?? note.txt"]
    assert sandbox.commit_landed() is False


def test_uncommitted_edit_on_a_sandbox_path_refuses_commit(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("other")).write_text("sandbox edit\n")
    (repo / "other").write_text("user edit\n")
    pre = git(repo, "rev-parse", "HEAD")
    with pytest.raises(SandboxCommitError, match="uncommitted changes") as err:
        sandbox.commit()
    assert err.value.conflicts == ["other"]
    assert (repo / "other").read_text() == "user edit\n"
    assert git(repo, "rev-parse", "HEAD") == pre
    assert sandbox.status is SandboxStatus.ACTIVE


@pytest.mark.parametrize("user_path", ["note.txt", "dir"])
def test_untracked_file_in_the_way_refuses_commit(repo: Path, root: Path, user_path: str) -> None:
    """An untracked file equal to, or a parent of, a path the sandbox adds blocks the commit."""
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("note.txt")).write_text("from sandbox\n")
    Path(sandbox.get_path("dir")).mkdir()
    Path(sandbox.get_path("dir/x")).write_text("x\n")
    (repo / user_path).write_text("user's\n")
    with pytest.raises(SandboxCommitError) as err:
        sandbox.commit()
    assert err.value.conflicts == [user_path if user_path == "note.txt" else "dir/x"]
    assert (repo / user_path).read_text() == "user's\n"
    assert sandbox.status is SandboxStatus.ACTIVE


def test_commit_merges_and_keeps_the_users_uncommitted_work(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    Path(sandbox.get_path("added.txt")).write_text("new\n")
    Path(sandbox.get_path("other")).unlink()
    (repo / "h").write_text("on main\n")
    git(repo, "add", "h")
    git(repo, "commit", "-qm", "main moves on")  # main moved: the commit needs a merge
    (repo / "note.txt").write_text("mine\n")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    (repo / "h").write_text("h edited, unstaged\n")
    pre = git(repo, "rev-parse", "HEAD")

    result = sandbox.commit("apply plan")

    assert result.success
    assert result.added_files == ["added.txt"]
    assert result.changed_files == ["f"]
    assert result.deleted_files == ["other"]
    assert result.metadata["pre_commit_sha"] == pre
    assert result.metadata["branch"] == "refs/heads/main"
    assert result.metadata["landed_as"] == "merge"
    assert git(repo, "rev-parse", "HEAD") == result.commit_ref
    assert git(repo, "rev-parse", "HEAD^1") == pre
    assert git(repo, "rev-parse", "sandbox/" + sandbox.sandbox_id + "/pre-commit") == pre
    assert (repo / "f").read_text() == "sandbox\n"
    assert (repo / "added.txt").read_text() == "new\n"
    assert not (repo / "other").exists()
    assert (repo / "note.txt").read_text() == "mine\n"
    assert (repo / "h").read_text() == "h edited, unstaged\n"
    assert set(git(repo, "status", "--porcelain").splitlines()) == {
        " M h",
        "A  staged.txt",
        "?? note.txt",
    }
    assert sandbox.commit_landed() is True


def test_commit_without_changes_is_a_no_op(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    pre = git(repo, "rev-parse", "HEAD")
    result = sandbox.commit()
    assert (result.changed_files, result.added_files, result.deleted_files) == ([], [], [])
    assert result.commit_ref == pre
    assert git(repo, "rev-parse", "HEAD") == pre
    sandbox.rollback()  # rollback from COMMITTED of a no-op commit
    assert sandbox.status is SandboxStatus.ROLLED_BACK
    assert git(repo, "rev-parse", "HEAD") == pre


def test_commit_refused_when_the_original_switched_branch(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("n")).write_text("n\n")
    git(repo, "checkout", "-q", "-b", "elsewhere")
    with pytest.raises(SandboxCommitError, match="refs/heads/elsewhere"):
        sandbox.commit()
    assert git(repo, "rev-parse", "main") == git(repo, "rev-parse", "elsewhere")
    assert not (repo / "n").exists()


# -- case 05: source is a linked worktree ---------------------------------------------------------


def test_case05_source_is_a_linked_worktree(repo: Path, root: Path, tmp_path: Path) -> None:
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(wt))
    (wt / "g").write_text("feat\n")
    git(wt, "add", "g")
    git(wt, "commit", "-qm", "feat")
    main_pre = git(repo, "rev-parse", "main")
    assert (wt / ".git").is_file()

    sandbox = GitWorktreeSandbox("res-wt", str(wt), sandbox_root=str(root))
    context = sandbox.create("p1")
    assert context.metadata["target_ref"] == "refs/heads/feature"
    assert context.metadata["git_common_dir"] == str((repo / ".git").resolve())
    assert Path(sandbox.get_path("g")).read_text() == "feat\n"
    Path(sandbox.get_path("h")).write_text("s1\n")
    result = sandbox.commit()

    assert result.added_files == ["h"]
    assert (wt / "h").read_text() == "s1\n"
    assert git(repo, "rev-parse", "feature") == result.commit_ref
    assert git(repo, "rev-parse", "main") == main_pre
    assert git(wt, "status", "--porcelain") == ""
    assert (wt / ".git").is_file()
    sandbox.cleanup()
    assert git(repo, "worktree", "list").count("\n") == 1  # repo and wt remain
    assert git(wt, "status", "--porcelain") == ""


# -- content policies -----------------------------------------------------------------------------


def test_binary_exec_bit_and_symlinks_round_trip(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    blob = bytes(range(256)) * 4
    Path(sandbox.get_path("bin.dat")).write_bytes(blob)
    script = Path(sandbox.get_path("run.sh"))
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    os.symlink("f", sandbox.get_path("link"))
    result = sandbox.commit()
    assert result.added_files == ["bin.dat", "link", "run.sh"]
    assert (repo / "bin.dat").read_bytes() == blob
    assert (repo / "run.sh").stat().st_mode & stat.S_IXUSR
    assert (repo / "link").is_symlink()
    assert os.readlink(repo / "link") == "f"


def test_empty_directories_and_ignored_files_are_not_carried(repo: Path, root: Path) -> None:
    """Policy: git carries files, not empty directories; .gitignore'd files stay in the sandbox."""
    (repo / "emptydir").mkdir()
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore logs")
    sandbox = make(repo, root)
    sandbox.create("p1")
    assert not Path(sandbox.get_path("emptydir")).exists()
    Path(sandbox.get_path("newempty")).mkdir()
    Path(sandbox.get_path("debug.log")).write_text("noise\n")
    result = sandbox.commit()
    assert (result.added_files, result.changed_files, result.deleted_files) == ([], [], [])
    assert not (repo / "newempty").exists()
    assert not (repo / "debug.log").exists()
    assert (repo / "emptydir").is_dir()


def test_detached_head_moves_the_detached_head(repo: Path, root: Path) -> None:
    """Policy: a detached original stays detached; commit moves its HEAD."""
    git(repo, "checkout", "-q", "--detach")
    sandbox = make(repo, root)
    context = sandbox.create("p1")
    assert context.metadata["detached"] is True
    assert context.metadata["target_ref"] is None
    Path(sandbox.get_path("d.txt")).write_text("d\n")
    result = sandbox.commit()
    assert git(repo, "rev-parse", "HEAD") == result.commit_ref
    assert git(repo, "rev-parse", "main") == result.metadata["pre_commit_sha"]
    assert (repo / "d.txt").read_text() == "d\n"
    assert sandbox.commit_landed() is True
    sandbox.rollback()
    assert git(repo, "rev-parse", "HEAD") == result.metadata["pre_commit_sha"]
    assert not (repo / "d.txt").exists()


# -- paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd", ".git", ".git/config", "a/.GIT/x"])
def test_get_path_refuses_traversal_and_git_admin(repo: Path, root: Path, bad: str) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    with pytest.raises(ValueError, match="Path traversal not allowed"):
        sandbox.get_path(bad)


def test_tampered_git_file_cannot_redirect_the_commit(
    repo: Path, root: Path, tmp_path: Path
) -> None:
    sandbox = make(repo, root)
    context = sandbox.create("p1")
    Path(sandbox.get_path("x")).write_text("x\n")
    decoy = tmp_path / "decoy"
    subprocess.run(["git", "init", "-q", str(decoy)], check=True)
    (Path(context.sandbox_path) / ".git").write_text(f"gitdir: {decoy / '.git'}\n")
    pre = git(repo, "rev-parse", "HEAD")
    with pytest.raises(SandboxCommitError, match="no longer linked"):
        sandbox.commit()
    assert git(repo, "rev-parse", "HEAD") == pre
    assert not (repo / "x").exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("plain-dir", "not a git repository"),
        ("subdir", "not the top level"),
        ("no-commit", "has no commit"),
        ("missing", "not a directory"),
    ],
)
def test_unusable_sources_are_refused_cleanly(
    tmp_path: Path, repo: Path, setup: str, message: str
) -> None:
    source = tmp_path / setup
    if setup == "plain-dir":
        source.mkdir()
    elif setup == "subdir":
        source = repo / "sub"
        source.mkdir()
    elif setup == "no-commit":
        subprocess.run(["git", "init", "-q", str(source)], check=True)
    sandbox = GitWorktreeSandbox("r", str(source), sandbox_root=str(tmp_path / "sb"))
    with pytest.raises(SandboxCreationError, match=message):
        sandbox.create("p1")
    assert sandbox.status is SandboxStatus.ERRORED
    assert not (tmp_path / "sb" / "git" / sandbox.sandbox_id).exists()


def test_process_errors_are_translated(
    repo: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_core.strategies.git_worktree import git as git_helper

    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("x")).write_text("x\n")

    def broken(*_args: object, **_kwargs: object) -> object:  # injected fault
        raise FileNotFoundError("injected: no git")

    monkeypatch.setattr(git_helper.subprocess, "run", broken)
    with pytest.raises(SandboxCommitError, match="injected") as err:
        sandbox.commit()
    assert isinstance(err.value.__cause__, GitFailure)  # translated at the boundary
    assert sandbox.status is SandboxStatus.ERRORED


# -- rollback -------------------------------------------------------------------------------------


def test_rollback_active_discards_everything_in_the_worktree(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    context = sandbox.create("p1")
    Path(sandbox.get_path("f")).write_text("changed\n")
    Path(sandbox.get_path("untracked")).write_text("u\n")
    sandbox.create_checkpoint_ref("c1")
    sandbox.rollback()
    assert sandbox.status is SandboxStatus.ROLLED_BACK
    assert Path(context.sandbox_path, "f").read_text() == "line1\n"
    assert not Path(context.sandbox_path, "untracked").exists()
    assert git(repo, "rev-parse", context.metadata["branch"]) == context.metadata["base_commit"]
    sandbox.restore_checkpoint_ref("c1")  # checkpoints survive a rollback
    assert Path(context.sandbox_path, "untracked").read_text() == "u\n"


def test_rollback_committed_restores_and_keeps_user_work(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    context = sandbox.create("p1")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    Path(sandbox.get_path("added")).write_text("a\n")
    pre = git(repo, "rev-parse", "HEAD")
    sandbox.commit()
    (repo / "note.txt").write_text("mine\n")
    (repo / "other").write_text("user edit\n")
    sandbox.rollback()
    assert sandbox.status is SandboxStatus.ROLLED_BACK
    assert git(repo, "rev-parse", "HEAD") == pre
    assert (repo / "f").read_text() == "line1\n"
    assert not (repo / "added").exists()
    assert (repo / "note.txt").read_text() == "mine\n"
    assert (repo / "other").read_text() == "user edit\n"
    assert set(git(repo, "status", "--porcelain").splitlines()) == {" M other", "?? note.txt"}
    assert not Path(context.sandbox_path, "added").exists()  # the sandbox is clean again
    assert sandbox.commit_landed() is False


def test_rollback_committed_refuses_when_the_branch_moved(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    result = sandbox.commit()
    (repo / "later").write_text("later\n")
    git(repo, "add", "later")
    git(repo, "commit", "-qm", "user commits after the sandbox")
    after = git(repo, "rev-parse", "HEAD")
    with pytest.raises(SandboxRollbackError, match="moved from") as refused:
        sandbox.rollback()
    assert refused.value.refused is True
    assert sandbox.status.value == "committed", "refused before touching anything: retryable"
    assert git(repo, "rev-parse", "HEAD") == after
    assert git(repo, "rev-parse", "HEAD~1") == result.commit_ref
    assert (repo / "f").read_text() == "sandbox\n"


def test_rollback_committed_refuses_over_uncommitted_edit_of_a_committed_path(
    repo: Path, root: Path
) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    sandbox.commit()
    (repo / "f").write_text("user edits the committed file\n")
    with pytest.raises(SandboxRollbackError, match="uncommitted changes"):
        sandbox.rollback()
    assert (repo / "f").read_text() == "user edits the committed file\n"


# -- checkpoints ----------------------------------------------------------------------------------


def test_checkpoints_are_tags_and_restore_exact_state(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    context = sandbox.create("p1")
    branch_tip = git(repo, "rev-parse", context.metadata["branch"])
    Path(sandbox.get_path("a")).write_text("a1\n")
    sha = sandbox.create_checkpoint_ref("one")
    assert git(repo, "rev-parse", f"sandbox/{sandbox.sandbox_id}/ckpt/one") == sha
    assert git(repo, "rev-parse", context.metadata["branch"]) == branch_tip  # branch not moved
    assert git(repo, "diff-tree", "-r", "--name-only", "--no-commit-id", sha) == "a"
    Path(sandbox.get_path("a")).write_text("a2\n")
    Path(sandbox.get_path("b")).write_text("b\n")
    Path(sandbox.get_path("f")).unlink()
    sandbox.create_checkpoint_ref("two")
    assert sandbox.checkpoint_names() == ["one", "two"]

    sandbox.restore_checkpoint_ref("one")
    assert Path(sandbox.get_path("a")).read_text() == "a1\n"
    assert not Path(sandbox.get_path("b")).exists()
    assert Path(sandbox.get_path("f")).read_text() == "line1\n"
    sandbox.restore_checkpoint_ref("two")
    assert Path(sandbox.get_path("b")).read_text() == "b\n"
    assert not Path(sandbox.get_path("f")).exists()

    sandbox.delete_checkpoint_ref("one")
    sandbox.delete_checkpoint_ref("one")  # idempotent
    assert sandbox.checkpoint_names() == ["two"]
    with pytest.raises(SandboxError, match="not found"):
        sandbox.restore_checkpoint_ref("one")
    with pytest.raises(ValueError, match="invalid checkpoint name"):
        sandbox.create_checkpoint_ref("../escape")
    result = sandbox.commit()
    assert result.added_files == ["a", "b"]
    assert result.deleted_files == ["f"]


# -- cleanup and reopen ---------------------------------------------------------------------------


def test_cleanup_removes_worktree_branch_and_tags_idempotently(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    context = sandbox.create("p1")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    sandbox.create_checkpoint_ref("c")
    sandbox.commit()
    sandbox.cleanup()
    sandbox.cleanup()
    assert sandbox.status is SandboxStatus.CLEANED_UP
    assert not Path(context.sandbox_path).exists()
    assert branches(repo) == {"main"}
    assert git(repo, "tag", "--list") == ""
    assert worktree_count(repo) == 1
    assert (repo / "f").read_text() == "sandbox\n"  # the original keeps the committed change


def test_cleanup_after_the_worktree_vanished(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    context = sandbox.create("p1")
    subprocess.run(["rm", "-rf", context.sandbox_path], check=True)
    reopened = GitWorktreeSandbox.reopen(sandbox.to_record())
    assert reopened.missing_artifacts == ["worktree"]
    with pytest.raises(SandboxCommitError, match="missing"):
        reopened.commit()
    reopened.cleanup()
    assert branches(repo) == {"main"}
    assert worktree_count(repo) == 1


_CHILD = """
import json, sys
from pathlib import Path
from sandbox_core import SandboxFactory
sandbox = SandboxFactory().create("git_worktree", "res", sys.argv[1], sandbox_root=sys.argv[2])
sandbox.create("plan-x")
Path(sandbox.get_path("from_child.txt")).write_text("child\\n")
print(json.dumps(sandbox.to_record()))
"""


def test_reopen_in_another_process_and_commit(repo: Path, root: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(repo), str(root)],
        check=True,
        capture_output=True,
        text=True,
        cwd=str(Path(__file__).parents[4]),
    )
    record = json.loads(child.stdout)
    sandbox = SandboxFactory().reopen(record)
    assert isinstance(sandbox, GitWorktreeSandbox)
    assert sandbox.missing_artifacts == []
    assert sandbox.status is SandboxStatus.ACTIVE
    result = sandbox.commit()
    assert result.added_files == ["from_child.txt"]
    assert (repo / "from_child.txt").read_text() == "child\n"
    assert sandbox.commit_landed() is True
    sandbox.cleanup()
    assert worktree_count(repo) == 1


def test_commit_landed_tracks_an_in_flight_commit(
    repo: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed tag is written before the merge, so recovery can ask whether it landed."""
    sandbox = make(repo, root)
    sandbox.create("p1")
    assert sandbox.commit_landed() is False
    Path(sandbox.get_path("x")).write_text("x\n")
    real_run = GitCommand.run

    def die_before_read_tree(self: GitCommand, *args: str, **kwargs: object) -> object:
        if args[:2] == ("read-tree", "-m"):  # injected crash in the middle of the commit
            raise KeyboardInterrupt
        return real_run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GitCommand, "run", die_before_read_tree)
    with pytest.raises(KeyboardInterrupt):
        sandbox.commit()
    monkeypatch.undo()
    reopened = GitWorktreeSandbox.reopen(sandbox.to_record())
    assert reopened.commit_landed() is False
    assert reopened.commit().added_files == ["x"]
    assert reopened.commit_landed() is True
    again = GitWorktreeSandbox.reopen({**reopened.to_record(), "status": "active"})
    assert again.commit().commit_ref == git(repo, "rev-parse", "HEAD")  # never merged twice
    assert git(repo, "rev-list", "--count", "HEAD") == "2"


def test_cleanup_after_the_source_worktree_was_removed(
    repo: Path, root: Path, tmp_path: Path
) -> None:
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(wt))
    sandbox = GitWorktreeSandbox("res-wt", str(wt), sandbox_root=str(root))
    context = sandbox.create("p1")
    sandbox.create_checkpoint_ref("c")
    git(repo, "worktree", "remove", "--force", str(wt))
    sandbox.cleanup()
    assert not Path(context.sandbox_path).exists()
    assert branches(repo) == {"main", "feature"}
    assert git(repo, "tag", "--list") == ""
    assert worktree_count(repo) == 1


def test_ignored_directory_blocks_only_files_that_exist_in_it(repo: Path, root: Path) -> None:
    (repo / ".gitignore").write_text("build/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore build")
    (repo / "build").mkdir()
    (repo / "build" / "old.o").write_text("user's build output\n")
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path(".gitignore")).write_text("")  # the plan starts tracking build/
    Path(sandbox.get_path("build")).mkdir()
    Path(sandbox.get_path("build/new.txt")).write_text("new\n")
    Path(sandbox.get_path("build/old.o")).write_text("tracked now\n")
    with pytest.raises(SandboxCommitError) as err:
        sandbox.commit()
    assert err.value.conflicts == ["build/old.o"]
    assert (repo / "build" / "old.o").read_text() == "user's build output\n"
    Path(sandbox.get_path("build/old.o")).unlink()
    result = sandbox.commit()
    assert result.added_files == ["build/new.txt"]
    assert (repo / "build" / "new.txt").read_text() == "new\n"
    assert (repo / "build" / "old.o").read_text() == "user's build output\n"


def test_actor_switching_branch_in_the_worktree_is_refused(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    context = sandbox.create("p1")
    Path(sandbox.get_path("x")).write_text("x\n")
    git(Path(context.sandbox_path), "checkout", "-q", "-b", "actor-branch")
    with pytest.raises(SandboxCommitError, match="actor-branch"):
        sandbox.commit()
    assert not (repo / "x").exists()
    assert git(repo, "rev-parse", "actor-branch") == context.metadata["base_commit"]


def test_reopen_refuses_a_malformed_record(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    record = sandbox.to_record()
    del record["context"]["metadata"]["branch"]
    with pytest.raises(SandboxError, match="lacks metadata: branch"):
        GitWorktreeSandbox.reopen(record)


def test_git_location_variables_of_an_enclosing_git_cannot_redirect_commands(
    repo: Path, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as if from inside a hook of another repository (GIT_DIR, GIT_INDEX_FILE set)."""
    decoy = tmp_path / "decoy"
    subprocess.run(["git", "init", "-q", str(decoy)], check=True)
    monkeypatch.setenv("GIT_DIR", str(decoy / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(decoy))
    monkeypatch.setenv("GIT_INDEX_FILE", str(decoy / ".git" / "index"))
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("x")).write_text("x\n")
    result = sandbox.commit()
    sandbox.cleanup()
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name)
    assert git(repo, "rev-parse", "HEAD") == result.commit_ref
    assert (repo / "x").read_text() == "x\n"
    assert git(repo, "status", "--porcelain") == ""
    assert not (decoy / ".git" / "index").exists()
    assert git(decoy, "for-each-ref") == ""


def test_diff_shows_what_commit_would_carry(repo: Path, root: Path) -> None:
    sandbox = make(repo, root)
    sandbox.create("p1")
    assert sandbox.diff() == ""
    Path(sandbox.get_path("f")).write_text("changed\n")
    Path(sandbox.get_path("brand_new")).write_text("n\n")
    text = sandbox.diff()
    assert "diff --git a/f b/f" in text
    assert "-line1\n+changed" in text
    assert "new file mode 100644" in text
    assert "+++ b/brand_new" in text
    assert (repo / "f").read_text() == "line1\n"  # the original is not touched


def test_plan_ids_are_made_safe_for_branch_names(repo: Path, root: Path) -> None:
    sandbox = make(repo, root, sandbox_id="s1")
    context = sandbox.create("plan with spaces/../x.lock")
    branch = context.metadata["branch"]
    assert branch == "sandbox/plan-with-spaces-x-lock/s1"
    assert context.plan_id == "plan with spaces/../x.lock"
    git(repo, "check-ref-format", f"refs/heads/{branch}")


@pytest.mark.parametrize("bad_id", ["a/b", "..", "-x", "x.lock", "a b"])
def test_unsafe_sandbox_ids_are_refused_before_touching_git(
    repo: Path, root: Path, bad_id: str
) -> None:
    sandbox = make(repo, root, sandbox_id=bad_id)
    with pytest.raises(SandboxCreationError, match="cannot name a git branch"):
        sandbox.create("p1")
    assert branches(repo) == {"main"}
    assert worktree_count(repo) == 1


def test_concurrent_commits_into_one_repository_all_land(repo: Path, root: Path) -> None:
    """Lone commits into one original queue on its lock (docs/concurrency.md)."""
    import threading

    sandboxes = [make(repo, root) for _ in range(4)]
    for index, sandbox in enumerate(sandboxes):
        sandbox.create(f"p{index}")
        Path(sandbox.get_path(f"file{index}")).write_text(f"{index}\n")
    errors: list[BaseException] = []

    def commit(sandbox: GitWorktreeSandbox) -> None:
        try:
            sandbox.commit()
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(s,)) for s in sandboxes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert all(sandbox.commit_landed() for sandbox in sandboxes)
    assert sorted(git(repo, "ls-files").split()) == [
        "f",
        "file0",
        "file1",
        "file2",
        "file3",
        "other",
    ]
    assert git(repo, "status", "--porcelain") == ""


def test_two_sandboxes_on_one_repository_roll_back_in_lifo_order(repo: Path, root: Path) -> None:
    """Seed 002 compensation: undoing the last commit first restores the original exactly."""
    first, second = make(repo, root), make(repo, root)
    first.create("p")
    second.create("p")
    Path(first.get_path("a")).write_text("a\n")
    Path(second.get_path("b")).write_text("b\n")
    pre = git(repo, "rev-parse", "HEAD")
    first.commit()
    second.commit()
    second.rollback()
    assert (repo / "a").read_text() == "a\n"
    assert not (repo / "b").exists()
    first.rollback()
    assert git(repo, "rev-parse", "HEAD") == pre
    assert not (repo / "a").exists()
    assert git(repo, "status", "--porcelain") == ""


def test_commit_interrupted_between_files_and_ref_completes_on_retry(
    repo: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash window: the original's files and index were updated, its branch not yet moved."""
    sandbox = make(repo, root)
    sandbox.create("p1")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    Path(sandbox.get_path("n")).write_text("new\n")
    real_run = GitCommand.run

    def die_before_ref_update(self: GitCommand, *args: str, **kwargs: object) -> object:
        if moves_ref(args, kwargs, "refs/heads/main"):  # injected crash
            raise KeyboardInterrupt
        return real_run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GitCommand, "run", die_before_ref_update)
    pre = git(repo, "rev-parse", "HEAD")
    with pytest.raises(KeyboardInterrupt):
        sandbox.commit()
    monkeypatch.undo()
    assert git(repo, "rev-parse", "HEAD") == pre
    assert (repo / "n").read_text() == "new\n"  # half-applied: files written
    reopened = GitWorktreeSandbox.reopen(sandbox.to_record())
    assert reopened.commit_landed() is False
    result = reopened.commit()
    assert result.added_files == ["n"]
    assert git(repo, "rev-parse", "HEAD") == result.commit_ref
    assert git(repo, "status", "--porcelain") == ""
    assert reopened.commit_landed() is True


def test_parallel_creates_and_cleanups_on_one_repository(repo: Path, root: Path) -> None:
    """Many sandboxes of one repository created and cleaned up at once (the operator does this).

    git itself races on concurrent ``worktree add`` (".git/worktrees/<id>/commondir" read before
    it is written); the strategy serialises them per repository.
    """
    from concurrent.futures import ThreadPoolExecutor

    sandboxes = [make(repo, root) for _ in range(12)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(lambda sandbox: sandbox.create("p-parallel"), sandboxes))
    assert all(s.status.value == "created" for s in sandboxes)
    assert worktree_count(repo) == 13
    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(lambda sandbox: sandbox.cleanup(), sandboxes))
    assert worktree_count(repo) == 1
    assert branches(repo) == {"main"}
