"""``sandbox-mcp`` over stdio, driven by the MCP client of the same ``mcp`` package (tier 2).

Issue 10, section 3: the server is scoped to one plan and namespace by its arguments; its tools
list, read, write, diff, checkpoint, restore and request the commit; paths leaving the sandbox
and sandboxes of other plans are refused. The server is the installed console script, started
as a subprocess, against the real API server and the operator (local executor).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from sandbox_client import Plan, SandboxClient
from sandbox_client.mcp_server import TOOL_NAMES
from tests.support.client import ClientEnv, make_dir, make_repo, three_sources
from tests.support.operator import git

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as connected:
        yield connected


def server(env: ClientEnv, plan_id: str) -> StdioServerParameters:
    """The installed ``sandbox-mcp`` script, scoped to ``plan_id`` in the test namespace."""
    return StdioServerParameters(
        command=str(Path(sys.executable).parent / "sandbox-mcp"),
        args=[
            "--plan",
            plan_id,
            "-n",
            env.namespace,
            "--kubeconfig",
            env.kubeconfig,
            "--allow-commit-without-approval",  # these agents run unattended
        ],
        env=env.env(),
    )


class Session:
    """Calls tools and unpacks their results (text, or JSON when the tool returns data)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, tool: str, **arguments: Any) -> Any:
        result = await self.client.call_tool(tool, arguments)
        assert not result.is_error, (tool, arguments, result.content)
        structured = result.structured_content
        if structured is not None:  # a tool's object, or {"result": value} for other values
            return structured["result"] if set(structured) == {"result"} else structured
        text = "".join(getattr(c, "text", "") for c in result.content)
        try:
            return json.loads(text)
        except ValueError:
            return text

    async def error(self, tool: str, **arguments: Any) -> str:
        result = await self.client.call_tool(tool, arguments)
        assert result.is_error, (tool, arguments, result.content)
        return "".join(getattr(c, "text", "") for c in result.content)


def test_agent_flow_over_stdio(env: ClientEnv, client: SandboxClient, tmp_path: Path) -> None:
    sources = three_sources(tmp_path)
    plan = Plan(client, "mcp-ok")
    plan.add_sandbox("repo", "git_worktree", sources["repo"])
    plan.add_sandbox("data", "copy_on_write", sources["data"])
    plan.add_sandbox("layer", "overlay", sources["layer"])
    other = Plan(client, "mcp-other")
    other.add_sandbox("secret", "copy_on_write", make_dir(tmp_path / "s", {"k": "v\n"}))
    plan.wait_ready(timeout=90)
    other.wait_ready(timeout=90)

    async def agent() -> None:
        async with Client(server(env, "mcp-ok")) as connected:
            session = Session(connected)
            tools = {t.name for t in (await connected.list_tools()).tools}
            assert tools == set(TOOL_NAMES)

            listed = (await session.call("list_sandboxes"))["sandboxes"]
            assert {s["resource_id"] for s in listed} == {"repo", "data", "layer"}
            assert all(s["phase"] == "Active" and s["ready"] for s in listed)
            found = await session.call("glob", sandbox="data", pattern="**/*")
            assert [p["path"] for p in found["paths"] if p["type"] == "file"] == [
                "g.txt",
                "sub/h.txt",
            ]
            read = await session.call("read", sandbox="repo", path="README.md")
            assert read["content"] == "r0\n"

            await session.call("write", sandbox="repo", path="src/app.py", content="v = 1\n")
            await session.call("write", sandbox="data", path="g.txt", content="d1\n")
            await session.call("write", sandbox="layer", path="o.txt", content="o1\n")
            diff = (await session.call("diff", sandbox="repo"))["diff"]
            assert "+v = 1" in diff and "-print('v0')" in diff

            made = await session.call("checkpoint", sandbox="data", phase="agent_step")
            assert made["kind"] == "directory-snapshot"
            await session.call("write", sandbox="data", path="g.txt", content="oops\n")
            await session.call("restore", sandbox="data", checkpoint=made["checkpoint"])
            assert (await session.call("read", sandbox="data", path="g.txt"))["content"] == "d1\n"

            for path in ("../escape.txt", "/etc/passwd", "sub/../../x"):
                refused = await session.error("write", sandbox="data", path=path, content="x")
                assert "PathTraversal" in refused, refused
            assert "PathTraversal" in await session.error(
                "read", sandbox="data", path="/etc/hostname"
            )
            outside = await session.error("read", sandbox="secret", path="k")
            assert "NotFound" in outside and "mcp-ok" in outside  # other plans are invisible
            missing = await session.error("restore", sandbox="data", checkpoint="not-a-checkpoint")
            assert "NotFound" in missing

            asked = await session.call("request_commit", message="agent commit")
            assert asked["status"] == "committed" and asked["digest"].startswith("sha256:")
            result = asked["result"]
            assert result["committed"] is True and result["phase"] == "Committed"
            assert result["rolled_back_ids"] == []
            assert {c["type"] for c in result["conditions"]} >= {"Committed"}

    asyncio.run(agent())
    assert (sources["repo"] / "src/app.py").read_text() == "v = 1\n"
    assert (sources["data"] / "g.txt").read_text() == "d1\n"
    assert (sources["layer"] / "o.txt").read_text() == "o1\n"
    assert not (tmp_path / "escape.txt").exists()
    plan.delete(cleanup=True)
    other.delete(cleanup=True)


def test_request_commit_reports_a_failure_with_rolled_back_ids(
    env: ClientEnv, client: SandboxClient, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    repo = make_repo(tmp_path / "repo", {"f.txt": "line1\n"})
    plan = Plan(client, "mcp-bad")
    plan.add_sandbox("data", "copy_on_write", data)
    plan.add_sandbox("repo", "git_worktree", repo)
    plan.wait_ready(timeout=90)

    async def agent() -> dict[str, Any]:
        async with Client(server(env, "mcp-bad")) as connected:
            session = Session(connected)
            await session.call("write", sandbox="data", path="g.txt", content="d1\n")
            await session.call("write", sandbox="repo", path="f.txt", content="mine\n")
            (repo / "f.txt").write_text("theirs\n")
            git(repo, "commit", "-qam", "the original moved")
            asked: dict[str, Any] = await session.call("request_commit")
            assert asked["status"] == "failed"
            return dict(asked["result"])

    result = asyncio.run(agent())
    assert result["committed"] is False and result["phase"] == "Failed"
    assert result["rolled_back_ids"] == []  # TwoPhase default: nothing landed, nothing undone
    committed = next(c for c in result["conditions"] if c["type"] == "Committed")
    assert committed["status"] == "False"
    assert committed["reason"] in ("Conflict", "SandboxCommitFailed")
    assert (data / "g.txt").read_text() == "d0\n"
    plan.delete(cleanup=True)
