"""File operations inside a sandbox, behind one interface.

:class:`FileOperations` is what the client calls for ``read_file``, ``write_file``,
``list_files`` and ``diff``. :class:`LocalFileOperations` serves Sandboxes of the *local*
executor (``status.executor == "local"``): the operator runs the core on paths this process can
reach, so the client works on ``status.sandboxPath`` directly. Sandboxes of the pod executor
(``status.executor == "pod"``) are served by
:class:`~sandbox_client.agent_files.AgentFileOperations`: their workspace agent,
reached through the API server's pod proxy. :class:`AsyncFileOperations` is the same interface
with awaitable methods (the async client; :class:`ThreadedFileOperations` adapts a blocking one).

Every path is resource-relative and goes through ``sandbox_core.resolve_inside``: absolute
paths, ``..`` and symlinks that resolve outside the sandbox are refused with reason
``PathTraversal`` (seed 003, "Path traversal is rejected").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from sandbox_client.errors import NotFoundError, OperationFailedError, RefusedError
from sandbox_client.models import SandboxInfo, SandboxPhase
from sandbox_core.paths import resolve_inside

# The core's own bookkeeping inside a sandbox tree, never shown as a sandbox file.
T = TypeVar("T")
_HIDDEN = frozenset({".git"})
_WRITABLE = (SandboxPhase.ACTIVE, SandboxPhase.CREATED, SandboxPhase.ROLLED_BACK)


@runtime_checkable
class FileOperations(Protocol):
    """File access to one Sandbox; ``path`` is relative to the resource root (``a/b.txt``).

    Implementations raise only :mod:`sandbox_client.errors` types: ``RefusedError``
    (``PathTraversal``; ``InvalidState`` when the sandbox is not writable), ``NotFoundError``
    (no such file), ``OperationFailedError`` (I/O or tool failure).
    """

    def read_file(self, sandbox: SandboxInfo, path: str) -> bytes:
        """The file's content."""
        ...

    def write_file(self, sandbox: SandboxInfo, path: str, data: bytes) -> None:
        """Create or replace the file (parent directories are created)."""
        ...

    def list_files(self, sandbox: SandboxInfo, path: str = "") -> list[str]:
        """Resource-relative paths of the files below ``path`` (recursive, sorted)."""
        ...

    def diff(self, sandbox: SandboxInfo) -> str:
        """Unified diff (git format) of the sandbox against its original; ``""`` when equal."""
        ...


def _root(sandbox: SandboxInfo) -> Path:
    if not sandbox.sandbox_path:
        raise RefusedError(
            "InvalidState", f"sandbox {sandbox.name} has no path yet (phase {sandbox.phase})"
        )
    return Path(sandbox.sandbox_path)


def _inside(sandbox: SandboxInfo, path: str) -> Path:
    """Absolute path of ``path`` inside the sandbox, or ``RefusedError(PathTraversal)``."""
    root = _root(sandbox)
    relative = path.strip()
    if not relative or relative in (".", "./"):
        return root
    if any(part in _HIDDEN for part in Path(relative).parts):
        raise RefusedError("ReservedPath", f"{path}: the sandbox's git metadata is off limits")
    try:
        return Path(resolve_inside(root, relative))
    except ValueError as exc:
        raise RefusedError("PathTraversal", f"{exc}: {path}") from exc


