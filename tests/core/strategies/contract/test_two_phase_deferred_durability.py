"""Durable ordering of a directory sandbox's two-phase prepare inside a plan (issue 9, speed).

Inside a plan's ``deferred_syncfs`` block the staging journal and the sandbox's ``prepared``
record are written without their own fsyncs: they become durable with the staged files by the
plan's one ``syncfs`` per filesystem, which runs before the decision record. The rules this
relies on, each tested here:

1. every filesystem holding a staging area or a ``prepared`` record is synced, and before the
   journal says ``applying`` (the decision);
2. without ``syncfs`` nothing is deferred: the record and the journal are fsynced one by one;
3. a crash before that flush may leave a torn (empty) staging journal or record: abort, a new
   prepare of the same txid and cleanup take them for only prepared and leave nothing behind,
   the original untouched;
4. a SIGKILL after the flush and before the decision record: recovery aborts, nothing is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_core import durable
from sandbox_core.durable import deferred_syncfs
from sandbox_core.errors import SandboxError
from sandbox_core.plan.journal import FileCommitJournal, JournalPhase, JournalState
from sandbox_core.plan.two_phase import TwoPhasePlanCommit, plan_txid
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies import _directory
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.tree import staging as tree_staging
from sandbox_core.tree import sync
from sandbox_core.tree.staging import find_prepared
from tests.support.directory_sandboxes import STRATEGIES, new_sandbox
from tests.support.fidelity_tree import tree_state
from tests.support.two_phase_dirs import edit, make_source, staged_beside

REPO_ROOT = Path(__file__).resolve().parents[4]
TXID = "plan-dd.1"


def _home(sandbox: BaseSandbox) -> Path:
    base = getattr(sandbox, "base_dir", None) or sandbox.base_path  # type: ignore[attr-defined]
    return Path(base)


def _record(sandbox: BaseSandbox, txid: str) -> Path:
    return _home(sandbox) / f"prepared-{txid}.json"


@pytest.fixture
def sandbox(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BaseSandbox]:
    src = make_source(tmp_path)
    made = new_sandbox(request.param, src, tmp_path / "root")
    made.create("tpc-dd")
    yield made
    made.cleanup()
    assert staged_beside(src) == []


def _plan(tmp_path: Path, count: int = 2) -> list[CopyOnWriteSandbox]:
    boxes = []
    for index in range(count):
        src = make_source(tmp_path / f"o{index}")
        box = CopyOnWriteSandbox(f"s{index}", str(src), sandbox_root=str(tmp_path / "root"))
        box.create("plan-dd")
        edit(box)
        boxes.append(box)
    return boxes


class _Recording(FileCommitJournal):
    def __init__(self, path: Path, log: list[Any]) -> None:
        super().__init__(path)
        self.log = log

    def save(self, state: JournalState) -> None:
        self.log.append(("save", state.phase))
        super().save(state)


def test_the_flush_syncs_every_staging_and_record_filesystem_before_the_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # glibc has syncfs on every machine the project runs on (CI's too): a broken lookup must
    # fail here, not skip; the fallback without it is the next test's (syncfs taken away).
    assert durable.has_syncfs(), "the C library's syncfs was not found"
    log: list[Any] = []
    real_syncfs = durable.syncfs
    real_fsync = os.fsync

    def syncfs(path: str) -> bool:
        log.append(("syncfs", os.stat(path).st_dev))
        return real_syncfs(path)

    def fsync(fd: int) -> None:
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(durable, "syncfs", syncfs)
    monkeypatch.setattr(os, "fsync", fsync)
    boxes = _plan(tmp_path)
    journal = _Recording(tmp_path / "journal.json", log)
    results = TwoPhasePlanCommit(journal).run("plan-dd", list(boxes))
    assert all(result.success for result in results)
    decision = log.index(("save", JournalPhase.APPLYING))
    synced = {entry[1] for entry in log[:decision] if entry[0] == "syncfs"}
    for box in boxes:
        assert os.stat(Path(box.original_path).parent).st_dev in synced
        assert os.stat(_home(box)).st_dev in synced
    # No staging journal or prepared record paid its own fsync before the decision.
    txid = plan_txid("plan-dd", 1)
    own = [
        entry[1]
        for entry in log[:decision]
        if entry[0] == "fsync"
        and (entry[1].endswith(f"prepared-{txid}.json.tmp") or entry[1].endswith(".tmp"))
    ]
    assert own == []
    assert [e for e in log[decision:] if e[0] == "fsync"], "the apply still fsyncs its journals"
    for box in boxes:
        assert box.status is SandboxStatus.COMMITTED
        assert staged_beside(Path(box.original_path)) == []
        box.cleanup()


def test_prepare_records_are_fsynced_one_by_one_without_syncfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(durable, "has_syncfs", lambda: False)
    boxes = _plan(tmp_path, 1)
    with deferred_syncfs() as flush:
        calls: list[int] = []
        real_fsync = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
        boxes[0].prepare(TXID)
        monkeypatch.setattr(os, "fsync", real_fsync)
        flush()
    # staged files and directories, the staging journal, its directory, the record, the home
    assert len(calls) >= 4
    boxes[0].abort_prepared(TXID)
    boxes[0].cleanup()


@pytest.mark.parametrize("sandbox", STRATEGIES, indirect=True)
def test_a_torn_journal_and_record_cut_before_the_flush_are_aborted(
    sandbox: BaseSandbox,
) -> None:
    src = Path(sandbox.original_path)
    before = tree_state(src)
    edit(sandbox)
    with deferred_syncfs():  # the plan's flush never ran: a crash before the decision
        prepared = sandbox.prepare(TXID)
    staging = Path(prepared.details["staging"])
    # What a power cut may leave of files renamed into place but never fsynced: empty files.
    (staging / sync._JOURNAL).write_bytes(b"")
    _record(sandbox, TXID).write_bytes(b"")
    assert tree_staging.staged_state(src, f"{TXID}.{sandbox.sandbox_id}") == "staged-two-phase"
    assert _directory.txids_in(_home(sandbox), "prepared") == []
    reopened = type(sandbox).reopen(json.loads(json.dumps(sandbox.to_record())))
    reopened.abort_prepared(TXID)
    reopened.abort_prepared(TXID)
    assert staged_beside(src) == [] and not _record(sandbox, TXID).exists()
    assert tree_state(src) == before
    assert reopened.status is SandboxStatus.ACTIVE
    # A new prepare of the same txid over torn leftovers, then cleanup, leave nothing either.
    with deferred_syncfs():
        again = sandbox.prepare(TXID)
    (Path(again.details["staging"]) / sync._JOURNAL).write_bytes(b"")
    _record(sandbox, TXID).write_bytes(b"")
    sandbox.prepare(TXID)  # replaces the torn area and record
    assert json.loads(_record(sandbox, TXID).read_text())["state"] == "prepared"
    sandbox.abort_prepared(TXID)
    assert find_prepared(src, f"{TXID}.{sandbox.sandbox_id}") is None
    assert tree_state(src) == before


KILL_AFTER_FLUSH = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from sandbox_core import durable
    from sandbox_core.plan.journal import FileCommitJournal
    from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
    from sandbox_core.plan.two_phase import TwoPhasePlanCommit
    from sandbox_core.plan.two_phase import TwoPhasePlanCommit
    from tests.support.two_phase_dirs import edit, make_source

    tmp = Path(sys.argv[1])
    boxes = []
    for index in range(3):
        src = make_source(tmp / f"o{index}")
        box = CopyOnWriteSandbox(f"s{index}", str(src), sandbox_root=str(tmp / "root"))
        box.create("plan-dd")
        edit(box)
        boxes.append(box)
    (tmp / "records.json").write_text(json.dumps([b.to_record() for b in boxes]))
    real = durable.syncfs

    def syncfs(path):
        real(path)
        os._exit(9)  # the flush is durable; the decision record is not written

    durable.syncfs = syncfs
    TwoPhasePlanCommit(FileCommitJournal(tmp / "journal.json")).run("plan-dd", boxes)
    """
)


