"""The OpenAI Agents SDK sandbox client keeps the product's promises: a SandboxAgent's writes land
in the sandbox only, reach the original through the plan's commit, and never escape the root."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import RunConfig, Runner, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run_config import SandboxRunConfig
from agents.sandbox import SandboxAgent
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExposedPortUnavailableError,
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession
from agents.usage import Usage
from openai.types.responses import (
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from sandbox_client.integrations.openai_agents import (
    OperatorSandboxClient,
    OperatorSandboxClientOptions,
    OperatorSandboxSessionState,
)
from sandbox_core.actor.actions import LocalActions
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.store import SandboxStore


def _client(state_dir: Path) -> OperatorSandboxClient:
    return OperatorSandboxClient(lambda sandbox_id: LocalActions(state_dir, sandbox_id))


@pytest.fixture
async def session(actions: LocalActions, tmp_path: Path) -> AsyncIterator[SandboxSession]:
    client = _client(tmp_path / "state")
    opened = await client.create(options=OperatorSandboxClientOptions(actions.sandbox_id))
    async with opened:
        yield opened
    await client.delete(opened)


def _paths(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


# (a) the session's operations --------------------------------------------------------------


async def test_the_sessions_root_is_the_sandboxs_root(
    session: SandboxSession, actions: LocalActions
) -> None:
    assert session.state.manifest.root == actions.root
    assert isinstance(session.state, OperatorSandboxSessionState)
    assert await session.running()
    entries = await session.ls(actions.root)
    assert [Path(e.path).name for e in entries] == ["README.md"]


async def test_exec_reports_exit_codes_and_output(session: SandboxSession) -> None:
    ok = await session.exec("printf 'one two' && pwd")
    assert ok.exit_code == 0
    assert ok.stdout.decode() == f"one two{session.state.manifest.root}\n"
    failed = await session.exec("echo oops >&2; exit 3")
    assert (failed.exit_code, failed.stdout.decode()) == (3, "oops\n")
    quoted = await session.exec("printf", "%s|", "a b", "it's", shell=False)
    assert quoted.stdout.decode() == "a b|it's|"


async def test_read_and_write_round_trip_text_and_binary(
    session: SandboxSession, tmp_path: Path
) -> None:
    root = Path(session.state.manifest.root)
    binary = bytes(range(256)) * 4
    await session.write(root / "bin" / "blob.dat", io.BytesIO(binary))
    await session.write(Path("notes.txt"), io.BytesIO("é\n".encode()))
    assert (await session.read(root / "bin" / "blob.dat")).read() == binary
    assert (await session.read(Path("notes.txt"))).read() == "é\n".encode()
    assert (root / "bin" / "blob.dat").read_bytes() == binary
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md"]
    with pytest.raises(WorkspaceReadNotFoundError):
        await session.read(root / "missing.txt")


async def test_mkdir_mv_and_rm_work_in_the_sandbox(session: SandboxSession) -> None:
    root = Path(session.state.manifest.root)
    await session.mkdir(root / "a" / "b", parents=True)
    await session.write(root / "a" / "b" / "x.txt", io.BytesIO(b"x"))
    await session.mv(root / "a" / "b" / "x.txt", root / "y.txt")
    assert (root / "y.txt").read_bytes() == b"x"
    await session.rm(root / "a", recursive=True)
    assert not (root / "a").exists()


@pytest.mark.parametrize("path", ["/etc/passwd", "{root}/../escape.txt", "../escape.txt"])
async def test_paths_outside_the_root_are_refused(session: SandboxSession, path: str) -> None:
    root = session.state.manifest.root
    target = Path(path.format(root=root))
    with pytest.raises(InvalidManifestPathError):
        await session.write(target, io.BytesIO(b"x"))
    with pytest.raises(InvalidManifestPathError):
        await session.read(target)
    assert not Path(root).parent.joinpath("escape.txt").exists()


async def test_a_symlink_out_of_the_root_does_not_lead_reads_or_writes_out(
    session: SandboxSession, tmp_path: Path
) -> None:
    root = Path(session.state.manifest.root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    made = await session.exec(f"ln -s {outside} link")
    assert made.exit_code == 0
    with pytest.raises(WorkspaceArchiveReadError):
        await session.read(root / "link" / "secret.txt")
    with pytest.raises(WorkspaceArchiveWriteError):
        await session.write(root / "link" / "planted.txt", io.BytesIO(b"x"))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


async def test_a_command_past_its_timeout_is_killed(session: SandboxSession) -> None:
    with pytest.raises(ExecTimeoutError):
        await session.exec("sleep 30", timeout=0.5)


async def test_git_control_files_are_refused_by_the_door(session: SandboxSession) -> None:
    root = Path(session.state.manifest.root)
    with pytest.raises(WorkspaceArchiveWriteError):
        await session.write(root / ".git" / "config", io.BytesIO(b"[core]\n"))
    assert not (root / ".git").exists()


async def test_persist_gives_a_tar_of_the_root(session: SandboxSession) -> None:
    root = Path(session.state.manifest.root)
    await session.write(root / "sub" / "f.bin", io.BytesIO(b"\x00\xff"))
    await session.write(root / "cache" / "skip.txt", io.BytesIO(b"skip"))
    session.register_persist_workspace_skip_path("cache")
    archive = await session.persist_workspace()
    with tarfile.open(fileobj=archive) as tar:
        names = {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}
        member = tar.extractfile("./sub/f.bin")
        assert member is not None and member.read() == b"\x00\xff"
    assert names == {"README.md", "sub/f.bin"}


async def test_hydrate_puts_a_persisted_tree_back_into_the_sandbox_only(
    session: SandboxSession, tmp_path: Path
) -> None:
    root = Path(session.state.manifest.root)
    await session.write(root / "src" / "run.sh", io.BytesIO(b"#!/bin/sh\necho ran\n"))
    made = await session.exec("chmod +x src/run.sh && mkdir -p empty/dir && ln -s src/run.sh go")
    assert made.exit_code == 0
    archive = await session.persist_workspace()
    wiped = await session.exec("rm -rf src empty go && echo changed > README.md")
    assert wiped.exit_code == 0
    await session.write(root / "kept.txt", io.BytesIO(b"kept"))

    await session.hydrate_workspace(archive)

    assert (root / "README.md").read_text() == "the original\n"
    assert (root / "src" / "run.sh").stat().st_mode & 0o100
    assert (root / "empty" / "dir").is_dir()
    assert os.readlink(root / "go") == "src/run.sh"
    assert (root / "kept.txt").read_bytes() == b"kept"
    assert (await session.exec("./go")).stdout == b"ran\n"
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md"]


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, body in members:
            info.size = len(body or b"")
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    buffer.seek(0)
    return buffer


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (_member("../escape.txt"), "parent traversal"),
        (_member("/abs.txt"), "absolute path"),
        (_member(".git/config"), "protected path"),
        (_member("out", tarfile.SYMTYPE, "/etc"), "absolute symlink target"),
        (_member("up", tarfile.SYMTYPE, "../.."), "escapes archive root"),
        (_member("hard", tarfile.LNKTYPE, "README.md"), "hardlink"),
    ],
)
async def test_hydrate_refuses_an_unsafe_tar_and_writes_nothing(
    session: SandboxSession, tmp_path: Path, bad: tarfile.TarInfo, reason: str
) -> None:
    root = Path(session.state.manifest.root)
    before = _paths(root)
    body = None if bad.issym() or bad.islnk() else b"x"
    archive = _tar((_member("first.txt"), b"first"), (bad, body))
    with pytest.raises(WorkspaceArchiveWriteError) as refused:
        await session.hydrate_workspace(archive)
    assert reason in str(refused.value.context["reason"])
    assert _paths(root) == before
    assert not (tmp_path / "escape.txt").exists()
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md"]


async def test_hydrate_refuses_what_is_not_a_tar(session: SandboxSession) -> None:
    with pytest.raises(WorkspaceArchiveWriteError) as refused:
        await session.hydrate_workspace(io.BytesIO(b"not a tar at all" * 64))
    assert refused.value.context["reason"] == "invalid_tar"


async def test_exposed_ports_and_foreign_roots_are_refused(
    session: SandboxSession, actions: LocalActions, tmp_path: Path
) -> None:
    with pytest.raises(ExposedPortUnavailableError):
        await session.resolve_exposed_port(8080)
    with pytest.raises(ValueError, match="not the sandbox's root"):
        await _client(tmp_path / "state").create(
            manifest=Manifest(root="/somewhere/else"),
            options=OperatorSandboxClientOptions(actions.sandbox_id),
        )
    with pytest.raises(WorkspaceStartError, match="cannot attach"):
        await _client(tmp_path / "state").create(
            options=OperatorSandboxClientOptions("no-such-sandbox")
        )


async def test_running_as_another_user_is_refused(session: SandboxSession) -> None:
    root = Path(session.state.manifest.root)
    with pytest.raises(ValueError, match="one jailed user"):
        await session.exec("id", user="alice")
    with pytest.raises(ValueError, match="one jailed user"):
        await session.write(root / "x.txt", io.BytesIO(b"x"), user="alice")
    assert not (root / "x.txt").exists()


async def test_a_serialized_session_resumes_on_the_same_sandbox(
    session: SandboxSession, tmp_path: Path
) -> None:
    root = Path(session.state.manifest.root)
    await session.write(root / "kept.txt", io.BytesIO(b"kept"))
    client = _client(tmp_path / "state")
    payload = json.loads(json.dumps(client.serialize_session_state(session.state)))
    assert payload["sandbox_id"] == session.state.sandbox_id
    payload["manifest"]["root"] = "/where/the/sandbox/was"
    resumed = await client.resume(client.deserialize_session_state(payload))
    async with resumed:
        assert resumed.state.manifest.root == str(root)
        assert (await resumed.read(root / "kept.txt")).read() == b"kept"
        assert (await resumed.exec("cat kept.txt")).stdout == b"kept"


# (b) a SandboxAgent run by the Runner ---------------------------------------------------------


class ScriptedModel(Model):
    """A model that answers each turn with pre-written output items (no network)."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = turns
        self.inputs: list[Any] = []
        self.tool_names: list[list[str]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        tools = kwargs.get("tools", args[1] if len(args) > 1 else [])
        self.tool_names.append(sorted(t.name for t in tools))
        self.inputs.append(input)
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=call_id, name=name, arguments=json.dumps(arguments)
    )


