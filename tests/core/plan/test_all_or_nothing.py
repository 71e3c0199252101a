"""A plan commit lands all of the plan or none of it, also across crashes and retries (case 38).

Invariant (``sandbox_core.plan.saga``): for every crash point of the saga's fault hook and every mix
of strategies, *crash -> recover -> commit the plan again* leaves the originals either all as they
were before the plan or all with the plan's changes; never some of each. The retry either
commits the whole plan, or is refused up front (``PlanRerunRequiredError``) with the originals
untouched; after the plan is re-run (the discarded sandboxes' work redone), it commits whole.

Crashes are real: a child process runs ``commit_all`` with ``SANDBOX_CORE_FAULT=<point>:<index>``
and SIGKILLs itself there; recovery and the retry run in a fresh manager loaded from the store.
Originals are real: a git repository, directories (copy_on_write, overlay: a kernel OverlayFS
mount when the process may mount, else the fallback), a SQLite database, and a directory written
directly by the ``none`` strategy (immediate by definition, so it is not part of the check).

The matrix is exhaustive over crash points for the mix of all five strategies and, for every pair
of strategies, over a rotating subset of points (every point and every pair appears);
``SANDBOX_TEST_CRASH_MATRIX=full`` runs every point for every pair.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_core import SandboxFactory, SandboxStatus, SandboxStore
from sandbox_core.errors import PlanRerunRequiredError
from sandbox_core.host.manager import SandboxManager
from tests.support.gitrepo import GIT_ENV, git, make_repo

STRATEGIES = ("git_worktree", "copy_on_write", "overlay", "transaction_rollback", "none")
COMMIT_POINTS = ("before_commit", "after_commit", "after_persist", "after_record")
PLAN = "p-aon"


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


# -- one resource per strategy: its original, the plan's edit, and what the original holds -------


@dataclass
class Resource:
    key: str
    strategy: str
    path: Path

    @property
    def checked(self) -> bool:
        """``none`` writes straight to the original: nothing to hold back, nothing to check."""
        return self.strategy != "none"

    def make(self) -> None:
        if self.strategy == "git_worktree":
            make_repo(self.path, {"v": "0\n"})
        elif self.strategy == "transaction_rollback":
            with sqlite3.connect(self.path) as connection:
                connection.execute("CREATE TABLE notes (body TEXT)")
                connection.execute("INSERT INTO notes VALUES ('0')")
            connection.close()
        else:
            self.path.mkdir()
            (self.path / "v").write_text("0\n")

    def edit(self, sandbox: Any) -> None:
        """The plan's write (also used to redo the work after a rollback discarded it)."""
        if self.strategy == "transaction_rollback":
            sandbox.execute("INSERT INTO notes VALUES ('1')")
        else:
            Path(sandbox.get_path("v")).write_text("1\n")

    def state(self) -> Any:
        """What the original holds, as the user sees it."""
        if self.strategy == "transaction_rollback":
            with sqlite3.connect(self.path) as connection:
                rows = connection.execute("SELECT body FROM notes ORDER BY rowid").fetchall()
            connection.close()
            return [row[0] for row in rows]
        text = (self.path / "v").read_text()
        if self.strategy == "git_worktree":
            return text, git(self.path, "show", "HEAD:v"), git(self.path, "status", "--porcelain")
        return text

    def intended(self) -> Any:
        if self.strategy == "transaction_rollback":
            return ["0", "1"]
        if self.strategy == "git_worktree":
            return "1\n", "1", ""
        return "1\n"


def build(tmp_path: Path, strategies: tuple[str, ...]) -> list[Resource]:
    suffix = {"transaction_rollback": ".db"}
    resources = [
        Resource(f"r{i}-{s}", s, tmp_path / f"orig-{i}-{s}{suffix.get(s, '')}")
        for i, s in enumerate(strategies)
    ]
    for resource in resources:
        resource.make()
    return resources


def manager_for(tmp_path: Path) -> SandboxManager:
    return SandboxManager.load(SandboxStore(tmp_path / "state"), SandboxFactory())


def set_up_plan(tmp_path: Path, resources: list[Resource]) -> None:
    """Create every sandbox and make the plan's writes; nothing stays open in this process."""
    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(tmp_path / "state")
    )
    for resource in resources:
        sandbox = manager.get_or_create_sandbox(
            PLAN, resource.key, str(resource.path), resource.strategy,
            sandbox_root=str(tmp_path / "sbx"),
        )
        resource.edit(sandbox)
    manager.persist(PLAN)
    for sandbox in manager.list_sandboxes(PLAN):
        close = getattr(sandbox, "close", None)
        if callable(close):
            close()  # a SQLite transaction must not outlive this step (the child commits)


