"""The actor's door from the client: commands, files, search, SQL and the audit log of a sandbox.

One set of operations (docs/actor.md, docs/actor-files.md), served two ways:

- through the **workspace agent** (pod executor): :class:`AgentActor` / :class:`AsyncAgentActor`
  send the agent's routes (:mod:`sandbox_core.agent.wire`: ``EXEC``, ``EXEC_SIGNAL``, ``AUDIT``,
  ``FILE_*``, ``GREP``, ``GLOB``, ``UPLOAD``, ``DOWNLOAD``, ``SQL``) over the transports of
  :mod:`sandbox_client.agent_files` (the API server's pod proxy, or an address and a token);
- on **local paths** (local executor): :class:`~sandbox_client.local_actor.LocalDoor` runs the
  core's own implementation (``sandbox_core.actor``) on the operator's state directory.

Both take the :class:`~sandbox_client.models.SandboxInfo` first and return the typed replies of
:mod:`sandbox_client.models` (``ExecResult``, ``FileStat``, ``GrepResult``, ``SqlResult``, ...).
The protocol is written once, sans-IO, as in :mod:`sandbox_client.agent_files`: each operation
is a flow that yields :class:`~sandbox_client.agent_files.AgentRequest` objects.

Errors (:func:`actor_error`, the same for both doors): ``RefusedError`` with reason
``PathTraversal`` (absolute, ``..``, a symlink on the way, ``.git``), ``InvalidOperation`` (an
edit whose text is absent or not unique, a target that exists, a directory not empty, a bad
pattern), ``InvalidState`` (a committed sandbox; SQL on another strategy), ``ExecRefused`` (a bad
command; ``transaction_rollback`` has no tree), ``Invalid`` (a bad argument);
``NotFoundError`` (``NotFound``: no such file or sandbox); ``ConflictError`` (``ExecLimit``: the
sandbox already runs its limit of commands; retry later); ``OperationFailedError``
(``JailUnavailable``: no bubblewrap, commands are never run unjailed; ``IOError``; ``StreamCut``:
a command's stream ended without its exit).
"""

from __future__ import annotations

import base64
import collections
import json
import uuid
from collections.abc import (
    AsyncGenerator,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any, Literal, Protocol, TypeAlias, TypeVar, cast

import sandbox_core.agent.wire as wire
from sandbox_client.agent_files import (
    AgentReply,
    AgentRequest,
    AgentTransport,
    AsyncAgentTransport,
    Flow,
    _payload,
    _route,
    arun_flow,
    checked_path,
    run_flow,
)
from sandbox_client.agent_files import error_of as transport_error_of
from sandbox_client.errors import (
    ConflictError,
    NotFoundError,
    OperationFailedError,
    RefusedError,
    SandboxClientError,
)
from sandbox_client.models import (
    AuditPage,
    EditResult,
    ExecChunk,
    ExecResult,
    FileChange,
    FileResult,
    FileStat,
    GlobResult,
    GrepResult,
    SandboxInfo,
    SqlResult,
)
from sandbox_core.paths import TRAVERSAL_MESSAGE

T = TypeVar("T")
Command: TypeAlias = Sequence[str] | str
"""What to run: an argv (``["pytest", "-q"]``) or a shell line (``"pytest -q | tail"``)."""
Uploads: TypeAlias = Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]]
Chunks: TypeAlias = Generator[ExecChunk, None, None]
"""A streamed command's chunks (close it to stop reading: the command is killed)."""
AsyncChunks: TypeAlias = AsyncGenerator[ExecChunk, None]
""":data:`Chunks`, asynchronous (``aclose`` it)."""

DEFAULT_MAX_MATCHES = 100
DEFAULT_MAX_RESULTS = 1000
DEFAULT_MAX_ROWS = 1000
DEFAULT_EXEC_TIMEOUT_SECONDS = 600.0
LOCAL_EXECUTOR = "local"
AGENT_EXECUTOR = "pod"

# The core's error types (by name, as the agent's replies carry them) -> (client error, reason).
_ERRORS: dict[str, tuple[Callable[[str, str], SandboxClientError], str]] = {
    "SandboxPathError": (RefusedError, "PathTraversal"),
    "SandboxFileNotFoundError": (NotFoundError, "NotFound"),
    "FileNotFoundError": (NotFoundError, "NotFound"),
    "NotFound": (NotFoundError, "NotFound"),
    "SandboxFileOperationError": (RefusedError, "InvalidOperation"),
    "SandboxStateError": (RefusedError, "InvalidState"),
    "ExecRefusedError": (RefusedError, "ExecRefused"),
    "ExecLimitError": (ConflictError, "ExecLimit"),
    "JailUnavailableError": (OperationFailedError, "JailUnavailable"),
    "ValueError": (RefusedError, "Invalid"),
    "BadRequest": (RefusedError, "Invalid"),
}
_BY_STATUS: dict[int, tuple[Callable[[str, str], SandboxClientError], str]] = {
    wire.NOT_FOUND: (NotFoundError, "NotFound"),
    wire.CONFLICT: (RefusedError, "InvalidState"),
    wire.UNPROCESSABLE: (RefusedError, "Invalid"),
    wire.TOO_MANY_REQUESTS: (ConflictError, "ExecLimit"),
    wire.BAD_REQUEST: (RefusedError, "Invalid"),
}


