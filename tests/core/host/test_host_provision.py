"""``sandbox_core.host.host.SandboxHost``: one idempotent provision and reopen (case 18).

Promises checked on real directories and git repositories: provisioning one id twice gives the
same sandbox and makes nothing twice; a process killed (SIGKILL) after the pending record and
before the complete one leaves a record that the next provision cleans up, then creates again
under the same id, the original untouched; a create that fails leaves nothing; a sandbox is
reopened by id in another host.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxCreationError, SandboxError
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.store import SandboxStore
from sandbox_core.status import SandboxStatus
from tests.support.gitrepo import git, make_repo
from tests.support.hygiene import make_original

ROOT = Path(__file__).resolve().parents[3]
SID = "01J0000000000000000000HOST"
FILES = {"a.txt": "alpha\n", "sub/b.txt": "beta\n"}


def _original(tmp_path: Path, strategy: str) -> Path:
    if strategy == "git_worktree":
        return make_repo(tmp_path / "repo", FILES)
    path = tmp_path / "data"
    for name, text in FILES.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def _tree(path: Path) -> dict[str, str]:
    """Every file of ``path`` outside ``.git`` with its text (the original's observable state)."""
    return {
        str(p.relative_to(path)): p.read_text()
        for p in sorted(path.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(path).parts
    }


def _git_state(repo: Path) -> tuple[str, str, str]:
    return (
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain"),
        git(repo, "branch", "--list", "main"),
    )


def _host(tmp_path: Path) -> SandboxHost:
    return SandboxHost(SandboxStore(tmp_path / "state"))


@pytest.mark.parametrize("strategy", ["copy_on_write", "git_worktree"])
def test_provisioning_twice_gives_the_same_sandbox(tmp_path: Path, strategy: str) -> None:
    original = _original(tmp_path, strategy)
    root = str(tmp_path / "boxes")
    first = _host(tmp_path).provision(
        "plan", "res", str(original), strategy, sandbox_id=SID, sandbox_root=root
    )
    Path(first.get_path("new.txt")).write_text("work\n")
    _host(tmp_path).save(first)
    second = _host(tmp_path).provision(
        "plan", "res", str(original), strategy, sandbox_id=SID, sandbox_root=root, activate=True
    )
    assert second.sandbox_id == first.sandbox_id == SID
    assert second.context is not None and first.context is not None
    assert second.context.sandbox_path == first.context.sandbox_path
    assert second.status is SandboxStatus.ACTIVE
    assert Path(second.get_path("new.txt")).read_text() == "work\n"  # nothing was made again
    assert [r["sandbox_id"] for r in SandboxStore(tmp_path / "state").records()] == [SID]
    assert sorted(p.name for p in (tmp_path / "boxes").iterdir()) == [first.layout_folder]
    if strategy == "git_worktree":
        assert len(git(original, "worktree", "list").splitlines()) == 2


CRASH_CHILD = """
import json, os, signal, sys
from sandbox_core.strategies.factory import SandboxFactory
from sandbox_core.strategies.git_worktree.git import GitCommand
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.store import SandboxStore

state, original, root, strategy, options, sid, when = sys.argv[1:]
factory = SandboxFactory()
base = factory.strategy_class(strategy)

class Killed(base):
    def _do_create(self, plan_id):
        if when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        context = super()._do_create(plan_id)
        os.kill(os.getpid(), signal.SIGKILL)  # the sandbox is made; its record still pending
        return context

if when == "mid":  # git_worktree: registered, branch made, submodules not yet checked out
    real_run = GitCommand.run
    def run(self, *args, **kwargs):
        result = real_run(self, *args, **kwargs)
        if args[:2] == ("worktree", "add"):
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    GitCommand.run = run

factory.register(strategy, Killed)
SandboxHost(SandboxStore(state), factory).provision(
    "plan", "res", original, strategy, sandbox_id=sid, sandbox_root=root, **json.loads(options)
)
"""

ALLOW_FILE = ("-c", "protocol.file.allow=always")

# (case, strategy, options): every strategy, overlay in both modes (kernel only where the
# process may mount), git_worktree also with a nested submodule (registrations in its stores).
CASES = {
    "copy_on_write": ("copy_on_write", {}),
    "overlay-fallback": ("overlay", {"mode": "fallback"}),
    "overlay-kernel": ("overlay", {"mode": "kernel"}),
    "sqlite": ("transaction_rollback", {}),
    "none": ("none", {}),
    "git_worktree": ("git_worktree", {}),
    "git_submodules": ("git_worktree", {}),
}
KILLS = [
    pytest.param(
        case,
        when,
        id=f"{case}-{when}",
        marks=[pytest.mark.overlay_kernel] if case == "overlay-kernel" else [],
    )
    for case in CASES
    for when in ("before", "mid", "after")
    if when != "mid" or case.startswith("git")
]


def _crash_original(tmp_path: Path, case: str) -> Path:
    """The original of ``case``; a git one also has the user's own worktree and a branch named
    after the sandbox id that holds work of its own (neither may be touched)."""
    if case == "sqlite":
        path = make_original(tmp_path, "transaction_rollback")  # table notes
        with sqlite3.connect(path) as connection:
            connection.execute("INSERT INTO notes VALUES ('kept')")
        connection.close()
        return path
    if not case.startswith("git"):
        return _original(tmp_path, case)
    repo = make_repo(tmp_path / "repo", FILES)
    if case == "git_submodules":
        leaf = make_repo(tmp_path / "leaf", {"leaf.txt": "leaf\n"})
        sub = make_repo(tmp_path / "sub", {"s.txt": "sub\n"})
        git(sub, *ALLOW_FILE, "submodule", "add", "-q", str(leaf), "deep/leaf")
        git(sub, "commit", "-qm", "leaf")
        git(repo, *ALLOW_FILE, "submodule", "add", "-q", str(sub), "libs/sub")
        git(repo, *ALLOW_FILE, "submodule", "update", "-q", "--init", "--recursive")
        git(repo, "commit", "-qm", "add sub")
    git(repo, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "users-worktree"))
    git(repo, "checkout", "-q", "-b", f"sandbox/foreign/{SID}")
    (repo / "theirs.txt").write_text("their work\n")
    git(repo, "add", "theirs.txt")
    git(repo, "commit", "-qm", "their work")
    git(repo, "checkout", "-q", "main")
    return repo


def _original_state(original: Path, case: str, boxes: Path) -> object:
    """Everything of the original a crashed create and its cleanup must leave as it was (the
    sandbox's own branch and worktree, under ``boxes``, left out)."""
    if case == "sqlite":
        with sqlite3.connect(original) as connection:
            rows = connection.execute("SELECT body FROM notes").fetchall()
        connection.close()
        return rows
    state: dict[str, object] = {"files": _tree(original)}
    if case.startswith("git"):
        state["git"] = _git_state(original)
        refs = git(original, "for-each-ref", "--format=%(refname) %(objectname)")
        state["branches"] = [line for line in refs.splitlines() if "/sandbox/plan/" not in line]
        blocks = git(original, "worktree", "list", "--porcelain").split("\n\n")
        state["worktrees"] = [block for block in blocks if str(boxes) not in block]
        modules = original / ".git" / "modules"
        state["module refs"] = sorted(
            git(store, "for-each-ref", "--format=%(refname) %(objectname)")
            for store in {p.parent for p in modules.rglob("HEAD")}
            if (store / "objects").is_dir()
        )
    return state


def _module_worktrees(original: Path) -> list[str]:
    """The worktree registrations in the original's submodule stores."""
    modules = original / ".git" / "modules"
    return sorted(str(p.relative_to(modules)) for p in modules.glob("**/worktrees/*"))


@pytest.mark.parametrize(("case", "when"), KILLS)
def test_a_create_killed_after_the_pending_record_is_cleaned_up_on_retry(
    tmp_path: Path, case: str, when: str
) -> None:
    strategy, options = CASES[case]
    original = _crash_original(tmp_path, case)
    state, root = tmp_path / "state", tmp_path / "boxes"
    before = _original_state(original, case, root)
    child = subprocess.run(
        [sys.executable, "-c", CRASH_CHILD, str(state), str(original), str(root), strategy,
         json.dumps(options), SID, when],
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'operator'}"},
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr
    assert SandboxStore(state).load(SID)["status"] == "pending"
    assert _original_state(original, case, root) == before
    if when != "before" and case.startswith("git"):
        assert (root / "git" / SID).is_dir()  # what the retry must remove first

    sandbox = SandboxHost(SandboxStore(state)).provision(
        "plan", "res", str(original), strategy, sandbox_id=SID, sandbox_root=str(root), **options
    )
    try:
        assert sandbox.sandbox_id == SID and sandbox.status is SandboxStatus.CREATED
        assert SandboxStore(state).load(SID)["status"] == "created"
        assert _original_state(original, case, root) == before
        if case != "sqlite":
            assert Path(sandbox.get_path("a.txt")).read_text() == "alpha\n"
        if sandbox.layout_folder is not None:
            assert [p.name for p in (root / sandbox.layout_folder).iterdir()] == [SID]
        if case.startswith("git"):
            assert sandbox.context is not None
            assert sandbox.context.metadata["branch"] == f"sandbox/plan/{SID}"  # none left
            listed = git(original, "for-each-ref", "--format=%(refname:short)", "refs/heads/")
            assert sorted(listed.split()) == [
                "feature",
                "main",
                f"sandbox/foreign/{SID}",
                f"sandbox/plan/{SID}",
            ]
            assert len(git(original, "worktree", "list").splitlines()) == 3
        if case == "git_submodules":
            assert Path(sandbox.get_path("libs/sub/deep/leaf/leaf.txt")).read_text() == "leaf\n"
            assert len(_module_worktrees(original)) == 2  # the new sandbox's, nothing stale
    finally:
        sandbox.cleanup()
    assert _original_state(original, case, root) == before
    if case == "git_submodules":
        assert _module_worktrees(original) == []


def test_a_failed_create_leaves_no_record_and_no_artefact(tmp_path: Path) -> None:
    host = _host(tmp_path)
    with pytest.raises(SandboxCreationError):
        host.provision(
            "plan",
            "res",
            str(tmp_path / "missing"),
            "git_worktree",
            sandbox_id=SID,
            sandbox_root=str(tmp_path / "boxes"),
        )
    assert host.record(SID) is None
    boxes = tmp_path / "boxes"
    assert not boxes.exists() or list(boxes.rglob("*")) == []


def test_a_sandbox_is_reopened_by_id_in_another_host(tmp_path: Path) -> None:
    original = _original(tmp_path, "copy_on_write")
    made = _host(tmp_path).provision(
        "plan", "res", str(original), "copy_on_write", sandbox_root=str(tmp_path / "boxes")
    )
    reopened = _host(tmp_path).reopen(made.sandbox_id)
    assert reopened.to_record() == made.to_record()
    with pytest.raises(SandboxError, match="no sandbox with id"):
        _host(tmp_path).reopen("01J0000000000000000000NONE")


def test_without_a_store_provision_only_creates(tmp_path: Path) -> None:
    original = _original(tmp_path, "copy_on_write")
    host = SandboxHost(None)
    made = host.provision(
        "plan", "res", str(original), "copy_on_write", sandbox_root=str(tmp_path / "boxes")
    )
    assert made.status is SandboxStatus.CREATED and host.record(made.sandbox_id) is None
