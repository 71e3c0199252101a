"""How one sandbox is shown: its JSON shape and its unified diff.

Shared by the CLI (``status --json``, ``diff``), the workspace agent (every reply describing a
sandbox, ``GET .../diff``) and the demo, which all sit above this module and import it; it
imports none of them.
"""

from __future__ import annotations

import json
from typing import Any

from sandbox_core.errors import SandboxStateError
from sandbox_core.redaction import redact
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.tree import textdiff


def describe(sandbox: BaseSandbox) -> dict[str, Any]:
    """``sandbox`` as a JSON-ready dict: ids, strategy, status, paths, metadata and its record.

    A database DSN may carry a password: every ``original_path`` in it is redacted
    (``sandbox_core.redact_dsn``).
    """
    record = sandbox.to_record()
    record["original_path"] = redact(sandbox.original_path)
    if record.get("context"):
        record["context"]["original_path"] = redact(sandbox.original_path)
    context = sandbox.context
    return {
        "sandbox_id": sandbox.sandbox_id,
        "strategy": sandbox.strategy,
        "status": sandbox.status.value,
        "resource_id": sandbox.resource_id,
        "original_path": redact(sandbox.original_path),
        "plan_id": context.plan_id if context else None,
        "sandbox_path": context.sandbox_path if context else None,
        "metadata": dict(context.metadata) if context else {},
        "record": record,
    }


def sandbox_diff(sandbox: BaseSandbox) -> str:
    """Unified diff of the sandbox against its original.

    Uses the strategy's own ``diff()`` when it has one (git_worktree); for a database
    (transaction_rollback) lists the pending write statements; else compares the trees.
    """
    native = getattr(sandbox, "diff", None)
    if callable(native):
        return str(native())
    pending = getattr(sandbox, "statements", None)
    if callable(pending):
        lines = []
        for entry in pending():
            params = f"  -- params: {json.dumps(entry['params'])}" if entry.get("params") else ""
            lines.append(f"{entry['sql'].rstrip(';')};{params}")
        return "\n".join(lines) + ("\n" if lines else "")
    context = sandbox.context
    if context is None:
        raise SandboxStateError(f"sandbox {sandbox.sandbox_id} has not been created")
    return textdiff.compute_diff(context.original_path, context.sandbox_path)
