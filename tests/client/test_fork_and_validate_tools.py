"""``kubectl sandbox fork`` / ``validate`` and the MCP tools ``fork`` / ``validate`` against the
real API server and the operator (tier 2, local executor; docs/forks.md): a fork starts from
its parent's checkpoint, a failing check exits 1 with its last lines and touches nothing, and
passing checks leave the plan waiting for its approval with the checks in its review."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from sandbox_client import Plan, SandboxClient
from sandbox_client.kubectl_plugin import EXIT_FAILED, EXIT_OK, cli
from tests.support.client import ClientEnv, make_dir

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as connected:
        yield connected


def run(env: ClientEnv, *args: str) -> Result:
    return CliRunner().invoke(
        cli, [*args, "-n", env.namespace, "--kubeconfig", env.kubeconfig], catch_exceptions=False
    )


def test_the_plugin_forks_and_validates(
    env: ClientEnv, client: SandboxClient, tmp_path: Path
) -> None:
    original = make_dir(tmp_path / "data", {"v.txt": "0\n"})
    plan = Plan(client, "plug-fork")
    base = plan.add_sandbox("data", "copy_on_write", original)
    base.wait_ready(timeout=90)
    base.write_file("v.txt", "1\n")
    start = base.checkpoint("explore", name="plug-start")

    made = run(env, "fork", base.name, start.name, "--name", "plug-a", "-o", "json")
    assert made.exit_code == EXIT_OK, made.output
    assert json.loads(made.output)["spec"]["source"]["fromCheckpoint"] == {
        "sandbox": base.name,
        "checkpoint": "plug-start",
    }
    assert client.sandbox("plug-a").read_file("v.txt") == "1\n"

    failing = run(
        env, "validate", "plug-fork", "--sandbox", "plug-a",
        "--check", "ok=plug-a:test -f v.txt",
        "--check", "bad=plug-a:/bin/sh -c 'echo nope; exit 2'",
    )  # fmt: skip
    assert failing.exit_code == EXIT_FAILED, failing.output
    assert "bad" in failing.output and "FAILED" in failing.output
    assert "--- bad (last lines)\nnope" in failing.output
    assert (original / "v.txt").read_text() == "0\n"

    passing = run(
        env, "validate", "plug-fork", "--sandbox", "plug-a", "--check", "ok=plug-a:test -f v.txt"
    )
    assert passing.exit_code == EXIT_OK, passing.output
    review = run(env, "review", "plug-fork")
    assert "check ok in plug-a: passed" in review.output, review.output
    plan.delete(cleanup=True)


def server(env: ClientEnv, plan_id: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(Path(sys.executable).parent / "sandbox-mcp"),
        args=["--plan", plan_id, "-n", env.namespace, "--kubeconfig", env.kubeconfig],
        env=env.env(),
    )


async def call(connected: Client, tool: str, **arguments: Any) -> Any:
    result = await connected.call_tool(tool, arguments)
    assert not result.is_error, (tool, arguments, result.content)
    return result.structured_content


def test_the_mcp_tools_fork_and_validate(
    env: ClientEnv, client: SandboxClient, tmp_path: Path
) -> None:
    original = make_dir(tmp_path / "mcp-data", {"v.txt": "0\n"})
    plan = Plan(client, "mcp-fork")
    plan.add_sandbox("data", "copy_on_write", original)
    plan.wait_ready(timeout=90)

    async def agent() -> None:
        async with Client(server(env, "mcp-fork")) as connected:
            await call(connected, "write", sandbox="data", path="v.txt", content="1\n")
            made = await call(connected, "checkpoint", sandbox="data", phase="explore")
            forked = await call(
                connected, "fork", sandbox="data", checkpoint=made["checkpoint"], name="mcp-a"
            )
            assert forked["sandbox"] == "mcp-a"
            read = await call(connected, "read", sandbox="mcp-a", path="v.txt")
            assert read["content"] == "1\n"
            checked = await call(
                connected,
                "validate",
                checks=[{"name": "has-v", "sandbox": "mcp-a", "command": ["test", "-f", "v.txt"]}],
                commit_sandboxes=["mcp-a"],
            )
            assert checked["passed"] is True
            assert checked["checks"][0]["exitCode"] == 0
            review = await call(connected, "review")
            assert [c["name"] for c in review["checks"]] == ["has-v"]

    asyncio.run(agent())
    assert (original / "v.txt").read_text() == "0\n"
    plan.delete(cleanup=True)
