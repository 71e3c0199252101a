"""git_worktree: the owner policy and classified failures (issue 7, section 2).

- A repository owned by another user is refused (nothing left behind) unless the option
  ``trust_repository_owner`` is true; then, as root, git runs as the owner: every file written
  back keeps its owner, group and permission bits, new files take their directory's owner, and
  nothing under ``.git`` becomes root's.
- A leftover lock, a permission problem and a real conflict are different errors with
  different CLI exit codes (8, 9, 5); each refuses before touching the original and leaves the
  sandbox ACTIVE, and each message says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_core import GitWorktreeSandbox, SandboxStatus
from sandbox_core.errors import (
    SandboxCommitLockedError,
    SandboxCommitPermissionError,
    SandboxConflictError,
    SandboxCreationPermissionError,
    SandboxLockedError,
    SandboxPermissionError,
    SandboxRollbackLockedError,
)
from tests.support.gitrepo import GIT_ENV, git, make_repo

OWNER = 1234
OTHER = 4321
CLI = [sys.executable, "-m", "sandbox_core.cli"]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A work dir another user can traverse (pytest's tmp_path is root-only, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="sandbox-git-owner-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def chown_tree(top: Path, uid: int, gid: int) -> None:
    for path in [top, *top.rglob("*")]:
        os.lchown(path, uid, gid)


def foreign_repo(base: Path) -> Path:
    repo = make_repo(
        base / "repo", {"f": "f\n", "secret": "s\n", "sub/g": "g\n", "root-file": "r\n"}
    )
    chown_tree(repo, OWNER, OWNER)
    (repo / "secret").chmod(0o600)
    os.lchown(repo / "root-file", OTHER, OTHER)
    (repo / "root-file").chmod(0o664)
    git(repo, "-c", "safe.directory=*", "update-index", "--refresh")
    return repo


def owners(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_uid, info.st_gid, info.st_mode & 0o7777


def snapshot(repo: Path) -> dict[str, tuple[int, int, int, bytes]]:
    out = {}
    for path in repo.rglob("*"):
        if ".git" not in path.relative_to(repo).parts and path.is_file():
            out[str(path.relative_to(repo))] = (*owners(path), path.read_bytes())
    return out


def not_owner_in_git_dir(repo: Path) -> list[str]:
    return [str(p) for p in (repo / ".git").rglob("*") if p.lstat().st_uid != OWNER]


@needs_root
def test_repository_of_another_user_is_refused_unless_trusted(open_dir: Path) -> None:
    repo = foreign_repo(open_dir)
    before = snapshot(repo)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(open_dir / "root"))
    with pytest.raises(SandboxCreationPermissionError) as err:
        sandbox.create("p")
    message = str(err.value)
    assert f"owned by uid {OWNER}" in message and "trust_repository_owner=true" in message
    assert isinstance(err.value, SandboxPermissionError)
    assert sandbox.status is SandboxStatus.ERRORED
    assert snapshot(repo) == before
    assert not (repo / ".git" / "worktrees").exists()
    assert not list((open_dir / "root").rglob("*")) if (open_dir / "root").exists() else True
    assert "sandbox" not in git(repo, "-c", "safe.directory=*", "branch", "--list")


@needs_root
def test_trusted_repository_keeps_owner_group_and_mode_of_everything_written(
    open_dir: Path,
) -> None:
    repo = foreign_repo(open_dir)
    sandbox = GitWorktreeSandbox(
        "r", str(repo), sandbox_root=str(open_dir / "root"), trust_repository_owner="true"
    )
    sandbox.create("p")
    for name in ("f", "secret", "root-file", "sub/g"):
        with Path(sandbox.get_path(name)).open("a") as handle:
            handle.write("edit\n")
    Path(sandbox.get_path("newdir")).mkdir()
    Path(sandbox.get_path("newdir/n")).write_text("n\n")
    result = sandbox.commit()
    assert sorted(result.changed_files) == ["f", "root-file", "secret", "sub/g"]
    assert owners(repo / "f") == (OWNER, OWNER, 0o644)
    assert owners(repo / "secret") == (OWNER, OWNER, 0o600)
    assert owners(repo / "root-file") == (OTHER, OTHER, 0o664)
    assert owners(repo / "sub" / "g")[:2] == (OWNER, OWNER)
    assert owners(repo / "newdir")[:2] == (OWNER, OWNER)
    assert owners(repo / "newdir" / "n")[:2] == (OWNER, OWNER)
    assert (repo / "root-file").read_text() == "r\nedit\n"
    assert not_owner_in_git_dir(repo) == []

    # Files an actor (root) makes in the sandbox do not block its rollback.
    sandbox.rollback()
    assert not (repo / "newdir").exists()
    assert owners(repo / "secret") == (OWNER, OWNER, 0o600)
    assert owners(repo / "root-file") == (OTHER, OTHER, 0o664)
    assert not_owner_in_git_dir(repo) == []
    Path(sandbox.get_path("made-by-root")).mkdir()
    Path(sandbox.get_path("made-by-root/x")).write_text("x\n")
    sandbox.rollback()
    assert not Path(sandbox.get_path("made-by-root")).exists()
    sandbox.cleanup()
    assert not_owner_in_git_dir(repo) == []
    assert git(repo, "-c", "safe.directory=*", "worktree", "list").count("\n") == 0


@needs_root
def test_a_folder_git_cannot_write_refuses_commit_before_touching(open_dir: Path) -> None:
    repo = foreign_repo(open_dir)
    os.lchown(repo / "sub", 0, 0)  # root's folder: the owner (git's user) cannot write in it
    sandbox = GitWorktreeSandbox(
        "r", str(repo), sandbox_root=str(open_dir / "root"), trust_repository_owner=True
    )
    sandbox.create("p")
    Path(sandbox.get_path("f")).write_text("changed\n")
    Path(sandbox.get_path("sub/g")).write_text("changed\n")
    before = snapshot(repo)
    with pytest.raises(SandboxCommitPermissionError) as err:
        sandbox.commit()
    assert str(repo / "sub") in str(err.value) and "Nothing was changed" in str(err.value)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert snapshot(repo) == before
    os.lchown(repo / "sub", OWNER, OWNER)
    assert sandbox.commit().success


@pytest.mark.parametrize("lock", ["index.lock", "refs/heads/main.lock"])
def test_leftover_lock_in_the_original_refuses_commit_until_removed(
    tmp_path: Path, lock: str
) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "f\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    Path(sandbox.get_path("f")).write_text("changed\n")
    lock_file = repo / ".git" / lock
    lock_file.write_text("")
    with pytest.raises(SandboxCommitLockedError) as err:
        sandbox.commit()
    assert err.value.lock_path == str(lock_file)
    assert "remove" in str(err.value) and "Nothing was changed" in str(err.value)
    assert isinstance(err.value, SandboxLockedError)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert (repo / "f").read_text() == "f\n"
    assert git(repo, "rev-parse", "main") == git(repo, "rev-parse", "HEAD")
    lock_file.unlink()
    assert git(repo, "status", "--porcelain") == ""
    assert sandbox.commit().success
    assert (repo / "f").read_text() == "changed\n"


def test_leftover_lock_in_the_sandbox_refuses_commit_and_rollback(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "f\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    context = sandbox.create("p")
    Path(sandbox.get_path("f")).write_text("changed\n")
    lock_file = Path(context.metadata["worktree_admin_dir"]) / "index.lock"
    lock_file.write_text("")  # an actor's git crashed in the sandbox
    with pytest.raises(SandboxCommitLockedError):
        sandbox.commit()
    assert sandbox.status is SandboxStatus.ACTIVE
    with pytest.raises(SandboxRollbackLockedError) as err:
        sandbox.rollback()
    assert err.value.refused and err.value.lock_path == str(lock_file)
    assert sandbox.status is SandboxStatus.ACTIVE
    lock_file.unlink()
    sandbox.rollback()
    assert Path(sandbox.get_path("f")).read_text() == "f\n"


def test_real_conflict_is_its_own_class(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f": "f\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p")
    Path(sandbox.get_path("f")).write_text("sandbox\n")
    (repo / "f").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    with pytest.raises(SandboxConflictError) as err:
        sandbox.commit()
    assert err.value.conflicts == ["f"] and "retry" in str(err.value)
    assert not isinstance(err.value, (SandboxLockedError, SandboxPermissionError))


# -- the CLI's exit codes ---------------------------------------------------------------------


def cli(env: dict[str, str], *args: str, expect: int) -> Any:
    done = subprocess.run([*CLI, "--json", *args], capture_output=True, text=True, env=env)
    assert done.returncode == expect, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def cli_env(open_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        **GIT_ENV,
        "SANDBOX_CORE_STATE_DIR": str(open_dir / "state"),
        "SANDBOX_CORE_ROOT": str(open_dir / "sandboxes"),
    }


def test_cli_exit_8_for_a_leftover_lock(cli_env: dict[str, str], open_dir: Path) -> None:
    repo = make_repo(open_dir / "repo", {"f": "f\n"})
    created = cli(
        cli_env,
        "create",
        "--plan",
        "p",
        "--resource",
        "r",
        "--strategy",
        "git_worktree",
        str(repo),
        expect=0,
    )
    sid = created["sandbox_id"]
    Path(cli(cli_env, "path", sid, "f", expect=0)["path"]).write_text("changed\n")
    (repo / ".git" / "index.lock").write_text("")
    out = cli(cli_env, "commit", sid, expect=8)
    assert out["error"]["type"] == "SandboxCommitLockedError"
    assert out["error"]["lock_path"] == str(repo / ".git" / "index.lock")
    assert cli(cli_env, "status", sid, expect=0)["status"] == "active"
    (repo / ".git" / "index.lock").unlink()
    cli(cli_env, "commit", sid, expect=0)


@needs_root
def test_cli_exit_9_for_an_untrusted_owner_and_the_option_to_trust(
    cli_env: dict[str, str], open_dir: Path
) -> None:
    repo = foreign_repo(open_dir)
    args = ["create", "--plan", "p", "--resource", "r", "--strategy", "git_worktree"]
    out = cli(cli_env, *args, str(repo), expect=9)
    assert out["error"]["type"] == "SandboxCreationPermissionError"
    assert "--option trust_repository_owner=true" in out["error"]["message"]
    created = cli(cli_env, *args, "--option", "trust_repository_owner=true", str(repo), expect=0)
    sid = created["sandbox_id"]
    Path(cli(cli_env, "path", sid, "f", expect=0)["path"]).write_text("changed\n")
    cli(cli_env, "commit", sid, expect=0)
    assert owners(repo / "f")[:2] == (OWNER, OWNER)
    cli(cli_env, "cleanup", sid, expect=0)


def test_checkpoint_restore_blocked_by_a_lock_says_so(tmp_path: Path) -> None:
    from sandbox_core import CheckpointManager

    repo = make_repo(tmp_path / "repo", {"f": "f\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    context = sandbox.create("p")
    manager = CheckpointManager(state_dir=str(tmp_path / "state"))
    checkpoint = manager.create_checkpoint(sandbox, "p", "pre")
    Path(sandbox.get_path("f")).write_text("after the checkpoint\n")
    lock_file = Path(context.metadata["worktree_admin_dir"]) / "index.lock"
    lock_file.write_text("")
    with pytest.raises(SandboxLockedError) as err:
        manager.rollback_to(checkpoint)
    assert err.value.lock_path == str(lock_file)
    assert Path(sandbox.get_path("f")).read_text() == "after the checkpoint\n"
    lock_file.unlink()
    assert manager.rollback_to(checkpoint)
    assert Path(sandbox.get_path("f")).read_text() == "f\n"


def test_cli_help_documents_the_exit_codes() -> None:
    done = subprocess.run([*CLI, "--help"], capture_output=True, text=True, check=True)
    text = " ".join(done.stdout.split())
    assert "8 a leftover lock file blocks it" in text
    assert "9 permission denied or untrusted owner" in text
    assert "5 commit refused for conflicts" in text
