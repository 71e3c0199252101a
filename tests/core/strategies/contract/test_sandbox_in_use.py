"""Sandboxes in use: a process whose working directory
or open file is inside a sandbox during a rollback or a checkpoint restore keeps working on the
live sandbox, or the operation is refused as busy naming it. It never writes into a view that
is then thrown away.

A real subprocess holds the working directory (or a file open for appending) inside the
sandbox; the operation runs; then the subprocess writes. Oracle: the operation was refused
naming the process (and its write lands in the sandbox, which is unchanged), or it succeeded
and the subprocess's write is visible in the live sandbox.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxError, SandboxLockedError, SandboxRollbackError
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.factory import SandboxFactory
from sandbox_core.strategies.overlay import mount as kernel
from tests.support.gitrepo import make_repo

KINDS = [
    "git_worktree",
    "copy_on_write",
    pytest.param("overlay-kernel", marks=pytest.mark.overlay_kernel),
    "overlay-fallback",
]

_HOLDER = r"""
import os, sys
os.chdir(sys.argv[1])
handle = open(sys.argv[2], "a") if sys.argv[2] != "-" else None
print("ready", flush=True)
sys.stdin.readline()
try:
    with open("from-the-shell.txt", "w") as out:
        out.write("shell\n")
    if handle is not None:
        handle.write("appended by the editor\n")
        handle.close()
    print("ok", flush=True)
except OSError as exc:
    print(f"error {exc}", flush=True)
