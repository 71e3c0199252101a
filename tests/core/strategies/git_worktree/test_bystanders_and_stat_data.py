"""git_worktree: bystander worktrees (case 02) and stale index stat data (case 29), broadly.

Case 02's kind: the product removes only what it made. Case 29's kind: any change of stat data
without a change of content in the original (``touch``, ``chown -R`` to the same owner, a
kubelet fsGroup pass: chgrp + ``chmod g+rw``, a restore that rewrites identical bytes, an old
mtime) never turns into a conflict, for commit and for rollback of a commit.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_core import GitWorktreeSandbox, SandboxCreationError, SandboxStatus
from sandbox_core.errors import SandboxConflictError
from tests.support.gitrepo import GIT_ENV, git, make_repo, moves_ref


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


# -- case 02 ----------------------------------------------------------------------------------


def test_case02_bystander_worktrees_survive_a_vanished_sandbox(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "a\n"})
    git(repo, "worktree", "add", "-q", "-b", "mine", str(tmp_path / "mine"))
    (tmp_path / "mine" / "wip.txt").write_text("wip\n")
    git(tmp_path / "mine", "add", "wip.txt")
    git(repo, "worktree", "add", "-q", "-b", "usb", str(tmp_path / "usb"))
    git(repo, "worktree", "lock", "--reason", "on removable disk", str(tmp_path / "usb"))
    (tmp_path / "mine").rename(tmp_path / "mine.away")  # both volumes unmounted for a moment
    (tmp_path / "usb").rename(tmp_path / "usb.away")
    root = tmp_path / "root"

    first = GitWorktreeSandbox("r", str(repo), sandbox_root=str(root), sandbox_id="s1")
    context = first.create("p02")
    branch = context.metadata["branch"]
    shutil.rmtree(context.sandbox_path)  # deleted behind our back, no git command

    again = GitWorktreeSandbox("r", str(repo), sandbox_root=str(root), sandbox_id="s1")
    second = again.create("p02")
    assert second.sandbox_path == context.sandbox_path
    assert second.metadata["branch"] == branch, "the stale branch was ours: no -2 residue"
    again.cleanup()
    again.cleanup()  # idempotent

    (tmp_path / "mine.away").rename(tmp_path / "mine")
    (tmp_path / "usb.away").rename(tmp_path / "usb")
    assert "A  wip.txt" in git(tmp_path / "mine", "status", "--porcelain").splitlines()
    listing = git(repo, "worktree", "list", "--porcelain")
    usb_entry = listing.split(f"worktree {tmp_path / 'usb'}\n", 1)[1].split("\n\n", 1)[0]
    assert "locked" in usb_entry
    assert sorted(p.name for p in (repo / ".git" / "worktrees").iterdir()) == ["mine", "usb"]
    heads = set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())
    assert heads == {"main", "mine", "usb"}
    assert git(repo, "for-each-ref", "refs/tags/sandbox/") == ""


def test_cleanup_and_failed_create_never_touch_other_registrations(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "a\n"})
    git(repo, "worktree", "add", "-q", "-b", "mine", str(tmp_path / "mine"))
    (tmp_path / "mine").rename(tmp_path / "mine.away")
    root = tmp_path / "root"
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(root))
    sandbox.create("p")
    sandbox.cleanup()
    # A create that fails inside git (the base commit vanished from under it) undoes itself.
    broken = GitWorktreeSandbox("r", str(repo), sandbox_root=str(root))
    (repo / ".git" / "refs" / "heads" / "sandbox").mkdir(parents=True, exist_ok=True)
    (repo / ".git" / "refs" / "heads" / "sandbox" / "p").write_text("not a ref dir\n")
    with pytest.raises(SandboxCreationError):
        broken.create("p")
    (repo / ".git" / "refs" / "heads" / "sandbox" / "p").unlink()
    assert (repo / ".git" / "worktrees" / "mine").is_dir(), "bystander registration kept"
    assert [p.name for p in (repo / ".git" / "worktrees").iterdir()] == ["mine"]


# -- case 29 and its kind ---------------------------------------------------------------------


def _touch(repo: Path) -> None:
    (repo / "f").touch()


def _chown_same_owner(repo: Path) -> None:
    for path in [repo, *repo.rglob("*")]:
        if ".git" not in path.relative_to(repo).parts:
            st = path.lstat()
            os.lchown(path, st.st_uid, st.st_gid)


def _fsgroup_pass(repo: Path) -> None:
    """What kubelet does for fsGroup on every mount: chgrp, g+rw (and g+s on directories)."""
    for path in [repo, *repo.rglob("*")]:
        if ".git" in path.relative_to(repo).parts or path.is_symlink():
            continue
        os.chown(path, -1, 2000)
        extra = 0o2070 if path.is_dir() else 0o060
        path.chmod(path.stat().st_mode | extra)


def _rewrite_same_bytes(repo: Path) -> None:
    """A volume restore or copy: same content, new inode, new times."""
    for name in ("f", "g"):
        data = (repo / name).read_bytes()
        (repo / name).unlink()
        (repo / name).write_bytes(data)


def _old_mtime(repo: Path) -> None:
    os.utime(repo / "f", (1_000_000_000, 1_000_000_000))
    os.utime(repo / "g", (1_000_000_000, 1_000_000_000))


STAT_CHANGES: dict[str, Callable[[Path], None]] = {
    "touch": _touch,
    "chown-R-same-owner": _chown_same_owner,
    "fsgroup-pass": _fsgroup_pass,
    "rewrite-same-bytes": _rewrite_same_bytes,
    "old-mtime": _old_mtime,
}


def _stale(repo: Path) -> bool:
    """True when git's index stat data no longer matches (without refreshing the index)."""
    listed = git(repo, "--no-optional-locks", "diff-files", "--name-only")
    return bool(listed.strip())


