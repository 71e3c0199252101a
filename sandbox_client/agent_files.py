"""File operations of pod-executor Sandboxes through their workspace agent.

A pod-executor Sandbox lives in a workspace Pod whose main process is the workspace agent
(``sandbox_core.agent``). The engine's client runs outside the cluster, so it reaches the
agent the way ``kubectl`` reaches a Pod: through the API server's **pod proxy**
(``/api/v1/namespaces/{ns}/pods/{pod}/proxy/...``, the ``pods/proxy`` subresource), with the
client's own kubeconfig credentials. The API server picks the Pod's first declared container
port, which is the agent's (the operator declares no other). The agent token is read from the
Sandbox's Secret (``sbx-<sandbox>-agent``, key ``token``; ``sandbox_api.naming``) and sent
in the agent's proxy token header (``wire.TOKEN_HEADER``): the API server consumes
``Authorization`` for its own credentials and does not forward it. The token is never logged,
never put in a message or an argument. Routes, headers and status codes are the agent's own
table, :mod:`sandbox_core.agent.wire` (standard library only: the client loads no agent server).

The protocol is written once, sans-IO: each operation is a *flow*, a generator that yields
:class:`AgentRequest` objects and receives :class:`AgentReply` objects; :class:`AgentFileOperations`
drives the flows with a blocking :class:`AgentTransport`, :class:`AsyncAgentFileOperations` with
an awaitable one. Transports: :class:`PodProxyTransport` / :class:`AsyncPodProxyTransport`
(the API server's pod proxy) and :class:`DirectTransport` (a base URL and a token: tests and
in-cluster callers that may reach the Pod's address).

Errors are those of :class:`~sandbox_client.files.LocalFileOperations`: ``RefusedError``
(``PathTraversal``, ``ReservedPath``, ``InvalidState``; ``Forbidden`` when RBAC refuses the
proxy or the Secret), ``NotFoundError`` (``NotFound``), ``OperationFailedError`` (``IOError``).
Traversal is refused here before any request (absolute paths, ``..``, NUL) and again by the
agent (symlinks resolving outside the sandbox).
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Protocol, TypeAlias, TypeVar

import sandbox_core.agent.wire as wire
from sandbox_api.naming import (
    AGENT_SECRET_SUFFIX,
    AGENT_TOKEN_KEY,
    child_object_name,
    legacy_child_object_name,
)
from sandbox_client._kube import AsyncKube, Kube
from sandbox_client.errors import (
    NotFoundError,
    OperationFailedError,
    RefusedError,
    SandboxClientError,
    from_api_exception,
)
from sandbox_client.models import SandboxInfo, SandboxPhase
from sandbox_core.paths import TRAVERSAL_MESSAGE

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS = 60.0
STREAM_CHUNK_BYTES = 1024 * 1024  # a read of a streamed reply takes what has come, up to this
_HIDDEN = frozenset({".git"})
_WRITABLE = (SandboxPhase.ACTIVE, SandboxPhase.CREATED, SandboxPhase.ROLLED_BACK)


@dataclass(frozen=True)
class AgentRequest:
    """One call to the agent: ``path`` is the agent's route filled in (``wire.READ.path(...)``)."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    request_id: str = ""
    content_type: str = wire.BYTES_CONTENT_TYPE  # of ``body``
    accept: str = wire.JSON_CONTENT_TYPE
    # A query name given more than once (``?path=A&path=B``).
    query_pairs: tuple[tuple[str, str], ...] = ()
    # Seconds one read of a streamed reply may wait (a command's output may pause for as long
    # as the command runs); None: the transport's own timeout.
    read_timeout: float | None = None

    def params(self) -> list[tuple[str, str]]:
        """The query as (name, value) pairs: ``query``, then ``query_pairs``."""
        return [*self.query.items(), *self.query_pairs]

    def headers(self, token: str) -> dict[str, str]:
        """Headers of the request, with ``token`` (never logged by this module)."""
        out = {wire.TOKEN_HEADER: token, "Accept": self.accept}
        if self.body is not None:
            out["Content-Type"] = self.content_type
        if self.request_id:
            out[wire.REQUEST_ID_HEADER] = self.request_id
        return out


