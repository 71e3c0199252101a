"""``sandbox-mcp``: a Model Context Protocol server for the agents of one plan.

Scoped by its arguments to one plan in one namespace: every tool names a sandbox of *that*
plan (by resource id or Sandbox name) and refuses any other, and every path is checked by the
client and again by the door (``PathTraversal``: absolute, ``..``, symlinks, ``.git``)::

    sandbox-mcp --plan plan-1 --namespace team-a [--context CTX] [--kubeconfig PATH]
                [--transport stdio | streamable-http] [--host 127.0.0.1] [--port 8000]
                [--approval-wait-seconds 120] [--allow-commit-without-approval]

Tools (each with its MCP annotations: ``readOnlyHint``, ``destructiveHint``,
``idempotentHint``, ``openWorldHint``; each returns structured content):

- ``list_sandboxes``; ``exec`` (a command in the sandbox's jail: exit code, output capped per
  stream); ``read`` (a capped range, ``next_offset`` continues); ``write`` (or append);
  ``edit`` (exact text, refused when absent or not unique); ``delete``; ``move``; ``stat``;
  ``grep`` and ``glob`` (capped, ``next_cursor`` continues); ``sql`` (``transaction_rollback``
  sandboxes); ``diff`` (capped, ``next_offset`` continues); ``checkpoint``; ``restore``;
  ``fork`` (a new sandbox from a checkpoint); ``validate`` (pre-commit checks, docs/forks.md);
- ``review``: the plan's review (files, lines, statements, conflicts and the ``digest``),
  made by a PlanCommit that waits for an approval;
- ``pending_approvals``: the plan's PlanCommits waiting for approvals, with the digest, the
  decisions recorded so far and the command a person runs to decide
  (``kubectl sandbox review --web PLAN -n NS``);
- ``request_commit``: asks for the atomic commit of the whole plan. It **never commits
  without a person's approval** unless the administrator started the server with
  ``--allow-commit-without-approval`` (or ``SANDBOX_MCP_ALLOW_COMMIT_WITHOUT_APPROVAL=1``):
  no tool argument can. It makes (or finds) the PlanCommit waiting for the approval, returns
  its review and digest, and waits, at most ``--approval-wait-seconds``, for the approval
  recorded on the PlanCommit (a person's named approval, docs/approvals.md); then it waits
  for the commit's outcome. Past the wait it returns ``status: awaiting_approval`` with the
  review page's command for a person (``review_command``); calling it again keeps waiting on
  the same PlanCommit. The server's own identity cannot approve (the admission policy refuses
  service accounts and the creator); the administrator's option writes the older, unnamed
  ``spec.approvedDigest``, which counts only where named approvals are not required.

A failure reaches the agent as a tool error whose text starts with the reason
(``PathTraversal: ...``, ``NotFound: ...``, ``InvalidOperation: ...``). Built on the
asynchronous client (:mod:`sandbox_client.aio`) and the ``mcp`` package's ``MCPServer``.
"""

from __future__ import annotations

import argparse
import base64
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from sandbox_client import _logic
from sandbox_client.aio import Plan, Sandbox, SandboxClient
from sandbox_client.errors import (
    NotFoundError,
    RefusedError,
    SandboxClientError,
    WaitTimeoutError,
)
from sandbox_client.models import (
    PLANCOMMIT_PLURAL,
    ExecResult,
    PlanCommitPhase,
    PlanCommitResult,
    PlanReview,
    find,
)

P = ParamSpec("P")
R = TypeVar("R")

ALLOW_ENV = "SANDBOX_MCP_ALLOW_COMMIT_WITHOUT_APPROVAL"
DEFAULT_APPROVAL_WAIT_SECONDS = 120.0
DEFAULT_REVIEW_TIMEOUT_SECONDS = 300.0
DEFAULT_COMMIT_TIMEOUT_SECONDS = 600.0
MAX_READ_BYTES = 256 * 1024  # one read's cap
DEFAULT_READ_BYTES = 64 * 1024
MAX_OUTPUT_BYTES = 256 * 1024  # a command's output kept per stream
DEFAULT_OUTPUT_BYTES = 64 * 1024
MAX_LISTING = 1000  # grep matches or glob paths per page
MAX_DIFF_CHARS = 200_000
DEFAULT_DIFF_CHARS = 50_000
MAX_ROWS = 1000

