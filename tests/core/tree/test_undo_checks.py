"""The undo of a sync compares each path right before it puts it back (docs/concurrency.md,
"A rollback from COMMITTED refuses when the original moved, before or while it undoes").

``record_written`` keeps the stamps of what a sync wrote beside its backup; ``undo_sync``
compares each path with them right before it replaces or removes it. A write of another
writer met then stops the undo, what it had put back is undone in turn (the target as the sync
left it plus that write), and the kept stamps of the entries it moved back are renewed, so a
retry refuses only the other writer's path. The same holds when the undo is cut by a crash and
finished by ``recover_sync``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_core.tree import beneath, sync
from sandbox_core.tree.guards import ChangedMeanwhileError
from sandbox_core.tree.sync import moved_since, record_written, recover_sync, sync_tree, undo_sync
from tests.support.fidelity_tree import tree_state


def _synced(tmp_path: Path) -> tuple[Path, Path, dict[bytes, object]]:
    """A target synced from a source (``a`` changed, ``b`` deleted, ``n`` added, ``dir/``
    added); returns target, backup and the target's state after the sync."""
    target, source = tmp_path / "vol" / "target", tmp_path / "source"
    for root in (target, source):
        root.mkdir(parents=True)
        (root / "a").write_text("a0\n")
        (root / "b").write_text("b0\n")
    (source / "a").write_text("a1\n")
    (source / "b").unlink()
    (source / "n").write_text("n1\n")
    (source / "dir").mkdir()
    (source / "dir" / "f").write_text("f1\n")
    backup = tmp_path / "backup"
    sync_tree(source, target, backup_dir=backup)
    assert record_written(backup, target)
    assert moved_since(backup, target) == []
    return target, backup, tree_state(target)


def _write_at_check(monkeypatch: pytest.MonkeyPatch, target: Path, rel: str) -> list[str]:
    """Another writer makes ``rel`` anew right when the undo first looks at it."""
    met: list[str] = []

    def hook(call: str, seen: str) -> None:
        if call == "stat" and seen == rel and not met:
            met.append(seen)
            (target / rel).write_text("the other writer's\n")

    monkeypatch.setattr(beneath, "fault_hook", hook)
    return met


def test_a_write_met_right_before_its_path_is_put_back_stops_the_undo_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The undo goes newest op first: ``n`` and ``dir`` are put back before ``b``, which the
    sync deleted and the other writer makes again right before the undo would recreate it.
    Refused naming ``b``; ``n`` and ``dir`` are the sync's again; nothing beside the target.
    Failed before (the undo read fresh stamps when it started, after the rollback's check):
    nothing to compare with but what it read itself."""
    target, backup, after = _synced(tmp_path)
    met = _write_at_check(monkeypatch, target, "b")
    with pytest.raises(ChangedMeanwhileError) as refused:
        undo_sync(backup, target)
    monkeypatch.setattr(beneath, "fault_hook", None)
    assert met == ["b"] and refused.value.paths == ["b"]
    now = tree_state(target)
    assert (target / "b").read_text() == "the other writer's\n"
    assert {k: v for k, v in now.items() if k != b"b"} == after
    assert sorted(p.name for p in target.parent.iterdir()) == ["target"]
    # The entries the undo moved back have new ctimes: renewed, so only ``b`` is named.
    assert moved_since(backup, target) == ["b"]
    (target / "b").unlink()
    assert moved_since(backup, target) == []
    undo_sync(backup, target)
    assert (target / "a").read_text() == "a0\n" and (target / "b").read_text() == "b0\n"
    assert not (target / "n").exists() and not (target / "dir").exists()


def test_a_write_inside_a_folder_the_sync_added_is_named_at_its_child(tmp_path: Path) -> None:
    """A folder's own stamp leaves out what moves with its children: a file another writer
    adds in ``dir`` is named as ``dir/app``, never as ``dir``, and the undo refuses."""
    target, backup, _ = _synced(tmp_path)
    (target / "dir" / "app").write_text("x\n")
    assert moved_since(backup, target) == ["dir/app"]
    with pytest.raises(ChangedMeanwhileError) as refused:
        undo_sync(backup, target)
    assert refused.value.paths == ["dir/app"]
    assert (target / "dir" / "app").read_text() == "x\n"


def test_an_undo_cut_by_a_crash_is_put_back_by_recovery_with_its_stamps_renewed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after the undo moved ``dir`` and ``n`` back (its own put-back never
    runs): ``recover_sync`` finds the undo's journal, puts the sync's entries back and renews
    their stamps from the backup the journal names, so the retry runs."""
    target, backup, after = _synced(tmp_path)
    swapped: list[str] = []

    class Died(BaseException):
        pass

    def die(rel: str) -> None:
        swapped.append(rel)
        if len(swapped) == 2:
            raise Died

    monkeypatch.setattr(sync, "fault_hook", die)
    monkeypatch.setattr(sync, "_undo_or_fail", lambda *args, **kwargs: None)  # died first
    with pytest.raises(Died):
        undo_sync(backup, target)
    monkeypatch.undo()
    assert tree_state(target) != after, "the cut undo changed nothing"
    assert recover_sync(target) == ["rolled_back"]
    assert tree_state(target) == after
    assert moved_since(backup, target) == []
    undo_sync(backup, target)
    assert (target / "a").read_text() == "a0\n" and not (target / "n").exists()
    assert sorted(os.listdir(target)) == ["a", "b"]