def test_killed_after_the_flush_before_the_decision_recovery_leaves_nothing(
    tmp_path: Path,
) -> None:
    assert durable.has_syncfs(), "the C library's syncfs was not found"  # see above
    done = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_FLUSH, str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    records = json.loads((tmp_path / "records.json").read_text())
    boxes = {r["sandbox_id"]: CopyOnWriteSandbox.reopen(r) for r in records}
    txid = plan_txid("plan-dd", 1)
    for box in boxes.values():
        assert _record(box, txid).exists()  # every participant was prepared and recorded
    journal = FileCommitJournal(tmp_path / "journal.json")
    assert journal.load().phase is JournalPhase.PREPARING  # type: ignore[union-attr]
    state = TwoPhasePlanCommit(journal).recover(lambda step: boxes[step.sandbox_id])
    assert state is not None and state.phase is JournalPhase.ROLLED_BACK
    for index, box in enumerate(boxes.values()):
        src = tmp_path / f"o{index}" / "src"
        assert (src / "a.txt").read_text() == "one\ntwo\nthree\n"
        assert not (src / "new.txt").exists()
        assert staged_beside(src) == []
        assert not _record(box, txid).exists()
        box.cleanup()


class _Crash(BaseException):
    """A simulated crash inside the apply (not an Exception: nothing catches it)."""


