"""The actor's door on local paths: the same operations as the workspace agent's, for sandboxes
kept in a state directory this process can reach (the CLI, the operator's local executor).

:class:`LocalActor` reopens a sandbox by id through :class:`~sandbox_core.host.host.SandboxHost`
(so it sees what the agent, the CLI or the operator recorded), runs the operation with the one
:class:`~sandbox_core.actor.exec.CommandRunner`, saves the record when the operation activated
the sandbox, and keeps the audit log in the same place the agent does
(``<state_dir>/actor/<sandbox_id>/audit.jsonl``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox_core.actor.audit import AuditLog
from sandbox_core.actor.exec import DEFAULT_MAX_CONCURRENT, CommandRunner, ExecRequest, Execution
from sandbox_core.actor.jail import Jail
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.store import SandboxStore

__all__ = ["LocalActor"]


class LocalActor:
    """Actor operations on the sandboxes of ``state_dir`` (module docstring).

    Args:
        state_dir: the sandboxes' state directory (``SandboxStore``'s).
        jail: how commands are isolated (default :class:`Jail`).
        max_concurrent: commands running at once per sandbox (in this process).
        host: the host to reopen sandboxes with (default one over ``state_dir``).
    """

    def __init__(
        self,
        state_dir: str | Path,
        jail: Jail | None = None,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        host: SandboxHost | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.host = host or SandboxHost(SandboxStore(self.state_dir))
        self.runner = CommandRunner(self.state_dir, jail, max_concurrent)

    def exec(self, sandbox_id: str, request: ExecRequest) -> Execution:
        """Start ``request`` in sandbox ``sandbox_id``; iterate the result for its output.

        Raises:
            SandboxError: no such sandbox; and everything :meth:`CommandRunner.start` raises.
            ValueError: ``cwd`` escapes the sandbox.
        """
        sandbox = self.host.reopen(sandbox_id)
        before = sandbox.status
        try:
            return self.runner.start(sandbox, request)
        finally:
            if sandbox.status is not before:  # activated by resolving cwd
                self.host.save(sandbox)

    def audit(self, sandbox_id: str, after: int = 0, limit: int = 100) -> dict[str, Any]:
        """A page of the sandbox's audit log (:meth:`AuditLog.read`)."""
        return AuditLog(self.state_dir, sandbox_id).read(after, limit)
