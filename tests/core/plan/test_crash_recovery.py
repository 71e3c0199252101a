"""Crash-safe plan commit (DESIGN.md "PlanCommit: atomic commit as a saga"; cases 20 and 22).

Crashes are real: a child Python process runs ``commit_all`` with ``SANDBOX_CORE_FAULT`` set and
SIGKILLs itself at the named point; a fresh process then recovers from the store and journal.
The sandboxes are real: git_worktree on a real repository, copy_on_write on a real directory,
and ``DirSandbox`` below (a small real-directory strategy whose ``commit_landed()`` lets us
test the "commit landed but was never recorded" window).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest

from sandbox_core import BaseSandbox, CommitResult, SandboxContext, SandboxFactory, SandboxStore
from sandbox_core.host.manager import SandboxManager, state_dir_journal_path
from sandbox_core.plan.journal import FileCommitJournal, JournalPhase, StepState
from tests.support.gitrepo import GIT_ENV, git, make_repo

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parents[2]


class DirSandbox(BaseSandbox):
    """Test strategy ``test_dir``: a copy of a flat directory; commit copies files back.

    The pre-commit state is kept in ``backup/`` so that ``commit_landed()`` can tell whether a
    commit reached the original, and rollback from COMMITTED can restore it.
    """

    strategy = "test_dir"
    rollbackable = True

    @property
    def _base(self) -> Path:
        return self.sandbox_root / "test-dir" / self.sandbox_id

    def _do_create(self, plan_id: str) -> SandboxContext:
        shutil.copytree(self.original_path, self._base / "tree")
        return SandboxContext(
            sandbox_id=self.sandbox_id,
            sandbox_path=str(self._base / "tree"),
            original_path=self.original_path,
            resource_id=self.resource_id,
            plan_id=plan_id,
        )

    def _do_commit(self, message: str | None) -> CommitResult:
        backup = self._base / "backup"
        if backup.exists():
            shutil.rmtree(backup)
        shutil.copytree(self.original_path, backup)
        changed = sorted(
            name
            for name, data in _files(self._base / "tree").items()
            if _files(Path(self.original_path)).get(name) != data
        )
        shutil.copytree(self._base / "tree", self.original_path, dirs_exist_ok=True)
        return CommitResult(sandbox_id=self.sandbox_id, success=True, changed_files=changed)

    def commit_landed(self) -> bool:
        landed = (self._base / "backup").is_dir()
        return landed and _files(self._base / "tree") == _files(Path(self.original_path))

    def _do_rollback(self) -> None:
        shutil.rmtree(self._base / "tree")
        shutil.copytree(self.original_path, self._base / "tree")

    def _do_rollback_committed(self) -> None:
        backup = self._base / "backup"
        if backup.is_dir():
            original = Path(self.original_path)
            for path in original.iterdir():
                path.unlink()
            shutil.copytree(backup, original, dirs_exist_ok=True)
            shutil.rmtree(backup)
        self._do_rollback()

    def _do_cleanup(self) -> None:
        shutil.rmtree(self._base, ignore_errors=True)


def _files(root: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(root.iterdir()) if path.is_file()}


def make_factory() -> SandboxFactory:
    factory = SandboxFactory()
    factory.register(DirSandbox.strategy, DirSandbox)
    return factory


# -- the child process --------------------------------------------------------------------------


def child_main(raw: str) -> None:
    """Entry point of the child processes (see ``run_child``)."""
    args = json.loads(raw)
    if args.get("kill_mid_sync"):
        from sandbox_core.tree import sync

        # SIGKILL at the n-th fault point of a directory sync: after the n-th path was swapped
        # into the original, or (n = paths + 1) once the sync's journal says "applied".
        calls = iter(range(1, 1_000))

        def kill_at_nth(path: str) -> None:
            if next(calls) == int(args["kill_mid_sync"]):
                os.kill(os.getpid(), signal.SIGKILL)

        sync.fault_hook = kill_at_nth
    store = SandboxStore(args["state_dir"])
    plan_id = args["plan_id"]
    if args["action"] == "commit_new":
        manager = SandboxManager(make_factory(), cleanup_on_exit=False, store=store)
        for spec in args["sandboxes"]:
            sandbox = manager.get_or_create_sandbox(
                plan_id,
                spec["resource_id"],
                spec["path"],
                spec["strategy"],
                sandbox_root=args["sandbox_root"],
                **spec.get("options", {}),
            )
            for relative, text in spec["writes"].items():
                Path(sandbox.get_path(relative)).write_text(text)
        manager.persist(plan_id)
        results = manager.commit_all(plan_id)
        print(json.dumps([result.to_dict() for result in results]))
    elif args["action"] == "recover":
        manager = SandboxManager.load(store, make_factory())
        state = manager.recover(plan_id)
        print(json.dumps(state.model_dump(mode="json") if state else None))
    elif args["action"] == "cleanup":
        SandboxManager.load(store, make_factory()).cleanup_all(plan_id)
    elif args["action"] == "commit":
        manager = SandboxManager.load(store, make_factory())
        results = manager.commit_all(plan_id)
        print(json.dumps([result.to_dict() for result in results]))


def run_child(args: dict[str, Any], fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("SANDBOX_CORE_FAULT", None)
    if fault:
        env["SANDBOX_CORE_FAULT"] = fault
    env["PYTHONPATH"] = str(REPO_ROOT)
    # Loaded by file path: tests/ itself must not go on sys.path (tests/operator would shadow
    # the standard library's operator module).
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('commit_child', {str(Path(__file__))!r})\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "m.child_main(sys.argv[1])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def case20(tmp_path: Path, git_identity: None) -> dict[str, Any]:
    """Case 20's setup: repository R (f = r0) and directory D (g = d0)."""
    repo = make_repo(tmp_path / "R", {"f": "r0\n"})
    directory = tmp_path / "D"
    directory.mkdir()
    (directory / "g").write_text("d0\n")
    return {
        "repo": repo,
        "dir": directory,
        "pre_r": git(repo, "rev-parse", "main"),
        "state_dir": str(tmp_path / "state"),
        "sandbox_root": str(tmp_path / "sandboxes"),
    }


