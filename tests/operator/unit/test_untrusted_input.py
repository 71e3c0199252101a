"""The operator steers by the spec and the uid, never by the status, and re-checks every path.

Paths: the CRD's CEL rules refuse a ``..`` or absolute ``subPath`` and a relative or ``..``
``nodePath``, but an object written past them (an older CRD, a bypassed admission) reached
the executor unchecked. These tests call the Sandbox logic directly with such a spec, as the
API server would never let it through.

Status: ``status.sandboxId`` and ``status.coreRecord`` were read back as input. A record
forged by whoever may patch the status (another sandbox's directory as its ``sandbox_path``)
made the local executor's cleanup remove that directory. Real directories and a real git
repository; the local executor as it runs in the operator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf
import pytest
from sandbox_operator.executors.base import sandbox_id_for_uid
from sandbox_operator.executors.local import LocalExecutor
from sandbox_operator.resources.sandbox import SandboxLogic
from sandbox_operator.resources.targets import check_paths, target_from_body
from sandbox_operator.settings import Settings

from sandbox_api.models import SandboxSpec
from tests.support.gitrepo import GIT_ENV, make_repo

UID_A = "0b6c44a1-5d7e-4c1f-8f52-7c3a9e2d1b0a"
UID_B = "0b6c44a1-5d7e-4c1f-8f52-7c3a9e2d1b0b"


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


def sandbox(name: str, uid: str, source: dict[str, Any], status: dict | None = None) -> dict:
    return {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": 1},
        "spec": {
            "planId": "p",
            "resourceId": name,
            "strategy": "copy_on_write",
            "source": source,
        },
        "status": status or {},
    }


class RecordingExecutor(LocalExecutor):
    """The local executor, recording whether it was asked to provision at all."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.provisioned: list[str] = []

    def provision(self, target: Any) -> Any:
        self.provisioned.append(target.name)
        return super().provision(target)


@pytest.mark.parametrize(
    ("executor", "source", "words"),
    [
        ("pod", {"persistentVolumeClaim": {"claimName": "c", "subPath": "../other"}}, "subPath"),
        ("pod", {"persistentVolumeClaim": {"claimName": "c", "subPath": "a/../../b"}}, "subPath"),
        ("pod", {"persistentVolumeClaim": {"claimName": "c", "subPath": "/etc"}}, "subPath"),
        ("local", {"nodePath": "relative/dir"}, "absolute path"),
        ("local", {"nodePath": "/srv/data/../../etc"}, "without '..'"),
        ("local", {"nodePath": "{state}"}, "operator's own directory"),
        ("local", {"nodePath": "{state}/records"}, "operator's own directory"),
        ("local", {"nodePath": "/"}, "operator's own directory"),
        ("local", {"nodePath": "/etc"}, "outside the allowed roots"),
    ],
)
def test_a_path_past_the_crd_is_refused_by_the_operator_itself(
    tmp_path: Path, executor: str, source: dict[str, Any], words: str
) -> None:
    settings = Settings(
        executor=executor,
        state_dir=tmp_path / "state",
        sandbox_root=tmp_path / "sbx",
        node_path_roots=(str(tmp_path / "allowed"), "/srv"),
    )
    if "nodePath" in source:
        source = {"nodePath": source["nodePath"].replace("{state}", str(tmp_path / "state"))}
    runner = RecordingExecutor(settings)
    logic = SandboxLogic(settings, runner, None, lambda *args: None)
    patch: dict[str, Any] = {}
    with pytest.raises(kopf.PermanentError):
        logic.provision(sandbox("s1", UID_A, source), patch)
    assert runner.provisioned == []
    status = patch["status"]
    assert status["phase"] == "Errored"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert words in ready["message"], ready["message"]


def test_paths_inside_the_allowed_roots_pass(tmp_path: Path) -> None:
    settings = Settings(
        state_dir=tmp_path / "state",
        sandbox_root=tmp_path / "sbx",
        node_path_roots=(str(tmp_path / "allowed"),),
    )
    check_paths(
        SandboxSpec.model_validate(
            {
                "planId": "p",
                "resourceId": "r",
                "strategy": "none",
                "source": {"nodePath": str(tmp_path / "allowed" / "repo")},
            }
        ),
        settings,
    )
    check_paths(
        SandboxSpec.model_validate(
            {
                "planId": "p",
                "resourceId": "r",
                "strategy": "none",
                "source": {"persistentVolumeClaim": {"claimName": "c", "subPath": "a/..b/c"}},
            }
        ),
        settings,
    )


def test_the_roots_setting_refuses_a_relative_root() -> None:
    from sandbox_operator.settings import SettingsError

    with pytest.raises(SettingsError, match="NODE_PATH_ROOTS"):
        Settings.from_env({"SANDBOX_OPERATOR_NODE_PATH_ROOTS": "/ok,relative"})
    assert Settings.from_env({"SANDBOX_OPERATOR_NODE_PATH_ROOTS": "/a, /b"}).node_path_roots == (
        "/a",
        "/b",
    )