INSTRUCTIONS = (
    "Tools to work inside the sandboxes of plan {plan} (namespace {namespace}). Every write goes "
    "to a sandbox, never to the original resource; paths are relative to the resource root. "
    "Run commands with exec, change files with write and edit, query databases with sql, "
    "review with diff and review, snapshot with checkpoint, undo with restore, and ask for the "
    "atomic commit of the whole plan with request_commit: a person approves the reviewed "
    "digest before anything is committed."
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


def approval_state(obj: dict[str, Any]) -> str | None:
    """Whether a person's approval of the PlanCommit ``obj`` (a raw object) is recorded:
    ``"approved"`` once the operator matched it (the ``Approved`` condition True, or the phase
    moved past ``AwaitingApproval`` to the commit), ``"expired"`` when it ended without one,
    ``"ended"`` for another end (failed before any approval), None while it waits.

    The one place that reads how an approval is recorded: the operator's ``Approved``
    condition, True (reason ``Approved``) once enough people's named approvals count, or
    ``DigestMatched`` for the older ``spec.approvedDigest``; then phase ``Committing``.
    """
    result = PlanCommitResult.from_object(obj)
    approved = find(result.conditions, "Approved")
    if approved is not None and approved.status == "True":
        return "approved"
    phase = result.phase
    if phase is PlanCommitPhase.EXPIRED:
        return "expired"
    if phase in (PlanCommitPhase.COMMITTING, PlanCommitPhase.COMMITTED):
        return "approved"
    if phase.is_terminal:
        return "ended"
    return None


def _approval_decided(name: str) -> _logic.Predicate[str]:
    def check(objects: _logic.Objects) -> str | None:
        obj = objects.get(name)
        if obj is None:
            raise NotFoundError("NotFound", f"PlanCommit {name} was deleted while waiting")
        return approval_state(obj)

    return check


def _review(review: PlanReview) -> dict[str, Any]:
    return review.model_dump(mode="json", exclude={"conditions"})


def _result(result: PlanCommitResult) -> dict[str, Any]:
    return {
        "plancommit": result.name,
        "committed": result.committed,
        "phase": result.phase.value,
        "rolled_back_ids": result.rolled_back_ids,
        "failed_rollback_ids": result.failed_rollback_ids,
        "failed_sandbox_id": result.failed_sandbox_id,
        "conditions": [
            c.model_dump(include={"type", "status", "reason", "message"}) for c in result.conditions
        ],
    }


def _text(data: bytes) -> tuple[str, str, int]:
    """``data`` as (content, encoding, bytes used): UTF-8 text when it is (a character cut at
    the end is left for the next read), else base64."""
    for cut in range(4):
        try:
            return data[: len(data) - cut].decode(), "utf-8", len(data) - cut
        except UnicodeDecodeError:
            continue
    return base64.b64encode(data).decode(), "base64", len(data)


def _output(result: ExecResult) -> dict[str, Any]:
    out = result.model_dump(mode="json", exclude={"stdout", "stderr", "replayed"})
    for name in ("stdout", "stderr"):
        data: bytes = getattr(result, name)
        out[name] = data.decode(errors="replace")
        out[f"{name}_truncated"] = getattr(result, f"{name}_bytes") > len(data)
    return out


def _cap(value: int, cap: int) -> int:
    return max(1, min(int(value), cap))


class PlanTools:
    """The tools' logic, bound to one plan; each method is one MCP tool.

    Args:
        client: the asynchronous client.
        plan_id / namespace: the plan the server is scoped to.
        allow_commit_without_approval: the administrator's server option (never a tool's).
        approval_wait_seconds: how long ``request_commit`` waits for an approval, at most.
    """

    def __init__(
        self,
        client: SandboxClient,
        plan_id: str,
        namespace: str,
        *,
        allow_commit_without_approval: bool = False,
        approval_wait_seconds: float = DEFAULT_APPROVAL_WAIT_SECONDS,
        review_timeout_seconds: float = DEFAULT_REVIEW_TIMEOUT_SECONDS,
        commit_timeout_seconds: float = DEFAULT_COMMIT_TIMEOUT_SECONDS,
    ) -> None:
        self.client = client
        self.plan = Plan(client, plan_id, namespace, keep=True)
        self.allow_commit_without_approval = allow_commit_without_approval
        self.approval_wait_seconds = approval_wait_seconds
        self.review_timeout_seconds = review_timeout_seconds
        self.commit_timeout_seconds = commit_timeout_seconds

    async def _sandbox(self, sandbox: str) -> Sandbox:
        """The plan's Sandbox named ``sandbox`` (resource id or object name); others refused."""
        for info in await self.client.list_sandboxes(self.plan.namespace, self.plan.plan_id):
            if sandbox in (info.spec.resource_id, info.name):
                return self.client.sandbox(info.name, self.plan.namespace)
        raise NotFoundError(
            "NotFound", f"plan {self.plan.plan_id} has no sandbox {sandbox!r} (see list_sandboxes)"
        )

    async def list_sandboxes(self) -> dict[str, Any]:
        """The plan's sandboxes: name, resource id, strategy, phase, ready."""
        found = await self.client.list_sandboxes(self.plan.namespace, self.plan.plan_id)
        return {
            "sandboxes": [
                {
                    "name": s.name,
                    "resource_id": s.spec.resource_id,
                    "strategy": s.spec.strategy,
                    "phase": s.phase.value if s.phase else "",
                    "ready": s.ready,
                }
                for s in found
            ]
        }

    async def exec(
        self,
        sandbox: str,
        command: list[str] | None = None,
        shell: str | None = None,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        stdin: str = "",
        timeout_seconds: float = 300.0,
        max_output_bytes: int = DEFAULT_OUTPUT_BYTES,
    ) -> dict[str, Any]:
        """Run a command inside the sandbox (an isolated jail that sees only the sandbox's
        files): ``command`` as an argv list, or ``shell`` as a /bin/sh line. Returns
        exit_code, stdout, stderr (each capped at max_output_bytes, at most 262144; the
        *_truncated flags say when cut), timed_out, signal, duration_seconds."""
        if (command is None) == (shell is None):
            raise RefusedError("Invalid", "give exactly one of command (a list) and shell")
        handle = await self._sandbox(sandbox)
        result = await handle.exec(
            shell if shell is not None else list(command or []),
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout=timeout_seconds,
            max_output_bytes=_cap(max_output_bytes, MAX_OUTPUT_BYTES),
        )
        return _output(result)

    async def read(
        self, sandbox: str, path: str, offset: int = 0, max_bytes: int = DEFAULT_READ_BYTES
    ) -> dict[str, Any]:
        """Read ``path`` from ``offset``: at most max_bytes (at most 262144). Returns content
        (encoding utf-8, or base64 for binary), size of the whole file, and next_offset to
        continue (null at the end)."""
        handle = await self._sandbox(sandbox)
        size = (await handle.stat(path)).size
        data = await handle.read_range(path, offset, _cap(max_bytes, MAX_READ_BYTES))
        content, encoding, used = _text(data)
        end = offset + used
        return {
            "path": path,
            "offset": offset,
            "content": content,
            "encoding": encoding,
            "size": size,
            "next_offset": end if end < size else None,
        }

    async def write(
        self, sandbox: str, path: str, content: str, append: bool = False
    ) -> dict[str, Any]:
        """Create or replace ``path`` with ``content`` (UTF-8), or append it; parent
        directories are made."""
        handle = await self._sandbox(sandbox)
        done = await (handle.append(path, content) if append else handle.write(path, content))
        return done.model_dump(exclude_none=True)

    async def edit(
        self, sandbox: str, path: str, old: str, new: str, replace_all: bool = False
    ) -> dict[str, Any]:
        """Replace the exact text ``old`` by ``new`` in ``path``. Refused when ``old`` is not
        in the file, or occurs more than once (unless replace_all); returns occurrences."""
        handle = await self._sandbox(sandbox)
        done = await handle.edit(path, old, new, replace_all=replace_all)
        return done.model_dump(exclude_none=True)

    async def delete(self, sandbox: str, path: str, recursive: bool = False) -> dict[str, Any]:
        """Delete a file, or a directory (empty, or with recursive)."""
        handle = await self._sandbox(sandbox)
        return (await handle.delete_path(path, recursive=recursive)).model_dump(exclude_none=True)

    async def move(
        self, sandbox: str, path: str, to: str, overwrite: bool = False
    ) -> dict[str, Any]:
        """Move or rename ``path`` to ``to`` (refused when ``to`` exists, unless overwrite)."""
        handle = await self._sandbox(sandbox)
        return (await handle.move(path, to, overwrite=overwrite)).model_dump(exclude_none=True)

    async def stat(self, sandbox: str, path: str) -> dict[str, Any]:
        """type (file, dir, symlink, special), size, mode, mtime of ``path``."""
        return (await (await self._sandbox(sandbox)).stat(path)).model_dump(exclude_none=True)

    async def grep(
        self,
        sandbox: str,
        pattern: str,
        path: str = ".",
        glob: str | None = None,
        ignore_case: bool = False,
        max_matches: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Lines matching the regular expression ``pattern`` below ``path`` (only files
        matching the shell pattern ``glob``): at most max_matches (at most 1000); pass
        next_cursor back as cursor for the next page."""
        handle = await self._sandbox(sandbox)
        found = await handle.grep(
            pattern, path=path, glob=glob, ignore_case=ignore_case,
            max_matches=_cap(max_matches, MAX_LISTING), cursor=cursor,
        )  # fmt: skip
        return found.model_dump()

    async def glob(
        self,
        sandbox: str,
        pattern: str,
        path: str = ".",
        max_results: int = 200,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Paths below ``path`` matching the shell pattern (``*``, ``?``, ``**``): at most
        max_results (at most 1000); pass next_cursor back as cursor for the next page."""
        handle = await self._sandbox(sandbox)
        found = await handle.glob(
            pattern, path=path, max_results=_cap(max_results, MAX_LISTING), cursor=cursor
        )
        return found.model_dump()

    async def sql(
        self,
        sandbox: str,
        statement: str,
        params: list[Any] | dict[str, Any] | None = None,
        max_rows: int = 200,
    ) -> dict[str, Any]:
        """Run one SQL statement in a database sandbox's transaction (nothing reaches the
        database before the plan's commit). Returns columns, rows (at most max_rows, at most
        1000; truncated when cut), rowcount, last_id."""
        handle = await self._sandbox(sandbox)
        done = await handle.sql(statement, params, max_rows=_cap(max_rows, MAX_ROWS))
        return done.model_dump(mode="json")

    async def diff(
        self, sandbox: str, offset: int = 0, max_chars: int = DEFAULT_DIFF_CHARS
    ) -> dict[str, Any]:
        """Unified diff of the sandbox against its original, from character ``offset``: at
        most max_chars (at most 200000); next_offset continues (null at the end)."""
        text = await (await self._sandbox(sandbox)).diff()
        end = offset + _cap(max_chars, MAX_DIFF_CHARS)
        return {
            "diff": text[offset:end],
            "offset": offset,
            "total_chars": len(text),
            "next_offset": end if end < len(text) else None,
        }

    async def checkpoint(self, sandbox: str, phase: str = "agent") -> dict[str, Any]:
        """Snapshot the sandbox now; returns the checkpoint's name for ``restore``."""
        info = await (await self._sandbox(sandbox)).checkpoint(phase)
        return {"checkpoint": info.name, "kind": info.kind, "created_at": info.created_at}

    async def restore(self, sandbox: str, checkpoint: str) -> dict[str, Any]:
        """Put the sandbox back to ``checkpoint`` (a name returned by ``checkpoint``)."""
        handle = await self._sandbox(sandbox)
        checkpoints = {c.name for c in await handle.checkpoints()}
        if checkpoint not in checkpoints:
            raise NotFoundError("NotFound", f"sandbox {sandbox} has no checkpoint {checkpoint}")
        await handle.restore(checkpoint)
        return {"sandbox": sandbox, "restored": checkpoint}

    async def fork(self, sandbox: str, checkpoint: str, name: str) -> dict[str, Any]:
        """Start a new sandbox ``name`` of this plan from ``checkpoint`` of ``sandbox``: the
        same original, with ``sandbox``'s change up to the checkpoint as its own. Use forks to
        try several approaches side by side; ``validate`` checks them, and the plan commits
        one (docs/forks.md)."""
        handle = await self._sandbox(sandbox)
        checkpoints = {c.name for c in await handle.checkpoints()}
        if checkpoint not in checkpoints:
            raise NotFoundError("NotFound", f"sandbox {sandbox} has no checkpoint {checkpoint}")
        made = await handle.fork(checkpoint, name=name)
        info = await made.wait_ready()
        return {"sandbox": info.name, "forked_from": handle.name, "checkpoint": checkpoint}

    async def validate(
        self, checks: list[dict[str, Any]], commit_sandboxes: list[str] | None = None
    ) -> dict[str, Any]:
        """Run pre-commit checks: each ``{"name", "sandbox", "command": [argv...],
        "timeoutSeconds"}`` runs in that sandbox of this plan before anything is prepared.
        ``commit_sandboxes``: the sandboxes the plan will commit (the others are discarded
        then; default all). Returns each check's exit code and last output lines; when all
        passed the plan waits for a person's approval of its review (``review``)."""
        wanted = []
        for check in checks:
            resolved = await self._sandbox(str(check.get("sandbox") or ""))
            wanted.append({**check, "sandbox": resolved.name})
        chosen = None
        if commit_sandboxes:
            chosen = [(await self._sandbox(name)).name for name in commit_sandboxes]
        results = await self.plan.validate(
            wanted, sandboxes=chosen, timeout=self.review_timeout_seconds
        )
        return {"passed": all(r.get("passed") for r in results), "checks": results}

    async def review(self, message: str = "") -> dict[str, Any]:
        """The review of the plan's changes (per sandbox: files added, changed, deleted,
        lines, statements, conflicts) and its digest, which a person approves."""
        found = await self.plan.review(message=message or None, timeout=self.review_timeout_seconds)
        return _review(found)

    def review_command(self) -> str:
        """The command a person runs to read the plan's changes and approve or reject them
        on a local page with their own credentials."""
        return f"kubectl sandbox review --web {self.plan.plan_id} -n {self.plan.namespace}"

    async def pending_approvals(self) -> dict[str, Any]:
        """The plan's PlanCommits waiting for a person's approval: digest, creator, decisions
        recorded so far and who counts as approved; ``review_command`` is what a person runs
        to review and decide. An agent cannot approve (its identity is refused)."""
        found = await self.plan.pending()
        return {
            "pending": [
                {
                    "plancommit": r.plancommit,
                    "digest": r.digest,
                    "created_by": r.created_by,
                    "approved_by": r.approved_by,
                    "decisions": [d.model_dump(mode="json") for d in r.approvals],
                }
                for r in found
            ],
            "review_command": self.review_command(),
        }

    async def request_commit(self, message: str = "") -> dict[str, Any]:
        """Ask for the atomic commit of every sandbox of the plan. Nothing is committed until
        a person approves the reviewed digest: returns the review and the digest, waits a
        bounded time for the approval, then for the outcome. status: committed, failed,
        awaiting_approval (call again to keep waiting), expired or ended."""
        review = await self.plan.review(
            message=message or None, timeout=self.review_timeout_seconds
        )
        base = {"plancommit": review.plancommit, "digest": review.digest, "review": _review(review)}
        if self.allow_commit_without_approval:
            # The administrator's option: the older, unnamed approval (spec.approvedDigest),
            # which counts only where nobody asked for named approvals (docs/approvals.md).
            await self.client.patch_object(
                PLANCOMMIT_PLURAL,
                review.plancommit,
                {"spec": {"approvedDigest": review.digest}},
                self.plan.namespace,
            )
            result = await self.client.wait(
                PLANCOMMIT_PLURAL,
                _logic.plancommit_progress(review.plancommit, None),
                self.commit_timeout_seconds,
                f"commit of plan {self.plan.plan_id} ({review.plancommit})",
                namespace=self.plan.namespace,
                name=review.plancommit,
            )
            return {
                **base,
                "status": "committed" if result.committed else "failed",
                "approved_by": "server option --allow-commit-without-approval",
                "result": _result(result),
            }
        try:
            decision = await self.client.wait(
                PLANCOMMIT_PLURAL,
                _approval_decided(review.plancommit),
                self.approval_wait_seconds,
                f"approval of plan {self.plan.plan_id} ({review.plancommit})",
                namespace=self.plan.namespace,
                name=review.plancommit,
            )
        except WaitTimeoutError:
            return {
                **base,
                "status": "awaiting_approval",
                "review_command": self.review_command(),
                "message": (
                    f"nothing is committed until a person approves digest {review.digest}: "
                    f"ask them to run `{self.review_command()}` (a local page with every "
                    "diff and Approve / Reject buttons acting as them) or `kubectl sandbox "
                    f"approve {self.plan.plan_id} -n {self.plan.namespace} --digest "
                    f"{review.digest}`; call request_commit again to keep waiting"
                ),
            }
        if decision != "approved":
            return {**base, "status": decision}
        result = await self.client.wait(
            PLANCOMMIT_PLURAL,
            _logic.plancommit_progress(review.plancommit, None),
            self.commit_timeout_seconds,
            f"commit of plan {self.plan.plan_id} ({review.plancommit})",
            namespace=self.plan.namespace,
            name=review.plancommit,
        )
        return {
            **base,
            "status": "committed" if result.committed else "failed",
            "approved_by": "a person (the PlanCommit's approval)",
            "result": _result(result),
        }


def _hints(read_only: bool, destructive: bool, idempotent: bool, world: bool = False) -> ToolAnnotations:  # fmt: skip  # noqa: E501
    return ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=world,
    )


TOOLS: dict[str, ToolAnnotations] = {
    "list_sandboxes": _hints(True, False, True),
    "exec": _hints(False, True, False, world=True),  # a command may change anything it sees
    "read": _hints(True, False, True),
    "write": _hints(False, True, False),  # replaces a file (or appends)
    "edit": _hints(False, True, False),
    "delete": _hints(False, True, True),
    "move": _hints(False, True, False),
    "stat": _hints(True, False, True),
    "grep": _hints(True, False, True),
    "glob": _hints(True, False, True),
    "sql": _hints(False, True, False),
    "diff": _hints(True, False, True),
    "checkpoint": _hints(False, False, False),
    "restore": _hints(False, True, True),
    "fork": _hints(False, False, False),  # a new sandbox; the original untouched
    "validate": _hints(False, True, False, world=True),  # commands, as exec
    "review": _hints(False, False, True),  # a PlanCommit that only waits; nothing applied
    "pending_approvals": _hints(True, False, True),
    "request_commit": _hints(False, True, False, world=True),  # the originals, once approved
}
"""Every tool and its annotations (MCP ``ToolAnnotations``)."""
TOOL_NAMES = tuple(TOOLS)


def build_server(tools: PlanTools) -> MCPServer[None]:
    """An ``MCPServer`` exposing every method of ``tools`` named in :data:`TOOLS`."""

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
    for name, hints in TOOLS.items():
        server.add_tool(
            _tool_errors(getattr(tools, name)),
            name=name,
            annotations=hints,
            structured_output=True,
        )
    return server


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``--plan`` (required), ``-n/--namespace``, ``--context``, ``--kubeconfig``,
    ``--transport``, ``--host``, ``--port``, ``--approval-wait-seconds``,
    ``--allow-commit-without-approval``."""
    parser = argparse.ArgumentParser(
        prog="sandbox-mcp", description="MCP server for the sandboxes of one plan."
    )
    parser.add_argument("--plan", required=True, help="The plan id (spec.planId).")
    parser.add_argument("-n", "--namespace", default=None, help="Namespace of the plan.")
    parser.add_argument("--context", default=None, help="kubeconfig context.")
    parser.add_argument("--kubeconfig", default=None, help="Path of the kubeconfig file.")
    parser.add_argument(
        "--transport", choices=("stdio", "streamable-http"), default="stdio",
        help="stdio (default), or streamable HTTP on --host:--port at /mcp.",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="streamable-http: address.")
    parser.add_argument("--port", type=int, default=8000, help="streamable-http: port.")
    parser.add_argument(
        "--approval-wait-seconds", type=float, default=DEFAULT_APPROVAL_WAIT_SECONDS,
        help="How long request_commit waits for a person's approval in one call.",
    )  # fmt: skip
    parser.add_argument(
        "--allow-commit-without-approval", action="store_true",
        default=_flag(os.environ.get(ALLOW_ENV)),
        help=f"request_commit approves the reviewed digest itself (also {ALLOW_ENV}=1). "
        "For unattended plans an administrator trusts; off by default.",
    )  # fmt: skip
    return parser.parse_args(argv)


def tools_from_args(args: argparse.Namespace) -> PlanTools:
    """The :class:`PlanTools` the arguments describe (a new client)."""
    client = SandboxClient(
        kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace
    )
    return PlanTools(
        client,
        args.plan,
        client.namespace,
        allow_commit_without_approval=args.allow_commit_without_approval,
        approval_wait_seconds=args.approval_wait_seconds,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point ``sandbox-mcp``: serve over stdio until the client disconnects, or
    over streamable HTTP until stopped."""
    args = parse_args(argv)
    server = build_server(tools_from_args(args))
    if args.transport == "streamable-http":
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run("stdio")
