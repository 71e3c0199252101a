"""One JSON shape of a sandbox, shared by the CLI (``status --json``) and the workspace agent."""

from __future__ import annotations

from typing import Any

from sandbox_core._db import redact
from sandbox_core.strategies.base import BaseSandbox


def describe(sandbox: BaseSandbox) -> dict[str, Any]:
    """``sandbox`` as a JSON-ready dict: ids, strategy, status, paths, metadata and its record.

    A database DSN may carry a password: every ``original_path`` in it is redacted
    (``sandbox_core.redact_dsn``, issue 7).
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
