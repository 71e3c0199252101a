"""The workspace agent's HTTP server (aiohttp): the routes of :mod:`sandbox_core.agent.wire`
served by :class:`~sandbox_core.agent.operations.Operations`.

Security: every request except the health probe (``wire.HEALTHZ``) carries the Pod's token as
``Authorization: Bearer <token>`` (or, through the API server's pod proxy, in
``wire.TOKEN_HEADER``); the token is read from a file (a Secret the operator creates per
Sandbox, mounted as a file: never an environment variable or an argument) and compared in
constant time. No token file, no service. A warm-pool Pod (made before its Sandbox existed)
has no token file but its pool's bootstrap token; ``wire.HANDOVER`` authenticated with it hands
the agent its Sandbox's token (kept under the state directory, mode 0600), after which only
that token is accepted and the bootstrap token never again (:class:`HandedOver`). A token
that carries a lifetime
(:mod:`sandbox_core.agent.tokens`) is refused with 401 ``TokenExpired`` once this process has
held it longer than that lifetime, measured on its own monotonic clock.

Idempotency: a changing request (POST, PUT, DELETE) carries a request id
(``wire.REQUEST_ID_HEADER``). Its reply is stored under the state directory before it is sent
(:class:`RequestJournal`), keyed by method, route, sandbox id and request id, so the same
request sent again - a retry after a lost reply or an operator restart - gets the stored reply
and does nothing twice (``wire.REPLAY_HEADER: true``), while the same id on another route or
sandbox is another request. The journal is pruned (age and count), and a change is refused
with 507 ``StateVolumeFull`` before it runs when the state volume has no room for its record.
Requests run one at a time, in the order they came (one worker thread): the agent
serves one Sandbox and the core's operations are not meant to overlap. A short read (a text
range of at most 64 KiB, a stat) of a sandbox already open runs on the event loop instead when
the worker has nothing queued or running: still one at a time, without the hop to the thread;
every change runs in the worker, so no fsync ever holds the event loop. The failures of the
two-phase routes (prepare, apply-prepared, abort-prepared) are not remembered: a failed apply
keeps the sandbox's status so the coordinator retries it, and a replayed failure would refuse
that retry. Nor are those of cleanup (idempotent; a refusal may pass on retry, and the
operator's finalizer retries it with the same request id).

This module is the only one of ``sandbox_core`` that imports aiohttp; nothing else imports it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from sandbox_core.actor.exec import (
    CommandRunner,
    ExecLimitError,
    ExecRequest,
    Execution,
    OutputChunk,
)
from sandbox_core.agent import bundle, wire
from sandbox_core.agent.chunked import ChunkedSender
from sandbox_core.agent.operations import AgentConfig, Operations
from sandbox_core.agent.tokens import TokenAges
from sandbox_core.durable import write_bytes_atomic

logger = logging.getLogger("sandbox_core.agent")
T = TypeVar("T")


JOURNAL_MAX_ENTRIES = 20_000  # stored replies kept at most (the oldest go first)
JOURNAL_MAX_AGE_SECONDS = 7 * 24 * 3600  # a retry comes within minutes; a week is plenty
JOURNAL_PRUNE_EVERY = 256  # puts between two prunes
STATE_RESERVE_BYTES = 8 * 1024 * 1024  # free space a changing request needs on the state volume


ON_LOOP_MAX_BYTES = 64 * 1024  # the largest read served on the event loop (_loop_is_free)


class NotOnLoop(Exception):  # noqa: N818 - a signal, not an error
    """A read offered to the event loop is not short: it runs in the worker instead."""


class StateVolumeFull(wire.AgentError):
    """The state volume has no room for a request's record: refused before the operation."""

    def __init__(self, free: int) -> None:
        super().__init__(
            wire.INSUFFICIENT_STORAGE,
            "StateVolumeFull",
            f"state volume full: {free} bytes free, {STATE_RESERVE_BYTES} needed before a "
            "change (nothing was done; free space on the agent's state claim, or grow it)",
        )


class RequestJournal:
    """Stored replies of changing requests (files under ``<state>/requests``).

    A reply is keyed by ``(method, route, sandbox id, request id)`` (:func:`journal_key`): the
    same request id on another route or sandbox is another request, never a replay of this one.
    Bounded: :meth:`prune` drops replies older than ``max_age`` seconds, then the oldest beyond
    ``max_entries``; it runs every :data:`JOURNAL_PRUNE_EVERY` puts and when the volume is low.
    A pruned reply's request, sent again, runs again (every operation is idempotent by its
    sandbox's state; the journal spares the repeat, it does not make it safe).

    The names of the stored replies are kept in memory (the directory is listed once, at the
    first use, and again by each prune; a name is added before its reply is written), so the
    look-up of a new request id - every change's - costs no system call. The agent is the
    journal's only writer.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        max_entries: int = JOURNAL_MAX_ENTRIES,
        max_age: float = JOURNAL_MAX_AGE_SECONDS,
        reserve: int = STATE_RESERVE_BYTES,
    ) -> None:
        self.directory = state_dir / "requests"
        self.max_entries = max_entries
        self.max_age = max_age
        self.reserve = reserve
        self._puts = 0
        self._names: set[str] | None = None  # the stored replies' names, once listed

    def _name(self, key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest() + ".json"

    def _path(self, key: str) -> Path:
        return self.directory / self._name(key)

    def _stored(self) -> set[str]:
        """The names of the stored replies (listed from the directory the first time)."""
        if self._names is None:
            try:
                names = (path.name for path in self.directory.iterdir())
                self._names = {name for name in names if _is_reply(name)}
            except FileNotFoundError:
                self._names = set()
        return self._names

    def get(self, key: str) -> tuple[int, Any] | None:
        """The stored ``(status, payload)``, or None."""
        name = self._name(key)
        if name not in self._stored():
            return None
        try:
            data = json.loads((self.directory / name).read_bytes())
        except (OSError, ValueError):
            return None
        return int(data["status"]), data["payload"]

    def put(self, key: str, status: int, payload: Any, *, durable: bool = True) -> None:
        """Store a reply (write, fsync, rename, fsync of the directory): :meth:`get` sees the
        whole reply or none. A crash leaves at most ``<name>.json.tmp``, which the next put of
        the same id replaces. ``durable=False`` skips both fsyncs and the rename: the reply is
        written straight to its name and survives a restart of the process, not a power loss
        (for changes that are not fsynced themselves); a crash in the middle leaves a torn
        file, which :meth:`get` takes for no reply (the request runs again, as after a crash
        before the put) and the next put of the same id replaces.

        Raises:
            OSError: the reply cannot be written.
        """
        self.put_text(key, status, json.dumps(payload), durable=durable)

    def put_text(self, key: str, status: int, payload_text: str, *, durable: bool = True) -> None:
        """:meth:`put` of a payload already encoded as JSON text (the reply as it is sent: it
        is not encoded twice). The stored record is the same.

        Raises:
            OSError: the reply cannot be written.
        """
        record = f'{{"status": {status}, "payload": {payload_text}}}'.encode()
        name = self._name(key)
        self._stored().add(name)  # before the file: a torn one is read (and taken for none)
        if durable:
            write_bytes_atomic(self.directory / name, record, tmp_suffix=".tmp")
        else:
            self._write_now(self.directory / name, record)
        self._puts += 1
        if self._puts % JOURNAL_PRUNE_EVERY == 0:
            self.prune()

    def _write_now(self, path: Path, content: bytes) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o666)
        except FileNotFoundError:  # the first reply: make the directory
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, flags, 0o666)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def prune(self, now: float | None = None) -> int:
        """Drop replies older than ``max_age`` and the oldest beyond ``max_entries`` (and torn
        ``.tmp`` files older than a minute); returns how many were removed."""
        now = time.time() if now is None else now
        try:
            with os.scandir(self.directory) as listing:
                entries = [(e.stat().st_mtime, e.path, e.name) for e in listing if e.is_file()]
        except FileNotFoundError:
            self._names = set()
            return 0
        entries.sort()
        removed = 0
        stored = {name for _, _, name in entries if _is_reply(name)}
        for mtime, path, name in entries:
            stale = now - mtime > (60 if name.endswith(".tmp") else self.max_age)
            if stale or (_is_reply(name) and len(stored) > self.max_entries):
                Path(path).unlink(missing_ok=True)
                if _is_reply(name):
                    stored.discard(name)
                    removed += 1
        self._names = stored
        return removed

    def free_bytes(self) -> int:
        """Bytes free on the state volume for this process (``statvfs``)."""
        try:
            info = os.statvfs(self.directory)
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
            info = os.statvfs(self.directory)
        return info.f_bavail * info.f_frsize

    def require_room(self) -> None:
        """Refuse a change when the state volume cannot hold its record (pruning first).

        Raises:
            StateVolumeFull: 507, before anything was done.
        """
        if self.free_bytes() >= self.reserve:
            return
        self.prune()
        free = self.free_bytes()
        if free < self.reserve:
            raise StateVolumeFull(free)


def _is_reply(name: str) -> bool:
    """Whether a file name of the journal's directory is a stored reply (not a staged one)."""
    return name.endswith(".json")


def journal_key(request: web.Request, request_id: str) -> str:
    """The journal's key of a changing request: method, route template, sandbox (or
    checkpoint) id and request id."""
    info = request.match_info
    route = info.route.resource.canonical if info.route.resource is not None else request.path
    target = info.get("sid") or info.get("cid") or ""
    return "\n".join((request.method, route, target, request_id))


# The longest token a hand-over accepts (the operator's are about 80 characters).
MAX_TOKEN_CHARS = 512


class HandedOver:
    """The token (and allowed root) handed over to a warm-pool Pod's agent: a file under its
    state directory, written atomically with mode 0600, read back after a restart of the
    container (the state directory of a pool Pod is an emptyDir: it lives as long as the Pod).
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / wire.HANDED_TOKEN_FILE
        self.token: bytes | None = None
        self.allowed_root = ""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        self.token = str(data.get("token") or "").encode() or None
        self.allowed_root = str(data.get("allowed_root") or "")

    def store(self, token: str, allowed_root: str) -> None:
        """Keep ``token`` and ``allowed_root`` (fsynced; replaces what was there).

        Raises:
            OSError: the state directory cannot be written.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staged = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"token": token, "allowed_root": allowed_root}, out)
            out.flush()
            os.fsync(out.fileno())
        staged.replace(self.path)
        self.token, self.allowed_root = token.encode(), allowed_root


def _inside(path: str, roots: tuple[Path, ...] | None) -> bool:
    """Whether absolute, normalised ``path`` is one of ``roots`` or beneath one (any when
    ``roots`` is None: a local agent)."""
    if roots is None:
        return True
    candidate = Path(path)
    return any(candidate == root or root in candidate.parents for root in roots)