def actor_error(kind: str, message: str, status: int | None = None) -> SandboxClientError:
    """The client error for a core error named ``kind`` (the agent's ``error.type``, or the
    class name of an exception raised on local paths), ``message`` kept as it is.

    A path refusal is ``RefusedError("PathTraversal")`` whatever its type; an unknown type is
    mapped by the HTTP ``status`` when there is one, else ``OperationFailedError("IOError")``.
    """
    if TRAVERSAL_MESSAGE.lower() in message.lower():
        return RefusedError("PathTraversal", message)
    found = _ERRORS.get(kind) or (_BY_STATUS.get(status) if status is not None else None)
    if found is None:
        return OperationFailedError("IOError", f"{kind}: {message}" if kind else message)
    make, reason = found
    return make(reason, message)


def reply_error(reply: AgentReply, what: str) -> SandboxClientError:
    """The typed error of a refused reply: the agent's ``{"error"}`` through
    :func:`actor_error`, else what the API server said (:func:`agent_files.error_of`)."""
    found = wire.error_of(_payload(reply))
    if not found:
        return transport_error_of(reply, what)
    if reply.status == wire.UNAUTHORIZED:
        return OperationFailedError("IOError", f"{what}: the agent refused the token")
    kind, message = str(found.get("type") or ""), str(found.get("message") or "")
    return actor_error(kind, f"{what}: {message}", reply.status)


def _json(reply: AgentReply, what: str) -> dict[str, Any]:
    if not 200 <= reply.status < 300:
        raise reply_error(reply, what)
    payload = _payload(reply)
    if not isinstance(payload, dict):
        raise OperationFailedError("IOError", f"{what}: the reply is not a JSON object")
    return payload


def _request_id(op: str) -> str:
    return f"{op}-{uuid.uuid4().hex}"


def _post(info: SandboxInfo, route: wire.Route, body: Mapping[str, Any], op: str) -> AgentRequest:
    return AgentRequest(
        route.method,
        _route(info, route),
        body=json.dumps(body).encode(),
        request_id=_request_id(op),
        content_type=wire.JSON_CONTENT_TYPE,
    )


def _get(info: SandboxInfo, route: wire.Route, query: Mapping[str, str]) -> AgentRequest:
    return AgentRequest(route.method, _route(info, route), dict(query))


def _file(path: str) -> str:
    rel = checked_path(path)
    if rel == ".":
        raise RefusedError("PathTraversal", f"{TRAVERSAL_MESSAGE}: the sandbox's root itself")
    return rel


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


# -- commands -------------------------------------------------------------------------------------


def exec_body(
    command: Command,
    *,
    cwd: str = ".",
    env: Mapping[str, str] | None = None,
    stdin: bytes | str = b"",
    timeout: float | None = None,
    max_output_bytes: int | None = None,
    network: bool | None = None,
) -> dict[str, Any]:
    """The ``EXEC`` body (``wire.EXEC``): ``argv`` for a sequence, ``shell`` for a string.

    Raises:
        RefusedError: ``Invalid`` (an empty command).
    """
    if isinstance(command, str):
        if not command.strip():
            raise RefusedError("Invalid", "an empty shell line")
        body: dict[str, Any] = {"shell": command}
    else:
        if not command:
            raise RefusedError("Invalid", "an empty argv")
        body = {"argv": [str(part) for part in command]}
    body["cwd"] = checked_path(cwd)
    if env:
        body["env"] = dict(env)
    if stdin:
        body["stdin_b64"] = base64.b64encode(_bytes(stdin)).decode()
    if timeout is not None:
        body["timeout_seconds"] = timeout
    if max_output_bytes is not None:
        body["max_output_bytes"] = max_output_bytes
    if network is not None:
        body["network"] = network
    return body


EXEC_READ_MARGIN_SECONDS = 30.0
FRAME_HEADER_BYTES = 5  # a frame's tag byte and its 4-byte big-endian length


def exec_request(info: SandboxInfo, body: Mapping[str, Any]) -> AgentRequest:
    """The ``EXEC`` request of ``body`` with a fresh request id; its reply is binary frames
    (``wire.FRAMES_CONTENT_TYPE``: the output's raw bytes, no base64); a read of its stream
    may wait as long as the command may run, and a margin."""
    timeout = float(body.get("timeout_seconds") or DEFAULT_EXEC_TIMEOUT_SECONDS)
    return AgentRequest(
        wire.EXEC.method,
        _route(info, wire.EXEC),
        body=json.dumps(body).encode(),
        request_id=_request_id("exec"),
        content_type=wire.JSON_CONTENT_TYPE,
        accept=wire.FRAMES_CONTENT_TYPE,
        read_timeout=timeout + EXEC_READ_MARGIN_SECONDS,
    )


