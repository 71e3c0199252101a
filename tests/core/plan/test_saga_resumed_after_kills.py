"""A saga killed in its commit, killed again while it resumes, then failing, ends all or nothing.

The small operator soak (SIGKILLs at random moments) once ended a plan ``Failed`` with every
sandbox reported rolled back while one original kept the plan's edit. Cause: the process that
resumed the plan found an interrupted commit landed and wrote so in the journal, then died
before it saved the sandbox's record; the next resume read the journal (step committed) and the
record (sandbox ACTIVE), and the compensation rolled back an ACTIVE sandbox, which only discards
its copy. The original stayed committed.

Property: for a saga over several directory originals, killed at the k-th write of its first
run, killed again at the j-th write of each of some resumes (the operator's ``resume=True``
recovery), and then resumed for good with the last sandbox's commit failing, every original is
exactly as before; or, when the plan had committed every sandbox already, every original is
exactly as committed and the journal says so. The kills are real (``os._exit`` in a child
process at the k-th ``os.rename``/``os.replace``: every swap of a sync, every journal and
record written). ``SANDBOX_TEST_ALL_KILL_POINTS=1`` sweeps every k; else every fifth.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
PLAN = "plan-resumed"
DIE = 77
SANDBOXES = 4


# -- the child processes -------------------------------------------------------------------------


def _count_writes(kill_at: int) -> Iterator[int]:
    """Count every ``os.rename``/``os.replace``; ``os._exit`` at the ``kill_at``-th (0: never).
    Returns the counter (its next value is the number of writes so far plus one)."""
    calls = iter(range(1, 1_000_000))
    for name in ("rename", "replace"):
        real = getattr(os, name)

        def counted(src: Any, dst: Any, *args: Any, _real: Any = real, **kwargs: Any) -> None:
            if next(calls) == kill_at:
                os._exit(DIE)
            _real(src, dst, *args, **kwargs)

        setattr(os, name, counted)
    return calls


def first_run(raw: str) -> None:
    """Build the plan (one sandbox per original, each edited) and commit it as a saga."""
    args = json.loads(raw)
    from sandbox_core.host.manager import SandboxManager
    from sandbox_core.host.store import SandboxStore
    from sandbox_core.strategies.factory import SandboxFactory

    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(args["state_dir"])
    )
    strategy, _, mode = args["kind"].partition("-")
    options = {"mode": mode} if mode else {}
    for number, original in enumerate(args["originals"]):
        sandbox = manager.get_or_create_sandbox(
            PLAN, f"r{number}", original, strategy, sandbox_root=args["root"], **options
        )
        Path(sandbox.get_path("f.txt")).write_text("v1\n")
    manager.persist(PLAN)
    calls = _count_writes(args["kill_at"])
    manager.commit_plan(PLAN, mode="saga")
    print(json.dumps({"writes": next(calls) - 1}))


def resume(raw: str) -> None:
    """Resume the plan as the operator does (``resume=True``); with ``kill_at`` die at that
    write, else make the last sandbox's commit fail."""
    args = json.loads(raw)
    _count_writes(args["kill_at"])
    from sandbox_core.host.manager import SandboxManager
    from sandbox_core.host.store import SandboxStore
    from sandbox_core.plan.saga import InjectedFaultError, PlanCommitSaga

    manager = SandboxManager.load(SandboxStore(args["state_dir"]))

    def fail_last(point: str, index: int, sandbox_id: str) -> None:
        if point == "before_commit" and index == SANDBOXES and not args["kill_at"]:
            raise InjectedFaultError(f"injected commit failure of {sandbox_id}")

    saga = PlanCommitSaga(
        manager.journal_for(PLAN), on_change=manager._persist, fault_hook=fail_last, resume=True
    )
    state = saga.recover(lambda step: manager._sandbox_for_step(PLAN, step.sandbox_id))
    assert state is not None
    print(json.dumps({"phase": state.phase.value, "rolled_back": state.rolled_back_ids}))


def _run(entry: str, args: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('resumed', {str(Path(__file__))!r})\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        f"m.{entry}(sys.argv[1])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- the property ---------------------------------------------------------------------------------


def _plan(where: Path, kind: str, kill_at: int) -> tuple[dict[str, Any], list[Path]]:
    originals = []
    for number in range(SANDBOXES):
        original = where / f"orig{number}"
        original.mkdir(parents=True)
        (original / "f.txt").write_text("v0\n")
        originals.append(original)
    args = {
        "kind": kind,
        "kill_at": kill_at,
        "state_dir": str(where / "state"),
        "root": str(where / "boxes"),
        "originals": [str(o) for o in originals],
    }
    return args, originals


def _writes(tmp: Path, kind: str) -> int:
    args, _ = _plan(tmp / "uncut", kind, 0)
    done = _run("first_run", args)
    assert done.returncode == 0, done.stderr[-3000:]
    return int(json.loads(done.stdout.splitlines()[-1])["writes"])


def _one(tmp: Path, kind: str, kill_at: int, resume_kills: tuple[int, ...]) -> None:
    args, originals = _plan(tmp / f"k{kill_at}-{'-'.join(map(str, resume_kills))}", kind, kill_at)
    first = _run("first_run", args)
    if first.returncode != DIE:  # the commit finished before the k-th write
        assert first.returncode == 0, first.stderr[-3000:]
        return
    for again in resume_kills:
        cut = _run("resume", {**args, "kill_at": again})
        if cut.returncode != DIE:  # the resume finished before its j-th write
            assert cut.returncode == 0, cut.stderr[-3000:]
            break
    final = _run("resume", {**args, "kill_at": 0})
    assert final.returncode == 0, final.stderr[-3000:]
    phase = json.loads(final.stdout.splitlines()[-1])["phase"]
    texts = [(o / "f.txt").read_text() for o in originals]
    where = f"{kind}: killed at write {kill_at}, then in resumes at {resume_kills}; {phase}"
    if phase == "committed":
        assert texts == ["v1\n"] * SANDBOXES, f"{where}: {texts}"
    else:
        assert phase in ("failed", "rolled_back"), where
        assert texts == ["v0\n"] * SANDBOXES, f"{where}: the plan failed, originals {texts}"


def _kill_points(writes: int) -> list[int]:
    if os.environ.get("SANDBOX_TEST_ALL_KILL_POINTS") == "1":
        return list(range(1, writes + 1))
    return list(range(2, writes + 1, 5))


@pytest.mark.parametrize(
    ("kind", "resume_kills"),
    [("copy_on_write", (3,)), ("overlay-fallback", (1, 5))],
    ids=["copy_on_write-resume-killed-once", "overlay-fallback-resume-killed-twice"],
)
def test_a_saga_killed_in_commit_and_in_resume_then_failing_ends_all_or_nothing(
    tmp_path: Path, kind: str, resume_kills: tuple[int, ...]
) -> None:
    writes = _writes(tmp_path, kind)
    assert writes > SANDBOXES  # at least one write per sandbox's commit
    for kill_at in _kill_points(writes):
        _one(tmp_path, kind, kill_at, resume_kills)
