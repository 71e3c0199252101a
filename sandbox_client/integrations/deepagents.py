"""A LangChain Deep Agents backend over a sandbox: ``deepagents``' ``SandboxBackendProtocol``.

Install the ``deepagents`` extra. Plug it into an agent in five lines::

    from deepagents import create_deep_agent
    from sandbox_core.actor.actions import LocalActions
    from sandbox_client.integrations.deepagents import SandboxBackend

    backend = SandboxBackend(LocalActions(state_dir, sandbox_id))
    agent = create_deep_agent(model=model, backend=backend)

The backend builds on ``deepagents.backends.sandbox.BaseSandbox``, which runs its file tools
(ls, read, edit, grep, glob) as commands through :meth:`execute`; this module adds the three
operations that class leaves to a backend (``execute``, ``upload_files``, ``download_files``)
and the ``id``. Commands run in the sandbox's jail with the sandbox's root as their working
directory; every write lands in the sandbox, shows in its diff and review, and reaches the
original only through the plan's commit. Paths are absolute as the commands see them
(:attr:`SandboxBackend.root`); paths outside the root are refused with ``invalid_path``.

Conformance: LangChain's standard sandbox suite (``langchain-tests``' ``SandboxIntegrationTests``)
runs against it in the test command (tests/integrations/test_deepagents_conformance.py).
"""

from __future__ import annotations

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from sandbox_client.integrations.actions import SandboxActions

__all__ = ["SandboxBackend"]


class SandboxBackend(BaseSandbox):
    """A Deep Agents sandbox backend for one sandbox of this product.

    Args:
        actions: the sandbox's door (``sandbox_core.actor.actions.LocalActions``
            on local paths, or another :class:`SandboxActions`).
        default_timeout: seconds a command may run when the agent gives no timeout.
    """

    def __init__(self, actions: SandboxActions, default_timeout: float = 600.0) -> None:
        self.actions = actions
        self.default_timeout = default_timeout

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self.actions.sandbox_id

    @property
    def root(self) -> str:
        """The sandbox's root, as commands see it (their working directory)."""
        return self.actions.root

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``command`` with ``/bin/sh -c`` in the sandbox; stdout then stderr.

        ``timeout`` 0 means the longest a command may run (24 h); None the default.
        """
        seconds = self.default_timeout if timeout is None else (timeout or 24 * 3600.0)
        outcome = self.actions.run(command, seconds)
        output = outcome.output
        if outcome.timed_out:
            output += f"\n[command timed out after {seconds:g} s]"
        return ExecuteResponse(
            output=output, exit_code=outcome.exit_code, truncated=outcome.truncated
        )

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each ``(absolute path, bytes)``; one response per file, in order."""
        return [
            FileUploadResponse(path=outcome.path, error=outcome.error)
            for outcome in self.actions.upload(files)
        ]

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each absolute path; one response per file, in order."""
        return [
            FileDownloadResponse(path=outcome.path, content=outcome.content, error=outcome.error)
            for outcome in self.actions.download(paths)
        ]