class ExecStream:
    """Reads the ``EXEC`` reply as it arrives: :meth:`feed` bytes, get the chunks.

    ``framed``: binary frames (``wire.FRAMES_CONTENT_TYPE``: a tag byte, a 4-byte big-endian
    length, the payload), else NDJSON lines. The ``exit`` event carries the result (with the
    output fed so far); an ``error`` event is raised as :func:`actor_error`; :meth:`end`
    raises ``StreamCut`` when neither came.
    """

    def __init__(self, what: str, collect: bool, framed: bool = False) -> None:
        self.what = what
        self.collect = collect
        self.framed = framed
        self.buffer = bytearray()  # NDJSON: the start of a line not complete yet
        self.held: collections.deque[memoryview] = collections.deque()  # frames: bytes fed
        self.held_bytes = 0
        self.frame: tuple[bytes, int] | None = None  # the tag and size of the frame under way
        self.stdout: list[bytes] = []
        self.stderr: list[bytes] = []
        self.result: ExecResult | None = None
        self.exec_id = ""
        self.replayed = False

    def feed(self, data: bytes) -> list[ExecChunk]:
        """The events complete in ``data`` (with what was fed before).

        Frames: the pieces fed are held as they are (views, no copy) and each frame's payload
        is cut out of them once, with one copy, however many reads it arrived in (a megabyte
        frame in 64 KiB reads). NDJSON: a ``bytearray`` consumed from the front once per call.
        """
        if self.framed:
            return self._frames(data)
        self.buffer += data
        out: list[ExecChunk] = []
        buffer = self.buffer
        view = memoryview(buffer)
        at = 0
        try:
            while (newline := buffer.find(b"\n", at)) >= 0:
                line = bytes(view[at:newline])
                at = newline + 1
                if line.strip():
                    out.append(self._event(line))
        finally:
            view.release()
            del buffer[:at]
        return out

    def _frames(self, data: bytes) -> list[ExecChunk]:
        if data:
            self.held.append(memoryview(bytes(data) if not isinstance(data, bytes) else data))
            self.held_bytes += len(data)
        out: list[ExecChunk] = []
        while True:
            if self.frame is None:
                if self.held_bytes < FRAME_HEADER_BYTES:
                    return out
                header = self._take(FRAME_HEADER_BYTES)
                self.frame = header[:1], int.from_bytes(header[1:], "big")
            tag, size = self.frame
            if self.held_bytes < size:
                return out
            payload = self._take(size)
            self.frame = None
            if tag == wire.FRAME_EVENT:
                out.append(self._event(payload))
            elif tag in (wire.FRAME_STDOUT, wire.FRAME_STDERR):
                kind: Literal["stdout", "stderr"] = (
                    "stdout" if tag == wire.FRAME_STDOUT else "stderr"
                )
                out.append(self._output(kind, payload))
            else:
                raise OperationFailedError("IOError", f"{self.what}: an unknown frame {tag!r}")

    def _take(self, size: int) -> bytes:
        """The first ``size`` bytes held (``size <= held_bytes``), copied once: a piece fed
        whole is handed on as it is, a part of one sliced, parts of several joined."""
        if not size:
            return b""
        held = self.held
        self.held_bytes -= size
        first = held[0]
        if len(first) >= size:
            if len(first) == size:
                held.popleft()
                whole = first.obj
                return whole if isinstance(whole, bytes) and len(whole) == size else first.tobytes()
            held[0] = first[size:]
            return first[:size].tobytes()
        parts: list[memoryview] = []
        while size:
            piece = held.popleft()
            if len(piece) > size:
                held.appendleft(piece[size:])
                piece = piece[:size]
            parts.append(piece)
            size -= len(piece)
        return b"".join(parts)

    def _event(self, line: bytes) -> ExecChunk:
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise OperationFailedError("IOError", f"{self.what}: a malformed event") from exc
        kind = event.get("event")
        if kind == "started":
            self.exec_id = str(event.get("exec_id") or "")
            return ExecChunk(kind="started", exec_id=self.exec_id)
        if kind in ("stdout", "stderr"):
            return self._output(kind, base64.b64decode(str(event.get("data_b64") or "")))
        if kind == "exit":
            fields = {k: v for k, v in event.items() if k != "event"}
            self.result = ExecResult.model_validate(
                {
                    **fields,
                    "stdout": b"".join(self.stdout),
                    "stderr": b"".join(self.stderr),
                    "replayed": self.replayed,
                }
            )
            self.exec_id = self.result.exec_id or self.exec_id
            return ExecChunk(kind="exit", exec_id=self.exec_id, result=self.result)
        if kind == "error":
            error = event.get("error") or {}
            raise actor_error(
                str(error.get("type") or ""), f"{self.what}: {error.get('message') or ''}"
            )
        raise OperationFailedError("IOError", f"{self.what}: an unknown event {kind!r}")

    def _output(self, kind: Literal["stdout", "stderr"], data: bytes) -> ExecChunk:
        if self.collect:
            (self.stdout if kind == "stdout" else self.stderr).append(data)
        return ExecChunk(kind=kind, exec_id=self.exec_id, data=data)

    def end(self) -> ExecResult:
        """The result, once the stream ended.

        Raises:
            OperationFailedError: ``StreamCut``, the stream ended without the command's exit.
        """
        if self.buffer.strip() and not self.framed:
            self.feed(b"\n")
        if self.result is None:
            raise OperationFailedError(
                "StreamCut",
                f"{self.what}: the stream ended before the command's exit (the connection or "
                "the agent went away; the command was killed)",
            )
        return self.result


