"""SQL through a ``transaction_rollback`` sandbox: the statement runs in the sandbox's
transaction (logged, replayed verified at commit: docs/transaction-strategy.md), never on a
connection of its own.

:func:`run_sql` is the one entry for the agent's ``POST .../sql`` route and for local callers:
it takes JSON-shaped parameters (a list, a mapping, or for ``many`` a list of them; bytes as
``{"$bytes": "<base64>"}``), calls the sandbox's ``execute``/``executemany``, and gives back
JSON-shaped rows (bytes as ``{"$bytes": ...}``, dates and times in ISO 8601, decimals and
anything else as text). It reports one audit record per statement: its kind (the leading
keyword, ``INSERT``, ``SELECT``, ...), ``many``, and the row count; never the SQL text or a
parameter value.
"""

from __future__ import annotations

import base64
import datetime
import re
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from sandbox_core.errors import SandboxError, SandboxStateError

DEFAULT_MAX_ROWS = 1000
_LEADING_NOISE = re.compile(r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/|\()+", re.DOTALL)
Audit = Callable[[dict[str, Any]], None]


def statement_kind(sql: str) -> str:
    """The leading keyword of ``sql``, upper-case, after comments, blanks and parentheses
    (``""`` when there is none)."""
    stripped = _LEADING_NOISE.sub("", sql, count=1)
    match = re.match(r"[A-Za-z]+", stripped)
    return match.group(0).upper() if match else ""


def decode_param(value: Any) -> Any:
    """A JSON parameter value as the driver takes it (``{"$bytes": b64}`` -> bytes)."""
    if isinstance(value, Mapping) and set(value) == {"$bytes"}:
        return base64.b64decode(str(value["$bytes"]))
    return value


def decode_params(params: Any) -> Any:
    """A JSON parameter set (list or mapping, or None) as the driver takes it.

    Raises:
        SandboxError: neither a list, a mapping nor null.
    """
    if params is None:
        return None
    if isinstance(params, Mapping):
        return {str(k): decode_param(v) for k, v in params.items()}
    if isinstance(params, list | tuple):
        return tuple(decode_param(v) for v in params)
    raise SandboxError("SQL parameters must be a list, an object or null")


def encode_value(value: Any) -> Any:
    """One column value as JSON."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode_value(v) for k, v in value.items()}
    return str(value)


def run_sql(
    sandbox: Any,
    sql: str,
    params: Any = None,
    *,
    many: bool = False,
    max_rows: int = DEFAULT_MAX_ROWS,
    audit: Audit | None = None,
) -> dict[str, Any]:
    """Run one statement (or one per parameter set when ``many``) in ``sandbox``.

    Args:
        sandbox: a ``transaction_rollback`` sandbox (anything with ``execute``,
            ``executemany``, ``last_outcome`` and ``last_columns``).
        sql: one statement, in the driver's placeholder style (``?``/``:name`` for SQLite,
            ``%s``/``%(name)s`` for PostgreSQL).
        params: JSON-shaped parameters (see the module docstring); for ``many`` a list of sets.
        max_rows: rows returned at most (``truncated`` says when more came back).

    Returns:
        ``{"kind", "columns": [str], "rows": [[value]], "rowcount": int, "last_id": int |
        None, "truncated": bool}`` (``rowcount`` ``-1`` when not applicable).

    Raises:
        SandboxStateError: not a ``transaction_rollback`` sandbox, or not open.
        The errors of ``TransactionSandbox.execute`` (``SandboxStatementError``,
        ``SandboxBusyError``, ``SandboxConnectionError``, ``SandboxReplayDivergedError``).
    """
    if not callable(getattr(sandbox, "execute", None)) or not hasattr(sandbox, "last_columns"):
        strategy = getattr(sandbox, "strategy", type(sandbox).__name__)
        raise SandboxStateError(
            f"SQL runs in transaction_rollback sandboxes only; this one is {strategy}: "
            "use the file operations"
        )
    if not isinstance(sql, str) or not sql.strip():
        raise SandboxError("sql must be a non-empty string")
    kind = statement_kind(sql)
    if many:
        if not isinstance(params, list):
            raise SandboxError("executemany needs a list of parameter sets")
        sandbox.executemany(sql, [decode_params(p) for p in params])
        rows: list[tuple[Any, ...]] = []
        columns: list[str] = []
    else:
        rows = sandbox.execute(sql, decode_params(params))
        columns = list(sandbox.last_columns)
    outcome = sandbox.last_outcome or {}
    rowcount = int(outcome.get("rowcount", -1))
    reply = {
        "kind": kind,
        "columns": columns,
        "rows": [[encode_value(v) for v in row] for row in rows[: max(0, max_rows)]],
        "rowcount": rowcount,
        "last_id": outcome.get("last_id"),
        "truncated": len(rows) > max_rows,
    }
    if audit is not None:
        audit(
            {
                "op": "sql",
                "kind": kind,
                "many": many,
                "rowcount": rowcount,
                "rows": len(rows),
            }
        )
    return reply