def test_a_forged_status_cannot_make_cleanup_remove_another_sandboxs_directory(
    tmp_path: Path,
) -> None:
    data_a = tmp_path / "data-a"
    data_a.mkdir()
    (data_a / "f.txt").write_text("a\n")
    data_b = tmp_path / "data-b"
    data_b.mkdir()
    (data_b / "g.txt").write_text("b\n")
    settings = Settings(state_dir=tmp_path / "state", sandbox_root=tmp_path / "sbx")
    executor = LocalExecutor(settings)
    body_a = sandbox("sa", UID_A, {"nodePath": str(data_a)})
    body_b = sandbox("sb", UID_B, {"nodePath": str(data_b)})
    state_a = executor.provision(target_from_body(body_a, settings, None))
    state_b = executor.provision(target_from_body(body_b, settings, None))
    (Path(state_a.sandbox_path) / "f.txt").write_text("a's work\n")

    # Whoever may patch sb's status points its record (and id) at sa's sandbox; the state
    # directory is lost, so the record is all the operator has.
    forged = dict(state_a.record)
    forged["sandbox_id"] = state_b.sandbox_id
    forged["resource_id"] = "sb"
    forged["context"] = {**state_a.record["context"], "sandbox_id": state_b.sandbox_id}
    forged["context"]["resource_id"] = "sb"
    body_b["status"] = {"coreRecord": forged}
    fresh = LocalExecutor(Settings(state_dir=tmp_path / "new-state", sandbox_root=tmp_path / "sbx"))
    target = target_from_body(body_b, fresh.settings, None)
    fresh.cleanup(target)
    assert (Path(state_a.sandbox_path) / "f.txt").read_text() == "a's work\n"
    assert target.core_record is None  # the forged record names another sandbox's directory
    assert executor.describe(target_from_body(body_a, settings, None)) is not None
    # A foreign status.sandboxId is not taken either: the id is derived from the uid.
    body_b["status"] = {"sandboxId": state_a.sandbox_id}
    target = target_from_body(body_b, fresh.settings, None)
    assert target.sandbox_id == sandbox_id_for_uid(UID_B) != state_a.sandbox_id

    # The genuine record of sb is still accepted (and its cleanup removes sb's own copy only).
    body_b["status"] = {"coreRecord": dict(state_b.record)}
    target = target_from_body(body_b, fresh.settings, None)
    assert target.core_record is not None
    fresh.cleanup(target)
    assert not Path(state_b.sandbox_path).exists()
    assert (Path(state_a.sandbox_path) / "f.txt").read_text() == "a's work\n"
    assert (data_b / "g.txt").read_text() == "b\n"


def test_a_record_with_another_sandbox_root_is_ignored(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "v1\n"})
    settings = Settings(state_dir=tmp_path / "state", sandbox_root=tmp_path / "sbx")
    executor = LocalExecutor(settings)
    body = sandbox("s1", UID_A, {"nodePath": str(repo)})
    body["spec"]["strategy"] = "git_worktree"
    state = executor.provision(target_from_body(body, settings, None))
    forged = {**state.record, "options": {"sandbox_root": str(tmp_path / "elsewhere")}}
    body["status"] = {"coreRecord": forged}
    assert target_from_body(body, settings, None).core_record is None
    body["status"] = {"coreRecord": state.record}
    assert target_from_body(body, settings, None).core_record is not None


def test_a_checkpoint_object_cannot_restore_over_another_sandbox(tmp_path: Path) -> None:
    from sandbox_operator.resources.targets import checkpoint_info_from_body

    from sandbox_core import SandboxError

    data_a = tmp_path / "data-a"
    data_a.mkdir()
    (data_a / "f.txt").write_text("a\n")
    data_b = tmp_path / "data-b"
    data_b.mkdir()
    settings = Settings(state_dir=tmp_path / "state", sandbox_root=tmp_path / "sbx")
    executor = LocalExecutor(settings)
    target_a = target_from_body(sandbox("sa", UID_A, {"nodePath": str(data_a)}), settings, None)
    target_b = target_from_body(sandbox("sb", UID_B, {"nodePath": str(data_b)}), settings, None)
    state_a = executor.provision(target_a)
    executor.provision(target_b)
    own = executor.create_checkpoint(target_a, "pre_execute", {})
    (Path(state_a.sandbox_path) / "f.txt").write_text("a's work\n")
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "evil.txt").write_text("x\n")

    def checkpoint(status: dict[str, Any], metadata: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": "c", "uid": "c-uid"},
            "spec": {"sandboxName": "sb", "phase": "pre_execute", "metadata": metadata},
            "status": {"phase": "Ready", "kind": "directory-snapshot", **status},
        }

    forged = [
        # A's checkpoint, named by a patched status of a Checkpoint of sb.
        checkpoint({"checkpointId": own.checkpoint_id, "sandboxId": state_a.sandbox_id}, {}),
        # An unknown id whose snapshot is a planted directory and whose spec metadata names
        # A's sandbox directory as the one to replace.
        checkpoint(
            {
                "checkpointId": "01ARZ3NDEKTSV4RRFFQ69G5FAV",
                "snapshotLocation": str(planted),
                "createdAt": "2026-01-01T00:00:00Z",
            },
            {"sandbox_path": state_a.sandbox_path},
        ),
    ]
    for body in forged:
        info = checkpoint_info_from_body(body, target_b)
        with pytest.raises(SandboxError, match="is not a checkpoint of sandbox"):
            executor.restore_checkpoint(target_b, info)
        assert (Path(state_a.sandbox_path) / "f.txt").read_text() == "a's work\n"
        assert not (Path(state_a.sandbox_path) / "evil.txt").exists()
    # Its own checkpoint still restores.
    restored = executor.restore_checkpoint(target_a, own)
    assert (Path(restored.sandbox_path) / "f.txt").read_text() == "a\n"