def signal_flow(info: SandboxInfo, exec_id: str, signal: str | int) -> Flow[bool]:
    """``EXEC_SIGNAL`` -> whether the signal was delivered."""
    _route(info, wire.STATUS)  # refuses a sandbox without an agent
    route = wire.EXEC_SIGNAL.path(sid=info.sandbox_id, eid=exec_id)
    request = AgentRequest(
        wire.EXEC_SIGNAL.method,
        route,
        body=json.dumps({"signal": signal}).encode(),
        request_id=_request_id("signal"),
        content_type=wire.JSON_CONTENT_TYPE,
    )
    reply = _json((yield request), f"signal {exec_id} in {info.name}")
    return bool(reply.get("signalled"))


def audit_flow(info: SandboxInfo, after: int = 0, limit: int = 100) -> Flow[AuditPage]:
    """``AUDIT`` -> a page of the audit log."""
    query = {wire.AFTER_QUERY: str(after), wire.LIMIT_QUERY: str(limit)}
    reply = yield _get(info, wire.AUDIT, query)
    return AuditPage.model_validate(_json(reply, f"audit of {info.name}"))


# -- files ----------------------------------------------------------------------------------------


def read_bytes_flow(
    info: SandboxInfo, path: str, offset: int = 0, length: int | None = None
) -> Flow[bytes]:
    """``FILE_BYTES`` -> the bytes of the range (to the end when ``length`` is None)."""
    rel = _file(path)
    query = {wire.PATH_QUERY: rel, wire.OFFSET_QUERY: str(offset)}
    if length is not None:
        query[wire.LENGTH_QUERY] = str(length)
    reply = yield _get(info, wire.FILE_BYTES, query)
    if not 200 <= reply.status < 300:
        raise reply_error(reply, f"read {rel} in {info.name}")
    return reply.body


def write_flow(info: SandboxInfo, path: str, data: bytes | str, append: bool) -> Flow[FileChange]:
    """``FILE_PUT`` (the body is the bytes; ``append=1`` to append) -> what was written."""
    rel = _file(path)
    query = {wire.PATH_QUERY: rel}
    if append:
        query[wire.APPEND_QUERY] = "1"
    request = AgentRequest(
        wire.FILE_PUT.method,
        _route(info, wire.FILE_PUT),
        query,
        _bytes(data),
        _request_id("append" if append else "write"),
    )
    return FileChange.model_validate(_json((yield request), f"write {rel} in {info.name}"))


def change_flow(
    info: SandboxInfo, route: wire.Route, body: dict[str, Any], op: str
) -> Flow[dict[str, Any]]:
    """A changing JSON route (``FILE_DELETE``, ``FILE_MOVE``, ``FILE_MKDIR``, ``FILE_EDIT``)."""
    reply = yield _post(info, route, body, op)
    return _json(reply, f"{op} {body.get('path')} in {info.name}")


def stat_flow(info: SandboxInfo, path: str) -> Flow[FileStat]:
    """``FILE_STAT`` -> the path's stat (never following a link)."""
    rel = checked_path(path)
    reply = yield _get(info, wire.FILE_STAT, {wire.PATH_QUERY: rel})
    return FileStat.model_validate(_json(reply, f"stat {rel} in {info.name}"))


def grep_flow(
    info: SandboxInfo,
    pattern: str,
    path: str = ".",
    glob: str | None = None,
    ignore_case: bool = False,
    max_matches: int = DEFAULT_MAX_MATCHES,
    cursor: str | None = None,
) -> Flow[GrepResult]:
    """``GREP`` -> a page of matches."""
    query = {
        wire.PATTERN_QUERY: pattern,
        wire.PATH_QUERY: checked_path(path),
        wire.MAX_QUERY: str(max_matches),
    }
    if glob:
        query[wire.GLOB_QUERY] = glob
    if ignore_case:
        query[wire.IGNORE_CASE_QUERY] = "1"
    if cursor:
        query[wire.CURSOR_QUERY] = cursor
    reply = yield _get(info, wire.GREP, query)
    return GrepResult.model_validate(_json(reply, f"grep {pattern!r} in {info.name}"))


def glob_flow(
    info: SandboxInfo,
    pattern: str,
    path: str = ".",
    max_results: int = DEFAULT_MAX_RESULTS,
    cursor: str | None = None,
) -> Flow[GlobResult]:
    """``GLOB`` -> a page of paths."""
    query = {
        wire.PATTERN_QUERY: pattern,
        wire.PATH_QUERY: checked_path(path),
        wire.MAX_QUERY: str(max_results),
    }
    if cursor:
        query[wire.CURSOR_QUERY] = cursor
    reply = yield _get(info, wire.GLOB, query)
    return GlobResult.model_validate(_json(reply, f"glob {pattern!r} in {info.name}"))


def upload_items(files: Uploads) -> list[tuple[str, bytes]]:
    """``files`` as (path, bytes) pairs; a path that leaves the sandbox is still sent (the door
    refuses it, for that file only)."""
    pairs = files.items() if isinstance(files, Mapping) else files
    return [(str(path), _bytes(data)) for path, data in pairs]