CHILD = (
    "import json, sys\n"
    "from sandbox_core import SandboxManager, SandboxStore\n"
    "manager = SandboxManager.load(SandboxStore(sys.argv[1]))\n"
    "results = manager.commit_all(sys.argv[2])\n"
    "print(json.dumps([r.success for r in results]))\n"
)


def commit_in_child(tmp_path: Path, kill: str | None, raise_at: str | None = None) -> int:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SANDBOX_CORE_")}
    if kill:
        env["SANDBOX_CORE_FAULT"] = kill
    if raise_at:
        env["SANDBOX_CORE_FAULT_RAISE"] = raise_at
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "state"), PLAN],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return done.returncode


@pytest.fixture
def cleanup_plan(tmp_path: Path) -> Iterator[None]:
    yield
    if (tmp_path / "state").is_dir():
        manager_for(tmp_path).cleanup_all(PLAN)  # overlay mounts must not outlive the test


# -- the invariant ------------------------------------------------------------------------------


def outcome(resources: list[Resource], before: dict[str, Any]) -> str:
    """``"none"`` / ``"all"`` of the plan landed; fails the test on anything in between."""
    checked = [r for r in resources if r.checked]
    states = {r.key: r.state() for r in checked}
    if all(states[r.key] == before[r.key] for r in checked):
        return "none"
    if all(states[r.key] == r.intended() for r in checked):
        return "all"
    raise AssertionError(f"half a plan landed: {states} (before: {before})")


def crash_recover_recommit(
    tmp_path: Path, strategies: tuple[str, ...], kill: str, raise_at: str | None = None
) -> None:
    resources = build(tmp_path, strategies)
    set_up_plan(tmp_path, resources)
    before = {r.key: r.state() for r in resources if r.checked}

    code = commit_in_child(tmp_path, kill, raise_at)
    assert code in (-signal.SIGKILL, 0), code  # 0: the crash point was never reached
    after_crash = outcome(resources, before) if code == 0 else None

    manager = manager_for(tmp_path)
    recovered = manager.recover(PLAN)
    assert recovered is not None and recovered.phase.is_terminal, recovered
    after_recovery = outcome(resources, before)
    if after_crash is not None:
        assert after_recovery == after_crash
    assert (after_recovery == "all") == (recovered.phase.value == "committed"), recovered

    try:
        results = manager.commit_all(PLAN)
    except PlanRerunRequiredError as refused:
        assert outcome(resources, before) == after_recovery == "none"
        assert "must be re-run" in str(refused)
        # Re-running the plan: redo the discarded sandboxes' work, then it commits whole.
        tracked = {sb.resource_id: sb for sb in manager.list_sandboxes(PLAN)}
        for resource in resources:
            sandbox = tracked[resource.key]
            if sandbox.status.blocks_plan_commit:
                resource.edit(sandbox)
        results = manager.commit_all(PLAN)
        assert results and all(r.success for r in results), results
        assert outcome(resources, before) == "all"
        return
    final = outcome(resources, before)
    if results:
        assert all(r.success for r in results), results
        assert final == "all"
    else:
        assert final == after_recovery
    # Never committed twice: the database row and the git merge are there at most once.
    for resource in resources:
        if resource.strategy == "transaction_rollback":
            assert resource.state().count("1") <= 1
        if resource.strategy == "git_worktree":
            assert git(resource.path, "log", "--format=%s").count("\n") <= 2


def _points(steps: int) -> list[str]:
    return [f"{point}:{index}" for index in range(1, steps + 1) for point in COMMIT_POINTS]


FULL_MIX = STRATEGIES


@pytest.mark.parametrize("kill", _points(len(FULL_MIX)))
def test_every_crash_point_of_the_full_mix_ends_all_or_nothing(
    tmp_path: Path, kill: str, cleanup_plan: None
) -> None:
    crash_recover_recommit(tmp_path, FULL_MIX, kill)


@pytest.mark.parametrize(
    ("raise_at", "kill"),
    [
        (f"before_commit:{failing}", f"{point}:{step}")
        for failing, step in ((3, 1), (3, 2), (2, 1))
        for point in ("before_compensate", "after_compensate")
    ],
)
def test_a_crash_inside_the_compensation_ends_all_or_nothing(
    tmp_path: Path, raise_at: str, kill: str, cleanup_plan: None
) -> None:
    """A commit fails (injected), and the process dies while compensating the earlier ones."""
    crash_recover_recommit(tmp_path, FULL_MIX, kill, raise_at)


def _pair_cases() -> list[tuple[tuple[str, str], str]]:
    pairs = list(itertools.permutations(STRATEGIES, 2))
    points = _points(2)
    if os.environ.get("SANDBOX_TEST_CRASH_MATRIX") == "full":
        return [(pair, point) for pair in pairs for point in points]
    return [(pair, points[i % len(points)]) for i, pair in enumerate(pairs)]


