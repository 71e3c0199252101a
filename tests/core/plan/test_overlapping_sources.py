"""Two-phase plans whose sandboxes share a directory or nest one in another (issue 9:
"conflicts found before any original is touched"): disjoint edits of both land and no staging
area of the inner one is left inside the outer original; two participants writing one path, or
one deleting a folder the other writes into, are a conflict before the decision, every
participant aborted and nothing touched. Executor handles whose original paths are the same
mount path (one per workspace Pod) are not an overlap.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandbox_core.host.manager import SandboxManager
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.factory import SandboxFactory
from tests.support.fidelity_tree import tree_state
from tests.support.landing import base_tree, no_staging

# -- two-phase plans over the same or nested directories -------------------------------------------


def _nested_plan(
    tmp_path: Path, layout: str, outer_kind: str
) -> tuple[Path, SandboxManager, list[BaseSandbox]]:
    src = base_tree(tmp_path)
    (src / "d" / "e.txt").write_text("e\n")
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
    boxes = str(tmp_path / "boxes")
    if outer_kind == "overlay-kernel":
        outer = manager.get_or_create_sandbox(
            "s14", "outer", str(src), "overlay", sandbox_root=boxes, mode="kernel"
        )
    else:
        outer = manager.get_or_create_sandbox(
            "s14", "outer", str(src), outer_kind, sandbox_root=boxes
        )
    inner_dir = src if layout == "same" else src / "d"
    inner = manager.get_or_create_sandbox(
        "s14", "inner", str(inner_dir), "copy_on_write", sandbox_root=boxes
    )
    return src, manager, [outer, inner]


LAYOUTS = ["same", "nested"]
OUTER_KINDS = ["copy_on_write", pytest.param("overlay-kernel", marks=pytest.mark.overlay_kernel)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("outer_kind", OUTER_KINDS)
def test_two_phase_plan_over_overlapping_directories_with_disjoint_edits(
    tmp_path: Path, layout: str, outer_kind: str
) -> None:
    """Two sandboxes of one plan on the same directory or on a directory and its child (the
    OverlayFS "same lower directory under two mounts" / two rsync transfers into one tree
    kind): disjoint edits both land, and no staging area of the inner one is left inside the
    outer original. Passes."""
    src, manager, (outer, inner) = _nested_plan(tmp_path, layout, outer_kind)
    try:
        Path(outer.get_path("a.txt")).write_text("A outer\n")
        os.unlink(outer.get_path("d/e.txt"))
        Path(inner.get_path("d/c.txt" if layout == "same" else "c.txt")).write_text("C inner\n")
        results = manager.commit_plan("s14", mode="two_phase")
        assert all(r.success for r in results)
        files = {k: v for k, v in tree_state(src).items() if v["kind"] == "file"}
        assert sorted(files) == [b"a.txt", b"d/c.txt"]
        assert (src / "a.txt").read_text() == "A outer\n"
        assert (src / "d" / "c.txt").read_text() == "C inner\n"
        no_staging(src)
        no_staging(src / "d")
    finally:
        manager.cleanup_all("s14")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("clash", ["same-file", "deleted-folder"])
def test_two_phase_plan_over_overlapping_directories_changing_one_file(
    tmp_path: Path, layout: str, clash: str
) -> None:
    """Issue 9: "conflicts found before any original is touched". Found: both prepared, the
    decision was written, the second apply was refused forever (recover could not finish), half
    the plan stayed landed and the inner staging area was left inside the outer original.
    Fixed (``two_phase.overlapping_writes``): two participants writing one path, or one
    deleting a folder the other writes into, are a conflict before the decision; every
    participant is aborted, nothing touched, both ACTIVE; the saga refuses it too."""
    src, manager, (outer, inner) = _nested_plan(tmp_path, layout, "copy_on_write")
    try:
        Path(outer.get_path("a.txt")).write_text("A outer\n")
        if clash == "same-file":
            Path(outer.get_path("d/c.txt")).write_text("C outer\n")
        else:
            shutil.rmtree(outer.get_path("d"))
        Path(inner.get_path("d/c.txt" if layout == "same" else "c.txt")).write_text("C inner\n")
        before = tree_state(src, top=True)
        results = manager.commit_plan("s14", mode="two_phase")
        assert len(results) == 1 and not results[0].success
        assert results[0].metadata["touched_originals"] == 0
        assert results[0].metadata["failed_sandbox_id"] == inner.sandbox_id
        assert results[0].metadata["conflicts"]
        assert tree_state(src, top=True) == before
        no_staging(src)
        no_staging(src / "d")
        assert [outer.status, inner.status] == [SandboxStatus.ACTIVE, SandboxStatus.ACTIVE]
        assert manager.recover("s14") is None or manager.recover("s14").finished_at is not None
    finally:
        manager.cleanup_all("s14")


def test_executor_handles_on_one_mount_path_are_not_an_overlap(tmp_path: Path) -> None:
    """Pod executor (CI tier 3): every workspace Pod mounts its original at the same path, so
    the handles' ``original_path`` is equal while the directories are in different Pods; only
    in-process sandboxes are checked for overlapping writes."""
    from types import SimpleNamespace

    from sandbox_core.plan.two_phase import overlapping_writes
    from sandbox_core.protocol import ChangeSummary, PreparedCommit

    def handle(sid: str) -> SimpleNamespace:
        return SimpleNamespace(sandbox_id=sid, strategy="copy_on_write",
                               original_path="/workspace/original")  # fmt: skip

    def prepared(sid: str) -> PreparedCommit:
        summary = ChangeSummary(sandbox_id=sid, resource_id=sid, strategy="copy_on_write",
                                digest="sha256:0", changed=["f.txt"])  # fmt: skip
        return PreparedCommit(sandbox_id=sid, txid="tpc.p.0.1", digest="sha256:0",
                              summary=summary)  # fmt: skip

    assert overlapping_writes([handle("a"), handle("b")], [prepared("a"), prepared("b")]) is None