def upload_flow(info: SandboxInfo, files: Uploads) -> Flow[list[FileResult]]:
    """``UPLOAD`` -> one result per file (a refused file does not stop the others)."""
    items = [
        {"path": path, "content_b64": base64.b64encode(data).decode()}
        for path, data in upload_items(files)
    ]
    reply = yield _post(info, wire.UPLOAD, {"files": items}, "upload")
    results = _json(reply, f"upload to {info.name}").get("results") or []
    return [FileResult.model_validate(result) for result in results]


def download_results(events: Iterable[Mapping[str, Any]]) -> list[FileResult]:
    """The per-file results of a download's events (chunks ``data`` or ``data_b64``, then each
    file's ``ok``/``error``), the chunks joined into each result's ``data``."""
    chunks: dict[str, list[bytes]] = {}
    out: list[FileResult] = []
    for event in events:
        path = str(event.get("path") or "")
        if "ok" not in event:
            data = event.get("data")
            if data is None:
                data = base64.b64decode(str(event.get("data_b64") or ""))
            chunks.setdefault(path, []).append(bytes(data))
            continue
        joined = b"".join(chunks.pop(path, []))
        out.append(
            FileResult(
                path=path,
                ok=bool(event["ok"]),
                size=int(event.get("size") or 0),
                data=joined,
                error=event.get("error"),
            )
        )
    return out


def download_flow(info: SandboxInfo, paths: Sequence[str]) -> Flow[list[FileResult]]:
    """``DOWNLOAD`` (NDJSON) -> one result per path, with its bytes."""
    request = AgentRequest(
        wire.DOWNLOAD.method,
        _route(info, wire.DOWNLOAD),
        query_pairs=tuple((wire.PATH_QUERY, str(path)) for path in paths),
        accept=wire.NDJSON_CONTENT_TYPE,
    )
    reply = yield request
    if not 200 <= reply.status < 300:
        raise reply_error(reply, f"download from {info.name}")
    events = [json.loads(line) for line in reply.body.splitlines() if line.strip()]
    return download_results(events)


# -- SQL ----------------------------------------------------------------------------------------


def sql_flow(
    info: SandboxInfo, statement: str, params: Any, many: bool, max_rows: int
) -> Flow[SqlResult]:
    """``SQL`` -> the statement's outcome (``transaction_rollback`` sandboxes only)."""
    body = {"sql": statement, "params": params, "many": many, "max_rows": max_rows}
    reply = yield _post(info, wire.SQL, body, "sql")
    return SqlResult.model_validate(_json(reply, f"sql in {info.name}"))


# -- the operations: one interface, two doors --------------------------------------------------


