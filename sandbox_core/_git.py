"""Private helpers: run git through GitPython with explicit locations and a fixed identity.

Every command names its repository explicitly (``-C <dir>``, or ``--git-dir``/``--work-tree`` for a
sandbox worktree), so a missing directory can never make git fall back to the process's current
directory, and a tampered ``.git`` file inside a worktree cannot redirect the product's own
commands. Failures surface as :class:`GitFailure`; strategies translate it into the sandbox_core
error of the phase they are in (GitPython errors never leave this module).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

# The product commits under its own name so that no global git identity is needed; git's own
# precedence still lets GIT_AUTHOR_* / GIT_COMMITTER_* in the environment override it.
PRODUCT_IDENTITY: Mapping[str, str] = {
    "user.name": "sandbox-core",
    "user.email": "sandbox-core@localhost",
}


class GitFailure(Exception):  # noqa: N818 - private; translated to a SandboxError by callers
    """A git command failed or could not be started. ``stderr`` holds git's own words."""

    def __init__(self, args: Iterable[str], status: int, stderr: str) -> None:
        self.args_run = list(args)
        self.status = status
        self.stderr = stderr.strip()
        super().__init__(f"git {' '.join(self.args_run)} failed ({status}): {self.stderr}")


@dataclass(frozen=True)
class GitResult:
    """Exit status and decoded output of one git command (stdout not stripped)."""

    status: int
    stdout: str
    stderr: str

    @property
    def out(self) -> str:
        """stdout without the trailing newline."""
        return self.stdout.rstrip("\n")

    def nul_fields(self) -> list[str]:
        """stdout of a ``-z`` command split on NUL, empty fields dropped."""
        return [field for field in self.stdout.split("\0") if field]


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    # surrogateescape keeps non-UTF-8 file names round-trippable.
    return data.decode("utf-8", "surrogateescape")


# Variables through which an enclosing git process (a hook, ``git rebase --exec``) would redirect
# our commands to its own repository; those without a command-line option are pinned explicitly.
_LOCATION_VARIABLES = ("GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


class GitCommand:
    """Runs git against one explicitly located repository.

    Args:
        git_dir: the (per-worktree) git directory.
        common_dir: the repository's common directory (objects, refs).
        work_tree: the working tree, or None for ref-only commands.
    """

    def __init__(self, git_dir: str, common_dir: str, work_tree: str | None = None) -> None:
        prefix = ["--git-dir", git_dir]
        if work_tree is not None:
            prefix += ["--work-tree", work_tree, "-C", work_tree]
        self._prefix = prefix
        self._pinned = {
            "GIT_INDEX_FILE": str(Path(git_dir) / "index"),
            "GIT_OBJECT_DIRECTORY": str(Path(common_dir) / "objects"),
            "GIT_COMMON_DIR": common_dir,
        }
        self._git = git.Git()
        config: list[str] = []
        for key, value in PRODUCT_IDENTITY.items():
            config += ["-c", f"{key}={value}"]
        self._config = config

    def run(
        self,
        *args: str,
        ok: Iterable[int] = (0,),
    ) -> GitResult:
        """Run ``git <prefix> <args>``; an exit status outside ``ok`` raises :class:`GitFailure`.

        Raises:
            GitFailure: git exited with an unexpected status or could not be started.
        """
        command = ["git", *self._config, *self._prefix, *args]
        try:
            status, out, err = self._git.execute(
                command,
                env={key: self._pinned[key] for key in _LOCATION_VARIABLES if key in os.environ},
                with_extended_output=True,
                with_exceptions=False,
                stdout_as_string=False,
                strip_newline_in_stdout=False,
            )
        except (git.GitError, OSError) as exc:
            raise GitFailure(args, -1, str(exc)) from exc
        result = GitResult(int(status), _decode(out), _decode(err))
        if result.status not in tuple(ok):
            raise GitFailure(args, result.status, result.stderr or result.stdout)
        return result


def open_repo(repo_dir: str | os.PathLike[str]) -> git.Repo:
    """Open the repository of the checkout at ``repo_dir`` with GitPython.

    Raises:
        GitFailure: not a git checkout, or unreadable.
    """
    try:
        return git.Repo(str(repo_dir), search_parent_directories=True)
    except (git.GitError, OSError, ValueError) as exc:
        raise GitFailure(["open", str(repo_dir)], -1, f"not a git repository: {exc}") from exc


def read_gitdir_file(work_tree: str | os.PathLike[str]) -> str | None:
    """The admin directory a linked worktree's ``.git`` file points at, or None if unreadable."""
    try:
        content = (Path(work_tree) / ".git").read_text(encoding="utf-8")
    except OSError:
        return None
    prefix = "gitdir:"
    if not content.startswith(prefix):
        return None
    target = content[len(prefix) :].strip()
    if not os.path.isabs(target):  # noqa: PTH117 - str path from git's own file
        target = str(Path(work_tree) / target)
    return target


@contextmanager
def repository_lock(common_dir: str) -> Iterator[None]:
    """Serialise the product's own updates of one repository across threads and processes.

    An exclusive ``flock`` on ``<common_dir>/sandbox-core.lock`` (the common dir, never a linked
    worktree's ``.git`` file). git's own commands do not take it; they are guarded by git's
    index and ref locks, which the product's updates also respect.

    Raises:
        OSError: the lock file cannot be opened.
    """
    fd = os.open(str(Path(common_dir) / "sandbox-core.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock
