"""``ActorDoor``: the actor's operations on one open sandbox, audited; the same for every door.

The workspace agent (:class:`sandbox_core.agent.operations.Operations`) and a local caller
(the operator's local executor, a library user) build one over the sandbox they opened::

    door = ActorDoor(sandbox, state_dir)
    door.files().write("src/app.py", b"print('hi')\\n")
    door.files().edit("src/app.py", "hi", "hello")
    door.grep("hello", path="src")
    door.sql("INSERT INTO t (x) VALUES (?)", [1])        # transaction_rollback only

:meth:`ActorDoor.files` resolves the sandbox's root with ``get_path(".")``: it activates a
CREATED or ROLLED_BACK sandbox (the caller saves the record when the status moved) and refuses
a sandbox that is committed, errored or cleaned up (``SandboxStateError``). Every change is
appended to the sandbox's audit log, ``<state_dir>/actor/<sandbox_id>/audit.jsonl``
(:class:`sandbox_core.actor.audit.AuditLog`, the one the command runner writes too): ``op``
``write`` (``path``, ``bytes``, ``append``), ``edit`` (``path``, ``occurrences``, ``bytes``),
``delete`` (``path``, ``type``), ``move`` (``path``, ``to``), ``mkdir`` (``path``), ``sql``
(``kind``, ``rowcount``, ``rows``, ``many``); never a file's content, a statement's text or a
parameter's value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sandbox_core.actor import search
from sandbox_core.actor.audit import AuditLog
from sandbox_core.actor.files import SandboxFiles
from sandbox_core.actor.sql import DEFAULT_MAX_ROWS, run_sql
from sandbox_core.strategies.base import BaseSandbox


class ActorDoor:
    """Files, search and SQL of one sandbox.

    Args:
        sandbox: the open sandbox (any strategy; SQL only for ``transaction_rollback``).
        state_dir: the state directory its audit log lives under (``None``: not audited).
    """

    def __init__(self, sandbox: BaseSandbox, state_dir: str | os.PathLike[str] | None) -> None:
        self.sandbox = sandbox
        self.log = AuditLog(Path(state_dir), sandbox.sandbox_id) if state_dir is not None else None

    def audit(self, record: dict[str, Any]) -> None:
        """Append ``record`` (``{"op", ...fields}``) to this sandbox's audit log (nothing
        without a state directory)."""
        if self.log is not None:
            fields = dict(record)
            self.log.append(str(fields.pop("op")), **fields)

    def root(self) -> str:
        """The sandbox's root directory (activates; see the module docstring).

        Raises:
            SandboxStateError: the sandbox is not open.
        """
        return self.sandbox.get_path(".")

    def _protected(self) -> frozenset[str]:
        """The strategy's own files in the root: a transaction sandbox's statement log."""
        context = self.sandbox.context
        log = (context.metadata or {}).get("statement_log") if context is not None else None
        return frozenset({Path(str(log)).name}) if log else frozenset()

    def files(self) -> SandboxFiles:
        """:class:`SandboxFiles` over the sandbox's root, audited."""
        return SandboxFiles(self.root(), audit=self.audit, protected=self._protected())

    def grep(self, pattern: str, **options: Any) -> dict[str, Any]:
        """:func:`sandbox_core.actor.search.grep` beneath the root."""
        return search.grep(self.root(), pattern, **options)

    def glob(self, pattern: str, **options: Any) -> dict[str, Any]:
        """:func:`sandbox_core.actor.search.glob` beneath the root."""
        return search.glob(self.root(), pattern, **options)

    def sql(
        self, sql: str, params: Any = None, *, many: bool = False, max_rows: int = DEFAULT_MAX_ROWS
    ) -> dict[str, Any]:
        """:func:`sandbox_core.actor.sql.run_sql` in the sandbox's transaction, audited."""
        return run_sql(self.sandbox, sql, params, many=many, max_rows=max_rows, audit=self.audit)
