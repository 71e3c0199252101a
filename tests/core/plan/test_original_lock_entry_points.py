"""Every entry point that writes an original takes the original's lock (docs/concurrency.md).

A lone ``sandbox.commit()`` (no plan), a rollback from COMMITTED, ``SandboxManager.commit_all``,
the ``sandbox-core`` CLI's ``commit`` and ``rollback`` and the workspace agent's operations take
the same durable lock as a plan (``sandbox_core.tree.original_lock``). While **another process**
holds it (a real second process, which took a process hold of the original), each of them is
refused with a lock error naming the original and the holder, changes nothing and keeps the
sandbox's status; once the holder lets go, the same call succeeds. And a lone commit in progress
is seen as the holder by another process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.agent.operations import AgentConfig, Operations
from sandbox_core.errors import SandboxCommitLockedError, SandboxRollbackLockedError
from sandbox_core.host.manager import SandboxManager
from sandbox_core.plan.original_lock import OriginalLock, OriginalLockedError, lock_path_for
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.factory import SandboxFactory
from sandbox_core.strategies.git_worktree import GitWorktreeSandbox
from tests.support.directory_sandboxes import new_sandbox
from tests.support.gitrepo import git, make_repo

CLI = [sys.executable, "-m", "sandbox_core.cli"]
KINDS = ["copy_on_write", "overlay-fallback", "git_worktree"]
# A second process of the product: takes a hold of argv[1] as plan "other-plan" (argv[2]: a
# "prepared" hold, a plan awaiting its decision, or a "process" hold, a commit under way), says
# "held", keeps it until its stdin closes, then lets go.
HOLDER = """
import sys
from sandbox_core.tree.original_lock import Hold, OriginalLock
lock = OriginalLock(sys.argv[1])
holder = "tx-other-plan" if sys.argv[2] == "prepared" else "saga:other-plan:1"
txid = holder if sys.argv[2] == "prepared" else None
lock.acquire(Hold(holder=holder, plan_id="other-plan", kind=sys.argv[2], txid=txid))
print("held", flush=True)
sys.stdin.read()
lock.release(holder)
print("released", flush=True)
"""


@contextmanager
def another_process_holds(
    original: Path, kind: str = "prepared"
) -> Iterator[subprocess.Popen[str]]:
    """A second process holding ``original``'s lock (a ``kind`` hold) for the body."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(original), kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.stdin.close()
        released = proc.stdout.readline().strip()
        proc.stdout.close()
        assert proc.wait(timeout=30) == 0
        assert released == "released"


def _original(tmp_path: Path, kind: str) -> Path:
    src = tmp_path / "src"
    if kind == "git_worktree":
        return make_repo(src, {"a.txt": "a0\n", "b.txt": "b0\n"})
    src.mkdir()
    (src / "a.txt").write_text("a0\n")
    (src / "b.txt").write_text("b0\n")
    return src


def _sandbox(kind: str, src: Path, root: Path) -> BaseSandbox:
    if kind == "git_worktree":
        box: BaseSandbox = GitWorktreeSandbox("res", str(src), sandbox_root=str(root))
    else:
        box = new_sandbox(kind, src, root)
    box.create("lone")
    return box


def _refusal_names_the_holder(exc: BaseException, src: Path) -> None:
    message = str(exc)
    assert str(src) in message and "other-plan" in message
    assert getattr(exc, "lock_path", None) == lock_path_for(str(src))


@pytest.mark.parametrize("kind", KINDS)
def test_a_lone_commit_changes_nothing_while_a_prepared_plan_of_another_process_holds(
    tmp_path: Path, kind: str
) -> None:
    """``sandbox.commit()`` outside any plan, while another process's plan holds the original
    prepared (awaiting its decision): at once a lock error naming the original and the holder;
    the original untouched, the sandbox ACTIVE with its edit. Fails without the lone lock: the
    commit landed under the other plan's hold."""
    src = _original(tmp_path, kind)
    box = _sandbox(kind, src, tmp_path / "root")
    Path(box.get_path("a.txt")).write_text("a by the lone commit\n")
    with another_process_holds(src), pytest.raises(OriginalLockedError) as refused:
        box.commit("lone")
    assert isinstance(refused.value, SandboxCommitLockedError)
    _refusal_names_the_holder(refused.value, src)
    assert (src / "a.txt").read_text() == "a0\n"
    assert box.status is SandboxStatus.ACTIVE
    assert box.commit("lone").success  # the holder let go
    assert (src / "a.txt").read_text() == "a by the lone commit\n"
    assert not Path(str(lock_path_for(str(src)))).exists()
    box.cleanup()


