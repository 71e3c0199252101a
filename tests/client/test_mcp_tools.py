"""``sandbox-mcp``'s tools as the MCP library's own clients see them, without a cluster: every
tool listed with its annotations and an output schema (in-memory session), the approval rule of
``request_commit`` (no tool argument can skip it; only the administrator's option), the decision
read from PlanCommits as the operator writes them, and one round trip over streamable HTTP on
127.0.0.1 to the installed console script (the tool's error is the client's typed reason)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client

from sandbox_client.aio import SandboxClient
from sandbox_client.mcp_server import (
    ALLOW_ENV,
    TOOLS,
    PlanTools,
    approval_state,
    build_server,
    parse_args,
)
from tests.support.apiserver.harness import free_port


def tools(kubeconfig: Path) -> PlanTools:
    return PlanTools(SandboxClient(kubeconfig=str(kubeconfig), namespace="ns"), "plan-a", "ns")


def unreachable_kubeconfig(path: Path) -> Path:
    """A kubeconfig whose API server is a closed port on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


def test_every_tool_is_listed_with_its_annotations_and_an_output_schema(tmp_path: Path) -> None:
    server = build_server(tools(unreachable_kubeconfig(tmp_path / "kubeconfig")))

    async def listed() -> list[Any]:
        async with Client(server) as client:
            return list((await client.list_tools()).tools)

    found = {tool.name: tool for tool in asyncio.run(listed())}
    assert set(found) == set(TOOLS) >= {
        "exec", "read", "write", "edit", "delete", "move", "grep", "glob", "stat", "sql",
        "diff", "checkpoint", "restore", "review", "request_commit", "pending_approvals",
        "fork", "validate",
    }  # fmt: skip
    for name, tool in found.items():
        hints = tool.annotations
        assert hints is not None, name
        assert hints.read_only_hint is not None and hints.destructive_hint is not None, name
        assert hints.idempotent_hint is not None, name
        assert (tool.output_schema or {}).get("type") == "object", name
    read_only = {n for n, t in found.items() if t.annotations and t.annotations.read_only_hint}
    assert read_only == {
        "list_sandboxes", "read", "stat", "grep", "glob", "diff", "pending_approvals",
    }  # fmt: skip
    assert found["request_commit"].annotations.destructive_hint is True  # type: ignore[union-attr]
    # The approval is the administrator's option, never a tool argument.
    assert set(found["request_commit"].input_schema["properties"]) == {"message"}
    for name in ("grep", "glob"):
        assert "cursor" in found[name].input_schema["properties"]
    assert "offset" in found["read"].input_schema["properties"]
    assert "offset" in found["diff"].input_schema["properties"]


def test_committing_without_approval_is_off_unless_the_administrator_allows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    assert parse_args(["--plan", "p"]).allow_commit_without_approval is False
    assert parse_args(
        ["--plan", "p", "--allow-commit-without-approval"]
    ).allow_commit_without_approval
    monkeypatch.setenv(ALLOW_ENV, "1")
    assert parse_args(["--plan", "p"]).allow_commit_without_approval is True
    monkeypatch.setenv(ALLOW_ENV, "0")
    assert parse_args(["--plan", "p"]).allow_commit_without_approval is False


def plancommit(phase: str, approved: str | None = None, reason: str = "") -> dict[str, Any]:
    conditions = []
    if approved is not None:
        conditions.append({"type": "Approved", "status": approved, "reason": reason})
    return {
        "metadata": {"name": "pc-1", "namespace": "ns"},
        "spec": {"planId": "plan-a", "action": "Commit", "approval": "Required"},
        "status": {"phase": phase, "conditions": conditions},
    }


def test_the_approval_decision_is_read_from_the_plancommit_status() -> None:
    assert approval_state(plancommit("Pending")) is None
    assert approval_state(plancommit("AwaitingApproval", "False", "AwaitingApproval")) is None
    assert approval_state(plancommit("AwaitingApproval", "False", "DigestMismatch")) is None
    assert approval_state(plancommit("AwaitingApproval", "True", "DigestMatched")) == "approved"
    assert approval_state(plancommit("Committing")) == "approved"
    assert approval_state(plancommit("Committed", "True", "DigestMatched")) == "approved"
    assert approval_state(plancommit("Expired", "False", "Expired")) == "expired"
    assert approval_state(plancommit("Failed", "False", "AwaitingApproval")) == "ended"


def test_a_streamable_http_round_trip_on_loopback(tmp_path: Path) -> None:
    kubeconfig = unreachable_kubeconfig(tmp_path / "kubeconfig")
    port = free_port()
    script = Path(sys.executable).parent / "sandbox-mcp"
    with open(tmp_path / "mcp.log", "wb") as log:
        process = subprocess.Popen(
            [
                str(script), "--plan", "plan-a", "-n", "ns", "--kubeconfig", str(kubeconfig),
                "--transport", "streamable-http", "--host", "127.0.0.1", "--port", str(port),
            ],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert process.poll() is None, (tmp_path / "mcp.log").read_text()
                time.sleep(0.1)

        async def session() -> tuple[set[str], Any]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                names = {tool.name for tool in (await client.list_tools()).tools}
                return names, await client.call_tool("list_sandboxes", {})

        names, failed = asyncio.run(session())
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert names == set(TOOLS)
    assert failed.is_error
    assert "ApiUnreachable" in "".join(getattr(c, "text", "") for c in failed.content)