"""


class Holder:
    """A subprocess sitting in ``cwd`` (and holding ``open_file`` open for appending)."""

    def __init__(self, cwd: str, open_file: str | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, cwd, open_file or "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def write(self) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def _make(kind: str, tmp_path: Path) -> BaseSandbox:
    root = str(tmp_path / "boxes")
    if kind == "git_worktree":
        src = make_repo(tmp_path / "repo", {"a.txt": "a0\n", "sub/b.txt": "b0\n"})
        box = SandboxFactory().create("git_worktree", "r", str(src), sandbox_root=root)
    else:
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "a.txt").write_text("a0\n")
        (src / "sub" / "b.txt").write_text("b0\n")
        strategy, _, mode = kind.partition("-")
        options = {"mode": mode} if mode else {}
        box = SandboxFactory().create(strategy, "r", str(src), sandbox_root=root, **options)
    box.create("p-busy")
    box.activate()
    return box


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for holder in made:
        holder.close()


def _check(box: BaseSandbox, holder: Holder, operation: object, open_file: bool) -> None:
    """Run ``operation``; then the holder writes; apply the oracle of the module docstring."""
    refused: BaseException | None = None
    try:
        done = operation()  # type: ignore[operator]
        if done is False:  # a checkpoint restore reports a refusal as False (logged)
            refused = SandboxError("restore returned False")
    except (SandboxRollbackError, SandboxLockedError) as exc:
        refused = exc
        assert str(holder.proc.pid) in str(exc) and "busy" in str(exc), exc
    answer = holder.write()
    assert answer == "ok", f"the process in the sandbox could not work on: {answer}"
    live = Path(box.get_path("sub/from-the-shell.txt"))
    assert live.read_text() == "shell\n", "the shell wrote into a view that was thrown away"
    if open_file:
        text = Path(box.get_path("sub/b.txt")).read_text()
        assert "appended by the editor" in text, (
            f"the editor's write went to a discarded file (refused: {refused}); now {text!r}"
        )


HOLDS = ["cwd", "open-file"]


def kinds_and_holds(kinds: list[object]) -> list[object]:
    """Every (kind, hold)."""
    out: list[object] = []
    for kind in kinds:
        name = kind if isinstance(kind, str) else kind.values[0]  # type: ignore[attr-defined]
        marks = [] if isinstance(kind, str) else list(kind.marks)  # type: ignore[attr-defined]
        for hold in HOLDS:
            out.append(pytest.param(name, hold, marks=marks, id=f"{name}-{hold}"))
    return out


@pytest.mark.parametrize(("kind", "hold"), kinds_and_holds(KINDS))
def test_rollback_of_an_active_sandbox_in_use(
    tmp_path: Path, kind: str, hold: str, holders: list[Holder]
) -> None:
    box = _make(kind, tmp_path)
    try:
        Path(box.get_path("sub/b.txt")).write_text("b1\n")
        sub = box.get_path("sub")
        holder = Holder(sub, box.get_path("sub/b.txt") if hold == "open-file" else None)
        holders.append(holder)

        def roll() -> None:
            box.rollback()
            box.activate()

        _check(box, holder, roll, hold == "open-file")
    finally:
        for holder in holders:
            holder.close()
        box.cleanup()


@pytest.mark.parametrize("hold", HOLDS)
@pytest.mark.parametrize("kind", KINDS)
def test_rollback_from_committed_of_a_sandbox_in_use(
    tmp_path: Path, kind: str, hold: str, holders: list[Holder]
) -> None:
    box = _make(kind, tmp_path)
    try:
        Path(box.get_path("sub/b.txt")).write_text("b1\n")
        box.commit("c")
        assert box.status is SandboxStatus.COMMITTED
        # After the commit the sandbox shows the committed tree; a shell still sits in it.
        sub = str(Path(box.context.sandbox_path) / "sub")  # type: ignore[union-attr]
        target = str(Path(sub) / "b.txt") if hold == "open-file" else None
        holder = Holder(sub, target)
        holders.append(holder)

        def roll() -> None:
            box.rollback()
            box.activate()

        refused: BaseException | None = None
        try:
            roll()
        except SandboxRollbackError as exc:
            refused = exc
            assert exc.refused and str(holder.proc.pid) in str(exc), exc
            assert box.status is SandboxStatus.COMMITTED
        assert holder.write() == "ok"
        if refused is None:
            assert Path(box.get_path("sub/from-the-shell.txt")).read_text() == "shell\n"
            if target:
                assert "appended by the editor" in Path(box.get_path("sub/b.txt")).read_text()
    finally:
        for holder in holders:
            holder.close()
        box.cleanup()


@pytest.mark.parametrize(("kind", "hold"), kinds_and_holds(KINDS))
def test_checkpoint_restore_of_a_sandbox_in_use(
    tmp_path: Path, kind: str, hold: str, holders: list[Holder]
) -> None:
    box = _make(kind, tmp_path)
    checkpoints = CheckpointManager(tmp_path / "checkpoints")
    try:
        checkpoint = checkpoints.create_checkpoint(box, "p-busy", "before")
        Path(box.get_path("sub/b.txt")).write_text("b1\n")
        sub = box.get_path("sub")
        holder = Holder(sub, box.get_path("sub/b.txt") if hold == "open-file" else None)
        holders.append(holder)
        _check(box, holder, lambda: checkpoints.restore(box, checkpoint), hold == "open-file")
    finally:
        for holder in holders:
            holder.close()
        box.cleanup()


@pytest.mark.overlay_kernel
@pytest.mark.parametrize("committed", [False, True], ids=["active", "committed"])
def test_a_kernel_view_in_use_stays_mounted_when_refused_and_is_rolled_back_once_left(
    tmp_path: Path, committed: bool, holders: list[Holder]
) -> None:
    """The kernel overlay's busy check is the kernel's own: a plain unmount of the view, which
    fails while a process is inside. Refused, the view is still mounted and shows the sandbox
    (the process keeps working in it); once the process has left, the same rollback unmounts,
    undoes and mounts the view again over an empty layer."""
    box = _make("overlay-kernel", tmp_path)
    try:
        Path(box.get_path("sub/b.txt")).write_text("b1\n")
        if committed:
            box.commit("c")
        view = Path(box.context.sandbox_path)  # type: ignore[union-attr]
        holder = Holder(str(view / "sub"), None)
        holders.append(holder)
        with pytest.raises(SandboxRollbackError) as refused:
            box.rollback()
        assert refused.value.refused and f"{holder.proc.pid} (python" in str(refused.value)
        assert box.status is (SandboxStatus.COMMITTED if committed else SandboxStatus.ACTIVE)
        assert kernel.is_overlay_mounted(view)
        assert (view / "sub" / "b.txt").read_text() == "b1\n"
        assert holder.write() == "ok"
        assert (view / "sub" / "from-the-shell.txt").read_text() == "shell\n"
        holder.close()
        box.rollback()
        assert box.status is SandboxStatus.ROLLED_BACK
        assert kernel.is_overlay_mounted(view)
        assert (view / "sub" / "b.txt").read_text() == "b0\n"
        assert not (view / "sub" / "from-the-shell.txt").exists()
        assert (tmp_path / "src" / "sub" / "b.txt").read_text() == "b0\n"
    finally:
        for holder in holders:
            holder.close()
        box.cleanup()


@pytest.mark.parametrize("kind", ["copy_on_write", "overlay-fallback"])
def test_a_copy_busy_at_a_rollback_from_committed_keeps_the_commit_and_the_copy(
    tmp_path: Path, kind: str, holders: list[Holder]
) -> None:
    """The copy-based strategies look for writers while they walk the trees, before the undo
    writes anything: refused as busy, the original still holds the commit and the copy is
    untouched; once the writer has closed its file the rollback undoes the commit."""
    box = _make(kind, tmp_path)
    try:
        Path(box.get_path("sub/b.txt")).write_text("b1\n")
        box.commit("c")
        view = Path(box.context.sandbox_path)  # type: ignore[union-attr]
        holder = Holder(str(view / "sub"), str(view / "sub" / "b.txt"))
        holders.append(holder)
        with pytest.raises(SandboxRollbackError) as refused:
            box.rollback()
        assert refused.value.refused and f"{holder.proc.pid} (python" in str(refused.value)
        assert "busy" in str(refused.value)
        assert box.status is SandboxStatus.COMMITTED
        assert (tmp_path / "src" / "sub" / "b.txt").read_text() == "b1\n"
        assert (view / "sub" / "b.txt").read_text() == "b1\n"
        assert holder.write() == "ok"
        assert "appended by the editor" in (view / "sub" / "b.txt").read_text()
        holder.close()
        box.rollback()
        assert box.status is SandboxStatus.ROLLED_BACK
        assert (tmp_path / "src" / "sub" / "b.txt").read_text() == "b0\n"
    finally:
        for holder in holders:
            holder.close()
        box.cleanup()
