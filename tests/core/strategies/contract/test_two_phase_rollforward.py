"""Roll-forward of a directory sandbox's two-phase apply is idempotent (issue 9, gap (b)).

The crash point: the renames are done and the kernel overlay is remounted over an empty upper
layer, but the ``applied`` record is not written yet (``_directory.fault_hook``
``"before_applied_record"``, a SIGKILL in a child process). Applying again in a fresh process
must finish exactly: the original holds the sandbox's tree once, the overlay is mounted with an
empty upper layer, nothing is staged, and the overlay's ``lower_generation`` (the count of
commits into its lower directory) went up by exactly one, also when the apply is repeated from
a record that already counted it.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.strategies.overlay import OverlaySandbox
from sandbox_core.strategies.overlay import mount as kernel
from tests.support.directory_sandboxes import STRATEGIES
from tests.support.fidelity_tree import tree_state
from tests.support.tree_generators import same
from tests.support.two_phase_dirs import make_source, staged_beside

REPO_ROOT = Path(__file__).resolve().parents[4]
TXID = "plan-rf.1"

KILL_SCRIPT = textwrap.dedent(
    """
    import json, os, pickle, sys
    from pathlib import Path
    from sandbox_core.strategies import _directory
    from tests.support.fidelity_tree import tree_state
    from tests.support.directory_sandboxes import new_sandbox

    kind, src, root, out, txid = sys.argv[1:6]
    s = new_sandbox(kind, Path(src), Path(root))
    s.create("plan-rf")
    Path(s.get_path("a.txt")).write_text("changed")
    Path(s.get_path("new.txt")).write_text("new")
    os.unlink(s.get_path("d/c.txt"))
    Path(out, "intended.pickle").write_bytes(pickle.dumps(tree_state(s.get_path(""))))
    s.prepare(txid)
    Path(out, "record.json").write_text(json.dumps(s.to_record()))  # the store's copy

    def hook(point):
        if point == "before_applied_record":
            os._exit(9)

    _directory.fault_hook = hook
    s.apply_prepared(txid)
    """
)


def _generation(sandbox: BaseSandbox) -> Any:
    context = sandbox.context
    return context.metadata.get("lower_generation") if context is not None else None


def _reopen(kind: str, record: dict[str, Any]) -> BaseSandbox:
    cls = CopyOnWriteSandbox if kind == "copy_on_write" else OverlaySandbox
    return cls.reopen(record)


def _assert_view_is_clean(kind: str, sandbox: BaseSandbox, src: Path) -> None:
    """Kernel mode: mounted again, over an empty upper layer, showing the committed original."""
    if kind != "overlay-kernel":
        return
    assert isinstance(sandbox, OverlaySandbox)
    merged = sandbox.base_path / "merged"
    assert kernel.is_overlay_mounted(merged)
    assert os.listdir(sandbox.upper_dir) == []
    assert (merged / "a.txt").read_text() == (src / "a.txt").read_text() == "changed"


@pytest.mark.parametrize("kind", STRATEGIES)
def test_killed_after_the_remount_before_the_applied_record_rolls_forward_once(
    tmp_path: Path, kind: str
) -> None:
    src = make_source(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, kind, str(src), str(tmp_path / "root"),
         str(tmp_path), TXID],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    intended = pickle.loads((tmp_path / "intended.pickle").read_bytes())  # noqa: S301 (ours)
    record = json.loads((tmp_path / "record.json").read_text())
    before = record["context"]["metadata"].get("lower_generation")
    sandbox = _reopen(kind, record)
    try:
        result = sandbox.apply_prepared(TXID)

        assert result.added_files == ["new.txt"] and result.deleted_files == ["d/c.txt"]
        same(tree_state(src), intended, "original after the roll-forward")
        assert staged_beside(src) == []
        assert sandbox.status is SandboxStatus.COMMITTED
        _assert_view_is_clean(kind, sandbox, src)
        if kind != "copy_on_write":
            assert _generation(sandbox) == before + 1
        # A second roll-forward, from the record taken before the bump was saved with COMMITTED
        # and from the one taken after it, changes nothing and counts nothing again.
        for again in (record, {**sandbox.to_record(), "status": "active", "last_commit": None}):
            repeat = _reopen(kind, json.loads(json.dumps(again)))
            assert repeat.apply_prepared(TXID).added_files == ["new.txt"]
            same(tree_state(src), intended, "original after a repeated roll-forward")
            if kind != "copy_on_write":
                assert _generation(repeat) == before + 1, "lower_generation bumped twice"
            _assert_view_is_clean(kind, repeat, src)
    finally:
        sandbox.cleanup()
    assert staged_beside(src) == []