@pytest.mark.parametrize("kind", KINDS)
def test_a_rollback_from_committed_is_refused_while_another_process_holds(
    tmp_path: Path, kind: str
) -> None:
    """Undoing a commit writes the original: refused (``refused``, status COMMITTED, the
    committed content in place) while another process holds it; done once it lets go."""
    src = _original(tmp_path, kind)
    box = _sandbox(kind, src, tmp_path / "root")
    Path(box.get_path("b.txt")).write_text("b committed\n")
    assert box.commit("one").success
    with another_process_holds(src), pytest.raises(SandboxRollbackLockedError) as refused:
        box.rollback()
    assert refused.value.refused
    _refusal_names_the_holder(refused.value, src)
    assert (src / "b.txt").read_text() == "b committed\n"
    assert box.status is SandboxStatus.COMMITTED
    box.rollback()
    assert (src / "b.txt").read_text() == "b0\n"
    assert box.status is SandboxStatus.ROLLED_BACK
    box.cleanup()


def test_a_lone_commit_in_progress_is_the_holder_another_process_sees(tmp_path: Path) -> None:
    """While a lone commit writes, another process reading the lock sees a process hold named
    after the commit; afterwards the lock is free and its file gone."""
    src = _original(tmp_path, "copy_on_write")
    box = _sandbox("copy_on_write", src, tmp_path / "root")
    Path(box.get_path("a.txt")).write_text("a1\n")
    seen: dict[str, Any] = {}
    real = box._do_commit  # type: ignore[attr-defined]

    def observed(message: str | None) -> Any:
        probe = (
            "import json, sys\nfrom sandbox_core.tree.original_lock import OriginalLock\n"
            "print(json.dumps(OriginalLock(sys.argv[1]).holder()))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, str(src)], capture_output=True, text=True, check=True
        )
        seen["holder"] = json.loads(out.stdout)
        return real(message)

    box._do_commit = observed  # type: ignore[attr-defined,method-assign]
    assert box.commit("seen").success
    assert seen["holder"]["kind"] == "process"
    assert seen["holder"]["holder"] == f"commit:{box.sandbox_id}"
    assert seen["holder"]["pid"] == os.getpid()
    assert OriginalLock(str(src)).holder() is None
    box.cleanup()


def test_the_managers_commit_all_is_refused_while_another_process_holds(tmp_path: Path) -> None:
    """``SandboxManager.commit_all`` (the saga the operator's local executor and the library
    run) over an original another process holds: refused before anything is committed."""
    src = _original(tmp_path, "copy_on_write")
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
    box = manager.get_or_create_sandbox(
        "plan-m", "res", str(src), "copy_on_write", sandbox_root=str(tmp_path / "root")
    )
    Path(box.get_path("a.txt")).write_text("a by the manager\n")
    with another_process_holds(src), pytest.raises(OriginalLockedError) as refused:
        manager.commit_all("plan-m")
    _refusal_names_the_holder(refused.value, src)
    assert (src / "a.txt").read_text() == "a0\n"
    assert box.status is SandboxStatus.ACTIVE
    assert [r.success for r in manager.commit_all("plan-m")] == [True]
    assert (src / "a.txt").read_text() == "a by the manager\n"
    manager.cleanup_all("plan-m")


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "--json", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("kind", ["copy_on_write", "git_worktree"])
def test_the_cli_commit_and_rollback_exit_8_while_another_process_holds(
    tmp_path: Path, kind: str
) -> None:
    """``sandbox-core commit`` and ``sandbox-core rollback`` (of a COMMITTED sandbox), each in
    its own process, while a third process holds the original: exit code 8 (a lock), the
    original named, nothing changed; both succeed once it lets go."""
    env = {
        **os.environ,
        "SANDBOX_CORE_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_CORE_ROOT": str(tmp_path / "sandboxes"),
    }
    src = _original(tmp_path, kind)
    made = _cli(env, "create", "--plan", "pc", "--resource", "r", "--strategy", kind, str(src))
    assert made.returncode == 0, made.stderr
    sid = json.loads(made.stdout)["sandbox_id"]
    path = json.loads(_cli(env, "path", sid, "a.txt").stdout)["path"]
    Path(path).write_text("a by the CLI\n")
    with another_process_holds(src):
        refused = _cli(env, "commit", sid, "-m", "cli")
    assert refused.returncode == 8, refused.stdout + refused.stderr
    assert str(src) in refused.stdout + refused.stderr
    assert (src / "a.txt").read_text() == "a0\n"
    assert json.loads(_cli(env, "status", sid).stdout)["status"] == "active"
    done = _cli(env, "commit", sid, "-m", "cli")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (src / "a.txt").read_text() == "a by the CLI\n"
    with another_process_holds(src):
        refused = _cli(env, "rollback", sid)
    assert refused.returncode == 8, refused.stdout + refused.stderr
    assert str(src) in refused.stdout + refused.stderr
    assert (src / "a.txt").read_text() == "a by the CLI\n"
    undone = _cli(env, "rollback", sid)
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert (src / "a.txt").read_text() == "a0\n"
    if kind == "git_worktree":
        assert git(src, "status", "--porcelain") == ""
    assert _cli(env, "cleanup", sid).returncode == 0