@pytest.mark.parametrize(("pair", "kill"), _pair_cases())
def test_every_pair_of_strategies_ends_all_or_nothing(
    tmp_path: Path, pair: tuple[str, str], kill: str, cleanup_plan: None
) -> None:
    crash_recover_recommit(tmp_path, pair, kill)


# -- case 38, as written, through the CLI --------------------------------------------------------

CLI = [sys.executable, "-m", "sandbox_core.cli", "--json"]


def run_cli(env: dict[str, str], *args: str, expect: int | None = 0) -> Any:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, check=False)
    if expect is not None:
        assert done.returncode == expect, done.stdout + done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else done.returncode


def test_case38_retry_after_recovery_never_commits_half_the_plan(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SANDBOX_CORE_")}
    env.update(GIT_ENV)
    env["SANDBOX_CORE_STATE_DIR"] = str(tmp_path / "st")
    env["SANDBOX_CORE_ROOT"] = str(tmp_path / "sbx")
    repo = make_repo(tmp_path / "R", {"f": "base\n"})
    directory = tmp_path / "D"
    directory.mkdir()
    (directory / "log.txt").write_text("line0\n")
    pre_r = git(repo, "rev-parse", "main")

    # Step 1: A (git_worktree on R) appends X, B (copy_on_write on D) appends Y.
    ids = {}
    for key, strategy, path in (("A", "git_worktree", repo), ("B", "copy_on_write", directory)):
        created = run_cli(
            env, "create", "--plan", "p38", "--resource", key, "--strategy", strategy, str(path)
        )
        ids[key] = created["sandbox_id"]
    a_file = Path(run_cli(env, "path", ids["A"], "f")["path"])
    a_file.write_text(a_file.read_text() + "X\n")
    b_file = Path(run_cli(env, "path", ids["B"], "log.txt")["path"])
    b_file.write_text(b_file.read_text() + "Y\n")

    # Step 2: killed right after A's merge, before it is recorded.
    killed = run_cli({**env, "SANDBOX_CORE_FAULT": "after_commit:1"}, "commit-plan", "p38",
                     expect=None)
    assert killed == -signal.SIGKILL
    assert (repo / "f").read_text() == "base\nX\n"  # A's merge landed

    # Step 3: recovery rolls the attempt back: the originals as before step 2.
    recovered = run_cli(env, "recover", "p38")["journal"]
    assert recovered["phase"] == "rolled_back"
    assert git(repo, "rev-parse", "main") == pre_r
    assert (repo / "f").read_text() == "base\n"
    assert (directory / "log.txt").read_text() == "line0\n"
    statuses = {r["sandbox_id"]: r["status"] for r in run_cli(env, "list")["sandboxes"]}
    assert statuses == {ids["A"]: "rolled_back", ids["B"]: "active"}

    # Step 4: committing again is refused with a clear error; both originals unchanged.
    refused = run_cli(env, "commit-plan", "p38", expect=4)
    assert refused["error"]["type"] == "PlanRerunRequiredError"
    message = refused["error"]["message"]
    assert "p38" in message and "must be re-run" in message and ids["A"] in message
    assert git(repo, "rev-parse", "main") == pre_r
    assert (repo / "f").read_text() == "base\n"
    assert (directory / "log.txt").read_text() == "line0\n"  # never Y without X

    # Re-running the plan (A's work redone) commits the whole of it.
    a_file = Path(run_cli(env, "path", ids["A"], "f")["path"])
    assert a_file.read_text() == "base\n", "the rollback discarded A's change"
    a_file.write_text(a_file.read_text() + "X\n")
    done = run_cli(env, "commit-plan", "p38")
    assert [r["success"] for r in done["results"]] == [True, True]
    assert (repo / "f").read_text() == "base\nX\n"
    assert git(repo, "show", "main:f") == "base\nX"
    assert (directory / "log.txt").read_text() == "line0\nY\n"


def test_a_plan_with_an_errored_sandbox_is_refused_not_committed_in_part(tmp_path: Path) -> None:
    """The same kind without a crash: one sandbox of the plan is ERRORED (its changes in doubt),
    so committing the others is refused; the statuses say which one."""
    resources = build(tmp_path, ("copy_on_write", "copy_on_write"))
    set_up_plan(tmp_path, resources)
    manager = manager_for(tmp_path)
    broken = manager.get_sandbox(PLAN, resources[0].key)
    broken._status = SandboxStatus.ERRORED  # fault injection: a commit that died with I/O errors
    with pytest.raises(PlanRerunRequiredError) as refused:
        manager.commit_all(PLAN)
    assert refused.value.sandbox_ids == [broken.sandbox_id]
    assert [r.state() for r in resources] == ["0\n", "0\n"]
    # Dropping it from the plan (cleanup) is the other way out: the rest then commits.
    broken.cleanup()
    assert [r.success for r in manager.commit_all(PLAN)] == [True]
    manager.cleanup_all(PLAN)
