"""Interrupted commits, then a rollback or a cleanup: the original ends one way, never half.

A security review found: a crash in the middle of a commit or a two-phase
apply, followed by a rollback or a deletion, left the original half-committed for good (the
overlay fallback on every path, copy_on_write on the two-phase path, git_worktree between its
files and its ref). Property: after a crash at ANY write of a commit, ``rollback_all`` or
``cleanup_all`` in a fresh process leaves every original of the plan either exactly as before
or exactly as committed (all the plan's originals the same way), no staging area beside it,
and the sandboxes rolled back or cleaned up.

The crashes are real: a child process builds the plan in a state directory and commits it
(one-shot ``commit()``, the saga, or two phases) with a fault hook that ``os._exit``s at the
k-th write: the k-th ``rename``/``replace`` of the Python process (every swap of a sync, every
journal and record written, every hand-over) for the directory strategies, the k-th git command
for git_worktree (git writes in its own processes). k runs from 1 until the commit finishes
unharmed. A fresh process then rolls back or cleans up.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gitrepo import GIT_ENV, git, make_repo
from tests.support.mounts import unmount_beneath

REPO_ROOT = Path(__file__).resolve().parents[3]
PLAN = "plan-interrupted"
DIE = 77
NAMES = ("a", "b", "c")

KINDS = [
    pytest.param("copy_on_write", id="copy_on_write"),
    pytest.param("overlay-fallback", id="overlay-fallback"),
    pytest.param("overlay-kernel", id="overlay-kernel", marks=pytest.mark.overlay_kernel),
    pytest.param("git_worktree", id="git_worktree"),
]
PATHS = ["one_shot", "saga", "two_phase"]
ACTIONS = ["rollback", "cleanup"]


# -- the child process ---------------------------------------------------------------------------


def child_main(raw: str) -> None:
    """Build the plan, arm the fault, commit (see the module docstring)."""
    args = json.loads(raw)
    from sandbox_core.host.manager import SandboxManager
    from sandbox_core.host.store import SandboxStore
    from sandbox_core.strategies.factory import SandboxFactory

    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(args["state_dir"])
    )
    sandboxes = []
    for number, (kind, original) in enumerate(args["originals"]):
        strategy, _, mode = kind.partition("-")
        options = {"mode": mode} if mode else {}
        sandbox = manager.get_or_create_sandbox(
            PLAN, f"r{number}", original, strategy, sandbox_root=args["root"], **options
        )
        for name in NAMES:
            Path(sandbox.get_path(name)).write_text(f"{name}1\n")
        sandboxes.append(sandbox)
    manager.persist(PLAN)
    counter = _arm(args["kind"], int(args["kill_at"]))
    if args["path"] == "one_shot":
        for sandbox in sandboxes:
            sandbox.commit()
            manager.persist(PLAN)
    else:
        manager.commit_plan(PLAN, mode=args["path"])
    print(json.dumps({"writes": next(counter) - 1}))


def _arm(kind: str, kill_at: int) -> Iterator[int]:
    """``os._exit`` at the ``kill_at``-th write (see the module docstring; 0: never); returns
    the counter (its next value is the number of writes so far plus one)."""
    calls = iter(range(1, 1_000_000))

    def hit() -> None:
        if next(calls) == kill_at:
            os._exit(DIE)

    if kind == "git_worktree":
        from sandbox_core.strategies.git_worktree import git as git_module

        run = git_module.GitCommand.run

        def counted(self: Any, *args: str, **kwargs: Any) -> Any:
            hit()
            return run(self, *args, **kwargs)

        git_module.GitCommand.run = counted  # type: ignore[method-assign]
        return calls
    for name in ("rename", "replace"):
        real = getattr(os, name)

        def counted_os(src: Any, dst: Any, *args: Any, _real: Any = real, **kwargs: Any) -> None:
            hit()
            _real(src, dst, *args, **kwargs)

        setattr(os, name, counted_os)
    return calls


def after_main(raw: str) -> None:
    """The fresh process: ``rollback_all`` or ``cleanup_all`` of the plan, then its statuses."""
    args = json.loads(raw)
    from sandbox_core.host.manager import SandboxManager
    from sandbox_core.host.store import SandboxStore

    store = SandboxStore(args["state_dir"])
    manager = SandboxManager.load(store)
    statuses_before = {sb.resource_id: sb.status.value for sb in manager.list_sandboxes(PLAN)}
    if args["action"] == "rollback":
        manager.rollback_all(PLAN)
        statuses = {sb.resource_id: sb.status.value for sb in manager.list_sandboxes(PLAN)}
    else:
        manager.cleanup_all(PLAN)
        statuses = {r["resource_id"]: r["status"] for r in store.records(PLAN)}
    print(json.dumps({"before": statuses_before, "after": statuses}))


def _run(entry: str, args: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('interrupted', {str(Path(__file__))!r})\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        f"m.{entry}(sys.argv[1])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)],
        env={**os.environ, **GIT_ENV, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- the originals ------------------------------------------------------------------------------


def _make_original(kind: str, where: Path) -> Path:
    content = {name: f"{name}0\n" for name in NAMES}
    if kind == "git_worktree":
        return make_repo(where, content)
    where.mkdir()
    for name, text in content.items():
        (where / name).write_text(text)
    return where


def _state(kind: str, original: Path) -> str:
    """``"before"``, ``"after"`` or a description of a half-committed original."""
    files = {name: (original / name).read_text() for name in NAMES if (original / name).exists()}
    if kind == "git_worktree":
        head = {name: git(original, "show", f"HEAD:{name}") + "\n" for name in NAMES}
        dirty = git(original, "status", "--porcelain")
        if dirty or head != files:
            return f"half: files {files}, HEAD {head}, status {dirty!r}"
    if files == {name: f"{name}0\n" for name in NAMES}:
        return "before"
    if files == {name: f"{name}1\n" for name in NAMES}:
        return "after"
    return f"half: {files}"


def _staging_left(original: Path) -> list[str]:
    beside = [n for n in os.listdir(original.parent) if n.startswith(f".{original.name}.sandbox")]
    inside = [n for n in os.listdir(original) if n.startswith(".sandbox-staging")]
    return beside + inside


def _plan_args(tmp: Path, kind: str, path: str, kill_at: int) -> tuple[dict[str, Any], list]:
    run_dir = tmp / f"k{kill_at}"
    run_dir.mkdir()
    originals = [(kind, _make_original(kind, run_dir / "orig"))]
    if path != "one_shot":  # a plan of two: the second participant is a copy_on_write helper
        originals.append(("copy_on_write", _make_original("copy_on_write", run_dir / "helper")))
    args = {
        "kind": kind,
        "path": path,
        "kill_at": kill_at,
        "state_dir": str(run_dir / "state"),
        "root": str(run_dir / "boxes"),
        "originals": [(k, str(o)) for k, o in originals],
    }
    return args, originals


def _writes(tmp: Path, kind: str, path: str) -> int:
    """How many writes the commit makes (a run without a kill)."""
    args, _ = _plan_args(tmp, kind, path, 0)
    done = _run("child_main", args)
    assert done.returncode == 0, done.stderr[-3000:]
    return int(json.loads(done.stdout.splitlines()[-1])["writes"])


def _one_crash(tmp: Path, kind: str, path: str, action: str, kill_at: int) -> None:
    """Crash at the ``kill_at``-th write, then ``action``; assert the property."""
    args, originals = _plan_args(tmp, kind, path, kill_at)
    crashed = _run("child_main", args)
    assert crashed.returncode == DIE, crashed.stderr[-3000:]
    done = _run("after_main", {**args, "action": action})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    states = [_state(k, o) for k, o in originals]
    where = f"{kind} {path} killed at write {kill_at}, then {action}: {report}"
    assert states[0] in ("before", "after"), f"{where}: the original is {states[0]}"
    assert len(set(states)) == 1, f"{where}: the plan ended in part: {states}"
    for _, original in originals:
        assert _staging_left(original) == [], f"{where}: staging left"
    final = set(report["after"].values())
    if action == "cleanup":
        assert final <= {"cleaned_up"}, where
    else:
        assert final <= {"rolled_back", "committed"}, where
        if "committed" in final:
            assert states[0] == "after", f"{where}: committed sandbox, original {states[0]}"


def kill_points(writes: int) -> list[int]:
    """Every write with ``SANDBOX_TEST_ALL_KILL_POINTS=1``; else three: half and three
    quarters of the way (the swaps), and the last write (git: its ref move, after the files
    were written). The in-process test below covers every write of the directory strategies."""
    if os.environ.get("SANDBOX_TEST_ALL_KILL_POINTS") == "1":
        return list(range(1, writes + 1))
    return sorted({max(1, writes * share // 4) for share in (2, 3, 4)})


@pytest.fixture(autouse=True)
def _unmount_what_is_left(tmp_path: Path) -> Iterator[None]:
    """A rolled-back or committed kernel-overlay sandbox stays mounted (it is still usable):
    this module's runs end there, so their mounts go with the test."""
    yield
    unmount_beneath(tmp_path)


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_commit_killed_at_any_write_then_rolled_back_or_cleaned_up_ends_one_way(
    tmp_path: Path, kind: str, path: str, action: str
) -> None:
    """The security review's finding, swept over the writes of the commit (see the module)."""
    writes = _writes(tmp_path, kind, path)
    assert writes > 0
    for kill_at in kill_points(writes):
        _one_crash(tmp_path, kind, path, action, kill_at)


