"""A crash while an applied two-phase staging area is being removed (issue 9, crash table).

With participants applied at once, a SIGKILL meant for one step can land in another step's
removal of its applied area. The area must then never look like a staged area that lost its
journal (the apply of a recovery refused it as "incomplete" and the plan could not finish):
the removal renames it away first, and :func:`recover_sync` finishes it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandbox_core.tree import sync
from sandbox_core.tree.snapshot import compute_changes
from sandbox_core.tree.staging import apply_staged, find_prepared, stage_sync
from sandbox_core.tree.sync import recover_sync

KEY = "tpc.plan.0123456789.1.SANDBOX"


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    original, sandbox = tmp_path / "original", tmp_path / "sandbox"
    for tree in (original, sandbox):
        (tree / "d").mkdir(parents=True)
        for n in range(20):
            (tree / "d" / f"f{n}.txt").write_text(f"old {n}\n")
    for n in range(0, 20, 2):
        (sandbox / "d" / f"f{n}.txt").write_text(f"new {n}\n")
    (sandbox / "added.txt").write_text("added\n")
    return original, sandbox


_REAL_RMTREE = shutil.rmtree


def _crash_after_two(path: str, *args: object, **kwargs: object) -> None:
    """Remove two entries of the area (the journal among them, in name order) and "die"."""
    for entry in sorted(os.listdir(path))[:2]:
        full = os.path.join(path, entry)
        _REAL_RMTREE(full) if os.path.isdir(full) else os.unlink(full)
    raise KeyboardInterrupt("simulated SIGKILL during the removal")


def _staged(tmp_path: Path) -> Path:
    """The original, with the sandbox's changes staged under ``KEY`` (backup in ``backup``)."""
    original, sandbox = _trees(tmp_path)
    stage_sync(sandbox, original, KEY, changes=compute_changes(original, sandbox),
               backup_dir=tmp_path / "backup")  # fmt: skip
    return original


def _leftovers(original: Path) -> list[str]:
    return sorted(p.name for p in original.parent.iterdir() if "sandbox-staging" in p.name)


def test_a_crash_part_way_through_the_removal_rolls_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = _staged(tmp_path)
    monkeypatch.setattr(sync.shutil, "rmtree", _crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        apply_staged(original, KEY)
    monkeypatch.undo()

    # The apply itself was complete: the original holds the new tree already.
    assert (original / "added.txt").read_text() == "added\n"
    assert (original / "d" / "f0.txt").read_text() == "new 0\n"
    # No area is left under the prepared name: a recovery's apply finds it applied.
    assert find_prepared(original, KEY) is None
    assert _leftovers(original)  # the renamed remains
    # The recovery's apply of the same key finds it applied and finishes the removal.
    assert apply_staged(original, KEY) is False
    assert _leftovers(original) == []
    assert (original / "d" / "f1.txt").read_text() == "old 1\n"


def test_remains_of_a_cut_removal_are_removed_by_recover_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = _staged(tmp_path)
    undo = tmp_path / "backup" / "undo.json"
    monkeypatch.setattr(sync.shutil, "rmtree", _crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        apply_staged(original, KEY)
    monkeypatch.undo()
    recorded = undo.read_bytes()
    assert recover_sync(original) == ["completed"]
    assert _leftovers(original) == []
    assert undo.read_bytes() == recorded  # the backup handed over is not touched again


def test_an_applied_area_leaves_nothing_beside_the_original(tmp_path: Path) -> None:
    original = _staged(tmp_path)
    assert apply_staged(original, KEY) is True
    assert _leftovers(original) == []
    assert (original / "d" / "f2.txt").read_text() == "new 2\n"
    assert (tmp_path / "backup" / "undo.json").exists()
