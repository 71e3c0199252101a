"""CheckpointManager on real strategies: native overlay snapshots and git refs in one process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sandbox_core import SandboxFactory
from sandbox_core.host.checkpoint import CheckpointManager


@pytest.mark.parametrize("strategy", ["overlay", "git_worktree", "copy_on_write"])
def test_checkpoint_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    for key in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(key, "t")
    for key in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(key, "t@example.invalid")
    original = tmp_path / "orig"
    original.mkdir()
    (original / "keep.txt").write_text("v0\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(original)], check=True)
    subprocess.run(["git", "-C", str(original), "add", "."], check=True)
    subprocess.run(["git", "-C", str(original), "commit", "-qm", "base"], check=True)
    sandbox = SandboxFactory().create(
        strategy, "res", str(original), sandbox_root=str(tmp_path / "sandboxes")
    )
    sandbox.create("plan-n")
    Path(sandbox.get_path("keep.txt")).write_text("v1\n")
    manager = CheckpointManager(state_dir=tmp_path / "state")
    checkpoint = manager.create_checkpoint(sandbox, "plan-n", "post_execute", {"step": 1})
    expected_kind = {"overlay": "overlay_snapshot", "git_worktree": "git_ref"}.get(
        strategy, "directory"
    )
    assert checkpoint.metadata["checkpoint_kind"] == expected_kind
    assert checkpoint.metadata["step"] == "1"

    Path(sandbox.get_path("keep.txt")).write_text("v2\n")
    Path(sandbox.get_path("added.txt")).write_text("new\n")
    assert manager.rollback_to(checkpoint) is True
    assert Path(sandbox.get_path("keep.txt")).read_text() == "v1\n"
    assert not Path(sandbox.get_path("added.txt")).exists()
    assert (original / "keep.txt").read_text() == "v0\n"

    assert manager.delete_checkpoint(checkpoint.checkpoint_id) is True
    assert manager.list_checkpoints(sandbox.sandbox_id) == []
    assert (
        CheckpointManager(state_dir=tmp_path / "state").list_checkpoints(sandbox.sandbox_id) == []
    )
    sandbox.cleanup()
