"""A rollback from COMMITTED never discards a write made to the original after the commit
(case 43, part B; docs/concurrency.md), in copy_on_write, overlay kernel and overlay fallback,
after a one-shot commit and after a two-phase apply.

Property: after ``commit``, another writer changes the original. When the change is at a path
the commit wrote (or below a directory it put in place), ``rollback`` refuses with
``SandboxRollbackConflictError`` naming those paths, nothing changes and the sandbox stays
COMMITTED. A change anywhere else is kept and the rollback undoes the commit. git_worktree
already refuses when work was built on the merge (case 23b).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxRollbackConflictError, SandboxRollbackError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.tree import beneath
from tests.support.directory_sandboxes import STRATEGIES, Make
from tests.support.fidelity_tree import tree_state


def strategies(func: Callable[..., None]) -> Callable[..., None]:
    return pytest.mark.parametrize("make", STRATEGIES, indirect=True)(func)


def _commit(box: BaseSandbox, how: str) -> None:
    if how == "one-shot":
        box.commit("c")
    else:
        box.prepare("tx-43b", "c")
        box.apply_prepared("tx-43b")
    assert box.status is SandboxStatus.COMMITTED


HOW = pytest.mark.parametrize("how", ["one-shot", "two-phase"])


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "vol" / "src"
    (src / "keep").mkdir(parents=True)
    (src / "ledger").write_text("seed\n")
    (src / "keep" / "other").write_text("other\n")
    (src / "gone").write_text("gone\n")
    return src


def _edit(box: BaseSandbox) -> None:
    with open(box.get_path("ledger"), "a") as handle:
        handle.write("sandbox\n")
    os.makedirs(box.get_path("newdir"))
    Path(box.get_path("newdir/n")).write_text("n\n")
    os.unlink(box.get_path("gone"))


@strategies
@HOW
def test_case43b_rollback_refuses_after_the_application_appended_to_a_committed_file(
    tmp_path: Path, make: Make, how: str
) -> None:
    """Case 43 B as written: ``ledger`` = seed, the sandbox appends, commit, the application
    appends ``app after commit``, rollback. Expected: refused, conflict naming ``ledger``,
    sandbox COMMITTED, the application's line kept. Failed before: the rollback succeeded
    and ``ledger`` was ``seed`` again."""
    src = _source(tmp_path)
    box = make(src)
    box.create("p43")
    box.activate()
    _edit(box)
    _commit(box, how)
    with open(src / "ledger", "a") as handle:
        handle.write("app after commit\n")
    before = tree_state(src)
    with pytest.raises(SandboxRollbackConflictError) as refused:
        box.rollback()
    assert refused.value.conflicts == ["ledger"]
    assert refused.value.refused and isinstance(refused.value, SandboxRollbackError)
    assert "ledger" in str(refused.value)
    assert box.status is SandboxStatus.COMMITTED
    assert tree_state(src) == before
    assert (src / "ledger").read_text() == "seed\nsandbox\napp after commit\n"


@strategies
def test_a_refused_rollback_leaves_the_sandbox_shown_and_a_retry_runs(
    tmp_path: Path, make: Make
) -> None:
    """A rollback refused because the original moved changes nothing in the sandbox either:
    it still shows the committed tree (the kernel overlay's view is still mounted: the busy
    check, which may unmount it, comes after this refusal); once the write is taken back the
    rollback runs and the sandbox shows the original again."""
    src = _source(tmp_path)
    box = make(src)
    box.create("p43")
    box.activate()
    _edit(box)
    _commit(box, "one-shot")
    (src / "newdir" / "app").write_text("a\n")
    with pytest.raises(SandboxRollbackConflictError):
        box.rollback()
    view = Path(box.context.sandbox_path)  # type: ignore[union-attr]
    assert (view / "ledger").read_text() == "seed\nsandbox\n"
    assert (view / "newdir" / "n").read_text() == "n\n"
    (src / "newdir" / "app").unlink()
    box.rollback()
    box.activate()
    assert Path(box.get_path("ledger")).read_text() == "seed\n"
    assert not Path(box.get_path("newdir")).exists()
    assert Path(box.get_path("gone")).read_text() == "gone\n"


LATER_WRITES = {
    "file-inside-added-dir": (
        lambda src: (src / "newdir" / "app").write_text("a\n"),
        ["newdir/app"],
    ),
    "rewrote-added-file": (lambda src: (src / "newdir" / "n").write_text("N\n"), ["newdir/n"]),
    "recreated-deleted": (lambda src: (src / "gone").write_text("back\n"), ["gone"]),
    "chmod-committed": (lambda src: os.chmod(src / "ledger", 0o600), ["ledger"]),
}


@strategies
@pytest.mark.parametrize("later", sorted(LATER_WRITES))
def test_rollback_refuses_any_later_write_the_undo_would_discard(
    tmp_path: Path, make: Make, later: str
) -> None:
    """Every kind of later write at a path the commit wrote (a file in a directory the commit
    added, a rewrite, a deleted file made again, a mode change) refuses the rollback, naming
    the path, with nothing changed."""
    src = _source(tmp_path)
    box = make(src)
    box.create("p43")
    box.activate()
    _edit(box)
    _commit(box, "one-shot")
    write, paths = LATER_WRITES[later]
    write(src)
    before = tree_state(src)
    with pytest.raises(SandboxRollbackConflictError) as refused:
        box.rollback()
    assert refused.value.conflicts == paths
    assert box.status is SandboxStatus.COMMITTED
    assert tree_state(src) == before


@strategies
@HOW
def test_rollback_keeps_a_later_write_elsewhere_and_undoes_the_commit(
    tmp_path: Path, make: Make, how: str
) -> None:
    """A later write at a path the commit did not write is kept; the commit is undone; a
    rollback with no later write at all still works (nothing refused by mistake)."""
    src = _source(tmp_path)
    box = make(src)
    box.create("p43")
    box.activate()
    _edit(box)
    _commit(box, how)
    (src / "keep" / "other").write_text("other, later\n")
    (src / "keep" / "fresh").write_text("fresh\n")
    box.rollback()
    assert box.status is SandboxStatus.ROLLED_BACK
    assert (src / "ledger").read_text() == "seed\n"
    assert (src / "gone").read_text() == "gone\n"
    assert not (src / "newdir").exists()
    assert (src / "keep" / "other").read_text() == "other, later\n"
    assert (src / "keep" / "fresh").read_text() == "fresh\n"


@strategies
def test_rollback_is_retried_once_the_later_write_is_undone(tmp_path: Path, make: Make) -> None:
    """The refusal is not final: once the later write is taken back (the entry's stamp as
    the commit left it is restored by putting the committed file back), the rollback runs."""
    src = _source(tmp_path)
    box = make(src)
    box.create("p43")
    box.activate()
    _edit(box)
    _commit(box, "one-shot")
    (src / "newdir" / "app").write_text("a\n")
    with pytest.raises(SandboxRollbackConflictError):
        box.rollback()
    (src / "newdir" / "app").unlink()
    box.rollback()
    assert box.status is SandboxStatus.ROLLED_BACK
    assert (src / "ledger").read_text() == "seed\n" and not (src / "newdir").exists()


@strategies
@HOW
def test_a_write_met_while_the_undo_runs_refuses_with_the_commit_whole_and_a_retry_runs(
    tmp_path: Path, make: Make, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is made right before each path is put back, not once up front: the undo
    puts ``newdir`` and ``ledger`` back first, then, right before it would remove ``gone``
    (which the commit deleted), finds that the application made it again. Refused, naming
    ``gone``; what the undo had put back is undone in turn, so the original is exactly as
    the commit left it plus the application's file; the sandbox stays COMMITTED. Once the
    application's file is gone the rollback is retried and runs (the undo's own renames,
    which moved the ctimes of the paths it put back, are no conflict then). Failed before:
    the application's ``gone`` was replaced by the old one."""
    src = _source(tmp_path)
    box = make(src)
    box.create("p43")
    box.activate()
    _edit(box)
    _commit(box, how)
    committed = tree_state(src)
    met: list[str] = []

    def write_meanwhile(call: str, rel: str) -> None:
        if call == "stat" and rel == "gone" and not met:
            met.append(rel)
            (src / "gone").write_text("the application's\n")

    monkeypatch.setattr(beneath, "fault_hook", write_meanwhile)
    with pytest.raises(SandboxRollbackConflictError) as refused:
        box.rollback()
    monkeypatch.setattr(beneath, "fault_hook", None)
    assert met == ["gone"]
    assert refused.value.conflicts == ["gone"]
    assert "while the rollback ran" in str(refused.value)
    assert box.status is SandboxStatus.COMMITTED
    assert (src / "gone").read_text() == "the application's\n"
    assert {k: v for k, v in tree_state(src).items() if k != b"gone"} == {
        k: v for k, v in committed.items() if k != "gone"
    }
    assert not [p for p in src.parent.iterdir() if p.name != "src"], "staging left behind"
    (src / "gone").unlink()
    box.rollback()
    assert box.status is SandboxStatus.ROLLED_BACK
    assert (src / "ledger").read_text() == "seed\n"
    assert (src / "gone").read_text() == "gone\n"
    assert not (src / "newdir").exists()