def _case20_args(setup: dict[str, Any], action: str, plan_id: str = "p1") -> dict[str, Any]:
    return {
        "action": action,
        "plan_id": plan_id,
        "state_dir": setup["state_dir"],
        "sandbox_root": setup["sandbox_root"],
        "sandboxes": [
            {
                "resource_id": "A",
                "path": str(setup["repo"]),
                "strategy": "git_worktree",
                "writes": {"f": "r1\n"},
            },
            {
                "resource_id": "B",
                "path": str(setup["dir"]),
                "strategy": "copy_on_write",
                "writes": {"g": "d1\n"},
            },
        ],
    }


def _journal_file(setup: dict[str, Any], plan_id: str = "p1") -> Path:
    return state_dir_journal_path(Path(setup["state_dir"]), plan_id)


def _snapshot(setup: dict[str, Any]) -> tuple[str, str, str, bytes]:
    repo = setup["repo"]
    return (
        git(repo, "rev-parse", "main"),
        git(repo, "rev-list", "--all", "--count"),
        (setup["dir"] / "g").read_text(),
        _journal_file(setup).read_bytes(),
    )


# -- case 20 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["after_persist:1", "after_record:1"])
def test_case20_crash_between_sandboxes_rolls_back_on_recovery(
    case20: dict[str, Any], fault: str
) -> None:
    crashed = run_child(_case20_args(case20, "commit_new"), fault=fault)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    # The crash left A merged and B untouched, and the journal unfinished.
    assert (case20["repo"] / "f").read_text() == "r1\n"
    assert git(case20["repo"], "show", "main:f") == "r1"
    assert (case20["dir"] / "g").read_text() == "d0\n"
    journal = FileCommitJournal(_journal_file(case20)).load()
    assert journal is not None
    assert journal.phase is JournalPhase.COMMITTING
    assert [step.state for step in journal.steps] == [
        StepState.COMMITTED if fault.startswith("after_record") else StepState.COMMITTING,
        StepState.PENDING,
    ]

    recovered = run_child(_case20_args(case20, "recover"))
    assert recovered.returncode == 0, recovered.stderr
    state = json.loads(recovered.stdout)
    assert state["phase"] == "rolled_back"
    assert state["reason"] == "Interrupted"
    a_id, b_id = (step["sandbox_id"] for step in state["steps"])
    assert state["rolled_back_ids"] == [a_id]
    assert state["failed_rollback_ids"] == []
    assert [step["state"] for step in state["steps"]] == ["compensated", "pending"]
    assert b_id
    # Roll-back outcome of case 20: R's main is back at PRE_R, D untouched.
    assert git(case20["repo"], "rev-parse", "main") == case20["pre_r"]
    assert (case20["repo"] / "f").read_text() == "r0\n"
    assert git(case20["repo"], "status", "--porcelain") == ""
    assert (case20["dir"] / "g").read_text() == "d0\n"

    # Step 3: recovery again changes nothing (no commits, no rewrites, same journal bytes).
    before = _snapshot(case20)
    again = run_child(_case20_args(case20, "recover"))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == state
    assert _snapshot(case20) == before


