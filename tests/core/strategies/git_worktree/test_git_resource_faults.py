"""A full or read-only file system during a ``git_worktree`` commit (one-shot, prepare, apply).

The property, for every git step of the commit: the original is exactly as before (files,
index, refs), the sandbox stays ACTIVE (prepare and apply keep their status), the error says
what happened (a full or read-only file system, never "conflict" or "uncommitted changes"),
and the same call succeeds once space is back. Tested on a small tmpfs holding the repository
(real ENOSPC, real EROFS) and by fault injection at each git command.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_core import GitWorktreeSandbox, SandboxStatus
from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCommitPermissionError,
    SandboxRollbackError,
)
from sandbox_core.strategies.git_worktree import merge
from sandbox_core.strategies.git_worktree.git import GitCommand, GitResult
from tests.support.gitrepo import GIT_ENV, git, make_repo

BIG = 3 * 1024 * 1024


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A 12 MiB tmpfs of its own, unmounted after the test."""
    where = tmp_path / "vol"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def state(repo: Path) -> tuple[dict[str, tuple[int, str]], str, str]:
    """({path: (mode, sha256)} outside .git, the index entries (mode, id, stage, flags, size;
    not git's stat cache), every ref and HEAD)."""
    files = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if rel == ".git" or rel.startswith(".git/") or path.is_dir():
            continue
        files[rel] = (path.lstat().st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
    index = git(repo, "ls-files", "-s", "--debug")  # entries and flags, not the stat cache
    index = "\n".join(
        line for line in index.splitlines() if not line.startswith(("  ctime", "  mtime", "  dev"))
    )
    refs = git(repo, "for-each-ref", "--format=%(refname) %(objectname)") + git(
        repo, "rev-parse", "HEAD"
    )
    return files, index, refs


def fill(volume: Path, leave: int) -> Path:
    """Fill ``volume`` until about ``leave`` bytes are free; the filler file."""
    filler = volume / "filler"
    info = os.statvfs(volume)
    size = max(0, info.f_bfree * info.f_frsize - leave)
    with filler.open("wb") as out:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            try:
                out.write(chunk[: min(size, len(chunk))])
                out.flush()
            except OSError:
                break
            size -= len(chunk)
    return filler


def world(tmp_path: Path, volume: Path) -> tuple[Path, GitWorktreeSandbox]:
    repo = make_repo(volume / "repo", {"a.txt": "a\n", "dir/b.txt": "b\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("a.txt")).write_text("a2\n")
    Path(sandbox.get_path("dir/big.bin")).write_bytes(os.urandom(BIG))  # incompressible
    Path(sandbox.get_path("dir/b.txt")).unlink()
    return repo, sandbox


def says_full(error: BaseException) -> None:
    text = str(error).lower()
    assert "space" in text or "full" in text, text
    assert "conflict" not in text
    assert "uncommitted" not in text
    assert getattr(error, "retryable", False) is True
    assert not getattr(error, "conflicts", [])


def landed(repo: Path) -> None:
    assert (repo / "a.txt").read_text() == "a2\n"
    assert (repo / "dir" / "big.bin").stat().st_size == BIG
    assert not (repo / "dir" / "b.txt").exists()
    assert git(repo, "status", "--porcelain") == ""


def run_commit(sandbox: GitWorktreeSandbox, how: str) -> None:
    if how == "one-shot":
        sandbox.commit()
    else:
        sandbox.prepare("tx")
        sandbox.apply_prepared("tx")


# -- a real full file system ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["one-shot", "two-phase"])
@pytest.mark.parametrize("leave", [256 * 1024, 4 * 1024 * 1024], ids=["no-room", "objects-only"])
def test_full_tmpfs_keeps_the_original_and_the_retry_lands(
    tmp_path: Path, volume: Path, how: str, leave: int
) -> None:
    """``no-room``: the object store cannot take the sandbox's blob (``add -A`` fails);
    ``objects-only``: the objects fit, the checked-out files would not (refused before the
    original's files are written)."""
    repo, sandbox = world(tmp_path, volume)
    filler = fill(volume, leave)
    before = state(repo)
    with pytest.raises(SandboxCommitError) as caught:
        run_commit(sandbox, how)
    says_full(caught.value)
    assert state(repo) == before
    assert sandbox.status is SandboxStatus.ACTIVE
    filler.unlink()
    run_commit(sandbox, how)
    landed(repo)
    assert sandbox.status is SandboxStatus.COMMITTED
    sandbox.cleanup()


@pytest.mark.parametrize("how", ["one-shot", "two-phase"])
def test_space_gone_between_check_and_write_is_put_back(
    tmp_path: Path, volume: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The space check passes, then the volume fills before ``read-tree`` has written every
    file (injected: the check is skipped): what git wrote is put back from the index."""
    repo, sandbox = world(tmp_path, volume)
    sandbox.prepare("tx")  # the objects are in the store: only the checkout needs room
    if how == "one-shot":
        sandbox.abort_prepared("tx")
    filler = fill(volume, 1024 * 1024)
    monkeypatch.setattr(merge.MergeBack, "_check_space", lambda *args: None)
    before = state(repo)
    with pytest.raises(SandboxCommitError) as caught:
        if how == "one-shot":
            sandbox.commit()
        else:
            sandbox.apply_prepared("tx")
    says_full(caught.value)
    assert state(repo) == before
    assert sandbox.status is SandboxStatus.ACTIVE
    filler.unlink()
    monkeypatch.undo()
    if how == "one-shot":
        sandbox.commit()
    else:
        sandbox.apply_prepared("tx")  # the decision stands: the apply is retried
    landed(repo)
    sandbox.cleanup()


# -- a read-only file system ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["one-shot", "two-phase"])
def test_read_only_tmpfs_refuses_and_the_retry_lands(
    tmp_path: Path, volume: Path, how: str
) -> None:
    repo, sandbox = world(tmp_path, volume)
    if how == "two-phase":
        sandbox.prepare("tx")
    before = state(repo)
    subprocess.run(["mount", "-o", "remount,ro", str(volume)], check=True)
    try:
        with pytest.raises(SandboxCommitPermissionError) as caught:
            if how == "one-shot":
                sandbox.commit()
            else:
                sandbox.apply_prepared("tx")
        assert "read-only" in str(caught.value).lower()
        assert "conflict" not in str(caught.value).lower()
        assert sandbox.status is SandboxStatus.ACTIVE
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(volume)], check=True)
    assert state(repo) == before
    if how == "one-shot":
        sandbox.commit()
    else:
        sandbox.apply_prepared("tx")
    landed(repo)
    sandbox.cleanup()


# -- fault injection at every git command of the commit ----------------------------------------

ENOSPC = "error: unable to write file dir/big.bin\nfatal: No space left on device"
EROFS = "error: unable to create file a.txt: Read-only file system"


def inject(
    monkeypatch: pytest.MonkeyPatch, command: str, stderr: str, *, after_write: bool
) -> list[int]:
    """Make the first ``git <command>`` fail with ``stderr``; with ``after_write``, it runs
    first (its writes happen, as when a disk fills part-way), then reports the failure."""
    real = GitCommand.run
    hits: list[int] = []

    def run(self: GitCommand, *args: str, **kwargs: Any) -> GitResult:
        if args[:1] == (command,) and not hits:
            hits.append(1)
            if after_write and command == "read-tree":
                # The files are written, the index (written last) is not: run it for real,
                # then put the index file back as it was.
                index = Path(self.git_dir) / "index"
                saved = index.read_bytes()
                real(self, *args, **kwargs)
                index.write_bytes(saved)
            failed = GitResult(128, "", stderr)
            if 128 in tuple(kwargs.get("ok", (0,))):
                return failed
            from sandbox_core.strategies.git_worktree.git import GitFailure

            raise GitFailure(args, 128, stderr)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GitCommand, "run", run)
    return hits


COMMIT_STEPS = ["add", "write-tree", "diff-tree", "rev-parse", "commit-tree", "read-tree",
                "update-ref"]  # fmt: skip


@pytest.mark.parametrize("after_write", [False, True], ids=["before-write", "after-write"])
@pytest.mark.parametrize("command", COMMIT_STEPS)
def test_no_space_at_each_step_of_a_one_shot_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, after_write: bool
) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "dir/b.txt": "b\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("a.txt")).write_text("a2\n")
    Path(sandbox.get_path("dir/c.txt")).write_text("c\n")
    before = state(repo)
    hits = inject(monkeypatch, command, ENOSPC, after_write=after_write)
    with pytest.raises(SandboxCommitError) as caught:
        sandbox.commit()
    assert hits
    says_full(caught.value)
    assert state(repo) == before
    assert sandbox.status is SandboxStatus.ACTIVE
    monkeypatch.undo()
    sandbox.commit()
    assert (repo / "a.txt").read_text() == "a2\n"
    assert (repo / "dir" / "c.txt").read_text() == "c\n"
    assert git(repo, "status", "--porcelain") == ""
    sandbox.cleanup()


@pytest.mark.parametrize("stderr", [ENOSPC, EROFS], ids=["ENOSPC", "EROFS"])
@pytest.mark.parametrize("command", ["read-tree", "update-ref"])
def test_fault_in_a_two_phase_apply_keeps_the_original_and_the_retry_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, stderr: str
) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "dir/b.txt": "b\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("a.txt")).write_text("a2\n")
    Path(sandbox.get_path("dir/c.txt")).write_text("c\n")
    sandbox.prepare("tx")
    before = state(repo)
    inject(monkeypatch, command, stderr, after_write=True)
    with pytest.raises(SandboxCommitError) as caught:
        sandbox.apply_prepared("tx")
    text = str(caught.value).lower()
    assert "conflict" not in text and "uncommitted" not in text
    assert ("space" in text or "full" in text) if stderr == ENOSPC else "read-only" in text
    assert state(repo) == before
    assert sandbox.status is SandboxStatus.ACTIVE
    monkeypatch.undo()
    sandbox.apply_prepared("tx")
    assert (repo / "a.txt").read_text() == "a2\n"
    assert git(repo, "status", "--porcelain") == ""
    sandbox.cleanup()


@pytest.mark.parametrize("command", ["read-tree", "update-ref"])
def test_no_space_while_undoing_a_commit_keeps_it_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """Rollback from COMMITTED meets a full disk: the original stays as committed, the
    sandbox COMMITTED, the refusal says the disk is full; the retry undoes the commit."""
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("a.txt")).write_text("a2\n")
    Path(sandbox.get_path("n.txt")).write_text("n\n")
    sandbox.commit()
    before = state(repo)
    inject(monkeypatch, command, ENOSPC, after_write=True)
    with pytest.raises(SandboxRollbackError) as caught:
        sandbox.rollback()
    assert caught.value.refused
    says_full(caught.value)
    assert state(repo) == before
    assert sandbox.status is SandboxStatus.COMMITTED
    monkeypatch.undo()
    sandbox.rollback()
    assert (repo / "a.txt").read_text() == "a\n"
    assert not (repo / "n.txt").exists()
    sandbox.cleanup()
