"""Helpers and fixtures of the actor tests (loaded by tests/core/actor/conftest.py and
tests/core/agent/conftest.py): a command runner over a state directory that looks like a
workspace agent's (a token file, records, a request journal), sandboxes of every strategy on
real git repositories and real directories, and a secret in the process environment."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_core.actor.exec import CommandRunner
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.factory import SandboxFactory
from tests.support.directory_sandboxes import new_sandbox
from tests.support.gitrepo import GIT_ENV, make_repo

TOKEN = "agent-token-0123456789abcdef"
DSN_SECRET = "postgresql://app:pw-secret-42@db/app"
FILES = {"f.txt": "base\n", "gone.txt": "bye\n", "d/g.txt": "g\n"}
KINDS = [
    pytest.param("git_worktree", id="git_worktree"),
    pytest.param("copy_on_write", id="copy_on_write"),
    pytest.param("overlay-kernel", id="overlay-kernel", marks=pytest.mark.overlay_kernel),
    pytest.param("overlay-fallback", id="overlay-fallback"),
]


class Layout:
    """The paths of one test: the agent's state (token, records, journal), an original, and
    another sandbox's private directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.token = self.state / "token"
        self.other = root / "sandboxes" / "other-sandbox"
        (self.state / "sandboxes").mkdir(parents=True)
        (self.state / "requests").mkdir()
        self.token.write_text(TOKEN)
        (self.state / "sandboxes" / "x.json").write_text('{"secret": "record-secret"}')
        (self.state / "requests" / "r.json").write_text('{"payload": "journal-secret"}')
        self.other.mkdir(parents=True)
        (self.other / "private.txt").write_text("other-sandbox-secret")

    def runner(self, **kwargs: object) -> CommandRunner:
        return CommandRunner(self.state, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    monkeypatch.setenv("SANDBOX_SOURCE_DSN", DSN_SECRET)
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    return Layout(tmp_path)


MakeSandbox = Callable[[str], BaseSandbox]


@pytest.fixture
def make_sandbox(layout: Layout) -> Iterator[MakeSandbox]:
    """``make_sandbox(kind)``: an ACTIVE sandbox of a fresh original holding :data:`FILES`
    (a git repository for git_worktree, a directory otherwise); cleaned up after the test."""
    made: list[BaseSandbox] = []

    def make(kind: str) -> BaseSandbox:
        original = layout.root / f"original-{len(made)}"
        root = str(layout.root / "sandboxes")
        if kind in ("git_worktree", "none"):
            make_repo(original, FILES)
            sandbox = SandboxFactory().create(kind, "res", str(original), sandbox_root=root)
        else:
            original.mkdir()
            for name, text in FILES.items():
                (original / name).parent.mkdir(parents=True, exist_ok=True)
                (original / name).write_text(text)
            sandbox = new_sandbox(kind, original, Path(root))
        made.append(sandbox)
        sandbox.create("plan-a")
        sandbox.activate()
        return sandbox

    yield make
    for sandbox in made:
        if sandbox.status.value not in ("cleaned_up",):
            sandbox.cleanup()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(layout.root) not in mounts, "a mount was left behind"