def test_the_agents_commit_and_rollback_are_refused_while_another_process_holds(
    tmp_path: Path,
) -> None:
    """The workspace agent's operations (what its HTTP routes run) over an original another
    process holds: commit and rollback from COMMITTED refused with the lock error, nothing
    changed, the record's status kept; both succeed once it lets go."""
    src = _original(tmp_path, "copy_on_write")
    ops = Operations(AgentConfig(state_dir=tmp_path / "state", sandbox_root=tmp_path / "root"))
    body = {"plan_id": "pa", "resource_id": "r", "original": str(src), "strategy": "copy_on_write"}
    sid = ops.create(body)["sandbox_id"]
    ops.write(sid, "a.txt", b"a by the agent\n")
    with another_process_holds(src), pytest.raises(OriginalLockedError) as refused:
        ops.commit(sid, {"message": "agent"})
    _refusal_names_the_holder(refused.value, src)
    assert (src / "a.txt").read_text() == "a0\n"
    assert ops.status(sid)["status"] == "active"
    assert ops.commit(sid, {"message": "agent"})["result"]["success"]
    with another_process_holds(src), pytest.raises(SandboxRollbackLockedError):
        ops.rollback(sid, {})
    assert (src / "a.txt").read_text() == "a by the agent\n"
    assert ops.status(sid)["status"] == "committed"
    ops.rollback(sid, {})
    assert (src / "a.txt").read_text() == "a0\n"
    ops.cleanup(sid)


@pytest.mark.parametrize("kind", KINDS)
def test_a_lone_commit_queues_behind_another_process_commit_and_then_lands(
    tmp_path: Path, kind: str
) -> None:
    """While another process's commit (a process hold) runs, a lone commit waits for it
    (``LONE_WAIT_SECONDS``), then lands: two lone commits of one original are serialised, not
    refused."""
    import threading

    src = _original(tmp_path, kind)
    box = _sandbox(kind, src, tmp_path / "root")
    Path(box.get_path("a.txt")).write_text("a by the lone commit\n")
    with another_process_holds(src, "process") as holder:
        assert holder.stdin is not None
        threading.Timer(1.0, holder.stdin.close).start()  # the other commit ends in 1 s
        assert box.commit("lone").success
    assert (src / "a.txt").read_text() == "a by the lone commit\n"
    box.cleanup()


class _Died(BaseException):
    """The process dies here (nothing of the product's own undo runs)."""


