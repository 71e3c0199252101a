"""Two plans over one original are serialised by the original's durable lock
(``sandbox_core.plan.original_lock``, docs/concurrency.md).

The second plan is refused, naming the plan that holds the original, with nothing changed; the
lock is held from a two-phase prepare to its apply or abort (also across a crash, until
recovery), around a saga's whole run, and a hold whose process died is taken over. Real
directories, real sandboxes, real subprocesses (the CLI) for the crash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.errors import SandboxLockedError
from sandbox_core.plan.commit import commit_plan
from sandbox_core.plan.journal import MemoryCommitJournal
from sandbox_core.plan.original_lock import (
    Hold,
    OriginalLock,
    OriginalLockedError,
    held_by_process,
    lock_path_for,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.strategies.overlay import OverlaySandbox

CLI = [sys.executable, "-m", "sandbox_core.cli"]


def _original(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a0\n")
    (src / "b.txt").write_text("b0\n")
    return src


def _sandbox(kind: str, src: Path, root: Path, plan: str) -> BaseSandbox:
    if kind == "copy_on_write":
        box: BaseSandbox = CopyOnWriteSandbox(plan, str(src), sandbox_root=str(root))
    else:
        box = OverlaySandbox(plan, str(src), sandbox_root=str(root), mode="fallback")
    box.create(plan)
    box.activate()
    return box


class _Interrupt(BaseException):
    """A simulated crash of the coordinator (not an Exception: nothing catches it)."""


@pytest.mark.parametrize("second_mode", ["two_phase", "saga"])
@pytest.mark.parametrize("kind", ["copy_on_write", "overlay-fallback"])
def test_a_second_plan_over_a_prepared_original_is_refused_naming_the_holder(
    tmp_path: Path, kind: str, second_mode: str
) -> None:
    """Plan A prepared its sandbox of ``src`` and has not applied yet; plan B, over the same
    original with a disjoint edit, is refused naming plan A, and changes nothing. Once A
    applied, B commits. Fails before the lock: B landed between A's prepare and apply."""
    src = _original(tmp_path)
    first = _sandbox(kind, src, tmp_path / "root", "plan-a")
    second = _sandbox(kind, src, tmp_path / "root", "plan-b")
    Path(first.get_path("a.txt")).write_text("a by plan A\n")
    Path(second.get_path("b.txt")).write_text("b by plan B\n")
    seen: dict[str, Any] = {}

    def during_a(point: str, index: int, sandbox_id: str) -> None:
        if point != "before_apply":
            return
        holder = OriginalLock(str(src)).holder()
        seen["holder"] = holder
        try:
            seen["b"] = commit_plan("plan-b", [second], MemoryCommitJournal(), mode=second_mode)
        except OriginalLockedError as exc:
            seen["b"] = exc
        seen["b_original"] = (src / "b.txt").read_text()

    results = commit_plan("plan-a", [first], MemoryCommitJournal(), fault_hook=during_a)
    assert [r.success for r in results] == [True]
    assert seen["holder"]["plan_id"] == "plan-a" and seen["holder"]["kind"] == "prepared"
    refused = seen["b"]
    if second_mode == "saga":
        assert isinstance(refused, OriginalLockedError)
        assert isinstance(refused, SandboxLockedError)
        message = str(refused)
        assert refused.holder["plan_id"] == "plan-a"
    else:
        assert [r.success for r in refused] == [False]
        message = refused[0].error or ""
        assert refused[0].metadata["touched_originals"] == 0
    assert "plan plan-a" in message and str(src) in message
    assert seen["b_original"] == "b0\n"
    assert second.status is SandboxStatus.ACTIVE
    # A applied: the lock is free and nothing is left beside the original.
    assert OriginalLock(str(src)).holder() is None
    assert sorted(os.listdir(tmp_path)) == ["root", "src"]
    assert [r.success for r in commit_plan("plan-b", [second], MemoryCommitJournal())] == [True]
    assert (src / "a.txt").read_text() == "a by plan A\n"
    assert (src / "b.txt").read_text() == "b by plan B\n"
    for box in (first, second):
        box.cleanup()


def test_a_two_phase_prepare_refused_by_the_lock_aborts_every_participant(
    tmp_path: Path,
) -> None:
    """A plan of two sandboxes (two originals) whose second original is held: the whole plan
    fails before its decision, the first participant's staging is aborted, both originals are
    untouched and the lock of the first original is released."""
    one, two = tmp_path / "one", tmp_path / "two"
    for d in (one, two):
        d.mkdir()
        (d / "f.txt").write_text("0\n")
    boxes = [_sandbox("copy_on_write", d, tmp_path / "root", "plan-c") for d in (one, two)]
    for box in boxes:
        Path(box.get_path("f.txt")).write_text("1\n")
    lock = OriginalLock(str(two))
    lock.acquire(Hold(holder="tx-other", plan_id="other-plan", kind="prepared", txid="tx-other"))
    try:
        results = commit_plan("plan-c", boxes, MemoryCommitJournal())
    finally:
        lock.release("tx-other")
    assert [r.success for r in results] == [False]
    assert "other-plan" in (results[0].error or "")
    assert (one / "f.txt").read_text() == "0\n" and (two / "f.txt").read_text() == "0\n"
    assert OriginalLock(str(one)).holder() is None
    assert not [n for n in os.listdir(tmp_path) if n.startswith((".one.", ".two."))]
    assert [r.success for r in commit_plan("plan-c", boxes, MemoryCommitJournal())] == [True] * 2
    for box in boxes:
        box.cleanup()