@dataclass(frozen=True)
class AgentReply:
    """The HTTP status and body of a reply (the agent's, or the API server's own refusal)."""

    status: int
    body: bytes


Flow: TypeAlias = Generator[AgentRequest, AgentReply, T]


class AgentTransport(Protocol):
    """Sends one request to the agent of ``sandbox``'s workspace Pod (blocking)."""

    def send(self, sandbox: SandboxInfo, request: AgentRequest) -> AgentReply:
        """The reply, whatever its status.

        Raises:
            SandboxClientError: the agent cannot be reached (``IOError``), the Secret is
                missing (``InvalidState``) or RBAC refuses (``Forbidden``).
        """
        ...


class AsyncAgentTransport(Protocol):
    """:class:`AgentTransport`, awaitable."""

    async def send(self, sandbox: SandboxInfo, request: AgentRequest) -> AgentReply:
        """As :meth:`AgentTransport.send`."""
        ...


# -- the protocol, sans-IO ----------------------------------------------------------------------


def checked_path(path: str) -> str:
    """``path`` as the agent's ``?path=`` value (``"."`` for the root), refused lexically first.

    Raises:
        RefusedError: ``PathTraversal`` (absolute, ``..``, NUL); ``ReservedPath`` (``.git``).
    """
    relative = path.strip()
    if not relative or relative in (".", "./"):
        return "."
    if "\x00" in relative:
        raise RefusedError("PathTraversal", f"{TRAVERSAL_MESSAGE}: {path!r}")
    pure = PurePosixPath(relative)
    if pure.is_absolute() or relative.startswith("\\") or ".." in pure.parts:
        raise RefusedError("PathTraversal", f"{TRAVERSAL_MESSAGE}: {path}")
    if any(part in _HIDDEN for part in pure.parts):
        raise RefusedError("ReservedPath", f"{path}: the sandbox's git metadata is off limits")
    return pure.as_posix()


def _route(sandbox: SandboxInfo, route: wire.Route) -> str:
    if not sandbox.sandbox_id or not sandbox.workspace_pod:
        raise RefusedError(
            "InvalidState",
            f"sandbox {sandbox.name} has no workspace agent yet (phase {sandbox.phase})",
        )
    return route.path(sid=sandbox.sandbox_id)


def _payload(reply: AgentReply) -> Any:
    try:
        return json.loads(reply.body or b"{}")
    except ValueError:
        return None


def error_of(reply: AgentReply, what: str) -> SandboxClientError:
    """The typed error of a failed reply (the agent's ``{"error"}`` or an API ``Status``)."""
    payload = _payload(reply)
    found = wire.error_of(payload)
    if found:  # the agent's own refusal
        kind, message = str(found.get("type") or ""), str(found.get("message") or "")
        text = f"{what}: {message}"
        if reply.status == wire.NOT_FOUND:
            return NotFoundError("NotFound", text)
        if reply.status == wire.UNAUTHORIZED:
            return OperationFailedError("IOError", f"{what}: the agent refused the token")
        if TRAVERSAL_MESSAGE.lower() in message.lower():
            return RefusedError("PathTraversal", text)
        refusal = reply.status in wire.REFUSAL_STATUSES
        if refusal or kind in ("IsADirectoryError", "NotADirectoryError"):
            return RefusedError("InvalidState", text)
        return OperationFailedError("IOError", text)
    if isinstance(payload, dict) and payload.get("kind") == "Status":
        # The API server answered itself: no such Pod, RBAC, or the Pod is unreachable.
        error = from_api_exception(reply.status, None, reply.body)
        if reply.status == 403:
            return error
        if reply.status in (400, 404):
            return RefusedError("InvalidState", f"{what}: workspace pod: {error.message}")
        return OperationFailedError("IOError", f"{what}: {error.message}")
    return OperationFailedError("IOError", f"{what}: HTTP {reply.status}")