def _cut_commit(box: BaseSandbox, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-shot commit of ``box`` cut in the middle of writing the original, as by a crash:
    directories after the first path swapped in (its own undo never runs), git after the
    files were written and before the ref moved (its marker stays)."""
    from sandbox_core.strategies.git_worktree.git import GitCommand
    from sandbox_core.tree import sync

    if kind == "git_worktree":
        real_run = GitCommand.run

        def run(self: GitCommand, *args: str, **kwargs: Any) -> Any:
            if args and args[0] == "update-ref":
                raise _Died
            return real_run(self, *args, **kwargs)

        monkeypatch.setattr(GitCommand, "run", run)
    else:

        def die(rel: str) -> None:
            raise _Died

        monkeypatch.setattr(sync, "fault_hook", die)
        monkeypatch.setattr(sync, "_undo_or_fail", lambda *args, **kwargs: None)
    with pytest.raises(_Died):
        box.commit("cut")
    monkeypatch.undo()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("action", ["cleanup", "rollback"])
def test_finishing_an_interrupted_commit_waits_for_the_original_lock_and_writes_nothing_meanwhile(
    tmp_path: Path, kind: str, action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit cut half-way leaves the original half-written; the sandbox's cleanup or
    rollback first finishes or undoes it (``finish_interrupted``), which writes the original,
    so it takes the original's lock as a lone commit does. While another process's commit
    holds it, it waits (here 0.3 s instead of LONE_WAIT_SECONDS), then is refused with a lock
    error naming the holder: the original is exactly as the cut commit left it and the
    sandbox keeps its status. Once the holder lets go the same call undoes the cut commit.
    Failed before: the half-written original was written under the other process's hold."""
    src = _original(tmp_path, kind)
    box = _sandbox(kind, src, tmp_path / "root")
    Path(box.get_path("a.txt")).write_text("a by the cut commit\n")
    Path(box.get_path("b.txt")).write_text("b by the cut commit\n")
    _cut_commit(box, kind, monkeypatch)
    status = box.status
    assert (src / "a.txt").read_text() == "a by the cut commit\n", "nothing was half written"
    half = sorted(os.listdir(src.parent)), (src / "a.txt").read_text(), (src / "b.txt").read_text()
    monkeypatch.setattr("sandbox_core.strategies.base.LONE_WAIT_SECONDS", 0.3)
    expected = SandboxRollbackLockedError if action == "rollback" else OriginalLockedError
    with another_process_holds(src, "process"), pytest.raises(expected) as refused:
        getattr(box, action)()
    _refusal_names_the_holder(refused.value, src)
    assert box.status is status
    assert (sorted(os.listdir(src.parent)), (src / "a.txt").read_text(),
            (src / "b.txt").read_text()) == half  # fmt: skip
    getattr(box, action)()  # the holder let go
    assert (src / "a.txt").read_text() == "a0\n" and (src / "b.txt").read_text() == "b0\n"
    assert sorted(os.listdir(src.parent)) == ["root", "src"]
    if kind == "git_worktree":
        assert git(src, "status", "--porcelain").strip() == ""


@pytest.mark.parametrize("own", [True, False], ids=["own-plan", "other-plan"])
def test_finishing_a_decided_apply_goes_on_under_its_own_plans_prepared_hold_only(
    tmp_path: Path, own: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A two-phase apply cut after its first rename (the plan decided), its plan's prepared
    hold still on the original (no recovery ran): the sandbox's cleanup rolls the apply
    forward when that hold names this sandbox (the plan's own decided work), and is refused
    at once, nothing written, when the prepared hold is another plan's."""
    from sandbox_core.tree import sync
    from sandbox_core.tree.original_lock import Hold

    src = _original(tmp_path, "copy_on_write")
    box = _sandbox("copy_on_write", src, tmp_path / "root")
    Path(box.get_path("a.txt")).write_text("a by the plan\n")
    Path(box.get_path("b.txt")).write_text("b by the plan\n")
    box.prepare("tx-cut", "plan")

    def die(rel: str) -> None:
        raise _Died

    monkeypatch.setattr(sync, "fault_hook", die)
    with pytest.raises(_Died):
        box.apply_prepared("tx-cut")
    monkeypatch.undo()
    half = (src / "a.txt").read_text(), (src / "b.txt").read_text()
    assert half == ("a by the plan\n", "b0\n")
    lock = OriginalLock(str(src))
    holder = "tx-cut" if own else "tx-other"
    lock.acquire(
        Hold(holder=holder, plan_id="lone" if own else "other-plan", kind="prepared",
             sandbox_id=box.sandbox_id if own else "another-sandbox", txid=holder)
    )  # fmt: skip
    try:
        if own:
            box.cleanup()
            assert (src / "a.txt").read_text() == "a by the plan\n"
            assert (src / "b.txt").read_text() == "b by the plan\n"
        else:
            with pytest.raises(OriginalLockedError) as refused:
                box.cleanup()
            assert "other-plan" in str(refused.value)
            assert ((src / "a.txt").read_text(), (src / "b.txt").read_text()) == half
            assert box.status is SandboxStatus.ACTIVE
    finally:
        lock.release(holder)
    if not own:
        box.cleanup()  # the other plan let go: rolled forward, then cleaned up
        assert (src / "b.txt").read_text() == "b by the plan\n"
