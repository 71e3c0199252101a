"""The local executor and the Sandbox logic on real git repositories and directories, without a
cluster: idempotent provisioning (case 18), cleanup of nothing (case 16), fault hooks, the
status patch a create handler leaves, and requests acted on once per id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf
import pytest
from sandbox_operator.errors import FaultInjected
from sandbox_operator.executors.base import SandboxTarget, sandbox_id_for_uid
from sandbox_operator.executors.local import LocalExecutor
from sandbox_operator.resources.sandbox import SandboxLogic
from sandbox_operator.settings import Settings

from sandbox_core import SandboxStatus, SandboxStore
from tests.support.gitrepo import GIT_ENV, git, make_repo

UID = "6f1c2a8e-3b7d-4c55-9e0a-2d7b9c41f0aa"


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"f.txt": "base\n"})


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", sandbox_root=tmp_path / "sandboxes")


def target(original: Path, strategy: str = "git_worktree") -> SandboxTarget:
    return SandboxTarget(
        name="s1",
        namespace="ns",
        uid=UID,
        sandbox_id=sandbox_id_for_uid(UID),
        plan_id="p",
        resource_id="r",
        strategy=strategy,
        original=str(original),
    )


def test_provision_twice_reopens_instead_of_creating_again(repo: Path, settings: Settings) -> None:
    executor = LocalExecutor(settings)
    first = executor.provision(target(repo))
    second = executor.provision(target(repo))
    assert first.status is SandboxStatus.ACTIVE
    assert second.sandbox_id == first.sandbox_id
    assert second.sandbox_path == first.sandbox_path
    assert len(git(repo, "worktree", "list").splitlines()) == 2  # exactly one worktree (case 18)


def test_provision_finishes_a_create_interrupted_after_the_pending_record(
    repo: Path, settings: Settings
) -> None:
    executor = LocalExecutor(settings)
    pending = executor.factory.create(
        "git_worktree",
        "r",
        str(repo),
        sandbox_id=sandbox_id_for_uid(UID),
        sandbox_root=str(settings.sandbox_root),
    )
    SandboxStore(settings.state_dir).save(pending)  # the first attempt died right here
    state = executor.provision(target(repo))
    assert state.status is SandboxStatus.ACTIVE
    assert len(git(repo, "worktree", "list").splitlines()) == 2


def test_cleanup_removes_the_worktree_and_is_fine_with_nothing(
    repo: Path, settings: Settings
) -> None:
    executor = LocalExecutor(settings)
    executor.cleanup(target(repo))  # nothing was ever made (case 16)
    state = executor.provision(target(repo))
    (Path(state.sandbox_path) / "new.txt").write_text("x\n")
    executor.cleanup(target(repo))
    assert not Path(state.sandbox_path).exists()
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (repo / "new.txt").exists()
    assert executor.describe(target(repo)) is None


def test_a_restarted_executor_reopens_from_the_core_record(
    repo: Path, settings: Settings, tmp_path: Path
) -> None:
    state = LocalExecutor(settings).provision(target(repo))
    lost = Settings(state_dir=tmp_path / "other-state", sandbox_root=settings.sandbox_root)
    restarted = LocalExecutor(lost)  # its state dir lost the record: status.coreRecord has it
    with_record = SandboxTarget(**{**target(repo).__dict__, "core_record": state.record})
    assert restarted.describe(with_record).sandbox_path == state.sandbox_path  # type: ignore[union-attr]
    assert restarted.open(with_record).status is SandboxStatus.ACTIVE


def test_fault_hooks_fail_commit_and_rollback_of_named_resources(
    repo: Path, settings: Settings
) -> None:
    faulty = Settings(
        state_dir=settings.state_dir,
        sandbox_root=settings.sandbox_root,
        fault_fail_commit=frozenset({"r"}),
        fault_fail_rollback=frozenset({"r"}),
    )
    executor = LocalExecutor(faulty)
    executor.provision(target(repo))
    handle = executor.open(target(repo))
    with pytest.raises(FaultInjected, match="commit failure for resource r"):
        handle.commit("m")
    with pytest.raises(FaultInjected, match="rollback failure"):
        handle.rollback()
    assert handle.status is SandboxStatus.ACTIVE


def body(original: Path, strategy: str = "git_worktree", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "s1", "namespace": "ns", "uid": UID, "generation": 1},
        "spec": {
            "planId": "p",
            "resourceId": "r",
            "strategy": strategy,
            "source": {"nodePath": str(original)},
            **spec,
        },
    }


def test_create_handler_logic_leaves_a_ready_status_and_a_none_warning(
    tmp_path: Path, settings: Settings
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    events: list[tuple[str, str]] = []
    logic = SandboxLogic(
        settings,
        LocalExecutor(settings),
        None,
        lambda _b, kind, reason, _m: events.append((kind, reason)),
    )
    patch: dict[str, Any] = {}
    logic.provision(body(data, "none"), patch)
    assert patch["status"]["phase"] == "Active"
    assert patch["status"]["conditions"][0]["type"] == "Ready"
    assert ("Warning", "NoSandbox") in events


def test_a_missing_source_is_permanent_with_a_condition_and_an_event(
    tmp_path: Path, settings: Settings
) -> None:
    events: list[tuple[str, str]] = []
    logic = SandboxLogic(
        settings,
        LocalExecutor(settings),
        None,
        lambda _b, kind, reason, _m: events.append((kind, reason)),
    )
    patch: dict[str, Any] = {}
    with pytest.raises(kopf.PermanentError, match="SandboxCreationFailed"):
        logic.provision(body(tmp_path / "missing"), patch)
    assert patch["status"]["phase"] == "Errored"
    degraded = [c for c in patch["status"]["conditions"] if c["type"] == "Degraded"]
    assert degraded[0]["reason"] == "SandboxCreationFailed"
    assert ("Warning", "ProvisionFailed") in events


def test_a_rollback_request_is_served_once_per_id(repo: Path, settings: Settings) -> None:
    executor = LocalExecutor(settings)
    logic = SandboxLogic(settings, executor, None, lambda *_: None)
    patch: dict[str, Any] = {}
    logic.provision(body(repo), patch)
    sandbox_path = Path(patch["status"]["sandboxPath"])
    (sandbox_path / "new.txt").write_text("x\n")
    requested = {**body(repo, rollbackRequest={"id": "x1"}), "status": patch["status"]}
    served: dict[str, Any] = {}
    logic.serve_requests(requested, served)
    assert served["status"]["lastRollbackRequestId"] == "x1"
    assert not (sandbox_path / "new.txt").exists()
    assert served["status"]["phase"] == "Active"
    (sandbox_path / "again.txt").write_text("y\n")
    again = {**requested, "status": {**patch["status"], **served["status"]}}
    repeat: dict[str, Any] = {}
    logic.serve_requests(again, repeat)  # same id: nothing happens
    assert repeat == {}
    assert (sandbox_path / "again.txt").exists()


def test_checkpoint_is_taken_once_per_uid_and_restores_after_a_restart(
    repo: Path, settings: Settings
) -> None:
    from sandbox_operator.resources.targets import checkpoint_info_from_body

    executor = LocalExecutor(settings)
    state = executor.provision(target(repo))
    sandbox_file = Path(state.sandbox_path) / "f.txt"
    sandbox_file.write_text("checkpointed\n")
    first = executor.create_checkpoint(target(repo), "pre_execute", {"by": "t"}, uid="ck-uid")
    again = executor.create_checkpoint(target(repo), "pre_execute", {"by": "t"}, uid="ck-uid")
    assert again.checkpoint_id == first.checkpoint_id  # a retry meets its snapshot (case 18)
    assert first.kind == "git-tag"
    sandbox_file.write_text("later\n")
    # A new operator process: only the Checkpoint object's status and the state dir remain.
    checkpoint_body = {
        "spec": {"sandboxName": "s1", "phase": "pre_execute", "metadata": {"by": "t"}},
        "status": {
            "phase": "Ready",
            "checkpointId": first.checkpoint_id,
            "sandboxId": first.sandbox_id,
            "snapshotLocation": first.snapshot_location,
            "kind": first.kind,
            "createdAt": first.created_at,
        },
    }
    restarted = LocalExecutor(settings)
    with_record = SandboxTarget(**{**target(repo).__dict__, "core_record": state.record})
    info = checkpoint_info_from_body(checkpoint_body, with_record)
    restored = restarted.restore_checkpoint(with_record, info)
    assert restored.status is SandboxStatus.ACTIVE
    assert sandbox_file.read_text() == "checkpointed\n"
    restarted.delete_checkpoint(info)
    restarted.delete_checkpoint(info)  # idempotent
    assert LocalExecutor(settings)._checkpoint_manager().get_checkpoint(info.checkpoint_id) is None


def test_a_rollback_request_on_a_committed_sandbox_is_refused_with_a_condition(
    repo: Path, settings: Settings
) -> None:
    executor = LocalExecutor(settings)
    logic = SandboxLogic(settings, executor, None, lambda *_: None)
    patch: dict[str, Any] = {}
    logic.provision(body(repo), patch)
    (Path(patch["status"]["sandboxPath"]) / "f.txt").write_text("changed\n")
    handle = executor.open(target(repo))
    handle.commit("apply")
    executor.persist(target(repo), handle)
    requested = {**body(repo, rollbackRequest={"id": "x2"}), "status": patch["status"]}
    served: dict[str, Any] = {}
    logic.serve_requests(requested, served)
    assert served["status"]["lastRollbackRequestId"] == "x2"  # acted on once, not retried
    condition = [c for c in served["status"]["conditions"] if c["type"] == "RollbackRequested"]
    assert condition[0]["status"] == "False" and condition[0]["reason"] == "InvalidState"
    assert (repo / "f.txt").read_text() == "changed\n"  # the commit stays


def test_a_sandbox_lock_is_shared_while_held_and_not_kept_after(
    repo: Path, settings: Settings
) -> None:
    executor = LocalExecutor(settings)
    sandbox_id = target(repo).sandbox_id
    held = executor._lock(sandbox_id)
    with held:
        assert executor._lock(sandbox_id) is held  # every caller waits on the same lock
        assert executor._lock("another") is not held
    del held
    executor.provision(target(repo))
    executor.cleanup(target(repo))
    assert len(executor._locks) == 0  # nothing kept per sandbox once no one holds its lock