def _json_of(reply: AgentReply, what: str) -> dict[str, Any]:
    if not 200 <= reply.status < 300:
        raise error_of(reply, what)
    payload = _payload(reply)
    if not isinstance(payload, dict):
        raise OperationFailedError("IOError", f"{what}: the reply is not a JSON object")
    return payload


def read_flow(sandbox: SandboxInfo, path: str) -> Flow[bytes]:
    """``GET .../files?path=`` -> the file's bytes."""
    rel = checked_path(path)
    if rel == ".":
        raise RefusedError("InvalidState", f"{path!r} is a directory")
    what = f"read {rel} in {sandbox.name}"
    reply = yield AgentRequest(wire.READ.method, _route(sandbox, wire.READ), {wire.PATH_QUERY: rel})
    payload = _json_of(reply, what)  # typed errors (a RefusedError is a ValueError) pass
    try:
        return base64.b64decode(payload["content_b64"], validate=True)
    except (KeyError, ValueError) as exc:
        raise OperationFailedError("IOError", f"{what}: malformed reply") from exc


def write_flow(sandbox: SandboxInfo, path: str, data: bytes) -> Flow[None]:
    """``PUT .../files?path=`` with a fresh request id (a retry of the same id is a replay)."""
    if sandbox.phase not in _WRITABLE:
        raise RefusedError(
            "InvalidState",
            f"sandbox {sandbox.name} is {sandbox.phase.value if sandbox.phase else 'new'}; "
            "writes need an Active sandbox",
        )
    rel = checked_path(path)
    if rel == ".":
        raise RefusedError("InvalidState", f"{path!r} is a directory")
    request = AgentRequest(
        wire.WRITE.method,
        _route(sandbox, wire.WRITE),
        {wire.PATH_QUERY: rel},
        data,
        f"write-{uuid.uuid4().hex}",
    )
    _json_of((yield request), f"write {rel} in {sandbox.name}")


def list_flow(sandbox: SandboxInfo, path: str = "") -> Flow[list[str]]:
    """``GET .../list?path=`` per directory (breadth first) -> sorted resource-relative files.

    Symlinks are listed, not followed out of the sandbox (the agent refuses those).
    """
    start = checked_path(path)
    method, route = wire.LIST.method, _route(sandbox, wire.LIST)
    what = f"list {start} in {sandbox.name}"
    first = yield AgentRequest(method, route, {wire.PATH_QUERY: start})
    if first.status == wire.NOT_FOUND and start != ".":
        # Not a directory: a file is listed as itself (as LocalFileOperations does).
        parent = PurePosixPath(start).parent.as_posix()
        up = yield AgentRequest(method, route, {wire.PATH_QUERY: parent})
        entries = _json_of(up, what).get("entries") or [] if up.status == 200 else []
        name = PurePosixPath(start).name
        if any(e.get("name") == name and e.get("type") != "dir" for e in entries):
            return [start]
        raise NotFoundError("NotFound", f"{path}: no such directory in {sandbox.name}")
    out: list[str] = []
    pending = [(start, first)]
    while pending:
        directory, reply = pending.pop()
        for entry in _json_of(reply, f"list {directory} in {sandbox.name}").get("entries") or []:
            name = str(entry.get("name") or "")
            if not name or name in _HIDDEN:
                continue
            rel = name if directory == "." else f"{directory}/{name}"
            if entry.get("type") != "dir":
                out.append(rel)
                continue
            below = yield AgentRequest(method, route, {wire.PATH_QUERY: rel})
            refused = below.status == wire.UNPROCESSABLE
            if refused and isinstance(error_of(below, what), RefusedError):
                out.append(rel)  # a symlink to a directory outside the sandbox: listed, not read
                continue
            pending.append((rel, below))
    return sorted(out)


