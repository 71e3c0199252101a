"""Seed 004 (CheckpointManager) scenarios on real directories in tmp_path.

The "mock sandbox" of the seed is a plain object with ``sandbox_id`` and ``context`` (the
Checkpointable protocol); OSErrors are injected by patching the copy/restore helpers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import pydantic
import pytest
from pytest_bdd import given, parsers, scenarios, then, when
from ulid import ULID

from sandbox_core import SandboxContext, SandboxError
from sandbox_core.host.checkpoint import Checkpointable, CheckpointManager, SandboxCheckpoint

scenarios("checkpoint_manager.feature")

SAMPLE_FILES = {"a.txt": "alpha\n", "sub/b.txt": "beta\n", "sub/deeper/c.txt": "gamma\n"}


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"tmp": tmp_path}
    yield state
    manager = state.get("manager")
    if manager is None:
        return
    # Snapshots live in the system temp dir: remove what the scenario made.
    for checkpoint in list(manager._checkpoints.values()):
        manager.delete_checkpoint(checkpoint.checkpoint_id)
    for path in state.get("snapshots", []):
        manager._cleanup_snapshot(path)


def _read_tree(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): path.read_text()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _context(sandbox_id: str, sandbox_path: Path) -> SandboxContext:
    return SandboxContext(
        sandbox_id=sandbox_id,
        sandbox_path=str(sandbox_path),
        original_path=str(sandbox_path),
        resource_id="res-1",
        plan_id="plan-1",
    )


def _crafted(ctx: dict[str, Any], snapshot_path: str, metadata: dict[str, str]) -> None:
    ctx["crafted"] = SandboxCheckpoint(
        sandbox_id="sb-crafted",
        plan_id="plan-c",
        phase="pre_execute",
        snapshot_path=snapshot_path,
        metadata=metadata,
    )


# -- model and protocol ------------------------------------------------------------------------


@given("I build a SandboxCheckpoint with valid fields")
def given_model(ctx: dict[str, Any]) -> None:
    ctx["fields"] = {
        "checkpoint_id": str(ULID()),
        "sandbox_id": "sb-1",
        "plan_id": "plan-1",
        "phase": "pre_execute",
        "snapshot_path": "/var/snap/x",
        "created_at": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        "metadata": {"k": "v"},
    }
    ctx["model"] = SandboxCheckpoint(**ctx["fields"])


@given("I build a SandboxCheckpoint without explicit metadata")
def given_model_no_metadata(ctx: dict[str, Any]) -> None:
    ctx["model"] = SandboxCheckpoint(
        sandbox_id="sb-1", plan_id="plan-1", phase="pre_execute", snapshot_path="/x"
    )


@then("the constructed checkpoint model should expose all field values")
def then_model_fields(ctx: dict[str, Any]) -> None:
    for name, value in ctx["fields"].items():
        assert getattr(ctx["model"], name) == value


@then("the constructed checkpoint model should be frozen")
def then_model_frozen(ctx: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        ctx["model"].phase = "other"
    assert ctx["model"].phase == "pre_execute"


@then("the constructed checkpoint metadata should be an empty dict")
def then_model_metadata_empty(ctx: dict[str, Any]) -> None:
    assert ctx["model"].metadata == {}
    assert len(ctx["model"].checkpoint_id) == 26


@given("a mock object with sandbox_id and context properties")
def given_checkpointable(ctx: dict[str, Any]) -> None:
    ctx["object"] = SimpleNamespace(sandbox_id="sb-1", context=None)


@given("a mock object without a sandbox_id property")
def given_not_checkpointable(ctx: dict[str, Any]) -> None:
    ctx["object"] = SimpleNamespace(context=None)


@then("the mock object should satisfy the Checkpointable protocol")
def then_checkpointable(ctx: dict[str, Any]) -> None:
    assert isinstance(ctx["object"], Checkpointable)


@then("the mock object should not satisfy the Checkpointable protocol")
def then_not_checkpointable(ctx: dict[str, Any]) -> None:
    assert not isinstance(ctx["object"], Checkpointable)


# -- manager -----------------------------------------------------------------------------------


@given("a freshly created CheckpointManager")
def given_manager(ctx: dict[str, Any]) -> None:
    ctx["manager"] = CheckpointManager()


@then("the manager internal checkpoints dict should be empty")
def then_empty(ctx: dict[str, Any]) -> None:
    assert ctx["manager"]._checkpoints == {}


@then("the manager should have a threading lock")
def then_lock(ctx: dict[str, Any]) -> None:
    assert isinstance(ctx["manager"]._lock, type(threading.Lock()))


@given("a mock sandbox whose context is None")
def given_sandbox_no_context(ctx: dict[str, Any]) -> None:
    ctx["sandbox"] = SimpleNamespace(sandbox_id=str(ULID()), context=None)


@given("a temporary sandbox directory with sample files")
def given_sample_dir(ctx: dict[str, Any]) -> None:
    root = ctx["tmp"] / "sandbox"
    for relative, text in SAMPLE_FILES.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    (root / "link-to-a").symlink_to("a.txt")
    ctx["sandbox_dir"] = root


@given("a mock sandbox whose context points to the temporary directory")
def given_sandbox_with_context(ctx: dict[str, Any]) -> None:
    sandbox_id = str(ULID())
    ctx["sandbox"] = SimpleNamespace(
        sandbox_id=sandbox_id, context=_context(sandbox_id, ctx["sandbox_dir"])
    )


@when(
    parsers.parse(
        'I invoke create_checkpoint with plan "{plan_id}" phase "{phase}" and {metadata_kind}'
    )
)
def when_create(ctx: dict[str, Any], plan_id: str, phase: str, metadata_kind: str) -> None:
    metadata: dict[str, Any] | None = {
        "no metadata": None,
        "None metadata": None,
        "numeric metadata": {"attempt": 3, "ratio": 0.5, "ok": True},
    }[metadata_kind]
    manager: CheckpointManager = ctx["manager"]
    if metadata_kind == "no metadata":
        ctx["checkpoint"] = manager.create_checkpoint(ctx["sandbox"], plan_id, phase)
    else:
        ctx["checkpoint"] = manager.create_checkpoint(ctx["sandbox"], plan_id, phase, metadata)


@given("a checkpoint was created for the temporary sandbox without explicit sandbox_path metadata")
@given("a checkpoint was created for the temporary sandbox")
def given_checkpoint_created(ctx: dict[str, Any]) -> None:
    ctx["checkpoint"] = ctx["manager"].create_checkpoint(ctx["sandbox"], "plan-r", "pre_execute")
    assert "sandbox_path" in ctx["checkpoint"].metadata


@given("the temporary sandbox files are then modified")
def given_modified(ctx: dict[str, Any]) -> None:
    root: Path = ctx["sandbox_dir"]
    (root / "a.txt").write_text("changed\n")
    (root / "sub" / "b.txt").unlink()
    (root / "sub" / "deeper" / "c.txt").unlink()
    (root / "sub" / "deeper").rmdir()
    (root / "new.txt").write_text("new\n")


@then("the returned checkpoint should have a non-empty snapshot_path directory")
def then_snapshot_dir(ctx: dict[str, Any]) -> None:
    path = ctx["checkpoint"].snapshot_path
    assert path
    assert Path(path).is_dir()


@then("the returned checkpoint sandbox_id should equal the mock sandbox id")
def then_sandbox_id(ctx: dict[str, Any]) -> None:
    assert ctx["checkpoint"].sandbox_id == ctx["sandbox"].sandbox_id


@then("the returned checkpoint metadata values should all be strings")
def then_metadata_strings(ctx: dict[str, Any]) -> None:
    assert ctx["checkpoint"].metadata == {"attempt": "3", "ratio": "0.5", "ok": "True"}


@then("the returned checkpoint metadata should be an empty dict")
def then_metadata_empty(ctx: dict[str, Any]) -> None:
    assert ctx["checkpoint"].metadata == {}


@then("the snapshot directory should contain copies of the sample files")
def then_snapshot_copies(ctx: dict[str, Any]) -> None:
    snapshot = Path(ctx["checkpoint"].snapshot_path)
    assert _read_tree(snapshot) == {**SAMPLE_FILES, "link-to-a": "alpha\n"}
    assert (snapshot / "link-to-a").is_symlink()


@then("the returned checkpoint metadata should contain the sandbox path")
def then_metadata_path(ctx: dict[str, Any]) -> None:
    assert ctx["checkpoint"].metadata["sandbox_path"] == str(ctx["sandbox_dir"])
    assert ctx["checkpoint"].metadata["checkpoint_kind"] == "directory"


# -- _snapshot_directory and _cleanup_snapshot -------------------------------------------------


@when("I call _snapshot_directory with a None sandbox_path")
def when_snapshot_none(ctx: dict[str, Any]) -> None:
    ctx["snapshot"] = ctx["manager"]._snapshot_directory(None)
    ctx.setdefault("snapshots", []).append(ctx["snapshot"])


@when("I call _snapshot_directory with a non-existent sandbox_path")
def when_snapshot_missing(ctx: dict[str, Any]) -> None:
    ctx["snapshot"] = ctx["manager"]._snapshot_directory(str(ctx["tmp"] / "missing"))
    ctx.setdefault("snapshots", []).append(ctx["snapshot"])


@when("I call _snapshot_directory with the temporary sandbox_path")
def when_snapshot_real(ctx: dict[str, Any]) -> None:
    ctx["snapshot"] = ctx["manager"]._snapshot_directory(str(ctx["sandbox_dir"]))
    ctx.setdefault("snapshots", []).append(ctx["snapshot"])


@when("I call _snapshot_directory with a path that triggers OSError")
def when_snapshot_oserror(ctx: dict[str, Any]) -> None:
    with patch(
        "sandbox_core.host.checkpoint.backup_directory",
        side_effect=OSError("injected copy failure"),
    ):
        try:
            ctx["manager"]._snapshot_directory(str(ctx["sandbox_dir"]))
        except SandboxError as exc:
            ctx["error"] = exc


@then("the returned snapshot should be an existing empty directory")
def then_snapshot_empty(ctx: dict[str, Any]) -> None:
    snapshot = Path(ctx["snapshot"])
    assert snapshot.is_dir()
    assert list(snapshot.iterdir()) == []


@then("the returned snapshot should contain the sample files")
def then_snapshot_files(ctx: dict[str, Any]) -> None:
    assert _read_tree(Path(ctx["snapshot"])) == {**SAMPLE_FILES, "link-to-a": "alpha\n"}


@then("a SandboxError should have been raised")
def then_sandbox_error(ctx: dict[str, Any]) -> None:
    assert isinstance(ctx.get("error"), SandboxError)
    assert "injected copy failure" in str(ctx["error"])


@when("I call _cleanup_snapshot with an empty string")
def when_cleanup_empty(ctx: dict[str, Any]) -> None:
    ctx["error"] = None
    ctx["manager"]._cleanup_snapshot("")


@given("a temporary snapshot directory tree for cleanup")
def given_snapshot_tree(ctx: dict[str, Any]) -> None:
    ctx["snapshot"] = ctx["manager"]._snapshot_directory(None)
    (Path(ctx["snapshot"]) / "file.txt").write_text("x")


@when("I call _cleanup_snapshot with the temporary snapshot path")
def when_cleanup_real(ctx: dict[str, Any]) -> None:
    ctx["manager"]._cleanup_snapshot(ctx["snapshot"])


@when("I call _cleanup_snapshot with a non-existent path")
def when_cleanup_missing(ctx: dict[str, Any]) -> None:
    ctx["error"] = None
    missing = ctx["tmp"] / "sandbox-checkpoint-gone" / "snapshot"
    ctx["manager"]._cleanup_snapshot(str(missing))
    ctx["missing_parent"] = missing.parent


@then("no error should occur from cleanup_snapshot")
def then_cleanup_ok(ctx: dict[str, Any]) -> None:
    assert ctx["error"] is None
    assert ctx["tmp"].is_dir()
    if "missing_parent" in ctx:
        assert not ctx["missing_parent"].exists()


@then("the temporary snapshot parent should no longer exist")
def then_parent_gone(ctx: dict[str, Any]) -> None:
    assert not Path(ctx["snapshot"]).parent.exists()


# -- rollback_to -------------------------------------------------------------------------------


@given("a SandboxCheckpoint with empty snapshot_path")
def given_crafted_empty(ctx: dict[str, Any]) -> None:
    _crafted(ctx, "", {"sandbox_path": str(ctx["tmp"])})


@given("a SandboxCheckpoint with a non-existent snapshot_path")
def given_crafted_missing(ctx: dict[str, Any]) -> None:
    _crafted(ctx, str(ctx["tmp"] / "nope"), {"sandbox_path": str(ctx["tmp"])})


@given("a SandboxCheckpoint whose snapshot exists but metadata has no sandbox_path")
def given_crafted_no_sandbox_path(ctx: dict[str, Any]) -> None:
    snapshot = ctx["tmp"] / "snap"
    snapshot.mkdir()
    _crafted(ctx, str(snapshot), {})


@given("a SandboxCheckpoint whose snapshot exists but sandbox_path points nowhere")
def given_crafted_sandbox_missing(ctx: dict[str, Any]) -> None:
    snapshot = ctx["tmp"] / "snap"
    snapshot.mkdir()
    _crafted(ctx, str(snapshot), {"sandbox_path": str(ctx["tmp"] / "nowhere")})


@given("a SandboxCheckpoint whose snapshot and sandbox exist but restore will fail")
def given_crafted_restore_fails(ctx: dict[str, Any]) -> None:
    snapshot = ctx["tmp"] / "snap"
    snapshot.mkdir()
    (snapshot / "a.txt").write_text("snapshot\n")
    sandbox = ctx["tmp"] / "live"
    sandbox.mkdir()
    (sandbox / "a.txt").write_text("live\n")
    ctx["live_dir"] = sandbox
    _crafted(ctx, str(snapshot), {"sandbox_path": str(sandbox)})
    ctx["restore_fault"] = OSError("injected restore failure")


@when("I invoke rollback_to on the crafted checkpoint")
def when_rollback_crafted(ctx: dict[str, Any]) -> None:
    fault = ctx.get("restore_fault")
    if fault is None:
        ctx["rollback"] = ctx["manager"].rollback_to(ctx["crafted"])
        return
    with patch("sandbox_core.host.checkpoint.safe_restore", side_effect=fault):
        ctx["rollback"] = ctx["manager"].rollback_to(ctx["crafted"])
    # The failed restore left the live sandbox as it was, and no staging copy behind.
    assert (ctx["live_dir"] / "a.txt").read_text() == "live\n"
    assert sorted(p.name for p in ctx["tmp"].iterdir()) == ["live", "snap"]


@when("I invoke rollback_to on the created checkpoint")
def when_rollback_created(ctx: dict[str, Any]) -> None:
    ctx["rollback"] = ctx["manager"].rollback_to(ctx["checkpoint"])


@then(parsers.parse("the rollback result should be {value}"))
def then_rollback_result(ctx: dict[str, Any], value: str) -> None:
    assert ctx["rollback"] is (value == "true")


@then("the temporary sandbox should contain the original files")
def then_restored(ctx: dict[str, Any]) -> None:
    root: Path = ctx["sandbox_dir"]
    assert _read_tree(root) == {**SAMPLE_FILES, "link-to-a": "alpha\n"}
    assert (root / "link-to-a").is_symlink()
    assert sorted(p.name for p in root.parent.iterdir()) == ["sandbox"]


# -- list and delete ---------------------------------------------------------------------------


@when(parsers.parse('I invoke list_checkpoints for sandbox "{sandbox_id}"'))
def when_list_unknown(ctx: dict[str, Any], sandbox_id: str) -> None:
    ctx["listed"] = ctx["manager"].list_checkpoints(sandbox_id)


@given("I create two checkpoints for the mock sandbox")
def given_two_checkpoints(ctx: dict[str, Any]) -> None:
    manager: CheckpointManager = ctx["manager"]
    ctx["created"] = [
        manager.create_checkpoint(ctx["sandbox"], "plan-l", "pre_execute"),
        manager.create_checkpoint(ctx["sandbox"], "plan-l", "post_execute"),
    ]


@given("a single checkpoint is created for the mock sandbox")
def given_one_checkpoint(ctx: dict[str, Any]) -> None:
    ctx["checkpoint"] = ctx["manager"].create_checkpoint(ctx["sandbox"], "plan-d", "pre_apply")


@when("I invoke list_checkpoints for the mock sandbox")
def when_list(ctx: dict[str, Any]) -> None:
    ctx["listed"] = ctx["manager"].list_checkpoints(ctx["sandbox"].sandbox_id)


@then("the checkpoint list should be empty")
def then_list_empty(ctx: dict[str, Any]) -> None:
    assert ctx["listed"] == []


@then(parsers.parse("the checkpoint list should have {count:d} entries in creation order"))
def then_list_order(ctx: dict[str, Any], count: int) -> None:
    assert len(ctx["listed"]) == count
    assert ctx["listed"] == ctx["created"]
    assert [cp.phase for cp in ctx["listed"]] == ["pre_execute", "post_execute"]


@when("I invoke delete_checkpoint with the created checkpoint id")
def when_delete(ctx: dict[str, Any]) -> None:
    ctx["snapshot"] = ctx["checkpoint"].snapshot_path
    ctx["deleted"] = ctx["manager"].delete_checkpoint(ctx["checkpoint"].checkpoint_id)


@when(parsers.parse('I invoke delete_checkpoint with id "{checkpoint_id}"'))
def when_delete_unknown(ctx: dict[str, Any], checkpoint_id: str) -> None:
    ctx["deleted"] = ctx["manager"].delete_checkpoint(checkpoint_id)


@then(parsers.parse("the checkpoint delete result should be {value}"))
def then_delete_result(ctx: dict[str, Any], value: str) -> None:
    assert ctx["deleted"] is (value == "true")
    if "snapshot" in ctx and value == "true":
        assert not Path(ctx["snapshot"]).exists()


@then(parsers.parse("listing checkpoints for the mock sandbox should return {count:d} entries"))
def then_list_count(ctx: dict[str, Any], count: int) -> None:
    assert len(ctx["manager"].list_checkpoints(ctx["sandbox"].sandbox_id)) == count