# -- in process: a write that raises -------------------------------------------------------------


DIRECTORY_KINDS = [p for p in KINDS if p.values[0] != "git_worktree"]


@contextlib.contextmanager
def _writes_fail_at(kill_at: int) -> Iterator[None]:
    """The ``kill_at``-th ``os.rename``/``os.replace`` raises ``OSError(EIO)``."""
    calls = iter(range(1, 1_000_000))
    real = {name: getattr(os, name) for name in ("rename", "replace")}

    def wrap(name: str) -> Any:
        def failing(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if next(calls) == kill_at:
                raise OSError(errno.EIO, "injected write error")
            real[name](src, dst, *args, **kwargs)

        return failing

    with pytest.MonkeyPatch.context() as patch:
        for name in real:
            patch.setattr(os, name, wrap(name))
        yield


def _one_raise(tmp: Path, kind: str, path: str, action: str, kill_at: int) -> bool:
    """Commit (or apply) with the ``kill_at``-th write raising, then ``action``; assert the
    property. Returns False once the commit met no ``kill_at``-th write."""
    from sandbox_core.strategies.factory import SandboxFactory

    where = tmp / f"raise{kill_at}"
    where.mkdir()
    original = _make_original("copy_on_write", where / "orig")
    strategy, _, mode = kind.partition("-")
    options = {"mode": mode} if mode else {}
    sandbox = SandboxFactory().create(
        strategy, "r", str(original), sandbox_root=str(where / "boxes"), **options
    )
    sandbox.create(PLAN)
    raised = False
    try:
        for name in NAMES:
            Path(sandbox.get_path(name)).write_text(f"{name}1\n")
        if path == "two_phase":
            sandbox.prepare("tx-raise")
        with _writes_fail_at(kill_at):
            try:
                if path == "two_phase":
                    sandbox.apply_prepared("tx-raise")
                else:
                    sandbox.commit()
            except Exception:  # the injected fault, however the strategy reports it
                raised = True
        if action == "cleanup":
            sandbox.cleanup()
        elif sandbox.status.value in ("active", "committed"):
            sandbox.rollback()
        where_ = f"{kind} {path}, write {kill_at} raised, then {action}"
        state = _state("copy_on_write", original)
        assert state in ("before", "after"), f"{where_}: the original is {state}"
        # A prepared area whose apply never began is the coordinator's to apply or abort (a
        # rollback of the sandbox leaves it); anything else is gone.
        left = [n for n in _staging_left(original) if "-prepared-" not in n]
        assert left == [], f"{where_}: staging left"
    finally:
        sandbox.cleanup()
    assert _staging_left(original) == [], f"{kind} {path}, write {kill_at}: cleanup left staging"
    return raised


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("path", ["one_shot", "two_phase"])
@pytest.mark.parametrize("kind", DIRECTORY_KINDS)
def test_a_write_that_raises_then_rollback_or_cleanup_ends_one_way(
    tmp_path: Path, kind: str, path: str, action: str
) -> None:
    """The same property in one process at EVERY write: the k-th ``rename``/``replace`` of the
    commit (or of the two-phase apply) raises ``OSError`` (a disk error), the commit's own error
    handling runs, then the sandbox is rolled back or cleaned up."""
    kill_at = 1
    while _one_raise(tmp_path, kind, path, action, kill_at):
        kill_at += 1
    assert kill_at > 1, "the commit wrote nothing"
