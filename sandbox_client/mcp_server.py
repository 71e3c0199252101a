"""``sandbox-mcp``: a Model Context Protocol server for the agents of one plan.

Scoped by its arguments to one plan in one namespace: every tool names a sandbox of *that*
plan (by resource id or Sandbox name) and refuses any other, and every path is checked by the
client (``PathTraversal``: absolute, ``..``, symlinks out of the sandbox). Runs over stdio::

    sandbox-mcp --plan plan-1 --namespace team-a [--context CTX] [--kubeconfig PATH]

Tools: ``list_sandboxes``, ``list_files``, ``read_file``, ``write_file``, ``diff``,
``checkpoint``, ``restore``, ``request_commit``. A failure reaches the agent as a tool error
whose text starts with the condition's reason (``PathTraversal: ...``, ``NotFound: ...``).
Built on the asynchronous client (:mod:`sandbox_client.aio`) and the ``mcp`` package's
``MCPServer``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from sandbox_client.aio import Plan, Sandbox, SandboxClient
from sandbox_client.errors import NotFoundError, RefusedError, SandboxClientError

P = ParamSpec("P")
R = TypeVar("R")

INSTRUCTIONS = (
    "Tools to work inside the sandboxes of plan {plan} (namespace {namespace}). Every write goes "
    "to a sandbox, never to the original resource; paths are relative to the resource root. "
    "Review with diff, snapshot with checkpoint, undo with restore, and ask for the atomic "
    "commit of the whole plan with request_commit."
)


def _tool_errors(func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Turn the client's typed errors into tool errors the agent can read."""

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await func(*args, **kwargs)
        except SandboxClientError as exc:
            raise ToolError(f"{exc.reason}: {exc.message}") from exc

    return wrapper


class PlanTools:
    """The tools' logic, bound to one plan; each method is one MCP tool."""

    def __init__(self, client: SandboxClient, plan_id: str, namespace: str) -> None:
        self.client = client
        self.plan = Plan(client, plan_id, namespace, keep=True)

    async def _sandbox(self, sandbox: str) -> Sandbox:
        """The plan's Sandbox named ``sandbox`` (resource id or object name); others refused."""
        for info in await self.client.list_sandboxes(self.plan.namespace, self.plan.plan_id):
            if sandbox in (info.spec.resource_id, info.name):
                return self.client.sandbox(info.name, self.plan.namespace)
        raise NotFoundError(
            "NotFound", f"plan {self.plan.plan_id} has no sandbox {sandbox!r} (see list_sandboxes)"
        )

    async def list_sandboxes(self) -> list[dict[str, Any]]:
        """The plan's sandboxes: name, resource id, strategy, phase, ready."""
        found = await self.client.list_sandboxes(self.plan.namespace, self.plan.plan_id)
        return [
            {
                "name": s.name,
                "resource_id": s.spec.resource_id,
                "strategy": s.spec.strategy,
                "phase": s.phase.value if s.phase else "",
                "ready": s.ready,
            }
            for s in found
        ]

    async def list_files(self, sandbox: str, path: str = "") -> list[str]:
        """Files below ``path`` in the sandbox (relative paths, recursive, sorted)."""
        return await (await self._sandbox(sandbox)).list_files(path)

    async def read_file(self, sandbox: str, path: str) -> str:
        """The text of ``path`` (UTF-8) in the sandbox."""
        try:
            return await (await self._sandbox(sandbox)).read_file(path)
        except UnicodeDecodeError as exc:
            raise RefusedError("BinaryFile", f"{path} is not UTF-8 text") from exc

    async def write_file(self, sandbox: str, path: str, content: str) -> str:
        """Create or replace ``path`` in the sandbox with ``content`` (UTF-8)."""
        await (await self._sandbox(sandbox)).write_file(path, content)
        return f"wrote {len(content.encode())} bytes to {path}"

    async def diff(self, sandbox: str) -> str:
        """Unified diff of the sandbox against its original ("" when unchanged)."""
        return await (await self._sandbox(sandbox)).diff()

    async def checkpoint(self, sandbox: str, phase: str = "agent") -> dict[str, str]:
        """Snapshot the sandbox now; returns the checkpoint's name for ``restore``."""
        info = await (await self._sandbox(sandbox)).checkpoint(phase)
        return {"checkpoint": info.name, "kind": info.kind, "created_at": info.created_at}

    async def restore(self, sandbox: str, checkpoint: str) -> str:
        """Put the sandbox back to ``checkpoint`` (a name returned by ``checkpoint``)."""
        handle = await self._sandbox(sandbox)
        checkpoints = {c.name for c in await handle.checkpoints()}
        if checkpoint not in checkpoints:
            raise NotFoundError("NotFound", f"sandbox {sandbox} has no checkpoint {checkpoint}")
        await handle.restore(checkpoint)
        return f"restored {sandbox} to {checkpoint}"

    async def request_commit(
        self, message: str = "", timeout_seconds: float = 300.0
    ) -> dict[str, Any]:
        """Commit every sandbox of the plan, all or nothing; wait for the outcome.

        Returns ``committed``, ``phase``, ``rolled_back_ids``, ``failed_rollback_ids`` and the
        conditions (type, status, reason, message).
        """
        result = await self.plan.commit(message=message or None, timeout=timeout_seconds)
        return {
            "plancommit": result.name,
            "committed": result.committed,
            "phase": result.phase.value,
            "rolled_back_ids": result.rolled_back_ids,
            "failed_rollback_ids": result.failed_rollback_ids,
            "failed_sandbox_id": result.failed_sandbox_id,
            "conditions": [
                c.model_dump(include={"type", "status", "reason", "message"})
                for c in result.conditions
            ],
        }


TOOL_NAMES = (
    "list_sandboxes",
    "list_files",
    "read_file",
    "write_file",
    "diff",
    "checkpoint",
    "restore",
    "request_commit",
)


def build_server(tools: PlanTools) -> MCPServer[None]:
    """An ``MCPServer`` exposing every method of ``tools`` named in :data:`TOOL_NAMES`."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[None]) -> AsyncIterator[None]:
        try:
            yield None
        finally:
            await tools.client.close()  # the HTTP session of the Kubernetes client

    server: MCPServer[None] = MCPServer(
        "sandbox",
        instructions=INSTRUCTIONS.format(plan=tools.plan.plan_id, namespace=tools.plan.namespace),
        lifespan=lifespan,
    )
    for name in TOOL_NAMES:
        server.add_tool(_tool_errors(getattr(tools, name)), name=name)
    return server


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``--plan`` (required), ``-n/--namespace``, ``--context``, ``--kubeconfig``."""
    parser = argparse.ArgumentParser(
        prog="sandbox-mcp", description="MCP server for the sandboxes of one plan (stdio)."
    )
    parser.add_argument("--plan", required=True, help="The plan id (spec.planId).")
    parser.add_argument("-n", "--namespace", default=None, help="Namespace of the plan.")
    parser.add_argument("--context", default=None, help="kubeconfig context.")
    parser.add_argument("--kubeconfig", default=None, help="Path of the kubeconfig file.")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point ``sandbox-mcp``: serve over stdio until the client disconnects."""
    args = parse_args(argv)
    client = SandboxClient(
        kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace
    )
    server = build_server(PlanTools(client, args.plan, client.namespace))
    server.run("stdio")