def _home_and_key(sandbox: BaseSandbox) -> tuple[Path, str]:
    return _home(sandbox), f"{TXID}.{sandbox.sandbox_id}"


@pytest.mark.parametrize("sandbox", STRATEGIES, indirect=True)
def test_the_applied_record_is_written_before_the_area_is_dropped(
    sandbox: BaseSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apply rule: the record says ``applied`` before the replaced entries are handed over and
    the area is dropped, so an area gone under a ``prepared`` record was never applied; a cut
    hand-over is redone by applying again, and the backup then undoes the commit."""
    src = Path(sandbox.original_path)
    before = tree_state(src)
    edit(sandbox)
    sandbox.prepare(TXID)
    real_finish = tree_staging._finish

    def finish(staging: str, journal: dict[str, Any]) -> None:
        assert json.loads(_record(sandbox, TXID).read_text())["state"] == "applied"
        raise _Crash

    monkeypatch.setattr(tree_staging, "_finish", finish)
    with pytest.raises(_Crash):
        sandbox.apply_prepared(TXID)
    monkeypatch.setattr(tree_staging, "_finish", real_finish)
    home, key = _home_and_key(sandbox)
    assert find_prepared(src, key) is not None  # not yet dropped
    assert _directory.apply_begun(sandbox, home, src) == []  # recorded applied
    reopened = type(sandbox).reopen(json.loads(json.dumps(sandbox.to_record())))
    result = reopened.apply_prepared(TXID)
    assert result.added_files == ["new.txt"]
    assert staged_beside(src) == []
    assert (src / "new.txt").read_text() == "n1\nn2\n"
    reopened.rollback()  # from COMMITTED: the handed-over backup undoes it
    assert tree_state(src) == before
    reopened.cleanup()


@pytest.mark.parametrize("sandbox", STRATEGIES, indirect=True)
def test_a_cut_apply_is_known_from_the_area_journal_and_only_rolls_forward(
    sandbox: BaseSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apply rule: the area's journal (``applying``, fsynced before the first rename) alone says
    the apply has begun: abort is refused, ``apply_begun`` names the txid (the kernel overlay
    does not remount over a half-written lower directory), applying again finishes."""
    src = Path(sandbox.original_path)
    edit(sandbox)
    sandbox.prepare(TXID)

    def hook(point: str) -> None:
        raise _Crash

    monkeypatch.setattr(sync, "fault_hook", hook)
    with pytest.raises(_Crash):
        sandbox.apply_prepared(TXID)
    monkeypatch.setattr(sync, "fault_hook", None)
    home, key = _home_and_key(sandbox)
    assert json.loads(_record(sandbox, TXID).read_text())["state"] == "prepared"
    assert tree_staging.staged_state(src, key) == "applying-two-phase"
    assert _directory.apply_begun(sandbox, home, src) == [TXID]
    with pytest.raises(SandboxError):
        sandbox.abort_prepared(TXID)
    reopened = type(sandbox).reopen(json.loads(json.dumps(sandbox.to_record())))
    assert reopened.apply_prepared(TXID).deleted_files == ["d/c.txt"]
    assert _directory.apply_begun(reopened, home, src) == []
    assert staged_beside(src) == [] and not (src / "d" / "c.txt").exists()
    reopened.cleanup()