class ActorOperations(Protocol):
    """What a client can do inside one sandbox (the module docstring; blocking)."""

    def exec(self, info: SandboxInfo, command: Command, **options: Any) -> ExecResult: ...
    def exec_stream(self, info: SandboxInfo, command: Command, **options: Any) -> Chunks: ...
    def signal(self, info: SandboxInfo, exec_id: str, signal: str | int = "SIGTERM") -> bool: ...
    def audit(self, info: SandboxInfo, after: int = 0, limit: int = 100) -> AuditPage: ...
    def read_bytes(
        self, info: SandboxInfo, path: str, offset: int = 0, length: int | None = None
    ) -> bytes: ...
    def write(
        self, info: SandboxInfo, path: str, data: bytes | str, *, append: bool = False
    ) -> FileChange: ...
    def delete(self, info: SandboxInfo, path: str, *, recursive: bool = False) -> FileChange: ...
    def move(
        self, info: SandboxInfo, path: str, to: str, *, overwrite: bool = False
    ) -> FileChange: ...
    def mkdir(
        self, info: SandboxInfo, path: str, *, parents: bool = True, exist_ok: bool = True
    ) -> FileChange: ...
    def stat(self, info: SandboxInfo, path: str) -> FileStat: ...
    def edit(
        self, info: SandboxInfo, path: str, old: str, new: str, *, replace_all: bool = False
    ) -> EditResult: ...
    def grep(self, info: SandboxInfo, pattern: str, **options: Any) -> GrepResult: ...
    def glob(self, info: SandboxInfo, pattern: str, **options: Any) -> GlobResult: ...
    def upload(self, info: SandboxInfo, files: Uploads) -> list[FileResult]: ...
    def download(self, info: SandboxInfo, paths: Sequence[str]) -> list[FileResult]: ...
    def sql(
        self,
        info: SandboxInfo,
        statement: str,
        params: Any = None,
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult: ...
    def sql_many(
        self,
        info: SandboxInfo,
        statement: str,
        param_sets: Sequence[Any],
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult: ...


class AsyncActorOperations(Protocol):
    """:class:`ActorOperations` with awaitable methods (``exec_stream`` an async iterator)."""

    async def exec(self, info: SandboxInfo, command: Command, **options: Any) -> ExecResult: ...
    def exec_stream(self, info: SandboxInfo, command: Command, **options: Any) -> AsyncChunks: ...
    async def signal(
        self, info: SandboxInfo, exec_id: str, signal: str | int = "SIGTERM"
    ) -> bool: ...
    async def audit(self, info: SandboxInfo, after: int = 0, limit: int = 100) -> AuditPage: ...
    async def read_bytes(
        self, info: SandboxInfo, path: str, offset: int = 0, length: int | None = None
    ) -> bytes: ...
    async def write(
        self, info: SandboxInfo, path: str, data: bytes | str, *, append: bool = False
    ) -> FileChange: ...
    async def delete(
        self, info: SandboxInfo, path: str, *, recursive: bool = False
    ) -> FileChange: ...
    async def move(
        self, info: SandboxInfo, path: str, to: str, *, overwrite: bool = False
    ) -> FileChange: ...
    async def mkdir(
        self, info: SandboxInfo, path: str, *, parents: bool = True, exist_ok: bool = True
    ) -> FileChange: ...
    async def stat(self, info: SandboxInfo, path: str) -> FileStat: ...
    async def edit(
        self, info: SandboxInfo, path: str, old: str, new: str, *, replace_all: bool = False
    ) -> EditResult: ...
    async def grep(self, info: SandboxInfo, pattern: str, **options: Any) -> GrepResult: ...
    async def glob(self, info: SandboxInfo, pattern: str, **options: Any) -> GlobResult: ...
    async def upload(self, info: SandboxInfo, files: Uploads) -> list[FileResult]: ...
    async def download(self, info: SandboxInfo, paths: Sequence[str]) -> list[FileResult]: ...
    async def sql(
        self,
        info: SandboxInfo,
        statement: str,
        params: Any = None,
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult: ...
    async def sql_many(
        self,
        info: SandboxInfo,
        statement: str,
        param_sets: Sequence[Any],
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult: ...


def _edit_body(path: str, old: str, new: str, replace_all: bool) -> dict[str, Any]:
    if not old:
        raise RefusedError("InvalidOperation", f"edit {path}: the text to replace is empty")
    return {"path": _file(path), "old": old, "new": new, "replace_all": replace_all}


class AgentActor:
    """:class:`ActorOperations` through the workspace agent (blocking).

    Args:
        transport: how requests reach the agent (``PodProxyTransport``: the API server's pod
            proxy; ``DirectTransport``: an address and a token). A transport with a ``stream``
            method streams a command's output as it comes; without one it comes at the exit.
    """

    def __init__(self, transport: AgentTransport) -> None:
        self.transport = transport

    def _run(self, info: SandboxInfo, flow: Flow[T]) -> T:
        return run_flow(flow, lambda request: self.transport.send(info, request))

    def _replies(self, info: SandboxInfo, request: AgentRequest) -> Iterator[AgentReply]:
        stream = getattr(self.transport, "stream", None)
        if stream is None:
            yield self.transport.send(info, request)
        else:
            yield from stream(info, request)

    def exec_stream(self, info: SandboxInfo, command: Command, **options: Any) -> Chunks:
        """Run ``command`` (:func:`exec_body`'s options: ``cwd``, ``env``, ``stdin``,
        ``timeout`` seconds, ``max_output_bytes``, ``network``); yield its chunks as they come
        (``started``, ``stdout``/``stderr``, then ``exit`` with the result). Errors as the
        module docstring; leaving the loop early closes the stream, which kills the command."""
        yield from self._exec(info, command, False, options)

    def _exec(
        self, info: SandboxInfo, command: Command, collect: bool, options: Mapping[str, Any]
    ) -> Chunks:
        request = exec_request(info, exec_body(command, **options))
        reader = ExecStream(f"exec in {info.name}", collect, framed=True)
        for reply in self._replies(info, request):
            if not 200 <= reply.status < 300:
                raise reply_error(reply, f"exec in {info.name}")
            yield from reader.feed(reply.body)
        reader.end()

    def exec(self, info: SandboxInfo, command: Command, **options: Any) -> ExecResult:
        """Run ``command`` to its end; its result with ``stdout`` and ``stderr`` collected."""
        result = None
        for chunk in self._exec(info, command, True, options):
            result = chunk.result or result
        assert result is not None  # _exec raises StreamCut otherwise
        return result

    def signal(self, info: SandboxInfo, exec_id: str, signal: str | int = "SIGTERM") -> bool:
        """Signal a running command (``SIGKILL`` cancels it). Raises: ``NotFoundError`` when
        no command runs under ``exec_id``."""
        return bool(self._run(info, signal_flow(info, exec_id, signal)))

    def audit(self, info: SandboxInfo, after: int = 0, limit: int = 100) -> AuditPage:
        """A page of the sandbox's audit log (entries with ``seq > after``)."""
        return self._run(info, audit_flow(info, after, limit))

    def read_bytes(
        self, info: SandboxInfo, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        """The bytes of ``path`` from ``offset``, ``length`` at most (to the end by default)."""
        return self._run(info, read_bytes_flow(info, path, offset, length))

    def write(
        self, info: SandboxInfo, path: str, data: bytes | str, *, append: bool = False
    ) -> FileChange:
        """Write ``data`` (``str`` as UTF-8) to ``path``, or append it; parents are made."""
        return self._run(info, write_flow(info, path, data, append))

    def delete(self, info: SandboxInfo, path: str, *, recursive: bool = False) -> FileChange:
        """Delete a file, a link or (``recursive``, or empty) a directory."""
        body = {"path": _file(path), "recursive": recursive}
        return FileChange.model_validate(
            self._run(info, change_flow(info, wire.FILE_DELETE, body, "delete"))
        )

    def move(self, info: SandboxInfo, path: str, to: str, *, overwrite: bool = False) -> FileChange:
        """Move ``path`` to ``to`` (refused when ``to`` exists unless ``overwrite``)."""
        body = {"path": _file(path), "to": _file(to), "overwrite": overwrite}
        return FileChange.model_validate(
            self._run(info, change_flow(info, wire.FILE_MOVE, body, "move"))
        )

    def mkdir(
        self, info: SandboxInfo, path: str, *, parents: bool = True, exist_ok: bool = True
    ) -> FileChange:
        """Make a directory (and its parents)."""
        body = {"path": _file(path), "parents": parents, "exist_ok": exist_ok}
        return FileChange.model_validate(
            self._run(info, change_flow(info, wire.FILE_MKDIR, body, "mkdir"))
        )

    def stat(self, info: SandboxInfo, path: str) -> FileStat:
        """The stat of ``path`` (never following a link)."""
        return self._run(info, stat_flow(info, path))

    def edit(
        self, info: SandboxInfo, path: str, old: str, new: str, *, replace_all: bool = False
    ) -> EditResult:
        """Replace the exact text ``old`` by ``new``; refused (``InvalidOperation``) when
        ``old`` is absent, or occurs more than once without ``replace_all``."""
        body = _edit_body(path, old, new, replace_all)
        return EditResult.model_validate(
            self._run(info, change_flow(info, wire.FILE_EDIT, body, "edit"))
        )

    def grep(self, info: SandboxInfo, pattern: str, **options: Any) -> GrepResult:
        """Lines matching the regular expression (:func:`grep_flow`'s options: ``path``,
        ``glob``, ``ignore_case``, ``max_matches``, ``cursor``)."""
        return self._run(info, grep_flow(info, pattern, **options))

    def glob(self, info: SandboxInfo, pattern: str, **options: Any) -> GlobResult:
        """Paths matching the shell pattern (``path``, ``max_results``, ``cursor``)."""
        return self._run(info, glob_flow(info, pattern, **options))

    def upload(self, info: SandboxInfo, files: Uploads) -> list[FileResult]:
        """Write several files; one result per file."""
        return self._run(info, upload_flow(info, files))

    def download(self, info: SandboxInfo, paths: Sequence[str]) -> list[FileResult]:
        """Read several files; one result per path, with its ``data``."""
        return self._run(info, download_flow(info, paths))

    def sql(
        self,
        info: SandboxInfo,
        statement: str,
        params: Any = None,
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult:
        """Run one statement in the sandbox's transaction (``transaction_rollback`` only)."""
        return self._run(info, sql_flow(info, statement, params, False, max_rows))

    def sql_many(
        self,
        info: SandboxInfo,
        statement: str,
        param_sets: Sequence[Any],
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult:
        """Run ``statement`` once per parameter set, in one call."""
        return self._run(info, sql_flow(info, statement, list(param_sets), True, max_rows))


class AsyncAgentActor:
    """:class:`AgentActor` with awaitable methods (same names, arguments, results, errors)."""

    def __init__(self, transport: AsyncAgentTransport) -> None:
        self.transport = transport

    async def _run(self, info: SandboxInfo, flow: Flow[T]) -> T:
        async def send(request: AgentRequest) -> AgentReply:
            return await self.transport.send(info, request)

        return await arun_flow(flow, send)

    async def _replies(
        self, info: SandboxInfo, request: AgentRequest
    ) -> AsyncGenerator[AgentReply, None]:
        stream = getattr(self.transport, "stream", None)
        if stream is None:
            yield await self.transport.send(info, request)
        else:
            async for reply in stream(info, request):
                yield reply

    async def _exec(
        self, info: SandboxInfo, command: Command, collect: bool, options: Mapping[str, Any]
    ) -> AsyncChunks:
        request = exec_request(info, exec_body(command, **options))
        reader = ExecStream(f"exec in {info.name}", collect, framed=True)
        replies = self._replies(info, request)
        try:
            async for reply in replies:
                if not 200 <= reply.status < 300:
                    raise reply_error(reply, f"exec in {info.name}")
                for chunk in reader.feed(reply.body):
                    yield chunk
        finally:
            await replies.aclose()
        reader.end()

    async def exec_stream(self, info: SandboxInfo, command: Command, **options: Any) -> AsyncChunks:
        """As :meth:`AgentActor.exec_stream` (an async iterator)."""
        chunks = self._exec(info, command, False, options)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    async def exec(self, info: SandboxInfo, command: Command, **options: Any) -> ExecResult:
        """As :meth:`AgentActor.exec`."""
        result = None
        async for chunk in self._exec(info, command, True, options):
            result = chunk.result or result
        assert result is not None  # _exec raises StreamCut otherwise
        return result

    async def signal(self, info: SandboxInfo, exec_id: str, signal: str | int = "SIGTERM") -> bool:
        """As :meth:`AgentActor.signal`."""
        return bool(await self._run(info, signal_flow(info, exec_id, signal)))

    async def audit(self, info: SandboxInfo, after: int = 0, limit: int = 100) -> AuditPage:
        """As :meth:`AgentActor.audit`."""
        return await self._run(info, audit_flow(info, after, limit))

    async def read_bytes(
        self, info: SandboxInfo, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        """As :meth:`AgentActor.read_bytes`."""
        return await self._run(info, read_bytes_flow(info, path, offset, length))

    async def write(
        self, info: SandboxInfo, path: str, data: bytes | str, *, append: bool = False
    ) -> FileChange:
        """As :meth:`AgentActor.write`."""
        return await self._run(info, write_flow(info, path, data, append))

    async def delete(self, info: SandboxInfo, path: str, *, recursive: bool = False) -> FileChange:
        """As :meth:`AgentActor.delete`."""
        body = {"path": _file(path), "recursive": recursive}
        return FileChange.model_validate(
            await self._run(info, change_flow(info, wire.FILE_DELETE, body, "delete"))
        )

    async def move(
        self, info: SandboxInfo, path: str, to: str, *, overwrite: bool = False
    ) -> FileChange:
        """As :meth:`AgentActor.move`."""
        body = {"path": _file(path), "to": _file(to), "overwrite": overwrite}
        return FileChange.model_validate(
            await self._run(info, change_flow(info, wire.FILE_MOVE, body, "move"))
        )

    async def mkdir(
        self, info: SandboxInfo, path: str, *, parents: bool = True, exist_ok: bool = True
    ) -> FileChange:
        """As :meth:`AgentActor.mkdir`."""
        body = {"path": _file(path), "parents": parents, "exist_ok": exist_ok}
        return FileChange.model_validate(
            await self._run(info, change_flow(info, wire.FILE_MKDIR, body, "mkdir"))
        )

    async def stat(self, info: SandboxInfo, path: str) -> FileStat:
        """As :meth:`AgentActor.stat`."""
        return await self._run(info, stat_flow(info, path))

    async def edit(
        self, info: SandboxInfo, path: str, old: str, new: str, *, replace_all: bool = False
    ) -> EditResult:
        """As :meth:`AgentActor.edit`."""
        body = _edit_body(path, old, new, replace_all)
        return EditResult.model_validate(
            await self._run(info, change_flow(info, wire.FILE_EDIT, body, "edit"))
        )

    async def grep(self, info: SandboxInfo, pattern: str, **options: Any) -> GrepResult:
        """As :meth:`AgentActor.grep`."""
        return await self._run(info, grep_flow(info, pattern, **options))

    async def glob(self, info: SandboxInfo, pattern: str, **options: Any) -> GlobResult:
        """As :meth:`AgentActor.glob`."""
        return await self._run(info, glob_flow(info, pattern, **options))

    async def upload(self, info: SandboxInfo, files: Uploads) -> list[FileResult]:
        """As :meth:`AgentActor.upload`."""
        return await self._run(info, upload_flow(info, files))

    async def download(self, info: SandboxInfo, paths: Sequence[str]) -> list[FileResult]:
        """As :meth:`AgentActor.download`."""
        return await self._run(info, download_flow(info, paths))

    async def sql(
        self,
        info: SandboxInfo,
        statement: str,
        params: Any = None,
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult:
        """As :meth:`AgentActor.sql`."""
        return await self._run(info, sql_flow(info, statement, params, False, max_rows))

    async def sql_many(
        self,
        info: SandboxInfo,
        statement: str,
        param_sets: Sequence[Any],
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult:
        """As :meth:`AgentActor.sql_many`."""
        return await self._run(info, sql_flow(info, statement, list(param_sets), True, max_rows))


# -- which door serves a sandbox ----------------------------------------------------------------


def _door_error(info: SandboxInfo) -> RefusedError:
    if not info.executor:
        return RefusedError("InvalidState", f"sandbox {info.name} is not provisioned yet")
    return RefusedError(
        "NoFileOperations",
        f"sandbox {info.name} runs on the {info.executor} executor; this client has the "
        "actor's operations for: local (a state directory), pod (a Kubernetes API client)",
    )


def actor_for(
    info: SandboxInfo, agent: ActorOperations, state_dir: str | Path | None
) -> ActorOperations:
    """The door serving ``info``: ``agent`` for the pod executor; for the local executor a
    :class:`~sandbox_client.local_actor.LocalDoor` on ``state_dir`` (the operator's
    ``SANDBOX_OPERATOR_STATE_DIR``).

    Raises:
        RefusedError: ``InvalidState`` (not provisioned yet), ``NoFileOperations`` (another
            executor).
    """
    if info.executor == AGENT_EXECUTOR:
        return agent
    if info.executor == LOCAL_EXECUTOR:
        from sandbox_client.local_actor import LocalDoor  # the core's actor: loaded on use

        return LocalDoor(state_dir)
    raise _door_error(info)


def async_actor_for(
    info: SandboxInfo, agent: AsyncActorOperations, state_dir: str | Path | None
) -> AsyncActorOperations:
    """:func:`actor_for` for the async client (the local door runs in worker threads)."""
    if info.executor == AGENT_EXECUTOR:
        return agent
    if info.executor == LOCAL_EXECUTOR:
        from sandbox_client.local_actor import AsyncLocalDoor

        return cast(AsyncActorOperations, AsyncLocalDoor(state_dir))
    raise _door_error(info)


__all__ = [
    "ActorOperations",
    "AgentActor",
    "AsyncActorOperations",
    "AsyncAgentActor",
    "AsyncChunks",
    "Chunks",
    "Command",
    "ExecStream",
    "actor_error",
    "actor_for",
    "async_actor_for",
]
