"""The actor's door on local paths: the local executor's sandboxes, through the core's own code.

The operator's local executor keeps its sandboxes in a state directory on its host
(``SANDBOX_OPERATOR_STATE_DIR``, default ``/var/lib/sandbox-operator/state``). A client on that
host runs the actor's operations exactly as the workspace agent does: it reopens the sandbox by
its id (``status.sandboxId``) through ``sandbox_core.host.SandboxHost``, runs the operation with
``sandbox_core.actor`` (:class:`~sandbox_core.actor.door.ActorDoor` for files, search and SQL;
:class:`~sandbox_core.actor.local.LocalActor` for commands, in the bubblewrap jail), saves the
record when the operation activated the sandbox, and appends to the same audit log
(``<state_dir>/actor/<sandbox_id>/audit.jsonl``).

This is the one module of the client that loads the core's actor (and with it the strategies):
:func:`sandbox_client.actor.actor_for` imports it on first use, never ``import sandbox_client``
(``.importlinter``, contract ``client``, names the exception).

Results and errors are those of :class:`sandbox_client.actor.AgentActor`
(:func:`sandbox_client.actor.actor_error` maps the core's exceptions).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sandbox_client.actor import (
    DEFAULT_MAX_ROWS,
    AsyncChunks,
    Chunks,
    Command,
    Uploads,
    _edit_body,
    _file,
    actor_error,
    download_results,
    exec_body,
    upload_items,
)
from sandbox_client.agent_files import checked_path
from sandbox_client.errors import NotFoundError, RefusedError, SandboxClientError
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

T = TypeVar("T")

STATE_DIR_ENV = "SANDBOX_OPERATOR_STATE_DIR"
DEFAULT_STATE_DIR = "/var/lib/sandbox-operator/state"
_ACTORS: dict[Path, Any] = {}  # one LocalActor per state directory (its running commands)
_ACTORS_LOCK = threading.Lock()


def state_dir_of(state_dir: str | os.PathLike[str] | None) -> Path:
    """``state_dir``, else ``$SANDBOX_OPERATOR_STATE_DIR``, else the operator's default."""
    return Path(state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def _translated(call: Callable[[], T], what: str) -> T:
    """``call()``, the core's exceptions raised as the client's (:func:`actor_error`)."""
    from sandbox_core.errors import SandboxError

    try:
        return call()
    except SandboxClientError:
        raise
    except KeyError as exc:  # the store knows no such sandbox
        raise actor_error("NotFound", f"{what}: no such sandbox ({exc})") from exc
    except (SandboxError, ValueError, OSError) as exc:
        raise actor_error(type(exc).__name__, f"{what}: {exc}") from exc


class LocalDoor:
    """:class:`~sandbox_client.actor.ActorOperations` on the local executor's state directory.

    Args:
        state_dir: the operator's state directory (default :func:`state_dir_of`).
    """

    def __init__(self, state_dir: str | os.PathLike[str] | None = None) -> None:
        self.state_dir = state_dir_of(state_dir)

    def _actor(self) -> Any:
        from sandbox_core.actor.local import LocalActor

        with _ACTORS_LOCK:
            if self.state_dir not in _ACTORS:
                _ACTORS[self.state_dir] = LocalActor(self.state_dir)
            return _ACTORS[self.state_dir]

    def _known(self, info: SandboxInfo, what: str) -> None:
        """Refuse a sandbox without an id, or one this state directory has no record of.

        Raises:
            RefusedError: ``InvalidState`` (no id yet). NotFoundError: no record here (another
                state directory: set ``SANDBOX_OPERATOR_STATE_DIR`` or ``local_state_dir``).
        """
        if not info.sandbox_id:
            raise RefusedError("InvalidState", f"sandbox {info.name} has no sandbox id yet")
        record = _translated(lambda: self._actor().host.record(info.sandbox_id), what)
        if record is None:
            raise NotFoundError(
                "NotFound",
                f"{what}: sandbox {info.name} ({info.sandbox_id}) has no record in the local "
                f"executor's state directory {self.state_dir} (set {STATE_DIR_ENV} or "
                "local_state_dir to the operator's)",
            )

    def _door(self, info: SandboxInfo, op: Callable[[Any], T], what: str) -> T:
        """Reopen the sandbox, run ``op(door)``, save the record when its status moved."""
        from sandbox_core.actor.door import ActorDoor

        self._known(info, f"{what} in {info.name}")

        def call() -> T:
            host = self._actor().host
            sandbox = host.reopen(info.sandbox_id)
            before = sandbox.status
            try:
                return op(ActorDoor(sandbox, self.state_dir))
            finally:
                if sandbox.status is not before:
                    host.save(sandbox)
                if sandbox.strategy == "transaction_rollback":
                    # Release this process's connection: the statement log stays, and the
                    # next reopen (here, or the operator's commit) replays it.
                    sandbox.close()

        return _translated(call, f"{what} in {info.name}")

    # -- commands -------------------------------------------------------------------------

    def _start(self, info: SandboxInfo, command: Command, options: Mapping[str, Any]) -> Any:
        from sandbox_core.actor.exec import ExecRequest

        body = exec_body(command, **options)
        stdin = options.get("stdin") or b""
        self._known(info, f"exec in {info.name}")

        def start() -> Any:
            data = stdin.encode() if isinstance(stdin, str) else stdin
            request = ExecRequest.from_json(body, stdin=data)
            return self._actor().exec(info.sandbox_id, request)

        return _translated(start, f"exec in {info.name}")

    def exec_stream(self, info: SandboxInfo, command: Command, **options: Any) -> Chunks:
        """As :meth:`sandbox_client.actor.AgentActor.exec_stream`."""
        execution = self._start(info, command, options)
        yield ExecChunk(kind="started", exec_id=execution.exec_id)
        chunks = iter(execution)
        try:
            for chunk in chunks:
                yield ExecChunk(kind=chunk.stream, exec_id=execution.exec_id, data=chunk.data)
        finally:
            chunks.close()  # leaving early cancels the command
        result = ExecResult.model_validate(execution.result.to_dict())
        yield ExecChunk(kind="exit", exec_id=execution.exec_id, result=result)

    def exec(self, info: SandboxInfo, command: Command, **options: Any) -> ExecResult:
        """As :meth:`sandbox_client.actor.AgentActor.exec`."""
        execution = self._start(info, command, options)
        stdout, stderr, result = execution.collect()
        return ExecResult.model_validate({**result.to_dict(), "stdout": stdout, "stderr": stderr})

    def signal(self, info: SandboxInfo, exec_id: str, signal: str | int = "SIGTERM") -> bool:
        """As :meth:`sandbox_client.actor.AgentActor.signal` (commands this process started)."""
        execution = self._actor().runner.find(exec_id)
        if execution is None:
            raise actor_error("NotFound", f"signal in {info.name}: no command {exec_id} running")
        return bool(_translated(lambda: execution.send_signal(signal), f"signal {exec_id}"))

    def audit(self, info: SandboxInfo, after: int = 0, limit: int = 100) -> AuditPage:
        """As :meth:`sandbox_client.actor.AgentActor.audit`."""
        self._known(info, f"audit of {info.name}")
        page = _translated(
            lambda: self._actor().audit(info.sandbox_id, after, limit), f"audit of {info.name}"
        )
        return AuditPage.model_validate(page)

    # -- files ----------------------------------------------------------------------------

    def read_bytes(
        self, info: SandboxInfo, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        """As :meth:`sandbox_client.actor.AgentActor.read_bytes` (streamed, any size)."""
        rel = _file(path)

        def read(door: Any) -> bytes:
            with door.files().open_range(rel, offset, length) as opened:
                return b"".join(opened.chunks())

        return self._door(info, read, f"read {rel}")

    def write(
        self, info: SandboxInfo, path: str, data: bytes | str, *, append: bool = False
    ) -> FileChange:
        """As :meth:`sandbox_client.actor.AgentActor.write`."""
        rel = _file(path)
        done = self._door(info, lambda d: d.files().write(rel, data, append=append), f"write {rel}")
        return FileChange.model_validate(done)

    def delete(self, info: SandboxInfo, path: str, *, recursive: bool = False) -> FileChange:
        """As :meth:`sandbox_client.actor.AgentActor.delete`."""
        rel = _file(path)
        done = self._door(
            info, lambda d: d.files().delete(rel, recursive=recursive), f"delete {rel}"
        )
        return FileChange.model_validate(done)

    def move(self, info: SandboxInfo, path: str, to: str, *, overwrite: bool = False) -> FileChange:
        """As :meth:`sandbox_client.actor.AgentActor.move`."""
        rel, target = _file(path), _file(to)
        done = self._door(
            info, lambda d: d.files().move(rel, target, overwrite=overwrite), f"move {rel}"
        )
        return FileChange.model_validate(done)

    def mkdir(
        self, info: SandboxInfo, path: str, *, parents: bool = True, exist_ok: bool = True
    ) -> FileChange:
        """As :meth:`sandbox_client.actor.AgentActor.mkdir`."""
        rel = _file(path)
        done = self._door(
            info, lambda d: d.files().mkdir(rel, parents=parents, exist_ok=exist_ok), f"mkdir {rel}"
        )
        return FileChange.model_validate(done)

    def stat(self, info: SandboxInfo, path: str) -> FileStat:
        """As :meth:`sandbox_client.actor.AgentActor.stat`."""
        rel = checked_path(path)
        return FileStat.model_validate(
            self._door(info, lambda d: d.files().stat(rel), f"stat {rel}")
        )

    def edit(
        self, info: SandboxInfo, path: str, old: str, new: str, *, replace_all: bool = False
    ) -> EditResult:
        """As :meth:`sandbox_client.actor.AgentActor.edit`."""
        body = _edit_body(path, old, new, replace_all)
        done = self._door(
            info,
            lambda d: d.files().edit(body["path"], old, new, replace_all=replace_all),
            f"edit {body['path']}",
        )
        return EditResult.model_validate(done)

    def grep(self, info: SandboxInfo, pattern: str, **options: Any) -> GrepResult:
        """As :meth:`sandbox_client.actor.AgentActor.grep`."""
        found = self._door(
            info,
            lambda d: d.grep(
                pattern,
                path=checked_path(options.get("path", ".")),
                glob_pattern=options.get("glob") or None,
                ignore_case=bool(options.get("ignore_case")),
                max_matches=int(options.get("max_matches") or 100),
                cursor=options.get("cursor") or None,
            ),
            f"grep {pattern!r}",
        )
        return GrepResult.model_validate(found)

    def glob(self, info: SandboxInfo, pattern: str, **options: Any) -> GlobResult:
        """As :meth:`sandbox_client.actor.AgentActor.glob`."""
        found = self._door(
            info,
            lambda d: d.glob(
                pattern,
                path=checked_path(options.get("path", ".")),
                max_results=int(options.get("max_results") or 1000),
                cursor=options.get("cursor") or None,
            ),
            f"glob {pattern!r}",
        )
        return GlobResult.model_validate(found)

    def upload(self, info: SandboxInfo, files: Uploads) -> list[FileResult]:
        """As :meth:`sandbox_client.actor.AgentActor.upload`."""
        items = upload_items(files)
        done = self._door(info, lambda d: d.files().upload(items), "upload")
        return [FileResult.model_validate(result) for result in done]

    def download(self, info: SandboxInfo, paths: Sequence[str]) -> list[FileResult]:
        """As :meth:`sandbox_client.actor.AgentActor.download`."""
        return self._door(
            info, lambda d: download_results(d.files().download(list(paths))), "download"
        )

    # -- SQL ------------------------------------------------------------------------------

    def sql(
        self,
        info: SandboxInfo,
        statement: str,
        params: Any = None,
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult:
        """As :meth:`sandbox_client.actor.AgentActor.sql`."""
        done = self._door(
            info, lambda d: d.sql(statement, _params(params), max_rows=max_rows), "sql"
        )
        return SqlResult.model_validate(done)

    def sql_many(
        self,
        info: SandboxInfo,
        statement: str,
        param_sets: Sequence[Any],
        *,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> SqlResult:
        """As :meth:`sandbox_client.actor.AgentActor.sql_many`."""
        sets = list(param_sets)
        done = self._door(
            info, lambda d: d.sql(statement, _params(sets), many=True, max_rows=max_rows), "sql"
        )
        return SqlResult.model_validate(done)


def _params(params: Any) -> Any:
    """JSON-shaped parameters as the agent receives them (``{"$bytes": ...}`` stays as is)."""
    return params


async def _in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    import asyncio

    return await asyncio.to_thread(function, *args, **kwargs)


class AsyncLocalDoor:
    """:class:`LocalDoor` with awaitable methods: each call runs in a worker thread; a streamed
    command's chunks are handed over through a bounded queue."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None) -> None:
        self.door = LocalDoor(state_dir)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        function = getattr(self.door, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await _in_thread(function, *args, **kwargs)

        return call

    async def exec_stream(self, info: SandboxInfo, command: Command, **options: Any) -> AsyncChunks:
        """As :meth:`LocalDoor.exec_stream` (leaving the loop early cancels the command)."""
        import asyncio

        handover: queue.Queue[ExecChunk | BaseException | None] = queue.Queue(maxsize=64)
        stop = threading.Event()

        def pump() -> None:
            chunks = self.door.exec_stream(info, command, **options)
            try:
                for chunk in chunks:
                    while not stop.is_set():
                        try:
                            handover.put(chunk, timeout=0.2)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                handover.put(None)
            except BaseException as exc:  # handed to the caller
                handover.put(exc)
            finally:
                chunks.close()

        worker = asyncio.get_running_loop().run_in_executor(None, pump)
        try:
            while True:
                item = await asyncio.to_thread(handover.get)
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            while not handover.empty():
                handover.get_nowait()
            await worker