def diff_flow(sandbox: SandboxInfo) -> Flow[str]:
    """``GET .../diff`` -> the unified diff (``""`` when equal)."""
    reply = yield AgentRequest(wire.DIFF.method, _route(sandbox, wire.DIFF))
    return str(_json_of(reply, f"diff of {sandbox.name}").get("diff") or "")


def run_flow(flow: Flow[T], send: Callable[[AgentRequest], AgentReply]) -> T:
    """Drive ``flow`` with a blocking ``send``; its return value."""
    try:
        request = next(flow)
        while True:
            request = flow.send(send(request))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun_flow(flow: Flow[T], send: Callable[[AgentRequest], Awaitable[AgentReply]]) -> T:
    """Drive ``flow`` with an awaitable ``send``; its return value."""
    try:
        request = next(flow)
        while True:
            request = flow.send(await send(request))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


# -- the operations -----------------------------------------------------------------------------


class AgentFileOperations:
    """:class:`~sandbox_client.files.FileOperations` through the workspace agent (blocking).

    Args:
        transport: how requests reach the agent (:class:`PodProxyTransport` by default in
            :class:`~sandbox_client.SandboxClient`).
    """

    def __init__(self, transport: AgentTransport) -> None:
        self.transport = transport

    def _run(self, sandbox: SandboxInfo, flow: Flow[T]) -> T:
        return run_flow(flow, lambda request: self.transport.send(sandbox, request))

    def read_file(self, sandbox: SandboxInfo, path: str) -> bytes:
        """The file's content. Raises: ``RefusedError`` (``PathTraversal``, ``InvalidState``),
        ``NotFoundError``, ``OperationFailedError`` (``IOError``)."""
        return self._run(sandbox, read_flow(sandbox, path))

    def write_file(self, sandbox: SandboxInfo, path: str, data: bytes) -> None:
        """Create or replace the file (parents made by the agent). Raises: ``RefusedError``
        (``PathTraversal``; ``InvalidState`` when not writable or a directory),
        ``OperationFailedError`` (``IOError``)."""
        self._run(sandbox, write_flow(sandbox, path, data))

    def list_files(self, sandbox: SandboxInfo, path: str = "") -> list[str]:
        """Resource-relative files below ``path`` (recursive, sorted). Raises: ``RefusedError``
        (``PathTraversal``), ``NotFoundError``."""
        return self._run(sandbox, list_flow(sandbox, path))

    def diff(self, sandbox: SandboxInfo) -> str:
        """The agent's unified diff against the original. Raises: ``OperationFailedError``."""
        return self._run(sandbox, diff_flow(sandbox))


class AsyncAgentFileOperations:
    """:class:`AgentFileOperations` with awaitable methods (same names, same errors)."""

    def __init__(self, transport: AsyncAgentTransport) -> None:
        self.transport = transport

    async def _run(self, sandbox: SandboxInfo, flow: Flow[T]) -> T:
        async def send(request: AgentRequest) -> AgentReply:
            return await self.transport.send(sandbox, request)

        return await arun_flow(flow, send)

    async def read_file(self, sandbox: SandboxInfo, path: str) -> bytes:
        """As :meth:`AgentFileOperations.read_file`."""
        return await self._run(sandbox, read_flow(sandbox, path))

    async def write_file(self, sandbox: SandboxInfo, path: str, data: bytes) -> None:
        """As :meth:`AgentFileOperations.write_file`."""
        await self._run(sandbox, write_flow(sandbox, path, data))

    async def list_files(self, sandbox: SandboxInfo, path: str = "") -> list[str]:
        """As :meth:`AgentFileOperations.list_files`."""
        return await self._run(sandbox, list_flow(sandbox, path))

    async def diff(self, sandbox: SandboxInfo) -> str:
        """As :meth:`AgentFileOperations.diff`."""
        return await self._run(sandbox, diff_flow(sandbox))


