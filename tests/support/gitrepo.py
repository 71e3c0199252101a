"""Real git repositories for tests: the identity CI lacks, a ``git`` runner, a one-commit repo.

Imported as ``tests.support.gitrepo`` (the repository root is on ``sys.path``). Loaded as a
pytest plugin too (``tests/conftest.py``): the ``git_identity`` fixture puts the identity in the
environment of a test that runs git in-process.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with the test identity; stdout without its trailing newline.

    Leading spaces are kept (``git status --porcelain`` starts lines with them).

    Raises:
        subprocess.CalledProcessError: git failed.
    """
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **GIT_ENV},
    )
    return done.stdout.rstrip("\n")


def make_repo(path: Path, files: Mapping[str, str]) -> Path:
    """A git repository at ``path`` on branch main with one commit ("base") of ``files``."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    return path


def moves_ref(args: tuple[str, ...], kwargs: Mapping[str, object], ref: str) -> bool:
    """True when a ``GitCommand.run(*args, **kwargs)`` call is an ``update-ref`` that moves
    ``ref``, given as arguments or as a line of an ``update-ref --stdin`` transaction (for
    fault injection: "crash right before the target ref moves")."""
    if args[:1] != ("update-ref",):
        return False
    stdin = str(kwargs.get("stdin") or "")
    return ref in args or any(line.split()[1:2] == [ref] for line in stdin.splitlines())


@pytest.fixture
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """:data:`GIT_ENV` in the test's environment, for git run by the product in this process."""
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
