"""Control paths are refused to actors in every strategy and on every route, and never committed
(docs/security.md, "Control paths").

Through the workspace agent's operations (what every agent route calls): writes, appends,
edits, deletes, moves (source and target), mkdir and uploads under ``.git`` (and its case and
Unicode aliases) or onto the core's own files are refused before anything is touched; and a
sandbox whose tree gained a control path by another way (a command) is refused at commit,
naming the path, the original untouched.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.actor.exec import ExecRequest
from sandbox_core.agent.operations import AgentConfig, Operations
from sandbox_core.errors import SandboxCommitError, SandboxPathError
from sandbox_core.paths import is_control_name
from tests.support.actor import Layout, MakeSandbox
from tests.support.gitrepo import GIT_ENV, git, make_repo

STRATEGIES = ["git_worktree", "copy_on_write", "overlay", "overlay:fallback", "none"]
DIRECTORY_STRATEGIES = ["copy_on_write", "overlay", "overlay:fallback"]
CONTROL_PATHS = [
    ".git/config",
    ".GIT/config",
    ".Git./hooks/pre-commit",
    ".g\u200cit/config",  # a zero-width non-joiner: HFS+ ignores it
    "\uff0egit/config",  # a full-width dot: NFKC makes it ".git"
    "sub/.git/config",
    ".repo.sandbox-lock",
    "sub/.data.sandbox-staging-prepared-tx.01J",
    ".data.overlay-01JABC/upper/x",
]
EVIL = b"[core]\n\tfsmonitor = touch /tmp/pwned\n"


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def ops(tmp_path: Path) -> Iterator[Operations]:
    operations = Operations(AgentConfig(tmp_path / "state", tmp_path / "sandboxes", environ={}))
    yield operations
    for sid in list(operations._live):  # a kernel overlay stays mounted until cleaned up
        operations.cleanup(sid)


def create(ops: Operations, original: Path, strategy: str, sid: str = "01JCTRL") -> str:
    """``strategy`` may be ``overlay:fallback`` (the userspace overlay) or ``overlay`` (the
    kernel's where it can mount, else the fallback)."""
    strategy, _, mode = strategy.partition(":")
    options = {"mode": mode} if mode else {}
    body = {
        "plan_id": "p", "resource_id": "r", "original": str(original), "strategy": strategy,
        "sandbox_id": sid, "options": options,
    }  # fmt: skip
    return str(ops.create(body)["sandbox_id"])


@pytest.fixture(params=STRATEGIES)
def sandbox(ops: Operations, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n", "sub/g.txt": "g\n"})
    return create(ops, repo, request.param)


def routes(ops: Operations, sid: str, rel: str) -> dict[str, Callable[[], Any]]:
    """Every changing operation an actor has, aimed at ``rel``."""
    content = base64.b64encode(EVIL).decode()
    return {
        "write (PUT files)": lambda: ops.write(sid, rel, EVIL),
        "put bytes": lambda: ops.put_bytes(sid, rel, EVIL, False),
        "append": lambda: ops.put_bytes(sid, rel, EVIL, True),
        "write file": lambda: ops.write_file(sid, {"path": rel, "content": EVIL.decode()}),
        "edit": lambda: ops.edit_file(sid, {"path": rel, "old": "[core]", "new": "x"}),
        "delete": lambda: ops.delete_file(sid, {"path": rel, "recursive": True}),
        "move from": lambda: ops.move_file(sid, {"path": rel, "to": "stolen"}),
        "move onto": lambda: ops.move_file(sid, {"path": "f.txt", "to": rel, "overwrite": True}),
        "mkdir": lambda: ops.make_dir(sid, {"path": rel}),
        "upload": lambda: ops.upload(sid, {"files": [{"path": rel, "content_b64": content}]}),
    }


@pytest.mark.parametrize("rel", CONTROL_PATHS)
def test_every_route_refuses_a_control_path_in_every_strategy(
    ops: Operations, sandbox: str, rel: str
) -> None:
    root = Path(ops.path(sandbox, "."))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    config = (root / ".git").read_bytes() if (root / ".git").is_file() else None
    for name, action in routes(ops, sandbox, rel).items():
        if name == "upload":
            (result,) = action()["results"]
            assert result["ok"] is False and "control path" in result["error"]["message"], name
            continue
        with pytest.raises(SandboxPathError, match="control path"):
            action()
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    if config is not None:
        assert (root / ".git").read_bytes() == config


def test_a_symlink_to_the_control_directory_is_never_followed(
    ops: Operations, sandbox: str
) -> None:
    root = Path(ops.path(sandbox, "."))
    (root / "alias").symlink_to(".git")  # as a command could
    try:
        for action in routes(ops, sandbox, "alias/config").values():
            try:
                result = action()
            except SandboxPathError:
                continue
            assert result["results"][0]["ok"] is False
    finally:
        (root / "alias").unlink()
    git_dir = root / ".git"
    if git_dir.is_dir():
        assert b"fsmonitor" not in (git_dir / "config").read_bytes()


@pytest.mark.parametrize("strategy", DIRECTORY_STRATEGIES)
def test_a_git_directory_made_by_a_command_is_never_committed_into_a_plain_original(
    ops: Operations, tmp_path: Path, strategy: str
) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "f.txt").write_text("base\n")
    sid = create(ops, data, strategy)
    root = Path(ops.path(sid, "."))
    (root / ".git").mkdir()  # what `git init` or `mkdir .git` in a command does
    (root / ".git" / "config").write_bytes(EVIL)
    (root / "f.txt").write_text("changed\n")
    with pytest.raises(SandboxCommitError, match=r"\.git/config") as refused:
        ops.commit(sid, {})
    assert ".git/config" in refused.value.conflicts
    assert not (data / ".git").exists()
    assert (data / "f.txt").read_text() == "base\n"  # nothing written
    assert ops.status(sid)["status"] == "active"  # fix the tree and commit again
    ops.delete_file(sid, {"path": "f.txt"})  # an actor's own change still goes through
    for path in sorted((root / ".git").rglob("*"), reverse=True):
        path.unlink()
    (root / ".git").rmdir()
    ops.commit(sid, {})
    assert not (data / "f.txt").exists() and not (data / ".git").exists()


@pytest.mark.parametrize("strategy", DIRECTORY_STRATEGIES)
def test_the_original_repository_keeps_its_configuration_and_hooks(
    ops: Operations, tmp_path: Path, strategy: str
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    config = (repo / ".git" / "config").read_bytes()
    sid = create(ops, repo, strategy)
    root = Path(ops.path(sid, "."))
    with (root / ".git" / "config").open("ab") as handle:  # a command, not a route
        handle.write(EVIL)
    with pytest.raises(SandboxCommitError, match=r"\.git/config"):
        ops.commit(sid, {})
    with pytest.raises(SandboxCommitError, match=r"\.git/config"):
        ops.prepare(sid, {"txid": "tx1"})
    assert (repo / ".git" / "config").read_bytes() == config
    assert "fsmonitor" not in git(repo, "config", "--list")


def test_a_commit_in_a_copy_of_a_main_worktree_still_lands(ops: Operations, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    sid = create(ops, repo, "copy_on_write")
    root = Path(ops.path(sid, "."))
    (root / "f.txt").write_text("changed\n")
    git(root, "commit", "-qam", "in the sandbox")  # history moves: objects, refs, logs
    ops.commit(sid, {})
    assert git(repo, "log", "-1", "--format=%s").strip() == "in the sandbox"


def test_none_refuses_a_commit_once_the_original_gained_a_repository(
    ops: Operations, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.txt").write_text("base\n")
    sid = create(ops, data, "none")
    (data / ".git").mkdir()  # a command in a pass-through sandbox writes the original
    with pytest.raises(SandboxCommitError, match=r"\.git"):
        ops.commit(sid, {})
    with pytest.raises(SandboxCommitError, match=r"\.git"):
        ops.prepare(sid, {"txid": "tx1"})


@pytest.mark.parametrize(
    ("name", "control"),
    [
        (".git", True), (".GIT", True), (".git.", True), (".git ", True),
        (".g\u200bit", True), ("\uff0egit", True), (".gitignore", False), (".github", False),
        ("a.git", False), (".x.sandbox-lock", True), (".sandbox-staging-1", True),
        (".x.overlay-01J", True), (".x.checkpoint-01J", True), ("sandbox-lock", False),
    ],
)  # fmt: skip
def test_control_names_and_their_aliases(name: str, control: bool) -> None:
    assert is_control_name(name) is control
    assert os.sep == "/"


def test_a_command_cannot_change_the_repositorys_config_or_hooks(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("none")  # writes land in the original itself
    original = Path(sandbox.original_path)
    config = (original / ".git" / "config").read_bytes()
    line = (
        "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' >> .git/config; "
        "echo 'touch /tmp/pwned' > .git/hooks/post-checkout; "
        "rm -rf .git/hooks; git config core.fsmonitor 'touch /tmp/pwned'; "
        "git -c user.name=a -c user.email=a@b commit --allow-empty -qm 'from the command' "
        "&& echo committed"
    )
    out, err, _ = layout.runner().run(sandbox, ExecRequest(shell_line=line))
    assert b"committed" in out, err  # history may move
    assert (original / ".git" / "config").read_bytes() == config
    assert not (original / ".git" / "hooks" / "post-checkout").exists()
    assert "fsmonitor" not in git(original, "config", "--list")
    assert git(original, "log", "-1", "--format=%s").strip() == "from the command"
