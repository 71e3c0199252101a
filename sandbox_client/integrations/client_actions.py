"""``SandboxActions`` over the engine's client: a Sandbox custom resource, wherever it runs.

:class:`ClientActions` drives one ``sandbox_client`` :class:`~sandbox_client.client.Sandbox`:
a pod-executor Sandbox through the API server's pod proxy to its workspace agent, or a
local-executor Sandbox on the operator's state directory (the client picks by
``status.executor``; docs/client.md). Plug it into either adapter::

    from sandbox_client import SandboxClient
    from sandbox_client.integrations.client_actions import ClientActions

    actions = ClientActions(SandboxClient().sandbox("plan-1-repo", "team-a"))
    backend = SandboxBackend(actions)   # Deep Agents; or OperatorSandboxClient(lambda _: actions)

The sandbox's root as its commands see it is asked of the sandbox itself once (``pwd -P`` in
the jail), so absolute paths in a command's output and in upload/download agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sandbox_client.client import Sandbox
from sandbox_core.paths import framework_error_code, relative_to_root

__all__ = ["ClientActions"]

DEFAULT_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class _Command:
    output: str
    exit_code: int
    truncated: bool
    timed_out: bool


@dataclass(frozen=True)
class _File:
    path: str
    content: bytes | None = None
    error: str | None = None


class ClientActions:
    """``SandboxActions`` for a Sandbox reached through ``sandbox_client`` (module docstring).

    Args:
        sandbox: the client's handle of an Active (or Created) Sandbox.

    Raises:
        sandbox_client.errors.SandboxClientError: the Sandbox cannot be reached or run
            commands (``NotFound``, ``InvalidState``, ``JailUnavailable``, ...).
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self._id = sandbox.info().sandbox_id or sandbox.name
        where = sandbox.exec(["pwd", "-P"], timeout=60)
        if where.exit_code != 0:
            raise RuntimeError(f"cannot find the sandbox's root: {where.stderr!r}")
        self._root = where.stdout.decode().strip()

    @property
    def sandbox_id(self) -> str:
        return self._id

    @property
    def root(self) -> str:
        return self._root

    def run(self, command: str, timeout_seconds: float | None = None) -> _Command:
        result = self.sandbox.exec(command, timeout=timeout_seconds or DEFAULT_TIMEOUT_SECONDS)
        return _Command(
            output=(result.stdout + result.stderr).decode("utf-8", "replace"),
            exit_code=result.exit_code,
            truncated=result.truncated,
            timed_out=result.timed_out,
        )

    def upload(self, files: Sequence[tuple[str, bytes]]) -> list[_File]:
        relatives = [relative_to_root(self._root, path) for path, _ in files]
        sent = [(rel, data) for rel, (_, data) in zip(relatives, files, strict=True) if rel]
        results = iter(self.sandbox.upload(sent) if sent else [])
        outcomes: list[_File] = []
        for (path, _), rel in zip(files, relatives, strict=True):
            if rel is None:
                outcomes.append(_File(path, error="invalid_path"))
                continue
            result = next(results)
            error = None if result.ok else framework_error_code(result.error or {})
            outcomes.append(_File(path, error=error))
        return outcomes

    def download(self, paths: Sequence[str]) -> list[_File]:
        relatives = [relative_to_root(self._root, path) for path in paths]
        wanted = [rel for rel in relatives if rel]
        results = iter(self.sandbox.download(wanted) if wanted else [])
        outcomes: list[_File] = []
        for path, rel in zip(paths, relatives, strict=True):
            if rel is None:
                outcomes.append(_File(path, error="invalid_path"))
                continue
            result = next(results)
            if result.ok:
                outcomes.append(_File(path, content=result.data))
            else:
                outcomes.append(_File(path, error=framework_error_code(result.error or {})))
        return outcomes