class LocalFileOperations:
    """:class:`FileOperations` on the local executor's sandbox paths (same host)."""

    def read_file(self, sandbox: SandboxInfo, path: str) -> bytes:
        """Read ``path``.

        Raises:
            RefusedError: ``PathTraversal``; ``InvalidState`` when it is a directory.
            NotFoundError: no such file.
            OperationFailedError: reason ``IOError``.
        """
        target = _inside(sandbox, path)
        try:
            return target.read_bytes()
        except FileNotFoundError as exc:
            raise NotFoundError("NotFound", f"{path}: no such file in {sandbox.name}") from exc
        except IsADirectoryError as exc:
            raise RefusedError("InvalidState", f"{path} is a directory") from exc
        except OSError as exc:
            raise OperationFailedError("IOError", f"{path}: {exc}") from exc

    def write_file(self, sandbox: SandboxInfo, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` through a temporary file and a rename (never half-written).

        Raises:
            RefusedError: ``PathTraversal``; ``InvalidState`` when the sandbox is not Active,
                Created or RolledBack, or ``path`` names the sandbox root or a directory.
            OperationFailedError: reason ``IOError``.
        """
        if sandbox.phase not in _WRITABLE:
            raise RefusedError(
                "InvalidState",
                f"sandbox {sandbox.name} is {sandbox.phase.value if sandbox.phase else 'new'}; "
                "writes need an Active sandbox",
            )
        target = _inside(sandbox, path)
        if target == _root(sandbox) or target.is_dir():
            raise RefusedError("InvalidState", f"{path!r} is a directory")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Re-check after mkdir: a parent created through a symlink must still be inside.
            _inside(sandbox, path)
            mode = target.stat().st_mode & 0o7777 if target.is_file() else 0o666
            tmp = target.parent / f".sbx-{uuid.uuid4().hex}.tmp"
            # O_EXCL: never follows a planted symlink; the kernel applies the umask to 0o666.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                tmp.replace(target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise OperationFailedError("IOError", f"{path}: {exc}") from exc

    def list_files(self, sandbox: SandboxInfo, path: str = "") -> list[str]:
        """Files (and symlinks) below ``path``, relative to the resource root, sorted.

        Raises:
            RefusedError: ``PathTraversal``.
            NotFoundError: ``path`` does not exist.
        """
        root = _root(sandbox)
        start = _inside(sandbox, path)
        if not start.exists():
            raise NotFoundError("NotFound", f"{path}: no such directory in {sandbox.name}")
        if not start.is_dir():
            return [start.relative_to(root).as_posix()]
        out: list[str] = []
        for current, dirs, files in os.walk(start):
            dirs[:] = [d for d in dirs if d not in _HIDDEN]
            base = Path(current)
            for name in files:
                if name not in _HIDDEN:
                    out.append((base / name).relative_to(root).as_posix())
            for name in dirs:
                if (base / name).is_symlink():
                    out.append((base / name).relative_to(root).as_posix())
        return sorted(out)

    def diff(self, sandbox: SandboxInfo) -> str:
        """git_worktree: ``git diff`` of everything the next commit would carry (untracked files
        too) against the sandbox's base commit, through a private index so the sandbox's own
        index is untouched. Other strategies: the core's ``compute_diff`` of the original
        (``spec.source.nodePath``) against the sandbox tree.

        Raises:
            RefusedError: ``InvalidState`` when the sandbox has no path.
            OperationFailedError: ``DiffFailed`` (git failed, a tree is unreadable).
        """
        # The core's tree diff is imported here, not with the module: it loads the core's
        # directory-tree code, which ``import sandbox_client`` does not need.
        from sandbox_core.tree.textdiff import compute_diff

        root = _root(sandbox)
        try:
            if sandbox.spec.strategy == "git_worktree":
                return _git_diff(root, sandbox.base_commit or "HEAD")
            original = sandbox.spec.source.node_path
            if not original:
                raise RefusedError("InvalidState", f"sandbox {sandbox.name} has no nodePath")
            return compute_diff(original, root, exclude=sorted(_HIDDEN))
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            raise OperationFailedError("DiffFailed", f"{sandbox.name}: {detail}") from exc


def _git_diff(worktree: Path, base: str) -> str:
    def git(*args: str, env: dict[str, str] | None = None) -> str:
        return subprocess.run(
            ["git", "-C", str(worktree), *args],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout

    index = Path(git("rev-parse", "--path-format=absolute", "--git-path", "index").strip())
    with tempfile.TemporaryDirectory(prefix="sbx-diff-") as tmp:
        private = Path(tmp) / "index"
        if index.exists():
            shutil.copy2(index, private)  # reuses the stat cache: O(changed files)
        env = {**os.environ, "GIT_INDEX_FILE": str(private)}
        git("add", "-A", env=env)
        return git("diff", "--cached", "--no-color", "--no-ext-diff", base, env=env)


@runtime_checkable
class AsyncFileOperations(Protocol):
    """:class:`FileOperations` with awaitable methods (same arguments, results and errors)."""

    async def read_file(self, sandbox: SandboxInfo, path: str) -> bytes:
        """As :meth:`FileOperations.read_file`."""
        ...

    async def write_file(self, sandbox: SandboxInfo, path: str, data: bytes) -> None:
        """As :meth:`FileOperations.write_file`."""
        ...

    async def list_files(self, sandbox: SandboxInfo, path: str = "") -> list[str]:
        """As :meth:`FileOperations.list_files`."""
        ...

    async def diff(self, sandbox: SandboxInfo) -> str:
        """As :meth:`FileOperations.diff`."""
        ...


async def _in_thread(function: Callable[..., T], *args: Any) -> T:
    import asyncio  # here, not with the module: only the async client runs blocking calls

    return await asyncio.to_thread(function, *args)


class ThreadedFileOperations:
    """:class:`AsyncFileOperations` running a blocking :class:`FileOperations` in a worker
    thread (the local executor's file system calls)."""

    def __init__(self, files: FileOperations) -> None:
        self.files = files

    async def read_file(self, sandbox: SandboxInfo, path: str) -> bytes:
        """As :meth:`FileOperations.read_file`."""
        return await _in_thread(self.files.read_file, sandbox, path)

    async def write_file(self, sandbox: SandboxInfo, path: str, data: bytes) -> None:
        """As :meth:`FileOperations.write_file`."""
        await _in_thread(self.files.write_file, sandbox, path, data)

    async def list_files(self, sandbox: SandboxInfo, path: str = "") -> list[str]:
        """As :meth:`FileOperations.list_files`."""
        return await _in_thread(self.files.list_files, sandbox, path)

    async def diff(self, sandbox: SandboxInfo) -> str:
        """As :meth:`FileOperations.diff`."""
        return await _in_thread(self.files.diff, sandbox)


_LOCAL = LocalFileOperations()
AGENT_EXECUTOR = "pod"


def operations_for(sandbox: SandboxInfo, agent: FileOperations | None = None) -> FileOperations:
    """The :class:`FileOperations` for the sandbox's executor (``status.executor``): the local
    paths for ``local``, ``agent`` (the client's
    :class:`~sandbox_client.agent_files.AgentFileOperations`) for ``pod``.

    Raises:
        RefusedError: reason ``NoFileOperations`` for an executor without an implementation
            here (or ``pod`` without ``agent``), ``InvalidState`` before the operator
            reported one.
    """
    if not sandbox.executor:
        raise RefusedError("InvalidState", f"sandbox {sandbox.name} is not provisioned yet")
    if sandbox.executor == "local":
        return _LOCAL
    if sandbox.executor == AGENT_EXECUTOR and agent is not None:
        return agent
    raise RefusedError(
        "NoFileOperations",
        f"sandbox {sandbox.name} runs on the {sandbox.executor} executor; this client "
        "has file operations for: local, pod (with a Kubernetes API client)",
    )


def files_for(
    sandbox: SandboxInfo, files: FileOperations | None, agent: FileOperations
) -> FileOperations:
    """The file operations a client uses for ``sandbox``: its own ``files`` when it was given
    some, else :func:`operations_for` (``agent`` for the pod executor). Errors as
    :func:`operations_for`."""
    return files if files is not None else operations_for(sandbox, agent)


def async_files_for(
    sandbox: SandboxInfo, files: FileOperations | None, agent: AsyncFileOperations
) -> AsyncFileOperations:
    """:func:`files_for` for the async client: blocking operations (the client's own ``files``,
    the local executor's) run in a worker thread; ``agent`` serves the pod executor."""
    if files is not None:
        return ThreadedFileOperations(files)
    if sandbox.executor == AGENT_EXECUTOR:
        return agent
    return ThreadedFileOperations(operations_for(sandbox))
