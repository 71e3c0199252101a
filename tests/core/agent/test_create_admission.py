"""The workspace agent's create admits only what its Sandbox's spec names (docs/security.md,
"The agent's create").

A token holder asks the real agent operations to sandbox ``/proc/self/environ``, the agent's
own state and request journal, its token, the claim past ``subPath``, a symlink out of the
allowed root, another process's environment variable, a literal DSN: each is refused (422
``RefusedOriginal``) and nothing is created. The original under the allowed root is created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sandbox_operator.executors.base import SandboxTarget, sandbox_id_for_uid
from sandbox_operator.executors.pod_manifests import SOURCE_MOUNT, build_workspace_pod
from sandbox_operator.settings import Settings

from sandbox_api.models import SandboxSource
from sandbox_core.agent import wire
from sandbox_core.agent.operations import AgentConfig, Operations
from sandbox_core.agent.wire import AgentError


@pytest.fixture
def claim(tmp_path: Path) -> Path:
    """A claim with the Sandbox's ``subPath`` (``repo``) and a sibling it must not reach."""
    (tmp_path / "claim" / "repo").mkdir(parents=True)
    (tmp_path / "claim" / "repo" / "f.txt").write_text("mine\n")
    (tmp_path / "claim" / "other-team").mkdir()
    (tmp_path / "claim" / "other-team" / "secret.txt").write_text("theirs\n")
    return tmp_path / "claim"


@pytest.fixture
def ops(tmp_path: Path, claim: Path) -> Operations:
    state = tmp_path / "scratch" / "state"
    (state / "requests").mkdir(parents=True)
    token = tmp_path / "token"
    token.write_text("t0ken-value")
    environ = {
        wire.ALLOWED_ROOTS_ENV: str(claim / "repo"),
        wire.STATE_DIR_ENV: str(state),
        wire.ROOT_ENV: str(tmp_path / "scratch" / "sandboxes"),
        wire.TOKEN_FILE_ENV: str(token),
        "OTHER": "postgresql://u:p@db/x",
    }
    return Operations(AgentConfig.from_env(environ))


def create(ops: Operations, original: str, **extra: Any) -> dict[str, Any]:
    body = {"plan_id": "p", "resource_id": "r", "strategy": "copy_on_write", **extra}
    return ops.create({**body, "original": original})


def refused(ops: Operations, original: str, **extra: Any) -> str:
    with pytest.raises(AgentError) as raised:
        create(ops, original, **extra)
    assert raised.value.status == 422, raised.value
    assert raised.value.type == "RefusedOriginal", raised.value
    return str(raised.value)


def test_the_configured_root_comes_from_the_environment(ops: Operations, claim: Path) -> None:
    assert ops.config.allowed_roots == (claim / "repo",)
    empty = AgentConfig.from_env({wire.ALLOWED_ROOTS_ENV: ""})
    assert empty.allowed_roots == ()
    assert AgentConfig.from_env({}).allowed_roots is None


def test_the_original_under_the_allowed_root_is_created(ops: Operations, claim: Path) -> None:
    reply = create(ops, str(claim / "repo"))
    assert reply["status"] == "created"


@pytest.mark.parametrize(
    "original",
    [
        "/proc/self/environ",
        "sqlite:///proc/self/environ",
        "/sys/kernel",
        "/dev/shm",
        "/",
        "relative/path",
        "sqlite://relative.db",
        "env:OTHER",
        "postgresql://app:pw@db.example:5432/app",
        "host=db.example user=app password=pw dbname=app",
    ],
)
def test_system_areas_other_secrets_and_literal_dsns_are_refused(
    ops: Operations, original: str
) -> None:
    refused(ops, original)
    assert not any(ops.config.sandbox_root.glob("*"))


def test_the_agents_own_files_and_the_claim_past_its_sub_path_are_refused(
    ops: Operations, claim: Path
) -> None:
    state = ops.config.state_dir
    for original in (state, state / "requests", ops.config.token_file, state.parent, claim):
        refused(ops, str(original))
    refused(ops, str(claim / "other-team"))
    refused(ops, str(claim / "repo" / ".." / "other-team"))


def test_a_symlinked_original_resolving_outside_is_refused(
    ops: Operations, claim: Path, tmp_path: Path
) -> None:
    (claim / "repo" / "escape").symlink_to(claim / "other-team")
    (claim / "repo" / "state").symlink_to(ops.config.state_dir)
    message = refused(ops, str(claim / "repo" / "escape"))
    refused(ops, str(claim / "repo" / "state"))
    assert str(tmp_path) not in message.replace(str(claim / "repo" / "escape"), "")


def test_the_caller_cannot_move_the_sandbox_root(ops: Operations, claim: Path) -> None:
    refused(ops, str(claim / "repo"), options={"sandbox_root": str(ops.config.state_dir)})


def test_the_workspace_pod_names_the_allowed_root_from_the_spec() -> None:
    def target(source: dict[str, Any]) -> SandboxTarget:
        uid = "6f1c2a8e-3b7d-4c55-9e0a-2d7b9c41f0aa"
        return SandboxTarget(
            name="s", namespace="ns", uid=uid, sandbox_id=sandbox_id_for_uid(uid), plan_id="p",
            resource_id="r", strategy="copy_on_write", original="",
            source=SandboxSource.model_validate(source),
        )  # fmt: skip

    def allowed(source: dict[str, Any]) -> str:
        pod = build_workspace_pod(target(source), Settings(), "scratch")
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        return str(env[wire.ALLOWED_ROOTS_ENV])

    pvc = {"persistentVolumeClaim": {"claimName": "data", "subPath": "team/repo"}}
    assert allowed(pvc) == f"{SOURCE_MOUNT}/team/repo"
    assert allowed({"persistentVolumeClaim": {"claimName": "data"}}) == SOURCE_MOUNT
    escaping = {"persistentVolumeClaim": {"claimName": "data", "subPath": "../../etc"}}
    assert allowed(escaping) == ""
    assert allowed({"secretRef": {"name": "db", "key": "dsn"}}) == ""
