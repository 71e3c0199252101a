"""What an agent framework's adapter needs of one sandbox: :class:`SandboxActions`.

A framework's sandbox contract (Deep Agents' ``SandboxBackendProtocol``, the OpenAI Agents
SDK's sandbox session) comes down to three operations: run a shell line, upload files and
download files. :class:`SandboxActions` is that contract on our side; the adapters in this
package are written against it only, and any door that meets it serves them:
``sandbox_core.actor.actions.LocalActions`` for sandboxes on local paths (the ``sandbox-core``
CLI's state directory, the operator's local executor).

Paths are the ones the sandbox's commands see: a command runs with its working directory at
:attr:`SandboxActions.root`, the sandbox's root at its own absolute path (docs/actor.md,
"Isolation"), so an absolute path an agent reads in a command's output is a path it can upload
to. A relative path, one outside the root, or one under ``.git`` is refused with
``invalid_path``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["CommandOutcome", "FileOutcome", "SandboxActions"]


class CommandOutcome(Protocol):
    """How one shell line ended."""

    @property
    def output(self) -> str:
        """stdout then stderr, decoded as UTF-8 (undecodable bytes replaced)."""
        ...

    @property
    def exit_code(self) -> int:
        """The exit status (``128 + N`` when ended by signal N)."""
        ...

    @property
    def truncated(self) -> bool:
        """Output was dropped past the door's cap."""
        ...

    @property
    def timed_out(self) -> bool:
        """The command was killed at its timeout."""
        ...


class FileOutcome(Protocol):
    """One file of a batch upload or download."""

    @property
    def path(self) -> str:
        """The path as the caller gave it."""
        ...

    @property
    def content(self) -> bytes | None:
        """The file's bytes (a download that succeeded), else None."""
        ...

    @property
    def error(self) -> str | None:
        """None on success; else ``"file_not_found"``, ``"is_directory"``,
        ``"permission_denied"``, ``"invalid_path"``, or the door's message."""
        ...


class SandboxActions(Protocol):
    """Run commands and move files in one sandbox (module docstring)."""

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (stable for its life)."""
        ...

    @property
    def root(self) -> str:
        """The sandbox's root as its commands see it: an absolute POSIX path."""
        ...

    def run(self, command: str, timeout_seconds: float | None = None) -> CommandOutcome:
        """Run ``command`` with ``/bin/sh -c`` in the root and wait for it."""
        ...

    def upload(self, files: Sequence[tuple[str, bytes]]) -> Sequence[FileOutcome]:
        """Write each ``(absolute path, bytes)``, creating parents; one outcome per file, in
        order (one failure does not stop the others)."""
        ...

    def download(self, paths: Sequence[str]) -> Sequence[FileOutcome]:
        """Read each absolute path; one outcome per file, in order."""
        ...