def test_case20_commit_again_before_recovery_recovers_first_and_never_merges_twice(
    case20: dict[str, Any],
) -> None:
    crashed = run_child(_case20_args(case20, "commit_new"), fault="after_record:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    merged_main = git(case20["repo"], "rev-parse", "main")
    assert merged_main != case20["pre_r"]

    retried = run_child(_case20_args(case20, "commit"))
    assert retried.returncode == 0, retried.stderr
    [result] = json.loads(retried.stdout)
    assert result["success"] is False
    assert result["error"].startswith("Atomic commit failed")
    assert result["metadata"]["phase"] == "rolled_back"
    # Recovery ran instead of a new attempt: A was undone, not merged a second time.
    assert git(case20["repo"], "rev-parse", "main") == case20["pre_r"]
    assert (case20["dir"] / "g").read_text() == "d0\n"
    journal = FileCommitJournal(_journal_file(case20)).load()
    assert journal is not None
    assert journal.attempt == 1
    assert journal.phase is JournalPhase.ROLLED_BACK


def test_crash_inside_the_commit_window_uses_commit_landed(tmp_path: Path) -> None:
    """SIGKILL after A's commit landed but before anything recorded it (store or journal)."""
    dirs = {}
    for name, text in (("A", "a0\n"), ("B", "b0\n")):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        (dirs[name] / "x").write_text(text)
    args = {
        "action": "commit_new",
        "plan_id": "p-window",
        "state_dir": str(tmp_path / "state"),
        "sandbox_root": str(tmp_path / "sandboxes"),
        "sandboxes": [
            {"resource_id": name, "path": str(path), "strategy": "test_dir", "writes": {"x": "new"}}
            for name, path in dirs.items()
        ],
    }
    crashed = run_child(args, fault="after_commit:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert (dirs["A"] / "x").read_text() == "new"
    store = SandboxStore(tmp_path / "state")
    records = {record["resource_id"]: record for record in store.records("p-window")}
    assert records["A"]["status"] != "committed"  # the store never heard of the commit

    recovered = run_child({**args, "action": "recover"})
    assert recovered.returncode == 0, recovered.stderr
    state = json.loads(recovered.stdout)
    assert state["phase"] == "rolled_back"
    assert state["rolled_back_ids"] == [records["A"]["sandbox_id"]]
    assert (dirs["A"] / "x").read_text() == "a0\n"
    assert (dirs["B"] / "x").read_text() == "b0\n"
    assert store.load(records["A"]["sandbox_id"])["status"] == "rolled_back"


def test_crash_after_the_last_step_landed_rolls_forward(tmp_path: Path) -> None:
    """Every step landed: recovery has nothing left to do but record the commit."""
    path = tmp_path / "A"
    path.mkdir()
    (path / "x").write_text("old")
    args = {
        "action": "commit_new",
        "plan_id": "p-forward",
        "state_dir": str(tmp_path / "state"),
        "sandbox_root": str(tmp_path / "sandboxes"),
        "sandboxes": [
            {"resource_id": "A", "path": str(path), "strategy": "test_dir", "writes": {"x": "new"}}
        ],
    }
    crashed = run_child(args, fault="after_commit:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    recovered = run_child({**args, "action": "recover"})
    assert recovered.returncode == 0, recovered.stderr
    state = json.loads(recovered.stdout)
    assert state["phase"] == "committed"
    assert state["rolled_back_ids"] == []
    assert (path / "x").read_text() == "new"


# -- case 22 ------------------------------------------------------------------------------------


def test_case22_first_step_conflict_ends_failed_without_compensation(
    tmp_path: Path, git_identity: None
) -> None:
    repo = make_repo(tmp_path / "R", {"f": "line1\n"})
    directory = tmp_path / "D"
    directory.mkdir()
    (directory / "g").write_text("d0\n")
    store = SandboxStore(tmp_path / "state")
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False, store=store)
    root = str(tmp_path / "sandboxes")
    a = manager.get_or_create_sandbox("p3", "A", str(repo), "git_worktree", sandbox_root=root)
    b = manager.get_or_create_sandbox("p3", "B", str(directory), "copy_on_write", sandbox_root=root)
    Path(a.get_path("f")).write_text("sandbox\n")
    Path(b.get_path("g")).write_text("d1\n")
    (repo / "f").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    main_before = git(repo, "rev-parse", "main")

    with (
        patch.object(a, "rollback", wraps=a.rollback) as a_rollback,
        patch.object(b, "rollback", wraps=b.rollback) as b_rollback,
        patch.object(b, "commit", wraps=b.commit) as b_commit,
    ):
        [result] = manager.commit_all("p3")
    assert result.success is False
    assert result.sandbox_id == a.sandbox_id
    assert a.sandbox_id in (result.error or "")
    assert result.metadata["conflicts"] == ["f"]
    assert result.metadata["rolled_back_ids"] == []
    assert result.metadata["failed_rollback_ids"] == []
    assert a_rollback.call_count == b_rollback.call_count == b_commit.call_count == 0
    assert (directory / "g").read_text() == "d0\n"
    assert git(repo, "rev-parse", "main") == main_before
    assert git(repo, "status", "--porcelain") == ""

    journal_path = state_dir_journal_path(store.state_dir, "p3")
    journal = FileCommitJournal(journal_path).load()
    assert journal is not None
    assert journal.phase is JournalPhase.FAILED
    assert journal.reason.value == "CommitFailed"
    assert journal.failed_sandbox_id == a.sandbox_id
    assert [step.state for step in journal.steps] == [StepState.FAILED, StepState.PENDING]
    # Step 4: recovery three times, from this process and from fresh managers: no work redone.
    written = journal_path.read_bytes()
    mtime = journal_path.stat().st_mtime_ns
    for recovering in (manager, SandboxManager.load(store), SandboxManager.load(store)):
        assert recovering.recover("p3") == journal
    assert journal_path.read_bytes() == written
    assert journal_path.stat().st_mtime_ns == mtime

    # The sandboxes are still usable: resolve the conflict in R, then commit the plan again.
    assert a.status.value == "active"
    assert b.status.value == "active"
    git(repo, "revert", "--no-edit", "HEAD")
    results = manager.commit_all("p3")
    assert [r.success for r in results] == [True, True]
    assert (repo / "f").read_text() == "sandbox\n"
    assert git(repo, "show", "main:f") == "sandbox"
    assert (directory / "g").read_text() == "d1\n"
    retried = FileCommitJournal(journal_path).load()
    assert retried is not None
    assert retried.attempt == 2
    assert retried.phase is JournalPhase.COMMITTED


def test_git_crash_inside_the_commit_window_is_compensated(
    tmp_path: Path, git_identity: None
) -> None:
    """Case 20 on a real repository: the merge landed, nothing recorded it; recovery undoes it.

    ``GitWorktreeSandbox`` rebuilds the lost ``CommitResult`` from its ``committed`` and
    ``pre-commit`` tags (``adopt_landed_commit``), so compensation can move ``main`` back.
    """
    repo = make_repo(tmp_path / "R", {"f": "r0\n"})
    pre = git(repo, "rev-parse", "main")
    directory = tmp_path / "D"
    directory.mkdir()
    (directory / "g").write_text("d0\n")
    args = {
        "action": "commit_new",
        "plan_id": "p-git-window",
        "state_dir": str(tmp_path / "state"),
        "sandbox_root": str(tmp_path / "sandboxes"),
        "sandboxes": [
            {"resource_id": "A", "path": str(repo), "strategy": "git_worktree",
             "writes": {"f": "r1\n"}},
            {"resource_id": "B", "path": str(directory), "strategy": "copy_on_write",
             "writes": {"g": "d1\n"}},
        ],
    }
    crashed = run_child(args, fault="after_commit:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert (repo / "f").read_text() == "r1\n", "A's merge landed before the kill"

    recovered = run_child({**args, "action": "recover"})
    assert recovered.returncode == 0, recovered.stderr
    state = json.loads(recovered.stdout)
    assert state["phase"] == "rolled_back"
    assert state["failed_rollback_ids"] == []
    assert len(state["rolled_back_ids"]) == 1
    assert git(repo, "rev-parse", "main") == pre
    assert (repo / "f").read_text() == "r0\n"
    assert (directory / "g").read_text() == "d0\n"
    again = run_child({**args, "action": "recover"})
    assert json.loads(again.stdout) == state, "a second recovery changes nothing"


@pytest.mark.parametrize("kill_at", [1, 2, 4])
@pytest.mark.parametrize(
    ("strategy", "options"),
    [
        ("copy_on_write", {}),
        ("overlay", {"mode": "fallback"}),
        pytest.param("overlay", {"mode": "kernel"}, marks=pytest.mark.overlay_kernel),
    ],
)
def test_a_crash_in_the_middle_of_a_directory_sync_is_compensated_whole(
    tmp_path: Path, strategy: str, options: dict[str, str], kill_at: int
) -> None:
    """Case 20 inside one step: the process dies after the first or second of three paths
    was swapped into the original, or after all three with the sync's journal saying
    "applied". Recovery cannot ask the strategy whether the commit landed, so it compensates;
    the compensation must first finish or undo the half-applied sync, or the original keeps
    part of the edits while the plan reports it rolled back (the operator soak's violation)."""
    directory = tmp_path / "D"
    directory.mkdir()
    for name in ("a", "b", "c"):
        (directory / name).write_text(f"{name}0\n")
    before = _files(directory)
    args = {
        "action": "commit_new",
        "plan_id": "p-mid-sync",
        "state_dir": str(tmp_path / "state"),
        "sandbox_root": str(tmp_path / "sandboxes"),
        "kill_mid_sync": kill_at,
        "sandboxes": [
            {"resource_id": "D", "path": str(directory), "strategy": strategy,
             "writes": {"a": "a1\n", "b": "b1\n", "c": "c1\n"}, "options": options},
        ],
    }
    crashed = run_child(args)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert _files(directory) != before, "the kill came after a path was swapped in"
    if kill_at == 4:
        assert _files(directory) == {"a": b"a1\n", "b": b"b1\n", "c": b"c1\n"}

    recovered = run_child({**args, "action": "recover", "kill_mid_sync": False})
    assert recovered.returncode == 0, recovered.stderr
    state = json.loads(recovered.stdout)
    assert state["failed_rollback_ids"] == []
    if strategy == "copy_on_write" and kill_at == 4:
        # copy_on_write's commit_landed() (issue 11) sees the applied sync: recorded, not undone.
        assert state["phase"] == "committed", state
        assert _files(directory) == {"a": b"a1\n", "b": b"b1\n", "c": b"c1\n"}
        return
    assert state["phase"] == "rolled_back", state
    assert _files(directory) == before
    assert sorted(os.listdir(tmp_path)) == ["D", "sandboxes", "state"], "no staging area left"
    cleaned = run_child({**args, "action": "cleanup", "kill_mid_sync": False})
    assert cleaned.returncode == 0, cleaned.stderr
    assert _files(directory) == before