# -- transports ---------------------------------------------------------------------------------


def proxy_path(sandbox: SandboxInfo, request: AgentRequest) -> str:
    """The API server path of ``request`` through the pod proxy of ``sandbox``'s workspace Pod."""
    namespace = urllib.parse.quote(sandbox.namespace, safe="")
    pod = urllib.parse.quote(sandbox.workspace_pod, safe="")
    return f"/api/v1/namespaces/{namespace}/pods/{pod}/proxy{request.path}"


def secret_name(sandbox: SandboxInfo) -> str:
    """Name of the Secret holding ``sandbox``'s agent token (made by the pod executor)."""
    return child_object_name(sandbox.name, AGENT_SECRET_SUFFIX)


def legacy_secret_name(sandbox: SandboxInfo) -> str:
    """The name an operator before hashed child names gave that Secret (read when the current
    name is absent, so a Sandbox made then keeps working)."""
    return legacy_child_object_name(sandbox.name, AGENT_SECRET_SUFFIX)


def _token_of(token: str | None, sandbox: SandboxInfo) -> str:
    if not token:
        raise RefusedError("InvalidState", f"secret {secret_name(sandbox)} holds no agent token")
    return token


def _cache_key(sandbox: SandboxInfo) -> tuple[str, str, str]:
    uid = str((sandbox.raw.get("metadata") or {}).get("uid") or "")
    return sandbox.namespace, sandbox.name, uid


def _secret_error(error: SandboxClientError, sandbox: SandboxInfo) -> SandboxClientError:
    """The error of reading the Secret; ``InvalidState`` when it does not exist."""
    if isinstance(error, NotFoundError):
        return RefusedError(
            "InvalidState",
            f"secret {secret_name(sandbox)}: not found (not a pod-executor sandbox yet)",
        )
    return error