def test_a_prepared_hold_survives_a_crash_until_recovery(tmp_path: Path) -> None:
    """The coordinator dies after the prepare (simulated crash, nothing applied): the lock is
    durable (the staged commit is still there), so another plan is refused; recovery aborts
    the attempt and frees the lock; the other plan then commits."""
    src = _original(tmp_path)
    first = _sandbox("copy_on_write", src, tmp_path / "root", "plan-a")
    second = _sandbox("copy_on_write", src, tmp_path / "root", "plan-b")
    Path(first.get_path("a.txt")).write_text("A\n")
    Path(second.get_path("b.txt")).write_text("B\n")
    journal = MemoryCommitJournal()

    def crash(point: str, index: int, sandbox_id: str) -> None:
        if point == "after_prepare":
            raise _Interrupt

    with pytest.raises(_Interrupt):
        commit_plan("plan-a", [first], journal, fault_hook=crash)
    assert OriginalLock(str(src)).holder()["plan_id"] == "plan-a"
    refused = commit_plan("plan-b", [second], MemoryCommitJournal())
    assert not refused[0].success and "plan plan-a" in (refused[0].error or "")
    from sandbox_core.plan.two_phase import TwoPhasePlanCommit

    state = TwoPhasePlanCommit(journal).recover(lambda step: first)
    assert state is not None and state.phase.value == "rolled_back"
    assert OriginalLock(str(src)).holder() is None
    assert [r.success for r in commit_plan("plan-b", [second], MemoryCommitJournal())] == [True]
    assert (src / "a.txt").read_text() == "a0\n" and (src / "b.txt").read_text() == "B\n"
    for box in (first, second):
        box.cleanup()


_HOLDER = """
import sys, time
from sandbox_core.plan.original_lock import held_by_process
with held_by_process([sys.argv[1]], "plan-x", "saga:plan-x:1"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_hold_whose_process_was_killed_is_taken_over(tmp_path: Path) -> None:
    """A process (another container sharing the volume would do the same) holds the original
    for a saga: this process is refused naming it; once it is SIGKILLed its hold no longer
    binds (the kernel dropped its lock on byte 1) and is taken over."""
    src = _original(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(src)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(OriginalLockedError) as refused:
            OriginalLock(str(src)).acquire(Hold(holder="tx-1", plan_id="plan-y", kind="prepared"))
        assert refused.value.holder["pid"] == proc.pid
        assert "plan plan-x" in str(refused.value)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    lock = OriginalLock(str(src))
    lock.acquire(Hold(holder="tx-1", plan_id="plan-y", kind="prepared"))
    assert lock.holder()["plan_id"] == "plan-y"
    assert lock.release("tx-1")
    assert not Path(str(lock_path_for(str(src)))).exists()


def test_two_holders_in_one_process_exclude_each_other_and_waiting_times_out(
    tmp_path: Path,
) -> None:
    """Open-file-description locks: two holds in one process exclude each other (POSIX record
    locks would not); a caller that chooses to wait is refused after ``timeout_seconds``."""
    src = _original(tmp_path)
    with held_by_process([str(src)], "plan-1", "saga:plan-1:1"):
        started = time.monotonic()
        with (
            pytest.raises(OriginalLockedError),
            held_by_process([str(src)], "plan-2", "saga:plan-2:1", timeout_seconds=0.3),
        ):
            pass
        assert time.monotonic() - started >= 0.3
    with held_by_process([str(src)], "plan-2", "saga:plan-2:1"):
        assert OriginalLock(str(src)).holder()["plan_id"] == "plan-2"
    assert OriginalLock(str(src)).holder() is None


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "--json", *args], capture_output=True, text=True, env=env)


def test_cli_plan_killed_after_prepare_blocks_another_plan_until_recovered(
    tmp_path: Path,
) -> None:
    """Across processes: ``commit-plan A`` is SIGKILLed after its prepare
    (``SANDBOX_CORE_FAULT=after_prepare:1``); ``commit-plan B`` over the same original then
    fails naming plan A, with the original untouched (another process of the product);
    ``recover A`` aborts A and frees the lock; ``commit-plan B`` then lands."""
    env = {
        **os.environ,
        "SANDBOX_CORE_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_CORE_ROOT": str(tmp_path / "sandboxes"),
    }
    src = _original(tmp_path)
    ids = {}
    for plan, name in (("pa", "a.txt"), ("pb", "b.txt")):
        made = _cli(env, "create", "--plan", plan, "--resource", plan, "--strategy",
                    "copy_on_write", str(src))  # fmt: skip
        assert made.returncode == 0, made.stderr
        ids[plan] = json.loads(made.stdout)["sandbox_id"]
        path = json.loads(_cli(env, "path", ids[plan], name).stdout)["path"]
        Path(path).write_text(f"{plan}\n")
    kill = {**env, "SANDBOX_CORE_FAULT": "after_prepare:1"}
    killed = _cli(kill, "commit-plan", "pa", "--two-phase")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    refused = _cli(env, "commit-plan", "pb", "--two-phase")
    assert refused.returncode != 0
    assert "plan pa" in refused.stdout + refused.stderr
    assert (src / "a.txt").read_text() == "a0\n" and (src / "b.txt").read_text() == "b0\n"
    recovered = _cli(env, "recover", "pa")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    done = _cli(env, "commit-plan", "pb", "--two-phase")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (src / "b.txt").read_text() == "pb\n" and (src / "a.txt").read_text() == "a0\n"
    assert sorted(os.listdir(tmp_path)) == ["sandboxes", "src", "state"]
