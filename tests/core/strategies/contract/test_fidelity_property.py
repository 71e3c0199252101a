"""Property-based differential test of the directory strategies (issue 7, docs/fidelity.md).

Invariant, for copy_on_write, overlay (kernel) and overlay (fallback), on random small trees
holding every kind the contract names (files with holes, directories with set-gid/sticky bits,
symlinks, FIFOs, sockets, character and block devices, hard-link groups, xattrs, POSIX ACLs,
other owners, names that are not UTF-8 or hold a newline) and random edits made in the sandbox:

- right after create, the sandbox shows the original exactly;
- after commit, the original equals the tree the sandbox showed (its intended tree);
- after rollback from COMMITTED, the original equals the tree before the commit, and the
  sandbox shows it again;
- checkpoint/restore: after restore the sandbox shows exactly what it showed at the checkpoint,
  and committing it lands exactly that.

"Equals" is :func:`tests.support.fidelity_tree.tree_state`: type, mode, owner, link groups, holes
and allocated blocks, xattrs, link targets, content, mtime. Bounded examples in the normal run
(``SANDBOX_HYPOTHESIS_EXAMPLES`` raises the count); every failure found became a plain test in
tests/core/strategies/contract/test_fidelity_cases.py. The generators are in
tests/support/tree_generators.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given

from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.status import SandboxStatus
from tests.support.directory_sandboxes import STRATEGIES, new_sandbox
from tests.support.fidelity_tree import tree_state
from tests.support.tree_generators import PROPERTY, Workdir, apply_edit, build, edits, same, trees


@pytest.mark.parametrize("kind", STRATEGIES)
@PROPERTY
@given(spec=trees(), changes=edits())
def test_commit_and_rollback_keep_the_trees_exact(kind: str, spec: Any, changes: Any) -> None:
    work = Workdir()
    try:
        src = work.path / "src"
        build(os.fsencode(src), spec)
        before = tree_state(src, top=True)
        sandbox = new_sandbox(kind, src, work.path / "root")
        sandbox.create("prop")
        view = os.fsencode(sandbox.get_path(""))
        same(tree_state(view, top=True), before, "sandbox after create")
        for change in changes:
            apply_edit(view, change)
        intended = tree_state(view, top=True)

        sandbox.commit()
        same(tree_state(src, top=True), intended, "original after commit")

        sandbox.rollback()
        assert sandbox.status is SandboxStatus.ROLLED_BACK
        same(tree_state(src, top=True), before, "original after rollback from COMMITTED")
        same(tree_state(view, top=True), before, "sandbox after rollback from COMMITTED")
        sandbox.cleanup()
    finally:
        work.close()


@pytest.mark.parametrize("kind", STRATEGIES)
@PROPERTY
@given(spec=trees(), first=edits(), second=edits())
def test_checkpoint_restore_keeps_the_tree_exact(
    kind: str, spec: Any, first: Any, second: Any
) -> None:
    work = Workdir()
    try:
        src = work.path / "src"
        build(os.fsencode(src), spec)
        before = tree_state(src, top=True)
        sandbox = new_sandbox(kind, src, work.path / "root")
        sandbox.create("prop")
        view = os.fsencode(sandbox.get_path(""))
        for change in first:
            apply_edit(view, change)
        at_checkpoint = tree_state(view, top=True)
        manager = CheckpointManager(state_dir=work.path / "state")
        checkpoint = manager.create_checkpoint(sandbox, "prop", "pre")
        for change in second:
            apply_edit(view, change)

        assert manager.rollback_to(checkpoint)
        same(tree_state(view, top=True), at_checkpoint, "sandbox after restore")

        sandbox.commit()
        committed = tree_state(src, top=True)
        same(committed, at_checkpoint, "original after committing the restored sandbox")
        sandbox.rollback()
        same(tree_state(src, top=True), before, "original after rollback from COMMITTED")
        sandbox.cleanup()
    finally:
        work.close()
