"""The agent frameworks' adapters' operations on a sandbox on local paths: :class:`LocalActions`.

The adapters in ``sandbox_client.integrations`` need three operations of a sandbox (run a
shell line, upload files, download files: ``sandbox_client.integrations.actions``'
``SandboxActions``). This module meets them for a sandbox kept in a state directory this
process can reach.

Paths are the ones the sandbox's commands see: a command runs with its working directory at
:attr:`SandboxActions.root`, the sandbox's root at its own absolute path (docs/actor.md,
"Isolation"), so an absolute path an agent reads in a command's output is a path it can upload
to. A path outside the root, a relative path, or one under ``.git`` is refused.

:class:`LocalActions` serves sandboxes kept in a state directory this process can reach (the
``sandbox-core`` CLI's, the operator's local executor's) through the core's actor door: the
command runs in the same jail as through a workspace agent, and writes go through the same
descriptor-relative file operations, audited in the sandbox's audit log.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox_core.actor.door import ActorDoor
from sandbox_core.actor.exec import ExecLimitError, ExecRequest, Execution
from sandbox_core.actor.local import LocalActor
from sandbox_core.paths import framework_error_code, relative_to_root

__all__ = [
    "CommandOutcome",
    "FileOutcome",
    "LocalActions",
]

DEFAULT_TIMEOUT_SECONDS = 600.0
"""A command's wall-clock limit when the framework gives none (seconds)."""
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
"""Bytes of output kept per stream of one command; more sets ``truncated``."""


@dataclass(frozen=True)
class CommandOutcome:
    """How one shell line ended.

    Attributes:
        output: stdout then stderr, decoded as UTF-8 (undecodable bytes replaced).
        exit_code: the exit status (``128 + N`` when ended by signal N).
        truncated: a stream wrote more than :data:`MAX_OUTPUT_BYTES`, the rest was dropped.
        timed_out: the command was killed at its timeout.
    """

    output: str
    exit_code: int
    truncated: bool = False
    timed_out: bool = False


@dataclass(frozen=True)
class FileOutcome:
    """One file of a batch upload or download.

    Attributes:
        path: the path as the caller gave it.
        content: the file's bytes (downloads that succeeded), else None.
        error: None on success; else one of ``"file_not_found"``, ``"is_directory"``,
            ``"permission_denied"``, ``"invalid_path"``, or the core's message.
    """

    path: str
    content: bytes | None = None
    error: str | None = None


def outcomes(
    paths: Sequence[str], relatives: Sequence[str | None], results: Iterable[dict[str, object]]
) -> list[FileOutcome]:
    """Join the core's per-file results (for the paths that had a relative form) with the
    refused ones, in the caller's order."""
    pending = iter(results)
    joined: list[FileOutcome] = []
    for path, rel in zip(paths, relatives, strict=True):
        if rel is None:
            joined.append(FileOutcome(path, error="invalid_path"))
            continue
        result = next(pending)
        if result.get("ok"):
            data = result.get("data")
            joined.append(FileOutcome(path, content=data if isinstance(data, bytes) else None))
        else:
            error = result.get("error")
            code = framework_error_code(error if isinstance(error, dict) else {})
            joined.append(FileOutcome(path, error=code))
    return joined


class LocalActions:
    """``SandboxActions`` for a sandbox in a state directory on this machine.

    Args:
        state_dir: the sandboxes' state directory (``SANDBOX_CORE_STATE_DIR`` of the CLI, the
            operator's local executor's).
        sandbox_id: the sandbox (any directory or git strategy; it is activated on first use).

    Raises:
        sandbox_core.errors.SandboxError: no such sandbox, or it is not open.
    """

    def __init__(self, state_dir: str | Path, sandbox_id: str) -> None:
        self._actor = LocalActor(state_dir)
        self._state_dir = Path(state_dir)
        self._sandbox_id = sandbox_id
        self._root = self._door().root()

    def _door(self) -> ActorDoor:
        """The sandbox's actor door (reopened per call: another process may have moved it)."""
        sandbox = self._actor.host.reopen(self._sandbox_id)
        before = sandbox.status
        door = ActorDoor(sandbox, self._state_dir)
        door.root()
        if sandbox.status is not before:
            self._actor.host.save(sandbox)
        return door

    @property
    def sandbox_id(self) -> str:
        return self._sandbox_id

    @property
    def root(self) -> str:
        return self._root

    def run(self, command: str, timeout_seconds: float | None = None) -> CommandOutcome:
        request = ExecRequest(
            shell_line=command,
            timeout_seconds=timeout_seconds or DEFAULT_TIMEOUT_SECONDS,
            max_output_bytes=MAX_OUTPUT_BYTES,
        )
        stdout, stderr, result = self._start(request).collect()
        return CommandOutcome(
            output=(stdout + stderr).decode("utf-8", "replace"),
            exit_code=result.exit_code,
            truncated=result.truncated,
            timed_out=result.timed_out,
        )

    def _start(self, request: ExecRequest) -> Execution:
        """Start ``request``; while the sandbox runs its limit of commands, wait for a slot
        (agents fan commands out; the limit is back-pressure, not a failure), at most the
        command's own timeout."""
        deadline = time.monotonic() + request.timeout_seconds
        pause = 0.02
        while True:
            try:
                return self._actor.exec(self._sandbox_id, request)
            except ExecLimitError:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def upload(self, files: Sequence[tuple[str, bytes]]) -> list[FileOutcome]:
        relatives = [relative_to_root(self._root, path) for path, _ in files]
        items = [(rel, data) for rel, (_, data) in zip(relatives, files, strict=True) if rel]
        results = self._door().files().upload(items) if items else []
        return outcomes([path for path, _ in files], relatives, results)

    def download(self, paths: Sequence[str]) -> list[FileOutcome]:
        relatives = [relative_to_root(self._root, path) for path in paths]
        files = self._door().files()
        results: list[dict[str, object]] = []
        for rel in relatives:
            if rel is None:
                continue
            chunks: list[bytes] = []
            for event in files.download([rel]):
                if "data" in event:
                    chunks.append(event["data"])
                elif event.get("ok"):
                    results.append({"ok": True, "data": b"".join(chunks)})
                else:
                    results.append(event)
        return outcomes(list(paths), relatives, results)
