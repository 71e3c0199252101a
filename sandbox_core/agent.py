"""The workspace agent: a workspace Pod's main process, serving sandbox operations over HTTP.

Issue 8, "A workspace agent instead of exec". One long-lived process (``sandbox-core
serve-workspace``) keeps the core in memory and answers the operator over the pod network, so a
call costs one HTTP round trip instead of an exec that starts a Python process.

Security:

- Every request except ``GET /healthz`` carries ``Authorization: Bearer <token>`` (or, through
  the API server's pod proxy, ``X-Sandbox-Agent-Token: <token>``); the token is
  read from a file (a Secret the operator creates per Sandbox, mounted as a file: never an
  environment variable or an argument) and compared in constant time. No token file, no service.
- A DSN arrives as a reference, ``env:NAME`` (the kubelet filled ``NAME`` from the Sandbox's
  Secret through ``secretKeyRef``); every reply shows the reference, never the value.

Idempotency: a changing request (POST, PUT, DELETE) carries ``X-Request-Id``; every reply
describing a sandbox has its ``revision`` (a counter of the agent's changes to it), which callers
put into their ids. Its reply is
stored under the state directory before it is sent, so the same id sent again - a retry after a
lost reply or an operator restart - gets the stored reply and does nothing twice (header
``X-Idempotent-Replay: true``). Requests run one at a time (one worker thread): the agent
serves one Sandbox and the core's operations are not meant to overlap.

Routes (JSON in and out; errors are ``{"error": {"type", "message"}}``)::

    GET    /healthz                               "ok" (unauthenticated; readiness probe)
    POST   /v1/sandboxes                          create (idempotent by sandbox_id)
    GET    /v1/sandboxes/{id}                     status
    POST   /v1/sandboxes/{id}/activate            CREATED/ROLLED_BACK -> ACTIVE
    GET    /v1/sandboxes/{id}/path?path=REL       sandbox path of REL (refuses traversal)
    GET    /v1/sandboxes/{id}/files?path=REL      read a file (base64)
    PUT    /v1/sandboxes/{id}/files?path=REL      write a file (request body = content)
    GET    /v1/sandboxes/{id}/list?path=REL       list a directory
    GET    /v1/sandboxes/{id}/diff                unified diff
    POST   /v1/sandboxes/{id}/commit              {"message"}
    POST   /v1/sandboxes/{id}/rollback            {"reactivate": bool}
    POST   /v1/sandboxes/{id}/checkpoints         {"phase", "metadata"}
    POST   /v1/checkpoints/{cid}/restore          restore
    DELETE /v1/sandboxes/{id}                     cleanup
    GET    /v1/sandboxes/{id}/review              change summary (issue 9; no locks, no change)
    POST   /v1/sandboxes/{id}/prepare             {"txid", "message"} -> the PreparedCommit
    POST   /v1/sandboxes/{id}/apply-prepared      {"txid"} -> the CommitResult
    POST   /v1/sandboxes/{id}/abort-prepared      {"txid"}
    GET    /v1/sandboxes/{id}/commit-landed       {"landed": true|false|null} (recovery probe)

Two-phase plan commit (issue 9): the three POST routes are idempotent by request id like the
others, and by transaction id in the core (``apply_prepared`` and ``abort_prepared`` may run
again). Their failures are not remembered: a failed apply keeps the sandbox's status so the
coordinator retries it, and a replayed failure would refuse that retry. A participant that
cannot prepare durably (``prepares_durably`` false in every sandbox reply: SQLite holds its
prepared writes in an open connection) is kept in this process between ``prepare`` and
``apply-prepared``/``abort-prepared``; an agent restart in between loses the prepare, as the
last resource's contract allows (its ``apply`` is the decision, recovery asks the status).

This module is the only one of ``sandbox_core`` that imports aiohttp; nothing else imports it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from sandbox_core._describe import describe as describe_sandbox
from sandbox_core._dsn import same_database
from sandbox_core._dsn import secrets_of as dsn_secrets
from sandbox_core.base import BaseSandbox
from sandbox_core.errors import (
    ChangedSinceApprovalError,
    SandboxCommitError,
    SandboxError,
    SandboxStateError,
)
from sandbox_core.factory import SandboxFactory
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.host.store import SandboxStore
from sandbox_core.status import SandboxStatus

logger = logging.getLogger("sandbox_core.agent")

DEFAULT_PORT = 8471
TOKEN_FILE = "/var/run/sandbox-agent/token"  # noqa: S105 - a path, not a token
REQUEST_ID_HEADER = "X-Request-Id"
# The token for callers that reach the agent through the API server's pod proxy (the engine's
# client, issue 10): the API server consumes ``Authorization`` (its own credentials) and never
# forwards it, so the proxied request carries the agent token in this header instead.
TOKEN_HEADER = "X-Sandbox-Agent-Token"  # noqa: S105 - a header name, not a token
REPLAY_HEADER = "X-Idempotent-Replay"
ENV_REF = "env:"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_TXID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # the coordinator's transaction ids (issue 9)
RESTORABLE = (SandboxStatus.CREATED, SandboxStatus.ACTIVE, SandboxStatus.ROLLED_BACK)


class AgentError(Exception):
    """A request the agent refuses; ``status`` is the HTTP status of the reply."""

    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_


@dataclass(frozen=True)
class AgentConfig:
    """Where the agent keeps its state and how it listens.

    ``secret_env``: names of environment variables whose values are secrets (DSNs); replies
    show ``env:NAME`` instead of the value.
    """

    state_dir: Path
    sandbox_root: Path
    token_file: Path = Path(TOKEN_FILE)
    host: str = "0.0.0.0"  # noqa: S104 - the pod network; a NetworkPolicy admits only the operator
    port: int = DEFAULT_PORT
    secret_env: tuple[str, ...] = ("SANDBOX_SOURCE_DSN",)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> AgentConfig:
        """Read ``SANDBOX_CORE_STATE_DIR``, ``SANDBOX_CORE_ROOT``, ``SANDBOX_AGENT_TOKEN_FILE``,
        ``SANDBOX_AGENT_PORT`` (defaults: ~/.local/state/sandbox-core, <state>/sandboxes,
        /var/run/sandbox-agent/token, 8471)."""
        env = dict(os.environ if environ is None else environ)
        state = Path(env.get("SANDBOX_CORE_STATE_DIR") or Path.home() / ".local/state/sandbox-core")
        return cls(
            state_dir=state,
            sandbox_root=Path(env.get("SANDBOX_CORE_ROOT") or state / "sandboxes"),
            token_file=Path(env.get("SANDBOX_AGENT_TOKEN_FILE") or TOKEN_FILE),
            port=int(env.get("SANDBOX_AGENT_PORT") or DEFAULT_PORT),
            environ=env,
        )


class Operations:
    """The sandbox operations, synchronous, on one state directory (run in the worker thread)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.store = SandboxStore(str(config.state_dir))
        self.factory = SandboxFactory()
        self.checkpoints = CheckpointManager(state_dir=str(config.state_dir))
        # Prepared participants that cannot prepare durably, by (sandbox id, txid).
        self._held: dict[tuple[str, str], BaseSandbox] = {}

    # -- secrets ------------------------------------------------------------------------------

    def resolve(self, original: str) -> str:
        """``env:NAME`` -> the value of ``NAME``; anything else as is.

        Raises:
            AgentError: 422 when ``NAME`` is not set in the Pod.
        """
        if not original.startswith(ENV_REF):
            return original
        name = original[len(ENV_REF) :]
        value = self.config.environ.get(name)
        if not value:
            raise AgentError(422, "MissingSecret", f"environment variable {name} is not set")
        return value

    def hide(self, payload: Any) -> Any:
        """``payload`` with every secret environment value replaced by its ``env:NAME``."""
        text = json.dumps(payload, default=str)
        for name in self.config.secret_env:
            value = self.config.environ.get(name)
            if value and len(value) >= 4:
                text = text.replace(json.dumps(value)[1:-1], ENV_REF + name)
        return json.loads(text)

    # -- helpers ------------------------------------------------------------------------------

    def _revision_path(self, sandbox_id: str) -> Path:
        return self.config.state_dir / "revisions" / sandbox_id

    def revision(self, sandbox_id: str) -> int:
        """How many times the agent changed this sandbox (0 when never). Callers put it into
        their request ids, so one logical call is deduplicated while a new one after any
        change is a new request."""
        try:
            return int(self._revision_path(sandbox_id).read_text())
        except (OSError, ValueError):
            return 0

    def _save(self, sandbox: BaseSandbox) -> None:
        self.store.save(sandbox)
        self._bump(sandbox.sandbox_id)

    def _bump(self, sandbox_id: str) -> None:
        path = self._revision_path(sandbox_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(self.revision(sandbox_id) + 1))

    def _reopen(self, record: dict[str, Any]) -> BaseSandbox:
        """Re-open from a record; a database sandbox gets its password back from the Pod's
        secret environment (records keep DSNs redacted, issue 7)."""
        sandbox = self.factory.reopen(record)
        use_credentials = getattr(sandbox, "use_credentials", None)
        if use_credentials is None:
            return sandbox
        for name in self.config.secret_env:
            dsn = os.environ.get(name, "")
            if dsn_secrets(dsn) and same_database(dsn, sandbox.original_path):
                use_credentials(dsn)
                break
        return sandbox

    def load(self, sandbox_id: str) -> BaseSandbox:
        """Re-open a stored sandbox.

        Raises:
            AgentError: 404 when unknown.
        """
        try:
            record = self.store.load(sandbox_id)
        except SandboxError as exc:
            raise AgentError(404, "NotFound", str(exc)) from exc
        return self._reopen(record)

    def describe(self, sandbox: BaseSandbox) -> dict[str, Any]:
        """The reply shape of one sandbox: the CLI's ``status --json`` shape without the
        top-level ``original_path`` (the record holds it), plus the agent's ``revision``."""
        reply = describe_sandbox(sandbox)
        del reply["original_path"]
        reply["revision"] = self.revision(sandbox.sandbox_id)
        reply["prepares_durably"] = bool(getattr(sandbox, "prepares_durably", True))
        return reply

    # -- operations ---------------------------------------------------------------------------

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create (or re-open: same ``sandbox_id``) a sandbox and return it (case 18)."""
        sandbox_id = str(body.get("sandbox_id") or "")
        if sandbox_id:
            try:
                sandbox = self._reopen(self.store.load(sandbox_id))
            except SandboxError:
                sandbox = None
            if sandbox is not None and sandbox.status is not SandboxStatus.PENDING:
                return self.describe(sandbox)
            if sandbox is not None:
                sandbox.cleanup()  # a create that died half-way: start again under the same id
        options: dict[str, Any] = {str(k): v for k, v in dict(body.get("options") or {}).items()}
        options.setdefault("sandbox_root", str(self.config.sandbox_root))
        if sandbox_id:
            options["sandbox_id"] = sandbox_id
        sandbox = self.factory.create(
            str(body["strategy"]),
            str(body["resource_id"]),
            self.resolve(str(body["original"])),
            **options,
        )
        self._save(sandbox)
        try:
            sandbox.create(str(body["plan_id"]))
        except SandboxError:
            sandbox.cleanup()
            self.store.delete(sandbox.sandbox_id)
            raise
        self._save(sandbox)
        return self.describe(sandbox)

    def status(self, sandbox_id: str) -> dict[str, Any]:
        """One sandbox."""
        return self.describe(self.load(sandbox_id))

    def activate(self, sandbox_id: str) -> dict[str, Any]:
        """CREATED or ROLLED_BACK -> ACTIVE; other states unchanged."""
        sandbox = self.load(sandbox_id)
        if sandbox.status in (SandboxStatus.CREATED, SandboxStatus.ROLLED_BACK):
            sandbox.activate()
            self._save(sandbox)
        return self.describe(sandbox)

    def path(self, sandbox_id: str, rel: str) -> Path:
        """The sandbox path of ``rel`` (activates; ``ValueError`` on traversal). Only an
        activation is saved: a read must not rewrite the record nor move the revision."""
        sandbox = self.load(sandbox_id)
        before = sandbox.status
        try:
            return Path(sandbox.get_path(rel))
        finally:
            if sandbox.status is not before:
                self._save(sandbox)

    def read(self, sandbox_id: str, rel: str) -> dict[str, Any]:
        """``{"path", "content_b64"}`` of a file in the sandbox."""
        target = self.path(sandbox_id, rel)
        if not target.is_file():
            raise AgentError(404, "NotFound", f"no file {rel} in sandbox {sandbox_id}")
        return {"path": rel, "content_b64": base64.b64encode(target.read_bytes()).decode()}

    def write(self, sandbox_id: str, rel: str, content: bytes) -> dict[str, Any]:
        """Write ``content`` to ``rel`` in the sandbox (parents made)."""
        target = self.path(sandbox_id, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        self._bump(sandbox_id)  # new content: a later commit is a new request
        return {"path": rel, "size": len(content)}

    def listdir(self, sandbox_id: str, rel: str) -> dict[str, Any]:
        """Entries of a directory of the sandbox: ``[{"name", "type", "size"}]``."""
        target = self.path(sandbox_id, rel)
        if not target.is_dir():
            raise AgentError(404, "NotFound", f"no directory {rel} in sandbox {sandbox_id}")
        entries = []
        for entry in sorted(target.iterdir()):
            kind = "dir" if entry.is_dir() else "symlink" if entry.is_symlink() else "file"
            size = entry.lstat().st_size
            entries.append({"name": entry.name, "type": kind, "size": size})
        return {"path": rel, "entries": entries}

    def diff(self, sandbox_id: str) -> dict[str, Any]:
        """Unified diff against the original (the CLI's ``diff``)."""
        from sandbox_core.cli import sandbox_diff

        return {"sandbox_id": sandbox_id, "diff": sandbox_diff(self.load(sandbox_id))}

    def commit(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Commit; the reply is the CommitResult plus the record after it."""
        sandbox = self.load(sandbox_id)
        try:
            result = sandbox.commit(body.get("message"))
        finally:
            self._save(sandbox)
        return {"result": result.to_dict(), "sandbox": self.describe(sandbox)}

    def rollback(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Discard changes (or undo a commit); re-activate when ``reactivate``."""
        sandbox = self.load(sandbox_id)
        try:
            if sandbox.status is SandboxStatus.CREATED:
                sandbox.activate()
            if sandbox.status is not SandboxStatus.ROLLED_BACK:
                sandbox.rollback()
            if body.get("reactivate") and sandbox.status is SandboxStatus.ROLLED_BACK:
                sandbox.activate()
        finally:
            self._save(sandbox)
        return self.describe(sandbox)

    def checkpoint(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Snapshot; a ``metadata.k8s_checkpoint_uid`` seen before returns the first snapshot."""
        sandbox = self.load(sandbox_id)
        metadata = {str(k): str(v) for k, v in dict(body.get("metadata") or {}).items()}
        uid = metadata.get("k8s_checkpoint_uid")
        if uid:
            for existing in self.checkpoints.list_checkpoints(sandbox_id):
                if existing.metadata.get("k8s_checkpoint_uid") == uid:
                    return existing.model_dump(mode="json")
        plan_id = sandbox.context.plan_id if sandbox.context else ""
        created = self.checkpoints.create_checkpoint(
            sandbox, plan_id, str(body.get("phase") or "manual"), metadata
        )
        self._save(sandbox)
        return created.model_dump(mode="json")

    def restore(self, checkpoint_id: str) -> dict[str, Any]:
        """Restore the sandbox of ``checkpoint_id`` to it (and activate)."""
        found = self.checkpoints.get_checkpoint(checkpoint_id)
        if found is None:
            raise AgentError(404, "NotFound", f"no checkpoint with id {checkpoint_id}")
        sandbox = self.load(found.sandbox_id)
        if sandbox.status not in RESTORABLE:
            raise SandboxStateError(
                f"cannot restore sandbox {sandbox.sandbox_id} in status {sandbox.status.value}"
            )
        if not self.checkpoints.restore(sandbox, found):
            raise SandboxError(f"restore of checkpoint {checkpoint_id} failed")
        if sandbox.status in (SandboxStatus.CREATED, SandboxStatus.ROLLED_BACK):
            sandbox.activate()
        self._save(sandbox)
        return self.describe(sandbox)

    # -- two-phase plan commit (issue 9) ---------------------------------------------------------

    @staticmethod
    def _txid(body: dict[str, Any]) -> str:
        txid = str(body.get("txid") or "")
        if not _TXID.match(txid):
            raise AgentError(422, "ValueError", "txid must be 1-64 characters of [A-Za-z0-9._-]")
        return txid

    def _participant(self, sandbox_id: str, txid: str) -> BaseSandbox:
        """The sandbox that prepared under ``txid`` when this process holds it, else re-opened."""
        held = self._held.get((sandbox_id, txid))
        return held if held is not None else self.load(sandbox_id)

    def review(self, sandbox_id: str) -> dict[str, Any]:
        """``{"summary": ChangeSummary, "sandbox"}``; nothing changes, nothing is saved."""
        sandbox = self.load(sandbox_id)
        return {"summary": sandbox.review().to_dict(), "sandbox": self.describe(sandbox)}

    def prepare(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"prepared": PreparedCommit, "sandbox"}``: stage the commit under ``txid``.

        A participant that does not prepare durably is held in this process for the apply.
        """
        txid = self._txid(body)
        message = body.get("message")
        sandbox = self._participant(sandbox_id, txid)
        prepared = sandbox.prepare(txid, str(message) if message is not None else None)
        if not getattr(sandbox, "prepares_durably", True):
            self._held[(sandbox_id, txid)] = sandbox
        self._save(sandbox)
        return {"prepared": prepared.to_dict(), "sandbox": self.describe(sandbox)}

    def apply_prepared(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"result": CommitResult, "sandbox"}``: apply what ``prepare`` staged (idempotent)."""
        txid = self._txid(body)
        sandbox = self._participant(sandbox_id, txid)
        try:
            result = sandbox.apply_prepared(txid)
        finally:
            self._save(sandbox)
        self._held.pop((sandbox_id, txid), None)
        return {"result": result.to_dict(), "sandbox": self.describe(sandbox)}

    def abort_prepared(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"sandbox"}``: drop what ``prepare`` staged (idempotent; fine when nothing was)."""
        txid = self._txid(body)
        sandbox = self._participant(sandbox_id, txid)
        sandbox.abort_prepared(txid)
        self._held.pop((sandbox_id, txid), None)
        self._save(sandbox)
        return {"sandbox": self.describe(sandbox)}

    def commit_landed(self, sandbox_id: str) -> dict[str, Any]:
        """``{"landed": bool | None}``: the strategy's ``commit_landed()`` (did a commit whose
        outcome was lost reach the original?), None when the strategy cannot tell. Recovery
        asks it of a last resource recorded committing (issue 9) and of an interrupted saga."""
        sandbox = self.load(sandbox_id)
        probe = getattr(sandbox, "commit_landed", None)
        answer = probe() if callable(probe) else None
        return {"landed": answer if isinstance(answer, bool) else None}

    def cleanup(self, sandbox_id: str) -> dict[str, Any]:
        """Remove every artefact and forget the sandbox; unknown ids are fine."""
        try:
            sandbox = self.load(sandbox_id)
        except AgentError:
            return {"sandbox_id": sandbox_id, "status": "cleaned_up"}
        sandbox.cleanup()
        self.store.delete(sandbox_id)
        self._revision_path(sandbox_id).unlink(missing_ok=True)
        return {"sandbox_id": sandbox_id, "status": sandbox.status.value}


class RequestJournal:
    """Stored replies of changing requests, by request id (files under ``<state>/requests``)."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "requests"

    def _path(self, request_id: str) -> Path:
        return self.directory / (hashlib.sha256(request_id.encode()).hexdigest() + ".json")

    def get(self, request_id: str) -> tuple[int, Any] | None:
        """The stored ``(status, payload)``, or None."""
        try:
            data = json.loads(self._path(request_id).read_text())
        except (OSError, ValueError):
            return None
        return int(data["status"]), data["payload"]

    def put(self, request_id: str, status: int, payload: Any) -> None:
        """Store a reply durably (write, fsync, rename)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self._path(request_id)
        temp = final.with_suffix(".tmp")
        with open(temp, "w") as handle:
            json.dump({"status": status, "payload": payload}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        temp.replace(final)


def _error_reply(exc: BaseException) -> tuple[int, dict[str, Any]]:
    if isinstance(exc, AgentError):
        status, type_ = exc.status, exc.type
    elif isinstance(exc, SandboxCommitError | SandboxStateError):
        status, type_ = 409, type(exc).__name__
    elif isinstance(exc, SandboxError | ValueError):
        status, type_ = 422, type(exc).__name__
    else:
        status, type_ = 500, type(exc).__name__
    error: dict[str, Any] = {"type": type_, "message": str(exc)}
    if isinstance(exc, SandboxCommitError) and exc.conflicts:
        error["conflicts"] = list(exc.conflicts)
    if isinstance(exc, ChangedSinceApprovalError):
        error["approved_digest"] = exc.approved_digest
        error["actual_digest"] = exc.actual_digest
    return status, {"error": error}


class Agent:
    """The aiohttp application around :class:`Operations` (see the module docstring)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.ops = Operations(config)
        self.journal = RequestJournal(config.state_dir)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent")

    def _token(self) -> bytes | None:
        try:
            token = self.config.token_file.read_bytes().strip()
        except OSError:
            return None
        return token or None

    def authorized(self, request: web.Request) -> bool:
        """True when the request carries the token of this Pod (constant-time compare)."""
        expected = self._token()
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            offered = header[len("Bearer ") :].strip()
        else:
            offered = request.headers.get(TOKEN_HEADER, "").strip()
        if expected is None or not offered:
            return False
        return hmac.compare_digest(offered.encode(), expected)

    async def _run(
        self,
        request: web.Request,
        action: Callable[[], Any],
        changes: bool,
        remember_failures: bool = True,
    ) -> web.Response:
        request_id = request.headers.get(REQUEST_ID_HEADER, "")
        if changes and not _REQUEST_ID.match(request_id):
            return _json(400, {"error": {"type": "BadRequest", "message": "X-Request-Id needed"}})

        def call() -> tuple[int, Any, bool]:
            if changes:
                stored = self.journal.get(request_id)
                if stored is not None:
                    return stored[0], stored[1], True
            try:
                status, payload = 200, self.ops.hide(action())
            except Exception as exc:  # every failure becomes a JSON reply
                status, payload = _error_reply(exc)
                payload = self.ops.hide(payload)
                if status == 500:
                    logger.exception("agent: %s %s failed", request.method, request.path)
            # A 5xx may pass on retry: not remembered (nor failures of routes that say so).
            if changes and (status < 300 or (status < 500 and remember_failures)):
                self.journal.put(request_id, status, payload)
            return status, payload, False

        loop = asyncio.get_running_loop()
        status, payload, replay = await loop.run_in_executor(self.worker, call)
        response = _json(status, payload)
        if replay:
            response.headers[REPLAY_HEADER] = "true"
        return response

    def app(self) -> web.Application:
        """The aiohttp application (auth middleware + routes)."""

        @web.middleware
        async def auth(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            if request.path == "/healthz" or self.authorized(request):
                return await handler(request)
            return _json(401, {"error": {"type": "Unauthorized", "message": "bad or no token"}})

        app = web.Application(middlewares=[auth], client_max_size=64 * 1024 * 1024)
        ops = self.ops

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def create(request: web.Request) -> web.Response:
            body = await _body(request)
            return await self._run(request, lambda: ops.create(body), True)

        def sid(request: web.Request) -> str:
            return request.match_info["sid"]

        def rel(request: web.Request) -> str:
            return request.query.get("path", ".")

        async def status(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.status(sid(request)), False)

        async def activate(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.activate(sid(request)), True)

        async def path(request: web.Request) -> web.Response:
            return await self._run(
                request, lambda: {"path": str(ops.path(sid(request), rel(request)))}, False
            )

        async def read(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.read(sid(request), rel(request)), False)

        async def write(request: web.Request) -> web.Response:
            content = await request.read()
            return await self._run(
                request, lambda: ops.write(sid(request), rel(request), content), True
            )

        async def listdir(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.listdir(sid(request), rel(request)), False)

        async def diff(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.diff(sid(request)), False)

        async def commit(request: web.Request) -> web.Response:
            body = await _body(request)
            return await self._run(request, lambda: ops.commit(sid(request), body), True)

        async def rollback(request: web.Request) -> web.Response:
            body = await _body(request)
            return await self._run(request, lambda: ops.rollback(sid(request), body), True)

        async def checkpoint(request: web.Request) -> web.Response:
            body = await _body(request)
            return await self._run(request, lambda: ops.checkpoint(sid(request), body), True)

        async def restore(request: web.Request) -> web.Response:
            cid = request.match_info["cid"]
            return await self._run(request, lambda: ops.restore(cid), True)

        async def cleanup(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.cleanup(sid(request)), True)

        async def review(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.review(sid(request)), False)

        async def landed(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.commit_landed(sid(request)), False)

        def two_phase(
            operation: Callable[[str, dict[str, Any]], dict[str, Any]],
        ) -> Callable[[web.Request], Awaitable[web.Response]]:
            async def handler(request: web.Request) -> web.Response:
                body = await _body(request)
                return await self._run(
                    request, lambda: operation(sid(request), body), True, remember_failures=False
                )

            return handler

        app.router.add_get("/healthz", healthz)
        app.router.add_post("/v1/sandboxes", create)
        app.router.add_get("/v1/sandboxes/{sid}", status)
        app.router.add_delete("/v1/sandboxes/{sid}", cleanup)
        app.router.add_post("/v1/sandboxes/{sid}/activate", activate)
        app.router.add_get("/v1/sandboxes/{sid}/path", path)
        app.router.add_get("/v1/sandboxes/{sid}/files", read)
        app.router.add_put("/v1/sandboxes/{sid}/files", write)
        app.router.add_get("/v1/sandboxes/{sid}/list", listdir)
        app.router.add_get("/v1/sandboxes/{sid}/diff", diff)
        app.router.add_post("/v1/sandboxes/{sid}/commit", commit)
        app.router.add_post("/v1/sandboxes/{sid}/rollback", rollback)
        app.router.add_post("/v1/sandboxes/{sid}/checkpoints", checkpoint)
        app.router.add_post("/v1/checkpoints/{cid}/restore", restore)
        app.router.add_get("/v1/sandboxes/{sid}/review", review)
        app.router.add_get("/v1/sandboxes/{sid}/commit-landed", landed)
        app.router.add_post("/v1/sandboxes/{sid}/prepare", two_phase(ops.prepare))
        app.router.add_post("/v1/sandboxes/{sid}/apply-prepared", two_phase(ops.apply_prepared))
        app.router.add_post("/v1/sandboxes/{sid}/abort-prepared", two_phase(ops.abort_prepared))
        return app


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        data = await request.json()
    except ValueError as exc:
        raise web.HTTPBadRequest(text="body is not JSON") from exc
    return dict(data) if isinstance(data, dict) else {}


def _json(status: int, payload: Any) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(payload, default=str), content_type="application/json"
    )


def serve(config: AgentConfig | None = None) -> None:
    """Run the agent until SIGTERM/SIGINT (aiohttp's own signal handling)."""
    config = config or AgentConfig.from_env()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    agent = Agent(config)
    logger.info("sandbox-core workspace agent listening on %s:%d", config.host, config.port)
    web.run_app(agent.app(), host=config.host, port=config.port, print=None, access_log=None)