class PodProxyTransport:
    """:class:`AgentTransport` through the API server's pod proxy (``kubernetes`` client).

    The Secret is read once per Sandbox (name, namespace and uid) and kept in memory. RBAC the
    caller needs in the Sandbox's namespace: ``get`` on ``secrets`` and ``get``, ``update`` on
    ``pods/proxy`` (docs/client.md, "RBAC").

    Args:
        api_client: a ``kubernetes.client.ApiClient`` (the client's own credentials), or the
            client's :class:`~sandbox_client._kube.Kube`.
        timeout_seconds: limit of one request.
    """

    def __init__(self, api_client: Any, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.kube = Kube.of(api_client)
        self.timeout_seconds = timeout_seconds
        self._tokens: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    def token(self, sandbox: SandboxInfo) -> str:
        """The agent token of ``sandbox`` from its Secret (cached).

        Raises:
            RefusedError: ``InvalidState`` (no Secret, no token), ``Forbidden`` (RBAC).
        """
        key = _cache_key(sandbox)
        with self._lock:
            if key in self._tokens:
                return self._tokens[key]
        try:
            try:
                found = self.kube.secret_token(
                    secret_name(sandbox), sandbox.namespace, AGENT_TOKEN_KEY
                )
            except NotFoundError:
                found = self.kube.secret_token(
                    legacy_secret_name(sandbox), sandbox.namespace, AGENT_TOKEN_KEY
                )
        except SandboxClientError as exc:
            raise _secret_error(exc, sandbox) from None
        token = _token_of(found, sandbox)
        with self._lock:
            self._tokens[key] = token
        return token

    def _forget(self, sandbox: SandboxInfo, token: str) -> bool:
        """Drop the cached ``token`` after the agent refused it (the operator renews tokens:
        docs/operations.md, "Agent tokens expire"); True when the Secret now holds another."""
        with self._lock:
            if self._tokens.get(_cache_key(sandbox)) == token:
                del self._tokens[_cache_key(sandbox)]
        return self.token(sandbox) != token

    def send(self, sandbox: SandboxInfo, request: AgentRequest) -> AgentReply:
        """As :meth:`AgentTransport.send` (one HTTPS request to the API server). A 401 is
        sent once more with the Secret's current token when it changed (renewed): the agent
        checks the token before doing anything."""
        for _ in range(2):
            token = self.token(sandbox)
            status, body = self.kube.proxy(
                request.method,
                proxy_path(sandbox, request),
                request.params(),
                request.headers(token),
                request.body,
                self.timeout_seconds,
            )
            if status != wire.UNAUTHORIZED or not self._forget(sandbox, token):
                break
        return AgentReply(status, body)

    def stream(
        self, sandbox: SandboxInfo, request: AgentRequest
    ) -> Generator[AgentReply, None, None]:
        """As :meth:`DirectTransport.stream`, through the pod proxy."""
        chunks = self.kube.proxy_stream(
            request.method,
            proxy_path(sandbox, request),
            request.params(),
            request.headers(self.token(sandbox)),
            request.body,
            request.read_timeout or self.timeout_seconds,
        )
        for status, data in chunks:
            if status == wire.UNAUTHORIZED:
                with self._lock:  # renewed since: the next request reads the Secret again
                    self._tokens.pop(_cache_key(sandbox), None)
            yield AgentReply(status, data)


class AsyncPodProxyTransport:
    """:class:`AsyncAgentTransport` through the pod proxy (``kubernetes_asyncio`` client);
    same Secret, cache and RBAC as :class:`PodProxyTransport`.

    Args:
        api_client: a ``kubernetes_asyncio.client.ApiClient``, or the client's
            :class:`~sandbox_client._kube.AsyncKube` (which connects on first use).
        timeout_seconds: limit of one request.
    """

    def __init__(self, api_client: Any, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.kube = AsyncKube.of(api_client)
        self.timeout_seconds = timeout_seconds
        self._tokens: dict[tuple[str, str, str], str] = {}

    async def token(self, sandbox: SandboxInfo) -> str:
        """As :meth:`PodProxyTransport.token`."""
        key = _cache_key(sandbox)
        if key in self._tokens:
            return self._tokens[key]
        try:
            try:
                found = await self.kube.secret_token(
                    secret_name(sandbox), sandbox.namespace, AGENT_TOKEN_KEY
                )
            except NotFoundError:
                found = await self.kube.secret_token(
                    legacy_secret_name(sandbox), sandbox.namespace, AGENT_TOKEN_KEY
                )
        except SandboxClientError as exc:
            raise _secret_error(exc, sandbox) from None
        self._tokens[key] = _token_of(found, sandbox)
        return self._tokens[key]

    async def send(self, sandbox: SandboxInfo, request: AgentRequest) -> AgentReply:
        """As :meth:`PodProxyTransport.send` (a 401 retried once with a renewed token)."""
        for _ in range(2):
            token = await self.token(sandbox)
            status, body = await self.kube.proxy(
                request.method,
                proxy_path(sandbox, request),
                request.params(),
                request.headers(token),
                request.body,
                self.timeout_seconds,
            )
            if status != wire.UNAUTHORIZED:
                break
            if self._tokens.get(_cache_key(sandbox)) == token:
                del self._tokens[_cache_key(sandbox)]
            if await self.token(sandbox) == token:
                break
        return AgentReply(status, body)

    async def stream(
        self, sandbox: SandboxInfo, request: AgentRequest
    ) -> AsyncGenerator[AgentReply, None]:
        """As :meth:`DirectTransport.stream`, through the pod proxy."""
        headers = request.headers(await self.token(sandbox))
        chunks = self.kube.proxy_stream(
            request.method,
            proxy_path(sandbox, request),
            request.params(),
            headers,
            request.body,
            request.read_timeout or self.timeout_seconds,
        )
        async for status, data in chunks:
            if status == wire.UNAUTHORIZED:
                self._tokens.pop(_cache_key(sandbox), None)  # the next request reads it again
            yield AgentReply(status, data)


class DirectTransport:
    """:class:`AgentTransport` straight to an agent's base URL (``http://host:port``) with a
    known token: for tests with a local agent process, and callers inside the cluster that the
    workspace Pod's NetworkPolicy admits (by default only the operator)."""

    def __init__(
        self, base_url: str, token: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_seconds = timeout_seconds

    def _url(self, request: AgentRequest) -> str:
        params = request.params()
        query = "?" + urllib.parse.urlencode(params) if params else ""
        return self.base_url + request.path + query

    def stream(
        self, sandbox: SandboxInfo, request: AgentRequest
    ) -> Generator[AgentReply, None, None]:
        """The reply as it arrives: one :class:`AgentReply` per chunk read, all with the
        reply's status (a refusal: one reply with the whole body). Closing the iterator closes
        the connection (the agent then kills a running command).

        Raises:
            OperationFailedError: ``IOError``, the agent cannot be reached.
        """
        import urllib.error
        import urllib.request

        http = urllib.request.Request(  # noqa: S310 - http(s) URL given by the caller
            self._url(request),
            data=request.body,
            method=request.method,
            headers=request.headers(self._token),
        )
        timeout = request.read_timeout or self.timeout_seconds
        try:
            reply = urllib.request.urlopen(http, timeout=timeout)  # noqa: S310
        except urllib.error.HTTPError as exc:
            with exc:
                yield AgentReply(int(exc.code), exc.read())
            return
        except (urllib.error.URLError, OSError) as exc:
            raise OperationFailedError(
                "IOError", f"agent {request.method}: {type(exc).__name__}"
            ) from None
        with reply:
            try:
                while data := reply.read1(STREAM_CHUNK_BYTES):
                    yield AgentReply(int(reply.status), data)
            except OSError as exc:  # a read timeout, a reset: the stream ends here
                raise OperationFailedError(
                    "IOError", f"agent {request.method}: the reply broke off ({type(exc).__name__})"
                ) from None

    def send(self, sandbox: SandboxInfo, request: AgentRequest) -> AgentReply:
        """As :meth:`AgentTransport.send` (``urllib``; the sandbox only names the route)."""
        import urllib.error  # here, not with the module: only this transport needs them
        import urllib.request

        url = self._url(request)
        http = urllib.request.Request(  # noqa: S310 - http(s) URL given by the caller
            url, data=request.body, method=request.method, headers=request.headers(self._token)
        )
        try:
            with urllib.request.urlopen(http, timeout=self.timeout_seconds) as reply:  # noqa: S310
                return AgentReply(int(reply.status), reply.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return AgentReply(int(exc.code), exc.read())
        except (urllib.error.URLError, OSError) as exc:
            raise OperationFailedError(
                "IOError", f"agent {request.method}: {type(exc).__name__}"
            ) from None


class AsyncDirectTransport:
    """:class:`DirectTransport`, awaitable (the blocking call runs in a worker thread)."""

    def __init__(self, direct: DirectTransport) -> None:
        self.direct = direct

    async def send(self, sandbox: SandboxInfo, request: AgentRequest) -> AgentReply:
        """As :meth:`DirectTransport.send`."""
        import asyncio  # here, not with the module: the blocking client never needs it

        return await asyncio.to_thread(self.direct.send, sandbox, request)

    async def stream(
        self, sandbox: SandboxInfo, request: AgentRequest
    ) -> AsyncGenerator[AgentReply, None]:
        """As :meth:`DirectTransport.stream` (each read in a worker thread)."""
        import asyncio

        replies = self.direct.stream(sandbox, request)
        try:
            while (reply := await asyncio.to_thread(next, replies, None)) is not None:
                yield reply
        finally:
            await asyncio.to_thread(replies.close)