@pytest.mark.parametrize("change", sorted(STAT_CHANGES))
@pytest.mark.parametrize("edited", ["f", "g", "f+g", "new"])
def test_stale_stat_data_is_never_a_conflict(tmp_path: Path, change: str, edited: str) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "base\n", "g": "other\n", "d/h": "h\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p29")
    for name in edited.split("+"):
        with Path(sandbox.get_path(name)).open("a") as handle:
            handle.write("edit\n")
    time.sleep(1.05)  # a second later, as in the case: mtime/ctime really move
    STAT_CHANGES[change](repo)
    assert _stale(repo), "the setup must leave stale stat data"
    assert git(repo, "--no-optional-locks", "status", "--porcelain") == ""

    result = sandbox.commit()
    assert result.success
    for name in edited.split("+"):
        expected = ("base\n" if name == "f" else "other\n" if name == "g" else "") + "edit\n"
        assert (repo / name).read_text() == expected
    assert git(repo, "status", "--porcelain") == ""

    STAT_CHANGES[change](repo)  # again, between commit and its rollback
    sandbox.rollback()
    assert (repo / "f").read_text() == "base\n" and (repo / "g").read_text() == "other\n"
    assert git(repo, "status", "--porcelain") == ""


def test_case29_touch_then_commit_twice(tmp_path: Path) -> None:
    """Case 29 as written: touch, commit (succeeds first time), commit again (state error)."""
    repo = make_repo(tmp_path / "repo", {"f": "base\n", "g": "other\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p29")
    with Path(sandbox.get_path("f")).open("a") as handle:
        handle.write("edit\n")
    time.sleep(1.05)
    (repo / "f").touch()
    assert git(repo, "--no-optional-locks", "status", "--porcelain") == ""
    result = sandbox.commit()
    assert result.changed_files == ["f"] and result.metadata.get("conflicts") is None
    assert (repo / "f").read_text() == "base\nedit\n"
    assert git(repo, "status", "--porcelain") == ""
    assert sandbox.status is SandboxStatus.COMMITTED


def test_real_local_change_is_still_a_conflict_after_a_stat_change(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "base\n", "g": "other\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    time.sleep(1.05)
    _fsgroup_pass(repo)
    (repo / "f").write_text("user's uncommitted work\n")
    with pytest.raises(SandboxConflictError) as err:
        sandbox.commit()
    assert err.value.conflicts == ["f"]
    assert (repo / "f").read_text() == "user's uncommitted work\n"
    assert sandbox.status is SandboxStatus.ACTIVE


@pytest.mark.parametrize("blocker", ["file", "symlink"])
def test_a_file_in_the_way_of_a_new_folder_is_a_conflict(tmp_path: Path, blocker: str) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "base\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    Path(sandbox.get_path("a/b")).mkdir(parents=True)
    Path(sandbox.get_path("a/b/c")).write_text("new\n")
    (repo / "a").mkdir()
    if blocker == "file":
        (repo / "a" / "b").write_text("untracked user file\n")
    else:
        (repo / "a" / "b").symlink_to(tmp_path)
    with pytest.raises(SandboxConflictError) as err:
        sandbox.commit()
    assert err.value.conflicts == ["a/b/c"]
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("change", ["touch", "fsgroup-pass"])
def test_interrupted_commit_completes_on_retry_despite_stale_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """Crash between files and ref, then a stat-only change, then the retry (recovery)."""
    from sandbox_core.strategies.git_worktree import GitCommand

    repo = make_repo(tmp_path / "repo", {"f": "base\n", "g": "other\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    real_run = GitCommand.run

    def die_before_ref_update(self: GitCommand, *args: str, **kwargs: object) -> object:
        if moves_ref(args, kwargs, "refs/heads/main"):  # injected crash
            raise KeyboardInterrupt
        return real_run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GitCommand, "run", die_before_ref_update)
    with pytest.raises(KeyboardInterrupt):
        sandbox.commit()
    monkeypatch.undo()
    time.sleep(1.05)
    STAT_CHANGES[change](repo)
    reopened = GitWorktreeSandbox.reopen(sandbox.to_record())
    result = reopened.commit()
    assert result.changed_files == ["f"]
    assert (repo / "f").read_text() == "sandbox\n"
    assert git(repo, "status", "--porcelain") == ""


def test_case02_recreate_through_a_symlinked_sandbox_root(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "a\n"})
    (tmp_path / "real-root").mkdir()
    (tmp_path / "root").symlink_to(tmp_path / "real-root")
    root = tmp_path / "root"
    first = GitWorktreeSandbox("r", str(repo), sandbox_root=str(root), sandbox_id="s2")
    context = first.create("p")
    shutil.rmtree(context.sandbox_path)
    again = GitWorktreeSandbox("r", str(repo), sandbox_root=str(root), sandbox_id="s2")
    assert again.create("p").metadata["branch"] == context.metadata["branch"]
    again.cleanup()
    assert not (repo / ".git" / "worktrees").exists() or not any(
        (repo / ".git" / "worktrees").iterdir()
    )
    assert git(repo, "for-each-ref", "refs/heads/sandbox/") == ""
