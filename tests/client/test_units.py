"""Tier 1: the client's pure logic and its local file operations on real directories and real
git worktrees, without an API server (issue 10)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import click
import pytest

import sandbox_api.models as operator_models
from sandbox_client import _logic, errors, models
from sandbox_client.files import LocalFileOperations, operations_for
from sandbox_client.history import sandbox_history
from sandbox_client.kubectl_plugin import parse_duration
from sandbox_client.models import CheckpointInfo, PlanCommitResult, SandboxInfo
from tests.support.gitrepo import git, make_repo

REPO_ROOT = Path(__file__).resolve().parents[2]


def sandbox_object(
    path: Path | str,
    *,
    strategy: str = "copy_on_write",
    phase: str = "Active",
    node_path: str = "/orig",
    executor: str = "local",
    conditions: list[dict[str, Any]] | None = None,
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "s1", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "planId": "p",
            "resourceId": "r",
            "strategy": strategy,
            "source": {"nodePath": node_path},
        },
        "status": {
            "phase": phase,
            "sandboxPath": str(path),
            "executor": executor,
            "conditions": conditions
            or [{"type": "Ready", "status": "True" if phase == "Active" else "False"}],
            **status,
        },
    }


def info_for(path: Path | str, **kwargs: Any) -> SandboxInfo:
    return SandboxInfo.from_object(sandbox_object(path, **kwargs))


# -- one definition of the models ------------------------------------------------------------


def test_the_client_uses_the_operators_models_not_a_copy() -> None:
    for name in ("SandboxSpec", "SandboxSource", "CheckpointSpec", "PlanCommitSpec", "StepResult"):
        assert getattr(models, name) is getattr(operator_models, name)


# -- names and manifests -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "expected"),
    [(("plan-1", "repo"), "plan-1-repo"), (("a", "b"), "a-b")],
)
def test_dns_name_keeps_valid_names(parts: tuple[str, ...], expected: str) -> None:
    assert _logic.dns_name(*parts) == expected


def test_dns_name_makes_distinct_valid_labels_of_anything() -> None:
    inputs = [
        ("Plan_1", "Repo"),
        ("plan.1", "repo"),
        ("plan 1", "repo"),
        ("p" * 80, "r"),
        ("p" * 80, "s"),
        ("ÄÖ", "x"),
        ("--", "--"),
    ]
    names = [_logic.dns_name(*parts) for parts in inputs]
    assert len(set(names)) == len(names)
    for name in names:
        assert len(name) <= 63
        assert name[0].isalnum() and name[-1].isalnum()
        assert all(c.islower() or c.isdigit() or c == "-" for c in name)


def test_sandbox_manifest_is_the_operators_spec_in_camel_case() -> None:
    body = _logic.sandbox_manifest(
        "n",
        "plan-1",
        "repo",
        "overlay",
        "/src",
        options={"overlayMode": "fallback"},
        workspace={"resources": {}},
    )
    assert body["spec"] == {
        "planId": "plan-1",
        "resourceId": "repo",
        "strategy": "overlay",
        "source": {"nodePath": "/src"},
        "options": {"overlayMode": "fallback"},
        "workspace": {"resources": {}},
    }
    assert body["metadata"]["labels"] == {models.PLAN_LABEL: "plan-1"}
    no_label = _logic.sandbox_manifest("n", "plan with spaces", "r", "none", Path("/src"))
    assert "labels" not in no_label["metadata"]
    pvc = _logic.sandbox_manifest(
        "n", "p", "r", "git_worktree", {"persistentVolumeClaim": {"claimName": "c"}}
    )
    assert pvc["spec"]["source"] == {"persistentVolumeClaim": {"claimName": "c", "subPath": ""}}
    with pytest.raises(errors.RefusedError) as refused:
        _logic.sandbox_manifest("n", "p", "r", "none", {"persistentVolumeClaim": {"x": 1}})
    assert refused.value.reason == "InvalidSpec"


def test_manifests_are_written_in_v1beta1_and_v1alpha1_objects_still_read() -> None:
    """The client writes the stored version; an object a v1alpha1 client wrote (the same
    fields: docs/api-evolution.md) reads the same as its v1beta1 form."""
    sandbox = _logic.sandbox_manifest("n", "plan-1", "repo", "overlay", "/src")
    checkpoint = _logic.checkpoint_manifest("n", "pre_execute", None, None)
    plancommit = _logic.plancommit_manifest("plan-1", models.PlanCommitAction.COMMIT, None)
    for body in (sandbox, checkpoint, plancommit):
        assert body["apiVersion"] == "sandbox.cleveragents.io/v1beta1"
    status = {"phase": "Active", "sandboxId": "01J", "sandboxPath": "/s"}
    new = {**sandbox, "metadata": {"name": "n", "namespace": "ns"}, "status": status}
    old = {**new, "apiVersion": "sandbox.cleveragents.io/v1alpha1"}
    read_old, read_new = SandboxInfo.from_object(old), SandboxInfo.from_object(new)
    assert read_old.model_dump(exclude={"raw"}) == read_new.model_dump(exclude={"raw"})
    assert SandboxInfo.from_object(old).phase is models.SandboxPhase.ACTIVE


def test_plancommit_manifest_uses_generate_name() -> None:
    body = _logic.plancommit_manifest("Plan_1", models.PlanCommitAction.ROLLBACK, None)
    assert body["metadata"]["generateName"].endswith("-rollback-")
    assert body["spec"] == {"planId": "Plan_1", "action": "Rollback", "cleanupPolicy": "Retain"}


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("Conflict", errors.ConflictError),
        ("AlreadyExists", errors.ConflictError),
        ("InvalidState", errors.RefusedError),
        ("SandboxCreationFailed", errors.RefusedError),
        ("PathTraversal", errors.RefusedError),
        ("ApiError404", errors.NotFoundError),
        ("Timeout", errors.WaitTimeoutError),
        ("SandboxCommitFailed", errors.OperationFailedError),
        ("RollbackFailed", errors.OperationFailedError),
    ],
)
def test_condition_reasons_map_to_typed_errors(reason: str, kind: type[Exception]) -> None:
    error = errors.error_for(reason, "details")
    assert type(error) is kind
    assert error.reason == reason and error.message == "details"
    assert str(error) == f"{reason}: details"


def test_api_status_bodies_become_typed_errors() -> None:
    def status(code: int, reason: str, message: str) -> bytes:
        body = {"kind": "Status", "code": code, "reason": reason, "message": message}
        return json.dumps(body).encode()

    invalid = errors.from_api_exception(422, "Unprocessable", status(422, "Invalid", "bad path"))
    assert isinstance(invalid, errors.RefusedError) and invalid.reason == "Invalid"
    assert invalid.message == "bad path"
    exists = errors.from_api_exception(409, "Conflict", status(409, "AlreadyExists", "exists"))
    assert isinstance(exists, errors.ConflictError) and exists.reason == "AlreadyExists"
    missing = errors.from_api_exception(404, "Not Found", "")
    assert isinstance(missing, errors.NotFoundError) and missing.reason == "NotFound"
    broken = errors.from_api_exception(500, "Internal", "not json")
    assert isinstance(broken, errors.OperationFailedError) and broken.message == "not json"


# -- predicates ------------------------------------------------------------------------------


def test_ready_predicate_raises_the_degraded_condition_of_an_errored_sandbox() -> None:
    check = _logic.sandbox_ready("s1")
    assert check({}) is None
    assert check({"s1": sandbox_object("/p", phase="Pending")}) is None
    assert check({"s1": sandbox_object("/p")}) is not None
    errored = sandbox_object(
        "",
        phase="Errored",
        conditions=[
            {"type": "Ready", "status": "False", "reason": "Errored", "message": "x"},
            {
                "type": "Degraded",
                "status": "True",
                "reason": "SandboxCreationFailed",
                "message": "original path /nope does not exist",
            },
        ],
    )
    with pytest.raises(errors.RefusedError) as refused:
        check({"s1": errored})
    assert refused.value.reason == "SandboxCreationFailed" and "/nope" in refused.value.message
    with pytest.raises(errors.RefusedError):
        check({"s1": sandbox_object("/p", phase="Committed")})
    deleting = sandbox_object("/p")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    with pytest.raises(errors.NotFoundError):
        check({"s1": deleting})


def test_request_predicate_waits_for_its_own_id() -> None:
    check = _logic.request_served("s1", "lastRestoreRequestId", "Restored", "id-2")
    served_old = sandbox_object(
        "/p",
        lastRestoreRequestId="id-1",
        conditions=[{"type": "Restored", "status": "True", "reason": "Restored", "message": ""}],
    )
    assert check({"s1": served_old}) is None
    failed = sandbox_object(
        "/p",
        lastRestoreRequestId="id-2",
        conditions=[
            {
                "type": "Restored",
                "status": "False",
                "reason": "InvalidSpec",
                "message": "checkpoint c belongs to another sandbox",
            }
        ],
    )
    with pytest.raises(errors.RefusedError) as refused:
        check({"s1": failed})
    assert "another sandbox" in refused.value.message


def test_plancommit_result_of_a_compensated_failure() -> None:
    obj = {
        "metadata": {"name": "pc", "namespace": "ns"},
        "spec": {"planId": "p"},
        "status": {
            "phase": "Failed",
            "rolledBackIds": ["A"],
            "failedRollbackIds": [],
            "failedSandboxId": "B",
            "sandboxes": [
                {"name": "a", "sandboxId": "A", "state": "Compensated"},
                {"name": "b", "sandboxId": "B", "state": "Failed", "error": "conflict"},
            ],
            "conditions": [
                {"type": "Committed", "status": "False", "reason": "Conflict", "message": "m"}
            ],
        },
    }
    result = PlanCommitResult.from_object(obj)
    assert result.done and not result.committed
    assert result.rolled_back_ids == ["A"] and result.failed_sandbox_id == "B"
    committed = result.condition("Committed")
    assert committed is not None and committed.reason == "Conflict"
    assert _logic.plancommit_done("pc")({"pc": obj}) == result
    pending = {**obj, "status": {"phase": "Committing"}}
    assert _logic.plancommit_done("pc")({"pc": pending}) is None


def test_history_is_newest_first_and_only_about_the_sandbox() -> None:
    commit = PlanCommitResult.from_object(
        {
            "metadata": {"name": "pc"},
            "spec": {"planId": "p"},
            "status": {
                "phase": "Committed",
                "sandboxes": [
                    {"name": "s1", "state": "Committed", "finishedAt": "2026-01-01T00:00:09Z"},
                    {"name": "other", "state": "Committed", "finishedAt": "2026-01-01T00:00:10Z"},
                ],
            },
        }
    )
    checkpoint = CheckpointInfo.from_object(
        {
            "metadata": {"name": "c1"},
            "spec": {"sandboxName": "s1", "phase": "pre"},
            "status": {"phase": "Ready", "kind": "git-tag", "createdAt": "2026-01-01T00:00:02Z"},
        }
    )
    foreign = CheckpointInfo.from_object(
        {"metadata": {"name": "c2"}, "spec": {"sandboxName": "s2", "phase": "pre"}}
    )
    events = [
        {
            "metadata": {"name": "e1"},
            "involvedObject": {"kind": "Sandbox", "name": "s1"},
            "reason": "Restored",
            "message": "restored",
            "lastTimestamp": "2026-01-01T00:00:05Z",
        },
        {
            "metadata": {"name": "e2"},
            "involvedObject": {"kind": "Sandbox", "name": "s1"},
            "reason": "SomethingElse",
            "lastTimestamp": "2026-01-01T00:00:06Z",
        },
        {
            "metadata": {"name": "e3"},
            "involvedObject": {"kind": "Sandbox", "name": "s1"},
            "reason": "RollbackFailed",
            "message": "no",
            "eventTime": "2026-01-01T00:00:07Z",
        },
    ]
    history = sandbox_history("s1", [commit], [checkpoint, foreign], events)
    assert [(h.kind, h.outcome) for h in history] == [
        ("commit", "Committed"),
        ("rollback", "failed"),
        ("restore", "ok"),
        ("checkpoint", "Ready"),
    ]


def test_parse_duration() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("90s") == 90
    assert parse_duration("5m") == 300
    assert parse_duration("1h1m30s") == 3690
    for bad in ("", "5x", "m5", "1.5.5s", "5m junk"):
        with pytest.raises(click.BadParameter):
            parse_duration(bad)


# -- local file operations on real directories ---------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sandbox"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a\n")
    (root / "sub" / "b.txt").write_text("b\n")
    (root / "script.sh").write_text("#!/bin/sh\n")
    (root / "script.sh").chmod(0o755)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s\n")
    (root / "out-dir").symlink_to(outside)
    (root / "out-file").symlink_to(outside / "secret")
    (root / "sub" / "up").symlink_to("../..")
    (root / "in-link").symlink_to("sub/b.txt")
    return root


ESCAPES = [
    "/etc/passwd",
    "..",
    "../x",
    "sub/../../x",
    "sub/../..",
    "out-dir/secret",
    "out-dir/new",
    "out-file",
    "sub/up/outside/secret",
    "sub/up/x",
    "a\x00b",
]


@pytest.mark.parametrize(
    ("operation", "path"), list(itertools.product(["read", "write", "list"], ESCAPES))
)
def test_every_way_out_of_the_sandbox_is_refused(tree: Path, operation: str, path: str) -> None:
    files = LocalFileOperations()
    info = info_for(tree)
    before = sorted(p.name for p in (tree.parent / "outside").iterdir())
    with pytest.raises(errors.RefusedError) as refused:
        if operation == "read":
            files.read_file(info, path)
        elif operation == "write":
            files.write_file(info, path, b"x")
        else:
            files.list_files(info, path)
    assert refused.value.reason == "PathTraversal"
    assert sorted(p.name for p in (tree.parent / "outside").iterdir()) == before
    assert (tree.parent / "outside" / "secret").read_text() == "s\n"


def test_inside_links_and_plain_paths_work(tree: Path) -> None:
    files = LocalFileOperations()
    info = info_for(tree)
    assert files.read_file(info, "in-link") == b"b\n"
    assert files.read_file(info, "./sub/b.txt") == b"b\n"
    files.write_file(info, "new/deep/c.txt", b"c\n")
    assert (tree / "new/deep/c.txt").read_bytes() == b"c\n"
    assert files.list_files(info, "new") == ["new/deep/c.txt"]
    listed = files.list_files(info)
    assert "a.txt" in listed and "sub/b.txt" in listed and "in-link" in listed
    with pytest.raises(errors.NotFoundError):
        files.read_file(info, "nope.txt")
    with pytest.raises(errors.NotFoundError):
        files.list_files(info, "nope")
    with pytest.raises(errors.RefusedError):
        files.read_file(info, "sub")


def test_write_replaces_atomically_and_keeps_the_mode(tree: Path) -> None:
    files = LocalFileOperations()
    info = info_for(tree)
    files.write_file(info, "script.sh", b"#!/bin/sh\necho 2\n")
    assert (tree / "script.sh").stat().st_mode & 0o777 == 0o755
    assert (tree / "script.sh").read_text() == "#!/bin/sh\necho 2\n"
    assert not [p for p in tree.iterdir() if p.name.startswith(".sbx-")]  # no temp file left
    old_umask = os.umask(0o022)
    try:
        files.write_file(info, "fresh.txt", b"x")
    finally:
        os.umask(old_umask)
    assert (tree / "fresh.txt").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("phase", ["Committed", "Errored", "CleanedUp", "Pending"])
def test_writes_need_a_writable_phase(tree: Path, phase: str) -> None:
    with pytest.raises(errors.RefusedError) as refused:
        LocalFileOperations().write_file(info_for(tree, phase=phase), "a.txt", b"x")
    assert refused.value.reason == "InvalidState"
    assert (tree / "a.txt").read_text() == "a\n"


def test_diff_of_a_directory_against_its_original(tmp_path: Path) -> None:
    original = tmp_path / "orig"
    original.mkdir()
    (original / "keep.txt").write_text("same\n")
    (original / "gone.txt").write_text("bye\n")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "keep.txt").write_text("same\n")
    (copy / "new.txt").write_text("hello\n")
    text = LocalFileOperations().diff(info_for(copy, node_path=str(original)))
    assert "diff --git a/gone.txt b/gone.txt" in text and "-bye" in text
    assert "diff --git a/new.txt b/new.txt" in text and "+hello" in text
    assert "keep.txt" not in text


def test_git_diff_uses_a_private_index(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "one\n", ".gitignore": "*.log\n"})
    base = git(repo, "rev-parse", "HEAD")
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "sbx", str(worktree))
    (worktree / "f.txt").write_text("two\n")
    (worktree / "untracked.txt").write_text("new\n")
    (worktree / "noise.log").write_text("ignored\n")
    status_before = git(worktree, "status", "--porcelain")
    info = info_for(
        worktree,
        strategy="git_worktree",
        coreRecord={"context": {"metadata": {"base_commit": base}}},
    )
    files = LocalFileOperations()
    text = files.diff(info)
    assert "-one" in text and "+two" in text and "b/untracked.txt" in text
    assert "noise.log" not in text
    assert git(worktree, "status", "--porcelain") == status_before  # index untouched
    assert ".git" not in files.list_files(info)
    with pytest.raises(errors.RefusedError) as reserved:
        files.read_file(info, ".git")
    assert reserved.value.reason == "ReservedPath"


def test_file_operations_exist_only_for_the_local_executor(tmp_path: Path) -> None:
    assert isinstance(operations_for(info_for(tmp_path)), LocalFileOperations)
    with pytest.raises(errors.RefusedError) as pod:
        operations_for(info_for(tmp_path, executor="pod"))
    assert pod.value.reason == "NoFileOperations"
    with pytest.raises(errors.RefusedError) as pending:
        operations_for(info_for(tmp_path, executor=""))
    assert pending.value.reason == "InvalidState"