class Agent:
    """The aiohttp application around :class:`Operations` (see the module docstring)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.ops = Operations(config)
        self.journal = RequestJournal(config.state_dir)
        self.journal.prune()  # what an earlier process left beyond the bounds
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent")
        # Operations handed to the worker and not finished yet (:meth:`_in_order`).
        self._queued = 0
        self._queued_lock = threading.Lock()
        # The actor's commands: their output is read in threads of their own, never the worker.
        self.actor = CommandRunner(
            config.state_dir, on_finish=lambda sid, _result: self.ops.count_change(sid)
        )
        self.exec_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="exec")
        self.token_ages = TokenAges()
        self.handed = HandedOver(config.state_dir)
        if self.handed.token is not None:
            self._narrow(self.handed.allowed_root)
        start_token = self._token()
        if start_token is not None:
            self.token_ages.held(start_token)  # its lifetime runs from now

    def _narrow(self, allowed_root: str) -> None:
        """Admit originals only under ``allowed_root`` from now on (``""``: none)."""
        roots = (Path(allowed_root),) if allowed_root else ()
        self.config = replace(self.config, allowed_roots=roots)
        self.ops.config = self.config

    def _token(self) -> bytes | None:
        if self.handed.token is not None:
            return self.handed.token
        try:
            token = _read_small(self.config.token_file).strip()
        except OSError:
            return None
        return token or None

    def _bootstrap(self) -> bytes | None:
        path = self.config.bootstrap_token_file
        if path is None:
            return None
        try:
            return path.read_bytes().strip() or None
        except OSError:
            return None

    def hand_over(self, offered: str, body: dict[str, Any]) -> dict[str, Any]:
        """``wire.HANDOVER``: keep the Sandbox's token ``body["token"]`` and narrow the allowed
        roots to ``body["allowed_root"]``.

        Raises:
            AgentError: 401 when ``offered`` is neither the bootstrap token (nothing handed
                over yet) nor the token handed over (a renewal: the allowed root must then
                stay as it was, else 422); 422 for an empty, over-long or non-printable token,
                or an allowed root that is not absolute, not normalised or outside this Pod's
                own allowed roots.
        """
        unauthorized = wire.AgentError(wire.UNAUTHORIZED, "Unauthorized", "bad or no token")
        if self.handed.token is not None:
            current = self._token()
            if current is None or not hmac.compare_digest(offered.encode(), current):
                raise unauthorized
            if self.token_ages.expired(current) is not None:
                raise wire.AgentError(
                    wire.UNAUTHORIZED, wire.TOKEN_EXPIRED, "the token handed over expired"
                )
        else:
            bootstrap = self._bootstrap()
            if bootstrap is None or not hmac.compare_digest(offered.encode(), bootstrap):
                raise unauthorized
        token = str(body.get("token") or "")
        printable = token.isascii() and token.isprintable()
        if not token or len(token) > MAX_TOKEN_CHARS or not printable:
            raise wire.AgentError(
                wire.UNPROCESSABLE, "ValueError", "token must be printable ASCII, 1-512 chars"
            )
        root = str(body.get("allowed_root") or "")
        if root and (
            not root.startswith("/")
            or os.path.normpath(root) != root
            or not _inside(root, self.config.allowed_roots)
        ):
            raise wire.AgentError(
                wire.UNPROCESSABLE,
                "RefusedOriginal",
                f"allowed_root {root!r} is not a normalised absolute path within this Pod's "
                "allowed roots",
            )
        if self.handed.token is not None and root != self.handed.allowed_root:
            raise wire.AgentError(
                wire.UNPROCESSABLE,
                "RefusedOriginal",
                "a renewal keeps the allowed root of the hand-over",
            )
        first = self.handed.token is None
        self.handed.store(token, root)
        self.token_ages.held(token.encode())  # its lifetime runs from now
        if first:
            self._narrow(root)
            logger.info("agent: handed over to its Sandbox; the bootstrap token is refused now")
        return {"handed_over": True}

    def authorized(self, request: web.Request) -> bool:
        """True when the request carries the token of this Pod, still valid (constant-time
        compare; :meth:`refusal`)."""
        return self.refusal(request) is None

    def refusal(self, request: web.Request) -> dict[str, str] | None:
        """None when the request carries this Pod's valid token; else the error object of the
        401: ``Unauthorized`` (no token, or not this Pod's) or ``TokenExpired`` (this Pod's
        token, held longer than its lifetime: the operator has not renewed it)."""
        expected = self._token()
        offered = _offered(request)
        if expected is None or not offered or not hmac.compare_digest(offered.encode(), expected):
            return {"type": "Unauthorized", "message": "bad or no token"}
        expired = self.token_ages.expired(expected)
        if expired is not None:
            held, lifetime = expired
            message = (
                f"the agent token expired: held {held:.0f} s, lifetime {lifetime} s; the "
                "operator renews it in the Sandbox's Secret before it runs out, and the "
                "kubelet brings the new one to this Pod"
            )
            return {"type": wire.TOKEN_EXPIRED, "message": message}
        return None

    async def _run(
        self,
        request: web.Request,
        action: Callable[[], Any],
        changes: bool,
        remember_failures: bool = True,
        durable_reply: bool = True,
        on_loop: Callable[[], Any] | None = None,
    ) -> web.Response:
        """``action()`` in order with every other operation (:meth:`_in_order`), its value or
        its refusal the JSON reply; a changing request's reply journaled first
        (``durable_reply``: fsynced). ``on_loop``: the same read in a bounded form, run on the
        event loop when the worker has nothing to do (:meth:`_loop_is_free`); it raises
        :class:`NotOnLoop` when the read is not short after all, and then ``action`` runs in
        the worker."""
        request_id = request.headers.get(wire.REQUEST_ID_HEADER, "")
        if changes and not wire.REQUEST_ID_PATTERN.match(request_id):
            needed = f"{wire.REQUEST_ID_HEADER} needed"
            return _json(wire.BAD_REQUEST, {"error": {"type": "BadRequest", "message": needed}})

        key = journal_key(request, request_id)

        def call(action: Callable[[], Any] = action) -> tuple[int, str, bool]:
            if changes:
                stored = self.journal.get(key)
                if stored is not None:
                    return stored[0], json.dumps(stored[1]), True
            try:
                if changes:
                    self.journal.require_room()  # before the operation, never after it
                self._refuse_while_commands_run(request)
                status, text = 200, self.ops.reply_text(action())
            except NotOnLoop:
                raise
            except Exception as exc:  # every failure becomes a JSON reply
                status, payload = wire.error_reply(exc)
                text = self.ops.reply_text(payload)
                if status == wire.SERVER_ERROR:
                    logger.exception("agent: %s %s failed", request.method, request.path)
            # A 5xx may pass on retry: not remembered (nor failures of routes that say so).
            if changes and (status < 300 or (status < 500 and remember_failures)):
                try:
                    self.journal.put_text(key, status, text, durable=durable_reply)
                except OSError as exc:  # the operation happened: its reply is still the truth
                    logger.warning(
                        "agent: the reply of %s %s not kept: %s",
                        request.method,
                        request.path,
                        exc.strerror,
                    )
            return status, text, False

        if on_loop is not None and not changes and self._loop_is_free():
            try:
                return _json_text(*call(on_loop)[:2])
            except NotOnLoop:
                pass
        status, text, replay = await self._in_order(call)
        response = _json_text(status, text)
        if replay:
            response.headers[wire.REPLAY_HEADER] = "true"
        return response

    def _loop_is_free(self) -> bool:
        """Whether an operation may run on the event loop now: the worker has nothing queued
        or running (only the loop's thread queues work, so this stays true until the loop
        awaits), and nothing else runs until it returns. That keeps the agent's order, one
        operation at a time, and spares the two thread switches of the hop to the worker.
        Only short reads do it (a file of at most :data:`ON_LOOP_MAX_BYTES`, a stat, of a
        sandbox already open and active: no record to save, no fsync); every change runs in
        the worker, so a slow disk never holds the loop (probes, streams)."""
        return self._queued == 0

    async def _in_order(self, action: Callable[[], T]) -> T:
        """``action()`` in the worker thread: one operation at a time, in the order they came
        (:meth:`_loop_is_free` counts what is queued)."""
        with self._queued_lock:
            self._queued += 1

        def done() -> None:
            with self._queued_lock:
                self._queued -= 1

        def run() -> T:
            try:
                return action()
            finally:
                done()

        try:
            future = asyncio.get_running_loop().run_in_executor(self.worker, run)
        except BaseException:  # never queued (the worker is shut down)
            done()
            raise
        return await future

    def _refuse_while_commands_run(self, request: web.Request) -> None:
        """A commit, rollback, restore, prepare or cleanup of a sandbox in which an actor's
        command still runs would act on a tree that is still being written: refused (409)."""
        sid = request.match_info.get("sid")
        last = request.path.rstrip("/").rsplit("/", 1)[-1]
        guarded = last in _GUARDED or (request.method == "DELETE" and last == sid)
        if sid and guarded and self.actor.running(sid):
            raise wire.AgentError(
                wire.CONFLICT,
                "SandboxStateError",
                f"commands are running in sandbox {sid}; wait for them or cancel them first",
            )

    # -- the actor's door ------------------------------------------------------------------------

    async def exec_command(self, request: web.Request) -> web.StreamResponse:
        """``wire.EXEC``: start the command, then stream its output as NDJSON (wire.py)."""
        sid = request.match_info["sid"]
        request_id = request.headers.get(wire.REQUEST_ID_HEADER, "")
        if not wire.REQUEST_ID_PATTERN.match(request_id):
            needed = f"{wire.REQUEST_ID_HEADER} needed"
            return _json(wire.BAD_REQUEST, {"error": {"type": "BadRequest", "message": needed}})
        body = await _body(request)
        exec_id = hashlib.sha256(request_id.encode()).hexdigest()[:32]

        key = journal_key(request, request_id)

        def start() -> Execution | tuple[int, Any, bool]:
            stored = self.journal.get(key)
            if stored is not None:
                return stored[0], stored[1], True
            try:
                self.journal.require_room()
                stdin = base64.b64decode(str(body.get("stdin_b64") or ""), validate=True)
                exec_request = ExecRequest.from_json(body, stdin=stdin)
                sandbox = self.ops.open_for_actor(sid)
                return self.actor.start(sandbox, exec_request, exec_id)
            except ExecLimitError as exc:
                return (wire.TOO_MANY_REQUESTS, *wire.error_reply(exc)[1:], False)
            except binascii.Error:
                return (*wire.error_reply(wire.bad_request("stdin_b64 is not base64")), False)
            except Exception as exc:  # every refusal becomes a JSON reply
                status, payload = wire.error_reply(exc)
                if status == wire.SERVER_ERROR:
                    logger.exception("agent: exec in %s failed", sid)
                return status, self.ops.hide(payload), False

        started = await self._in_order(start)
        if not isinstance(started, Execution):
            status, payload, replay = started
            if replay and status == 200:
                response = await self._stream_start(request, replay=True)
                await response.write(_encoder(request)(payload))
                await response.write_eof()
                return response
            reply = _json(status, payload)
            if replay:
                reply.headers[wire.REPLAY_HEADER] = "true"
            return reply
        return await self._stream(request, key, started)

    async def _stream_start(self, request: web.Request, replay: bool = False) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = _content_type(request)
        if replay:
            response.headers[wire.REPLAY_HEADER] = "true"
        response.enable_chunked_encoding()
        await response.prepare(request)
        return response

    async def _stream(
        self, request: web.Request, key: str, execution: Execution
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        chunks = iter(execution)
        lock = threading.Lock()  # one reader of the output at a time

        encode = _encoder(request)
        frames = encode is _frame

        def piece(chunk: OutputChunk) -> tuple[bytes, bytes]:
            """A chunk as (head, body): a frame's header and the raw bytes, kept apart so that
            a megabyte of output is not copied once more to prefix five bytes."""
            if frames:
                tag = wire.FRAME_STDOUT if chunk.stream == "stdout" else wire.FRAME_STDERR
                return tag + len(chunk.data).to_bytes(4, "big"), chunk.data
            # base64 never needs JSON escaping: the line is built without json.dumps
            data = base64.b64encode(chunk.data)
            head = b'{"event": "' + chunk.stream.encode() + b'", "data_b64": "'
            return b"", head + data + b'"}\n'

        def take() -> tuple[bytes, bytes] | None:
            with lock:
                chunk = next(chunks, None)
            return None if chunk is None else piece(chunk)

        def pump(sender: ChunkedSender) -> None:
            """The whole output, read and sent by one worker thread (module chunked)."""
            try:
                with lock:
                    for chunk in chunks:
                        sender.send(*piece(chunk))
            finally:
                sender.close()

        def drain() -> None:
            with lock:
                for _ in chunks:
                    pass

        async def watch() -> None:
            """aiohttp does not cancel a handler whose caller left: look at the connection."""
            while True:
                await asyncio.sleep(DISCONNECT_POLL_SECONDS)
                transport = request.transport
                if transport is None or transport.is_closing():
                    execution.cancel()
                    return

        finished = False
        watcher = asyncio.ensure_future(watch())
        try:
            response = await self._stream_start(request)
            await response.write(encode({"event": "started", "exec_id": execution.exec_id}))
            sender = await _direct_sender(request, response, execution.request.timeout_seconds)
            if sender is not None:
                try:
                    await loop.run_in_executor(self.exec_pool, pump, sender)
                except OSError:  # gone, or stopped reading: a chunk may be half sent
                    if request.transport is not None:
                        request.transport.abort()
                    raise
            else:
                while (taken := await loop.run_in_executor(self.exec_pool, take)) is not None:
                    head, body = taken
                    if head:
                        await response.write(head)
                    await response.write(body)
            finished = True
        finally:
            watcher.cancel()
            if not finished:  # the caller went away (or the write failed): kill the command
                execution.cancel()
                self.exec_pool.submit(drain)
        try:
            result = execution.result
            payload: dict[str, Any] = {"event": "exit", **result.to_dict()}
            await self._in_order(lambda: self.journal.put(key, 200, payload))
        except Exception as exc:  # the command ran; its record could not be kept
            logger.exception("agent: exec %s: recording its end failed", execution.exec_id)
            payload = {"event": "error", **wire.error_reply(exc)[1]}
        await response.write(encode(payload))
        await response.write_eof()
        return response

    # -- forks across workspace Pods (sandbox_core.agent.bundle) ----------------------------------

    async def export_checkpoint(self, request: web.Request) -> web.StreamResponse:
        """``wire.EXPORT``: the checkpoint's bundle, packed on the state volume (in the worker,
        in order with every other operation), then streamed with its length and removed."""
        cid = request.match_info["cid"]
        limit = _max_bytes(request)
        packed, refusal = await self._open(request, lambda: self.ops.export_checkpoint(cid, limit))
        if refusal is not None:
            return refusal
        loop = asyncio.get_running_loop()
        try:
            response = web.StreamResponse()
            response.content_type = wire.TAR_CONTENT_TYPE
            response.content_length = packed.stat().st_size
            await response.prepare(request)
            with open(packed, "rb") as source:
                while chunk := await loop.run_in_executor(None, source.read, _CHUNK):
                    await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            bundle.remove(packed)

    async def import_checkpoint(self, request: web.Request) -> web.StreamResponse:
        """``wire.IMPORT``: the body (a bundle) written to the state volume as it comes, at
        most ``max_bytes`` (413 past it, nothing kept), then unpacked in the worker
        (:meth:`Operations.import_checkpoint`; a changing request, journaled)."""
        cid = request.match_info["cid"]
        request_id = request.headers.get(wire.REQUEST_ID_HEADER, "")
        if not wire.REQUEST_ID_PATTERN.match(request_id):
            needed = f"{wire.REQUEST_ID_HEADER} needed"
            return _json(wire.BAD_REQUEST, {"error": {"type": "BadRequest", "message": needed}})
        limit = _max_bytes(request)
        spool = (
            self.config.state_dir
            / "spool"
            / f"{hashlib.sha256(request_id.encode()).hexdigest()[:32]}.tar"
        )
        loop = asyncio.get_running_loop()
        try:
            spool.parent.mkdir(parents=True, exist_ok=True)
            size = 0
            with open(spool, "wb") as sink:
                async for chunk in request.content.iter_chunked(_CHUNK):
                    size += len(chunk)
                    if size > limit:
                        too_large = {
                            "type": "PayloadTooLarge",
                            "message": f"the checkpoint bundle is larger than {limit} bytes",
                        }
                        return _json(wire.PAYLOAD_TOO_LARGE, {"error": too_large})
                    await loop.run_in_executor(None, sink.write, chunk)
            return await self._run(
                request, lambda: self.ops.import_checkpoint(cid, spool, limit), True
            )
        except OSError as exc:
            free = self.journal.free_bytes()
            logger.warning("agent: import of checkpoint %s not kept: %s", cid, exc.strerror)
            return _json(*wire.error_reply(StateVolumeFull(free)))
        finally:
            bundle.remove(spool)

    def signal_command(self, sandbox_id: str, exec_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``wire.EXEC_SIGNAL``: signal a running command of ``sandbox_id``.

        Raises:
            AgentError: 404 when no command runs under ``exec_id`` in that sandbox.
            ExecRefusedError: an unknown signal.
        """
        execution = self.actor.find(exec_id)
        if execution is None or self.actor.running(sandbox_id) == 0:
            raise wire.AgentError(wire.NOT_FOUND, "NotFound", f"no command {exec_id} running")
        signalled = execution.send_signal(str(body.get("signal") or "SIGTERM"))
        return {"exec_id": exec_id, "signalled": signalled}

    def app(self) -> web.Application:
        """The aiohttp application (auth middleware + routes)."""

        @web.middleware
        async def auth(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            # HANDOVER authenticates itself (the bootstrap token or the token handed over).
            unguarded = request.path in (wire.HEALTHZ.template, wire.HANDOVER.template)
            refused = None if unguarded else self.refusal(request)
            if refused is None:
                return await handler(request)
            return _json(wire.UNAUTHORIZED, {"error": refused})

        app = web.Application(middlewares=[_json_errors, auth], client_max_size=wire.MAX_BODY_BYTES)
        ops = self.ops

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def handover(request: web.Request) -> web.Response:
            body = await _body(request)
            offered = _offered(request)

            def run() -> tuple[int, Any]:
                try:
                    return 200, self.hand_over(offered, body)
                except wire.AgentError as exc:
                    return wire.error_reply(exc)

            status, payload = await self._in_order(run)
            return _json(status, payload)

        async def create(request: web.Request) -> web.Response:
            body = await _body(request)
            return await self._run(request, lambda: ops.create(body), True)

        def sid(request: web.Request) -> str:
            return request.match_info["sid"]

        def rel(request: web.Request) -> str:
            return request.query.get(wire.PATH_QUERY, ".")

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
            # Idempotent, and a refusal may pass later (an interrupted commit finished, an
            # artefact freed): a failed cleanup is not remembered, so a retry runs it again.
            return await self._run(
                request, lambda: ops.cleanup(sid(request)), True, remember_failures=False
            )

        async def review(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.review(sid(request)), False)

        async def target_identity(request: web.Request) -> web.Response:
            return await self._run(request, lambda: ops.target_identity(sid(request)), False)

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

        handlers: dict[wire.Route, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
            wire.EXPORT: self.export_checkpoint,
            wire.IMPORT: self.import_checkpoint,
            wire.HEALTHZ: healthz,
            wire.HANDOVER: handover,
            wire.CREATE: create,
            wire.STATUS: status,
            wire.CLEANUP: cleanup,
            wire.ACTIVATE: activate,
            wire.PATH: path,
            wire.READ: read,
            wire.WRITE: write,
            wire.LIST: listdir,
            wire.DIFF: diff,
            wire.COMMIT: commit,
            wire.ROLLBACK: rollback,
            wire.CHECKPOINT: checkpoint,
            wire.RESTORE: restore,
            wire.REVIEW: review,
            wire.COMMIT_LANDED: landed,
            wire.TARGET_IDENTITY: target_identity,
            wire.PREPARE: two_phase(ops.prepare),
            wire.APPLY_PREPARED: two_phase(ops.apply_prepared),
            wire.ABORT_PREPARED: two_phase(ops.abort_prepared),
        }
        # the actor's door (docs/actor.md)

        async def signal_command(request: web.Request) -> web.Response:
            body = await _body(request)
            eid = request.match_info["eid"]
            return await self._run(
                request, lambda: self.signal_command(sid(request), eid, body), True, False
            )

        async def audit(request: web.Request) -> web.Response:
            def page() -> dict[str, Any]:
                try:
                    after = int(request.query.get(wire.AFTER_QUERY, "0"))
                    limit = int(request.query.get(wire.LIMIT_QUERY, "100"))
                except ValueError as exc:
                    raise ValueError(f"after and limit are integers: {exc}") from exc
                return ops.audit(sid(request), after, limit)

            return await self._run(request, page, False)

        async def stop_commands(_: web.Application) -> None:
            self.actor.cancel_all()  # the agent stops: no command outlives it

        app.on_shutdown.append(stop_commands)
        handlers[wire.EXEC] = self.exec_command
        handlers[wire.EXEC_SIGNAL] = signal_command
        handlers[wire.AUDIT] = audit
        # The actor's file routes first: aiohttp tries the routes under /v1/sandboxes in the
        # order they were added (a regular expression each), and those are the most frequent
        # calls (about 25 microseconds a request saved against the end of the list).
        handlers = {**self._actor_handlers(sid, rel), **handlers}
        for route, handler in handlers.items():
            if route.method == "GET":
                app.router.add_get(route.template, handler)  # HEAD too, aiohttp's default
            else:
                app.router.add_route(route.method, route.template, handler)
        return app

    # -- the actor's files and SQL ---------------------------------------------------------------

    def _actor_handlers(
        self, sid: Callable[[web.Request], str], rel: Callable[[web.Request], str]
    ) -> dict[wire.Route, Callable[[web.Request], Awaitable[web.StreamResponse]]]:
        """The routes of ``wire.ACTOR_ROUTES`` (files, search, SQL: :mod:`sandbox_core.actor`).

        Reads of bytes (``FILE_BYTES``, ``DOWNLOAD``) stream: the file is opened in the worker
        thread (in order with every other operation), then read in chunks of 1 MiB off the
        event loop and written to the response as they come, so memory stays bounded.

        The replies of file changes are journaled without fsync (``durable_reply=False``), as
        the changed files themselves are not fsynced: a restart of the agent keeps both, a
        power loss may lose both, never the reply alone. SQL replies are journaled durably
        (the statement log is fsynced). The audit log is fsynced for every change.
        """
        ops = self.ops

        def json_route(
            operation: Callable[[str, dict[str, Any]], dict[str, Any]], *, durable: bool = False
        ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
            async def handler(request: web.Request) -> web.StreamResponse:
                body = await _body(request)
                return await self._run(
                    request, lambda: operation(sid(request), body), True, durable_reply=durable
                )

            return handler

        def query_route(
            operation: Callable[[str, dict[str, str]], dict[str, Any]], *, short: bool = False
        ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
            """A read whose arguments are the query; ``short``: bounded (a stat), so it may
            run on the event loop (:meth:`_loop_is_free`) once its sandbox is open."""

            async def handler(request: web.Request) -> web.StreamResponse:
                query = dict(request.query)

                def action() -> dict[str, Any]:
                    return operation(sid(request), query)

                def on_loop() -> dict[str, Any]:
                    if not ops.is_open(sid(request)):
                        raise NotOnLoop
                    return action()

                return await self._run(request, action, False, on_loop=on_loop if short else None)

            return handler

        def span(request: web.Request) -> tuple[int, int | None]:
            try:
                offset = int(request.query.get(wire.OFFSET_QUERY) or 0)
                raw = request.query.get(wire.LENGTH_QUERY)
                return offset, int(raw) if raw not in (None, "") else None
            except ValueError:
                message = "offset and length must be integers"
                raise wire.AgentError(wire.BAD_REQUEST, "ValueError", message) from None

        async def read_text(request: web.Request) -> web.StreamResponse:
            def action() -> dict[str, Any]:
                offset, length = span(request)
                return ops.read_text(sid(request), rel(request), offset, length)

            def short() -> dict[str, Any]:
                """The same reply for a range of at most ON_LOOP_MAX_BYTES; else NotOnLoop."""
                if not ops.is_open(sid(request)):
                    raise NotOnLoop
                offset, length = span(request)
                if length is not None and length <= ON_LOOP_MAX_BYTES:
                    return ops.read_text(sid(request), rel(request), offset, length)
                # one byte more than the bound tells whether the range is longer than it
                reply = ops.read_text(sid(request), rel(request), offset, ON_LOOP_MAX_BYTES + 1)
                if reply["length"] > ON_LOOP_MAX_BYTES:
                    raise NotOnLoop
                return reply

            return await self._run(request, action, False, on_loop=short)

        async def read_bytes(request: web.Request) -> web.StreamResponse:
            def action() -> Any:
                offset, length = span(request)
                return ops.open_range(sid(request), rel(request), offset, length)

            opened, refusal = await self._open(request, action)
            if refusal is not None:
                return refusal
            loop = asyncio.get_running_loop()
            with opened:
                response = web.StreamResponse(
                    headers={
                        wire.FILE_SIZE_HEADER: str(opened.size),
                        wire.RANGE_OFFSET_HEADER: str(opened.offset),
                    }
                )
                response.content_type = wire.BYTES_CONTENT_TYPE
                response.content_length = opened.length
                await response.prepare(request)
                chunks = opened.chunks()
                while (data := await loop.run_in_executor(None, next, chunks, None)) is not None:
                    await response.write(data)
                await response.write_eof()
            return response

        async def put_bytes(request: web.Request) -> web.StreamResponse:
            content = await request.read()
            append = request.query.get(wire.APPEND_QUERY) in ("1", "true")
            return await self._run(
                request,
                lambda: ops.put_bytes(sid(request), rel(request), content, append),
                True,
                durable_reply=False,
            )

        async def download(request: web.Request) -> web.StreamResponse:
            rels = request.query.getall(wire.PATH_QUERY, [])
            events, refusal = await self._open(request, lambda: ops.download(sid(request), rels))
            if refusal is not None:
                return refusal
            loop = asyncio.get_running_loop()
            response = web.StreamResponse()
            response.content_type = wire.NDJSON_CONTENT_TYPE
            await response.prepare(request)
            while (event := await loop.run_in_executor(None, next, events, None)) is not None:
                if "data" in event:
                    # base64 needs no JSON escaping: the chunk is not run through json.dumps
                    data = base64.b64encode(event.pop("data"))
                    head = json.dumps(event).encode()[:-1]
                    await response.write(head + b', "data_b64": "' + data + b'"}\n')
                    continue
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
            return response

        return {
            wire.FILE_BYTES: read_bytes,
            wire.FILE_TEXT: read_text,
            wire.FILE_PUT: put_bytes,
            wire.FILE_WRITE: json_route(ops.write_file),
            wire.FILE_STAT: query_route(
                lambda s, q: ops.stat_file(s, q.get(wire.PATH_QUERY, ".")), short=True
            ),
            wire.FILE_EDIT: json_route(ops.edit_file),
            wire.FILE_DELETE: json_route(ops.delete_file),
            wire.FILE_MOVE: json_route(ops.move_file),
            wire.FILE_MKDIR: json_route(ops.make_dir),
            wire.GREP: query_route(ops.grep),
            wire.GLOB: query_route(ops.glob),
            wire.UPLOAD: json_route(ops.upload),
            wire.DOWNLOAD: download,
            wire.SQL: json_route(ops.sql, durable=True),
        }

    async def _open(
        self, request: web.Request, action: Callable[[], Any]
    ) -> tuple[Any, web.Response | None]:
        """``action()`` in the worker thread: ``(its value, None)``, or ``(None, the JSON
        refusal)`` when it raised (the same error table as :meth:`_run`)."""

        def call() -> tuple[Any, web.Response | None]:
            try:
                return action(), None
            except Exception as exc:  # every failure becomes a JSON reply
                status, payload = wire.error_reply(exc)
                if status == wire.SERVER_ERROR:
                    logger.exception("agent: %s %s failed", request.method, request.path)
                return None, _json(status, self.ops.hide(payload))

        return await self._in_order(call)


def _read_small(path: Path) -> bytes:
    """The bytes of a small file read afresh (a token), in three system calls: every request
    reads the token, so a renewed one counts from the next request on.

    Raises:
        OSError: the file cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 64 * 1024):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _offered(request: web.Request) -> str:
    """The token a request carries (``Authorization: Bearer``, else ``wire.TOKEN_HEADER``)."""
    header = request.headers.get(wire.AUTHORIZATION_HEADER, "")
    if header.startswith(wire.BEARER_PREFIX):
        return header[len(wire.BEARER_PREFIX) :].strip()
    return request.headers.get(wire.TOKEN_HEADER, "").strip()


_CHUNK = 1024 * 1024  # bytes read and written at a time by the bundle routes


def _max_bytes(request: web.Request) -> int:
    """The bundle routes' ``max_bytes`` query: at most ``bundle.DEFAULT_MAX_BYTES`` (its
    default).

    Raises:
        AgentError: 400 when it is not a positive integer.
    """
    raw = request.query.get(wire.MAX_BYTES_QUERY)
    if raw in (None, ""):
        return bundle.DEFAULT_MAX_BYTES
    try:
        value = int(str(raw))
    except ValueError:
        value = 0
    if value <= 0:
        raise wire.bad_request(f"{wire.MAX_BYTES_QUERY} must be a positive integer")
    return min(value, bundle.DEFAULT_MAX_BYTES)


async def _body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, its fields checked against ``wire.BODY_FIELDS``.

    Raises:
        AgentError: 400 ``BadRequest`` (not JSON, not an object, a field of the wrong type).
    """
    if not request.can_read_body:
        return {}
    try:
        data = json.loads(await request.read())
    except (ValueError, RecursionError):
        raise wire.bad_request("the body is not JSON") from None
    return wire.check_body(_route_of(request), data)


def _route_of(request: web.Request) -> wire.Route:
    """The contract's route of a matched request (method and path template)."""
    resource = request.match_info.route.resource
    template = resource.canonical if resource is not None else request.path
    return wire.Route("GET" if request.method == "HEAD" else request.method, template)


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every refusal as ``{"error": {"type", "message"}}``: the agent's own (a malformed
    body), and the HTTP layer's (no such route, wrong method, body too large); anything
    unexpected a 500 without a traceback or a path (the agent's log has them)."""
    try:
        return await handler(request)
    except wire.AgentError as exc:
        return _json(*wire.error_reply(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        refused = {"type": type(exc).__name__.removeprefix("HTTP"), "message": exc.reason}
        return _json(exc.status, {"error": refused})
    except Exception:  # never a traceback on the wire
        logger.exception("agent: %s %s failed", request.method, request.path)
        failed = {"type": "ServerError", "message": "the agent failed; its log has the cause"}
        return _json(wire.SERVER_ERROR, {"error": failed})


def _line(payload: Any) -> bytes:
    """One NDJSON line."""
    return (json.dumps(payload, default=str) + "\n").encode("utf-8")


def _frame(payload: Any) -> bytes:
    """One event as a frame of ``wire.FRAMES_CONTENT_TYPE``."""
    data = json.dumps(payload, default=str).encode("utf-8")
    return wire.FRAME_EVENT + len(data).to_bytes(4, "big") + data


async def _direct_sender(
    request: web.Request, response: web.StreamResponse, timeout_seconds: float
) -> ChunkedSender | None:
    """A :class:`ChunkedSender` on the request's connection once everything written so far
    (headers, the first frame) has left the transport's buffer; None where the body must go
    through aiohttp: a TLS connection, a reply that is not chunked, a transport without a
    socket, or one that is closing."""
    transport = request.transport
    if transport is None or not response.chunked:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("ssl_object") is not None:
        return None
    while transport.get_write_buffer_size() and not transport.is_closing():
        await asyncio.sleep(DIRECT_SEND_POLL_SECONDS)
    if transport.is_closing():
        return None
    try:
        return ChunkedSender(sock.fileno(), timeout_seconds)
    except OSError:
        return None


def _content_type(request: web.Request) -> str:
    """Frames when the caller accepts them, else NDJSON (wire.py, the actor's door)."""
    accepted = request.headers.get("Accept", "")
    return (
        wire.FRAMES_CONTENT_TYPE
        if wire.FRAMES_CONTENT_TYPE in accepted
        else wire.NDJSON_CONTENT_TYPE
    )


def _encoder(request: web.Request) -> Callable[[Any], bytes]:
    return _frame if _content_type(request) == wire.FRAMES_CONTENT_TYPE else _line


DISCONNECT_POLL_SECONDS = 0.5  # how often a streaming exec checks that its caller is still there
DIRECT_SEND_POLL_SECONDS = 0.001  # waiting for the transport's buffer to empty before a stream
# The last path segment of the routes refused while an actor's command runs in the sandbox.
_GUARDED = frozenset({"commit", "rollback", "prepare", "apply-prepared"})


def _json(status: int, payload: Any) -> web.Response:
    return _json_text(status, json.dumps(payload, default=str))


def _json_text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type=wire.JSON_CONTENT_TYPE)


class HideSecrets(logging.Filter):
    """A handler filter: every form of the agent's secret environment values in a record's
    message and traceback becomes ``env:NAME`` (:meth:`Operations.hide`)."""

    def __init__(self, ops: Operations) -> None:
        super().__init__()
        self.ops = ops

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keeps the record; rewrites its text first."""
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        record.msg, record.args = self.ops.hide(message), None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text, record.exc_info = self.ops.hide(text), None
        return True


def serve(config: AgentConfig | None = None) -> None:
    """Run the agent until SIGTERM/SIGINT (aiohttp's own signal handling)."""
    config = config or AgentConfig.from_env()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    agent = Agent(config)
    for handler in logging.getLogger().handlers:
        handler.addFilter(HideSecrets(agent.ops))  # no secret in a log line either
    logger.info("sandbox-core workspace agent listening on %s:%d", config.host, config.port)
    web.run_app(
        agent.app(),
        host=config.host,
        port=config.port,
        print=None,
        access_log=None,
        loop=_event_loop(),
    )


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (the operator extra: the image has it),
    else asyncio's own: each request's reads, writes and wake-ups cost less on uvloop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - the operator extra installs it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
