"""Commands in a sandbox: an actor's shell, test runner or build, run in a jail that sees only
the sandbox (docs/actor.md; issue "The actor's door", item 1).

:class:`CommandRunner` starts an :class:`ExecRequest` (an argv or a shell line, a working
directory relative to the sandbox's root, environment, stdin, a timeout, an output cap) in one
sandbox and returns an :class:`Execution`: iterate it for :class:`OutputChunk` s of stdout and
stderr as the command writes them, then read its :class:`ExecResult` (exit code, signal,
``timed_out``, ``cancelled``, ``truncated``, byte counts, duration). ``cancel()`` kills the
command; ``send_signal()`` sends a signal to it (from any thread).

Rules:

- The command runs in a :class:`~sandbox_core.actor.jail.Jail`: it sees the sandbox's working
  tree and read-only system directories, nothing of the agent, nothing of other sandboxes, and
  for git_worktree a private copy of the repository's metadata. Its writes land in the sandbox
  like any other write: the diff, the review and the commit show them.
- Which sandboxes: every strategy whose view is a directory (git_worktree, copy_on_write,
  overlay in both modes) and ``none``, whose "sandbox" is the original itself: there a command
  writes the original directly, as every write of that strategy does (no isolation of the
  original, by the strategy's definition), while the agent's state and other sandboxes stay out
  of its reach. ``transaction_rollback`` has no working tree: refused (:class:`ExecRefusedError`).
- ``cwd`` resolves like every sandbox path (``BaseSandbox.get_path``: ``..``, absolute paths,
  symlinks out of the sandbox and, for git_worktree, ``.git`` are refused with ``ValueError``)
  and must be a directory. Running a command activates a CREATED or ROLLED_BACK sandbox.
- At most ``max_concurrent`` commands run per sandbox in this process; one more is refused
  at once (:class:`ExecLimitError`), never queued.
- Output beyond ``max_output_bytes`` per stream is read and dropped (the command is never
  blocked on a full pipe) and the result says ``truncated``.
- A command still running at ``timeout_seconds`` is killed with its whole jail (SIGKILL):
  ``timed_out``. The jail's PID namespace dies with its first process, so nothing it started
  survives it.
- Each finished command is appended to the sandbox's audit log
  (:class:`~sandbox_core.actor.audit.AuditLog`) before the result is returned.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import selectors
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sandbox_core.actor.audit import AuditLog, audit_dir
from sandbox_core.actor.jail import BASE_ENV, Jail, git_control_binds, git_shadow
from sandbox_core.errors import SandboxError
from sandbox_core.strategies.base import BaseSandbox

__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_TIMEOUT_SECONDS",
    "CommandRunner",
    "ExecLimitError",
    "ExecRefusedError",
    "ExecRequest",
    "ExecResult",
    "Execution",
    "OutputChunk",
]

DEFAULT_TIMEOUT_SECONDS = 600.0
MAX_TIMEOUT_SECONDS = 24 * 3600.0
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024  # per stream
MAX_OUTPUT_BYTES = 1024 * 1024 * 1024
DEFAULT_MAX_CONCURRENT = 4
READ_BYTES = 1024 * 1024  # the largest chunk of output handed on at once
COALESCE_SECONDS = 0.001  # how long a chunk may wait for more output before it is handed on
COALESCE_NAP_SECONDS = 0.0001
PIPE_BYTES = 1024 * 1024  # F_SETPIPE_SZ: fewer, larger chunks
_F_SETPIPE_SZ = 1031
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXEC_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SIGNALS: dict[str, int] = {
    name: int(getattr(signal, name))
    for name in ("SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
}
"""The signals :meth:`Execution.send_signal` accepts by name."""
NO_WORKING_TREE = frozenset({"transaction_rollback"})


class ExecRefusedError(SandboxError):
    """A command that cannot run in this sandbox (no working tree, a bad request)."""


class ExecLimitError(SandboxError):
    """The sandbox already runs its maximum of commands; retry when one has finished."""


@dataclass(frozen=True)
class ExecRequest:
    """One command to run (module docstring).

    Attributes:
        argv: the program and its arguments (``argv[0]`` found on the jail's PATH); or
        shell_line: a line for ``/bin/sh -c`` (exactly one of ``argv`` and ``shell_line``;
            ``"shell"`` on the wire).
        cwd: the working directory, relative to the sandbox's root.
        env: added to (and overriding) the jail's base environment (``PATH``, ``HOME=/tmp``,
            ``LANG``, ``TMPDIR``); the agent's own environment is never passed on.
        stdin: bytes written to the command's stdin, which is then closed.
        timeout_seconds: wall-clock limit (0 < t <= 24 h).
        max_output_bytes: bytes kept per stream (0 .. 1 GiB).
        network: share the network (default: the runner's jail decides).
    """

    argv: tuple[str, ...] = ()
    shell_line: str | None = None
    cwd: str = "."
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bytes = b""
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    network: bool | None = None

    def __post_init__(self) -> None:
        if bool(self.argv) == (self.shell_line is not None):
            raise ExecRefusedError("give exactly one of argv (a list) and shell (a string)")
        if any("\x00" in part for part in (*self.argv, self.shell_line or "", self.cwd)):
            raise ExecRefusedError("a command, its arguments and cwd cannot hold NUL bytes")
        for name, value in self.env.items():
            if not ENV_NAME.match(name) or "\x00" in value:
                raise ExecRefusedError(f"bad environment variable {name!r}")
        if not 0 < self.timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise ExecRefusedError(f"timeout_seconds must be in (0, {MAX_TIMEOUT_SECONDS:g}]")
        if not 0 <= self.max_output_bytes <= MAX_OUTPUT_BYTES:
            raise ExecRefusedError(f"max_output_bytes must be in [0, {MAX_OUTPUT_BYTES}]")

    @property
    def command(self) -> list[str]:
        """The argv that runs: ``argv``, or ``["/bin/sh", "-c", shell]``."""
        return list(self.argv) if self.argv else ["/bin/sh", "-c", str(self.shell_line)]

    @classmethod
    def from_json(cls, body: Mapping[str, Any], stdin: bytes = b"") -> ExecRequest:
        """From the agent's JSON body (``sandbox_core.agent.wire.EXEC``).

        Raises:
            ExecRefusedError: a field has the wrong type or value.
        """
        try:
            argv = body.get("argv") or ()
            if isinstance(argv, str) or not all(isinstance(part, str) for part in argv):
                raise ExecRefusedError("argv must be a list of strings")
            shell = body.get("shell")
            if shell is not None and not isinstance(shell, str):
                raise ExecRefusedError("shell must be a string")
            env = dict(body.get("env") or {})
            if not all(isinstance(value, str) for value in env.values()):
                raise ExecRefusedError("env values must be strings")
            network = body.get("network")
            return cls(
                argv=tuple(argv),
                shell_line=shell,
                cwd=str(body.get("cwd") or "."),
                env=env,
                stdin=stdin,
                timeout_seconds=float(body.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS),
                max_output_bytes=int(
                    body["max_output_bytes"]
                    if body.get("max_output_bytes") is not None
                    else DEFAULT_MAX_OUTPUT_BYTES
                ),
                network=None if network is None else bool(network),
            )
        except (TypeError, ValueError) as exc:
            raise ExecRefusedError(f"bad exec request: {exc}") from exc


@dataclass(frozen=True)
class OutputChunk:
    """Bytes the command wrote: ``stream`` is ``"stdout"`` or ``"stderr"``."""

    stream: str
    data: bytes


@dataclass(frozen=True)
class ExecResult:
    """How a command ended.

    Attributes:
        exit_code: the exit status (a command ended by signal N shows ``128 + N``, as a shell
            reports it).
        signal: N when the command was ended by a signal, else None.
        timed_out / cancelled: killed at its timeout / by :meth:`Execution.cancel`.
        truncated: a stream wrote more than ``max_output_bytes`` (the rest was dropped).
        stdout_bytes / stderr_bytes: what the command wrote (kept or dropped).
        duration_seconds: from start to exit.
    """

    exec_id: str
    exit_code: int
    signal: int | None
    timed_out: bool
    cancelled: bool
    truncated: bool
    stdout_bytes: int
    stderr_bytes: int
    duration_seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "exec_id": self.exec_id,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
            "truncated": self.truncated,
            "stdout_bytes": self.stdout_bytes,
            "stderr_bytes": self.stderr_bytes,
            "duration_seconds": self.duration_seconds,
        }


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (``/proc/<pid>/task/*/children``), deepest last."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop(0)
        try:
            tasks = [task.name for task in Path(f"/proc/{parent}/task").iterdir()]
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in children:
                found.append(int(child))
                queue.append(int(child))
    return found


def _gather(fd: int) -> tuple[bytes, bool]:
    """What a non-blocking pipe holds now, and what more comes within ``COALESCE_SECONDS``,
    up to ``READ_BYTES``: ``(data, ended)``, ``ended`` when the writer closed it.

    A fast writer fills the pipe while this waits, so a stream of small writes leaves as a few
    large chunks (each chunk costs a thread hop and an HTTP write downstream); a slow writer's
    output is late by at most ``COALESCE_SECONDS``.
    """
    parts: list[bytes] = []
    got = 0
    deadline = 0.0
    while got < READ_BYTES:
        try:
            data = os.read(fd, READ_BYTES - got)
        except BlockingIOError:
            now = time.monotonic()
            if not deadline:
                deadline = now + COALESCE_SECONDS
            elif now >= deadline:
                break
            if not select.select([fd], [], [], deadline - now)[0]:
                break
            continue
        if not data:
            return b"".join(parts), True
        parts.append(data)
        got += len(data)
    return b"".join(parts), False


class Execution:
    """A started command (module docstring): iterate for output, then :attr:`result`."""

    def __init__(
        self,
        exec_id: str,
        process: subprocess.Popen[bytes],
        request: ExecRequest,
        finish: Callable[[Execution], None],
    ) -> None:
        self.exec_id = exec_id
        self.request = request
        self._process = process
        self._finish = finish
        self._started = time.monotonic()
        self._deadline = self._started + request.timeout_seconds
        self._timed_out = False
        self._cancelled = False
        self._truncated = False
        self._counts = {"stdout": 0, "stderr": 0}
        self._result: ExecResult | None = None
        self._iterated = False
        self._lock = threading.Lock()
        if request.stdin:
            threading.Thread(target=self._feed, daemon=True, name="exec-stdin").start()

    def _feed(self) -> None:
        stdin = self._process.stdin
        if stdin is None:
            return
        with contextlib.suppress(OSError):
            stdin.write(self.request.stdin)
        with contextlib.suppress(OSError):
            stdin.close()

    @property
    def result(self) -> ExecResult:
        """How it ended.

        Raises:
            SandboxError: it has not been iterated to its end yet (use :meth:`wait`).
        """
        if self._result is None:
            raise SandboxError(f"command {self.exec_id} has not finished")
        return self._result

    def __iter__(self) -> Iterator[OutputChunk]:
        """The output as it comes; ends when the command has exited and its result is
        recorded. Leaving the loop early (``close()``) cancels the command."""
        if self._iterated:
            raise SandboxError(f"the output of command {self.exec_id} was already read")
        self._iterated = True
        streams: dict[int, tuple[str, IO[bytes]]] = {}
        selector = selectors.DefaultSelector()
        for name, pipe in (("stdout", self._process.stdout), ("stderr", self._process.stderr)):
            if pipe is not None:
                os.set_blocking(pipe.fileno(), False)
                selector.register(pipe.fileno(), selectors.EVENT_READ)
                streams[pipe.fileno()] = (name, pipe)
        cap = self.request.max_output_bytes
        try:
            while streams:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0 and not self._timed_out:
                    self._timed_out = True
                    self._kill()
                ready = selector.select(max(remaining, 0.05) if not self._timed_out else 0.5)
                for key, _ in ready:
                    fd = int(key.fd)
                    name, pipe = streams[fd]
                    data, ended = _gather(fd)
                    if ended:
                        selector.unregister(fd)
                        pipe.close()
                        del streams[fd]
                        if not data:
                            continue
                    kept = max(0, min(len(data), cap - self._counts[name]))
                    self._counts[name] += len(data)
                    if kept < len(data):
                        self._truncated = True
                    if kept:
                        yield OutputChunk(name, data[:kept])
            self._end()
        finally:
            selector.close()
            if self._result is None:  # left early: the consumer went away
                self.cancel()
                for _, pipe in streams.values():
                    pipe.close()
                self._end()

    def wait(self) -> ExecResult:
        """Read (and drop) the output to the end; the result."""
        for _ in self:
            pass
        return self.result

    def collect(self) -> tuple[bytes, bytes, ExecResult]:
        """Read the output to the end: ``(stdout, stderr, result)`` (each capped)."""
        out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        for chunk in self:
            out[chunk.stream].append(chunk.data)
        return b"".join(out["stdout"]), b"".join(out["stderr"]), self.result

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)

    def cancel(self) -> None:
        """Kill the command and everything it started (its jail); ``cancelled`` in the
        result. Nothing when it has already ended."""
        if self._process.poll() is None:
            self._cancelled = True
            self._kill()

    def send_signal(self, sig: int | str) -> bool:
        """Send ``sig`` (a number or a name of :data:`SIGNALS`) to the command and what it
        started (not to the jail's own processes: SIGKILL through :meth:`cancel`).

        Returns:
            False when the command had already ended.

        Raises:
            ExecRefusedError: an unknown signal name.
        """
        if isinstance(sig, str):
            name = sig.upper() if sig.upper().startswith("SIG") else "SIG" + sig.upper()
            if name not in SIGNALS:
                raise ExecRefusedError(f"unknown signal {sig!r}; one of {sorted(SIGNALS)}")
            sig = SIGNALS[name]
        if self._process.poll() is not None:
            return False
        if sig == signal.SIGKILL:
            self.cancel()
            return True
        # bwrap (outside) -> bwrap, PID 1 of the jail -> the command and its children.
        jailed = _descendants(self._process.pid)[1:]
        for pid in jailed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return bool(jailed)

    def _end(self) -> None:
        with self._lock:
            if self._result is not None:
                return
            try:
                returncode = self._process.wait()
            finally:
                if self._process.stdin is not None:
                    with contextlib.suppress(OSError):
                        self._process.stdin.close()
            exit_code = 128 - returncode if returncode < 0 else returncode
            self._result = ExecResult(
                exec_id=self.exec_id,
                exit_code=exit_code,
                signal=exit_code - 128 if 128 < exit_code <= 128 + 64 else None,
                timed_out=self._timed_out,
                cancelled=self._cancelled,
                truncated=self._truncated,
                stdout_bytes=self._counts["stdout"],
                stderr_bytes=self._counts["stderr"],
                duration_seconds=round(time.monotonic() - self._started, 6),
            )
            self._finish(self)


class CommandRunner:
    """Starts commands in sandboxes (module docstring), with a per-sandbox limit.

    Args:
        state_dir: the state directory of the sandboxes (their audit logs and the private git
            metadata of running commands live under ``<state_dir>/actor/<sandbox_id>``).
        jail: how commands are isolated.
        max_concurrent: commands running at once per sandbox.
        on_finish: called with the sandbox id and the result after each command (the agent
            counts a revision).
    """

    def __init__(
        self,
        state_dir: str | Path,
        jail: Jail | None = None,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        on_finish: Callable[[str, ExecResult], None] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.jail = jail or Jail()
        self.max_concurrent = max_concurrent
        self.on_finish = on_finish
        self._lock = threading.Lock()
        self._running: dict[str, dict[str, Execution]] = {}

    def audit(self, sandbox_id: str) -> AuditLog:
        """The audit log of ``sandbox_id``."""
        return AuditLog(self.state_dir, sandbox_id)

    def running(self, sandbox_id: str) -> int:
        """How many commands run in ``sandbox_id`` now."""
        with self._lock:
            return len(self._running.get(sandbox_id, {}))

    def cancel_all(self) -> None:
        """Cancel every running command (the process is stopping)."""
        with self._lock:
            running = [e for by_id in self._running.values() for e in by_id.values() if e]
        for execution in running:
            execution.cancel()

    def find(self, exec_id: str) -> Execution | None:
        """The running command ``exec_id``, or None."""
        with self._lock:
            for running in self._running.values():
                if running.get(exec_id) is not None:
                    return running[exec_id]
        return None

    def start(
        self, sandbox: BaseSandbox, request: ExecRequest, exec_id: str | None = None
    ) -> Execution:
        """Start ``request`` in ``sandbox`` (module docstring for the rules).

        Raises:
            ExecRefusedError: the strategy has no working tree, or ``cwd`` is not a directory.
            ValueError: ``cwd`` escapes the sandbox (``"Path traversal not allowed"``).
            SandboxStateError: the sandbox is not open (COMMITTED, CLEANED_UP, ...).
            ExecLimitError: ``max_concurrent`` commands already run in it.
            JailUnavailableError: no ``bwrap`` here.
            SandboxError: the git metadata could not be copied, or the process not started.
        """
        if sandbox.strategy in NO_WORKING_TREE:
            raise ExecRefusedError(
                f"sandbox {sandbox.sandbox_id} ({sandbox.strategy}) has no working tree to run "
                "commands in; use its SQL operations"
            )
        cwd = Path(sandbox.get_path(request.cwd or "."))
        context = sandbox.context
        if context is None or not Path(context.sandbox_path).is_dir():
            raise ExecRefusedError(f"sandbox {sandbox.sandbox_id} has no directory to run in")
        if not cwd.is_dir():
            raise ExecRefusedError(f"cwd {request.cwd!r} is not a directory in the sandbox")
        work_tree = os.path.realpath(context.sandbox_path)
        exec_id = exec_id or uuid.uuid4().hex
        if not EXEC_ID.match(exec_id):
            raise ExecRefusedError("an exec id is 1-64 characters of [A-Za-z0-9_-]")
        sid = sandbox.sandbox_id
        with self._lock:
            running = self._running.setdefault(sid, {})
            if len(running) >= self.max_concurrent:
                raise ExecLimitError(
                    f"sandbox {sid} already runs {len(running)} commands (the limit); "
                    "wait for one to finish"
                )
            if exec_id in running:
                raise ExecRefusedError(f"command {exec_id} is already running")
            running[exec_id] = None  # type: ignore[assignment]  # reserved until started
        try:
            run_dir = audit_dir(self.state_dir, sid) / "runs" / exec_id
            shutil.rmtree(run_dir, ignore_errors=True)
            binds = git_shadow(work_tree, run_dir)  # makes run_dir only for a linked worktree
            binds += git_control_binds(work_tree)  # a repository's own config and hooks: ro
            process = self.jail.spawn(
                work_tree,
                os.path.realpath(cwd),
                request.command,
                {**BASE_ENV, **request.env},
                binds,
                network=request.network,
                stdin=subprocess.PIPE if request.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            with self._lock:
                self._running[sid].pop(exec_id, None)
            shutil.rmtree(audit_dir(self.state_dir, sid) / "runs" / exec_id, ignore_errors=True)
            raise
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)

        def finish(execution: Execution) -> None:
            try:
                if run_dir.exists():  # the git copy: removed off the caller's path
                    threading.Thread(
                        target=shutil.rmtree, args=(run_dir, True), daemon=True, name="exec-gc"
                    ).start()
                result = execution.result
                self.audit(sid).append(
                    "exec",
                    command=list(request.argv) if request.argv else None,
                    shell=request.shell_line,
                    cwd=request.cwd,
                    env_names=sorted(request.env),
                    **result.to_dict(),
                )
                if self.on_finish is not None:
                    self.on_finish(sid, result)
            finally:
                with self._lock:
                    self._running.get(sid, {}).pop(exec_id, None)

        execution = Execution(exec_id, process, request, finish)
        with self._lock:
            self._running[sid][exec_id] = execution
        return execution

    def run(
        self, sandbox: BaseSandbox, request: ExecRequest, exec_id: str | None = None
    ) -> tuple[bytes, bytes, ExecResult]:
        """:meth:`start` and :meth:`Execution.collect`: ``(stdout, stderr, result)``."""
        return self.start(sandbox, request, exec_id).collect()
