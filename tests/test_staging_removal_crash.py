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

from sandbox_core import _fs_utils
from sandbox_core._fs_utils import (
    apply_staged,
    compute_changes,
    find_prepared,
    recover_sync,
    stage_sync,
)

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


def _leftovers(original: Path) -> list[str]:
    return sorted(p.name for p in original.parent.iterdir() if "sandbox-staging" in p.name)


def test_a_crash_part_way_through_the_removal_rolls_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original, sandbox = _trees(tmp_path)
    stage_sync(sandbox, original, KEY, changes=compute_changes(original, sandbox),
               backup_dir=tmp_path / "backup")  # fmt: skip
    real_rmtree = shutil.rmtree

    def crash_half_way(path: str, *args: object, **kwargs: object) -> None:
        # Remove some entries (the journal among the first) and then "die".
        for entry in sorted(os.listdir(path))[:2]:
            full = os.path.join(path, entry)
            real_rmtree(full) if os.path.isdir(full) else os.unlink(full)
        raise KeyboardInterrupt("simulated SIGKILL during the removal")

    monkeypatch.setattr(_fs_utils.shutil, "rmtree", crash_half_way)
    with pytest.raises(KeyboardInterrupt):
        apply_staged(original, KEY)
    monkeypatch.setattr(_fs_utils.shutil, "rmtree", real_rmtree)

    # The apply itself was complete: the original holds the new tree already.
    assert (original / "added.txt").read_text() == "added\n"
    assert (original / "d" / "f0.txt").read_text() == "new 0\n"
    # No area is left under the prepared name: a recovery's apply finds it applied.
    assert find_prepared(original, KEY) is None
    assert apply_staged(original, KEY) is False
    # The renamed remains are a one-shot area: recover_sync removes them.
    assert _leftovers(original)
    recover_sync(original)
    assert _leftovers(original) == []
    assert (original / "d" / "f1.txt").read_text() == "old 1\n"


def test_an_applied_area_leaves_nothing_beside_the_original(tmp_path: Path) -> None:
    original, sandbox = _trees(tmp_path)
    stage_sync(sandbox, original, KEY, changes=compute_changes(original, sandbox),
               backup_dir=tmp_path / "backup")  # fmt: skip
    assert apply_staged(original, KEY) is True
    assert _leftovers(original) == []
    assert (original / "d" / "f2.txt").read_text() == "new 2\n"
    assert (tmp_path / "backup" / "undo.json").exists()