def _said(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg-1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def _outputs(model_input: Any) -> dict[str, str]:
    return {
        item["call_id"]: str(item["output"])
        for item in model_input
        if isinstance(item, dict) and item.get("type", "").endswith("call_output")
    }


async def test_a_sandbox_agent_changes_the_original_only_through_the_commit(
    actions: LocalActions, tmp_path: Path
) -> None:
    original = tmp_path / "original"
    before = _tree(original)
    seen_before_commit: dict[str, bytes] = {}
    paths_before_commit: list[str] = []

    @function_tool
    def request_commit() -> str:
        """Commit the sandbox's changes to the original."""
        seen_before_commit.update(_tree(original))
        paths_before_commit.extend(_paths(original))
        host = SandboxHost(SandboxStore(tmp_path / "state"))
        sandbox = host.reopen(actions.sandbox_id)
        sandbox.commit()
        host.save(sandbox)
        return "committed"

    patch = (
        "*** Begin Patch\n*** Add File: docs/notes.md\n+from the agent\n+line two\n*** End Patch\n"
    )
    build = "sed -i s/original/edited/ README.md && printf built > build.txt && cat README.md"
    model = ScriptedModel(
        [
            [
                ResponseCustomToolCall(
                    type="custom_tool_call", call_id="c1", name="apply_patch", input=patch
                )
            ],
            [
                _call(
                    "c2",
                    "exec_command",
                    {"cmd": build},
                )
            ],
            [_call("c3", "request_commit", {})],
            [_said("done")],
        ]
    )
    agent = SandboxAgent(
        name="builder", instructions="Edit and commit.", model=model, tools=[request_commit]
    )
    sandbox = SandboxRunConfig(
        client=_client(tmp_path / "state"), options=OperatorSandboxClientOptions(actions.sandbox_id)
    )
    result = await Runner.run(
        agent, "make the change", run_config=RunConfig(sandbox=sandbox, tracing_disabled=True)
    )

    assert result.final_output == "done"
    assert model.tool_names[0] == ["apply_patch", "exec_command", "request_commit", "view_image"]
    outputs = _outputs(model.inputs[-1])
    assert "the edited" in outputs["c2"]
    assert outputs["c3"] == "committed"
    assert (seen_before_commit, paths_before_commit) == (before, ["README.md"])
    assert _paths(original) == ["README.md", "build.txt", "docs", "docs/notes.md"]
    assert _tree(original) == {
        "README.md": b"the edited\n",
        "build.txt": b"built",
        "docs/notes.md": b"from the agent\nline two",
    }
