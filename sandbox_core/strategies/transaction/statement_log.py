"""The statement log of a ``transaction_rollback`` sandbox, and what each statement produced.

One JSON object per line in ``<sandbox_root>/txn/<sandbox_id>/statements.jsonl``, appended and
fsynced after the statement succeeded::

    {"sql": "INSERT INTO parent(name) VALUES (?) RETURNING id", "params": ["p"], "many": false,
     "outcome": {"rowcount": 1, "last_id": 7, "rows": 1, "rows_sha256": "...",
                 "preview": "[[7]]"}}

``outcome`` is what the sandbox saw when it ran the statement (case 32): the row count,
the id the database generated for it (``Connection.run``'s ``generated_id``), and a digest of the
rows it returned (``RETURNING``), compared as a multiset because without ``ORDER BY`` the order is
not part of the result. A replay that produces another outcome did not reproduce the sandbox's
transaction. Entries written before outcomes were recorded have none and are replayed unchecked.

For a plan's review: :func:`log_digest` names the exact changes of a log (statements,
parameters and recorded outcomes), :func:`tables_written` the tables a statement's text writes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREVIEW_CHARS = 120

_NAME = r'("[^"]+"|[A-Za-z_][\w$]*)(\s*\.\s*("[^"]+"|[A-Za-z_][\w$]*))?'
# Clauses that contain a write keyword without naming a written table.
_NOT_A_TARGET = re.compile(
    r"\b(DO\s+UPDATE|FOR\s+(NO\s+KEY\s+)?UPDATE|ON\s+(UPDATE|DELETE)|"
    r"(BEFORE|AFTER|INSTEAD\s+OF)\s+(INSERT|UPDATE|DELETE)|OR\s+(INSERT|UPDATE|DELETE))\b",
    re.IGNORECASE,
)
_WRITE_TARGET = re.compile(
    r"\b(?:(?:INSERT|REPLACE)(?:\s+OR\s+\w+)?\s+INTO|MERGE\s+INTO|"
    r"UPDATE(?:\s+OR\s+\w+)?(?:\s+ONLY)?|DELETE\s+FROM(?:\s+ONLY)?|"
    r"(?:CREATE|ALTER|DROP)(?:\s+(?:TEMP|TEMPORARY|UNLOGGED))?\s+TABLE"
    r"(?:\s+IF(?:\s+NOT)?\s+EXISTS)?(?:\s+ONLY)?|"
    r"TRUNCATE(?:\s+TABLE)?(?:\s+ONLY)?)\s+" + _NAME,
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Outcome:
    """What one statement produced.

    Attributes:
        rowcount: the driver's row count (``-1`` when not applicable).
        last_id: the generated id this statement produced, ``None`` when it produced none.
        rows: how many rows it returned.
        rows_sha256: digest of the returned rows in a canonical JSON form.
        preview: the start of that JSON form, for error messages.
        effects: what the statement wrote (``Result.effects``: rows inserted, updated and
            deleted per table, or whether an insert assigned a rowid), ``None`` when unknown;
            compared only when both runs know it.
    """

    rowcount: int
    last_id: int | None
    rows: int
    rows_sha256: str
    preview: str
    effects: str | None = None

    @classmethod
    def of(
        cls,
        rows: Sequence[tuple[Any, ...]],
        rowcount: int,
        last_id: int | None,
        effects: str | None = None,
    ) -> Outcome:
        """The outcome of a statement that returned ``rows`` and changed ``rowcount`` rows."""
        # Rows compare as a multiset: without ORDER BY a replay may return them in another order.
        encoded = sorted(
            json.dumps([_canonical(cell) for cell in row], sort_keys=True, separators=(",", ":"))
            for row in rows
        )
        text = "[" + ",".join(encoded) + "]"
        preview = text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."
        return cls(
            rowcount=int(rowcount),
            last_id=last_id,
            rows=len(rows),
            rows_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
            preview=preview,
            effects=effects,
        )

    @property
    def wrote(self) -> bool:
        """True when the statement is known to have written rows (``effects`` says so)."""
        effects = _effects(self.effects)
        if effects is None or not effects:
            return False
        return bool(effects.get("rowid", True))  # SQLite: an insert that assigned a row

    def to_json(self) -> dict[str, Any]:
        """The log form (``effects`` only when known, so older logs read the same)."""
        data: dict[str, Any] = {
            "rowcount": self.rowcount,
            "last_id": self.last_id,
            "rows": self.rows,
            "rows_sha256": self.rows_sha256,
            "preview": self.preview,
        }
        if self.effects is not None:
            data["effects"] = self.effects
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        """Inverse of :meth:`to_json`."""
        last_id = data.get("last_id")
        return cls(
            rowcount=int(data["rowcount"]),
            last_id=None if last_id is None else int(last_id),
            rows=int(data["rows"]),
            rows_sha256=str(data["rows_sha256"]),
            preview=str(data.get("preview", "")),
            effects=None if data.get("effects") is None else str(data["effects"]),
        )

    def difference(self, replayed: Outcome) -> str | None:
        """What ``replayed`` does differently from this (recorded) outcome; ``None`` if nothing."""
        found = []
        if self.rows_sha256 != replayed.rows_sha256:
            found.append(f"returned {replayed.preview} instead of {self.preview}")
        if self.last_id != replayed.last_id:
            found.append(f"generated id {replayed.last_id} instead of {self.last_id}")
        if self.rowcount != replayed.rowcount:
            found.append(f"changed {replayed.rowcount} rows instead of {self.rowcount}")
        if _effects_differ(self.effects, replayed.effects):
            found.append(f"wrote {replayed.effects} instead of {self.effects}")
        return ", ".join(found) or None


@dataclass(frozen=True)
class LogEntry:
    """One logged statement: SQL, its parameters in log form, and what it produced."""

    sql: str
    params: Any
    many: bool
    outcome: Outcome | None = None

    @classmethod
    def make(cls, sql: str, params: Any, *, many: bool) -> LogEntry:
        """An entry for a statement about to run (no outcome yet).

        Raises:
            ValueError: a parameter of a type the log cannot hold (see :func:`encode_params`).
        """
        return cls(sql=sql, params=encode_params(params, many=many), many=many)

    def with_outcome(self, outcome: Outcome) -> LogEntry:
        """This entry with ``outcome`` recorded."""
        return LogEntry(self.sql, self.params, self.many, outcome)

    def driver_params(self) -> Any:
        """The parameters as the driver takes them (bytes restored)."""
        if self.many:
            return [_decode_params(p) for p in self.params]
        return _decode_params(self.params)

    def digest_form(self) -> dict[str, Any]:
        """What this entry contributes to :func:`log_digest`: everything but the preview (it is
        derived from the digested rows)."""
        outcome = self.outcome.to_json() if self.outcome else None
        if outcome is not None:
            del outcome["preview"]
        return {"sql": self.sql, "params": self.params, "many": self.many, "outcome": outcome}

    def to_json(self) -> dict[str, Any]:
        """The log form (also what ``TransactionSandbox.statements()`` returns)."""
        data: dict[str, Any] = {"sql": self.sql, "params": self.params, "many": self.many}
        if self.outcome is not None:
            data["outcome"] = self.outcome.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LogEntry:
        """Inverse of :meth:`to_json`."""
        outcome = data.get("outcome")
        return cls(
            sql=str(data["sql"]),
            params=data.get("params"),
            many=bool(data.get("many")),
            outcome=Outcome.from_json(outcome) if outcome else None,
        )


class StatementLog:
    """The append-only, fsynced statement log file of one sandbox.

    Raises (every method):
        OSError: the file cannot be read or written.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[LogEntry]:
        """Every entry, oldest first; a torn last line is ignored.

        A torn last line is a statement whose process died before ``execute()`` returned: its
        transaction died too, so it never happened.
        """
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        entries = []
        for number, line in enumerate(lines, start=1):
            try:
                entries.append(LogEntry.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                if number == len(lines):
                    break
                raise
        return entries

    def append(self, entry: LogEntry) -> None:
        """Append ``entry`` and fsync it."""
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(_line(entry))
            handle.flush()
            os.fsync(handle.fileno())

    def replace(self, entries: list[LogEntry]) -> None:
        """Replace the whole log atomically (rename over it)."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.writelines(_line(e) for e in entries)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.path)


def log_digest(entries: Iterable[LogEntry]) -> str:
    """``"sha256:<hex>"`` over the statements in order, with their parameters and recorded
    outcomes: equal digests mean the same statements would be replayed and checked against the
    same outcomes. Stable across processes and Python versions (canonical JSON)."""
    text = json.dumps(
        [entry.digest_form() for entry in entries], sort_keys=True, separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def tables_written(sql: str) -> list[str]:
    """The tables a statement's text names as written (``INSERT INTO``, ``UPDATE``, ``DELETE
    FROM``, ``REPLACE``/``MERGE INTO``, ``CREATE``/``ALTER``/``DROP TABLE``, ``TRUNCATE``), in
    order of appearance, without quotes (``schema.table`` kept). A lexical reading, not a parse:
    ``[]`` when the text names none (a function that writes, called from ``SELECT``)."""
    found: list[str] = []
    for match in _WRITE_TARGET.finditer(_NOT_A_TARGET.sub(" ", sql)):
        parts = [match.group(1), match.group(3)] if match.group(3) else [match.group(1)]
        name = ".".join(part.strip('"') for part in parts)
        if name not in found:
            found.append(name)
    return found


def _line(entry: LogEntry) -> str:
    return json.dumps(entry.to_json(), separators=(",", ":")) + "\n"


def encode_params(params: Any, *, many: bool) -> Any:
    """JSON form of ``params`` for the statement log.

    Raises:
        ValueError: a value of another type than None, bool, int, float, str, bytes.
    """
    if many:
        return [encode_params(p, many=False) for p in params]
    if params is None:
        return None
    if isinstance(params, dict):
        return {str(k): _encode_value(v) for k, v in params.items()}
    if isinstance(params, str | bytes):
        raise ValueError("params must be a sequence or a mapping, not a string")  # noqa: TRY004 - callers map ValueError to SandboxStatementError
    return [_encode_value(v) for v in params]


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise ValueError(
        f"parameter of type {type(value).__name__} cannot be recorded in the statement log "
        "(use None, bool, int, float, str or bytes)"
    )


def _decode_params(params: Any) -> Any:
    if params is None:
        return None
    if isinstance(params, dict):
        return {k: _decode_value(v) for k, v in params.items()}
    return tuple(_decode_value(v) for v in params)


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict) and "$bytes" in value:
        return base64.b64decode(value["$bytes"])
    return value


def _canonical(value: Any) -> Any:
    """A JSON value standing for one result cell, equal for equal cells of one driver."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    return {f"${type(value).__name__}": str(value)}


def _effects(text: str | None) -> dict[str, Any] | None:
    """``Outcome.effects`` parsed (``None`` when unknown or not an object)."""
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _effects_differ(recorded: str | None, replayed: str | None) -> bool:
    """True when both effects are known and differ. A SQLite ``"conflicts"`` count missing on
    one side (a log written before it was measured) is not a difference."""
    if recorded is None or replayed is None or recorded == replayed:
        return False
    old, new = _effects(recorded), _effects(replayed)
    if old is None or new is None:
        return True
    if ("conflicts" in old) != ("conflicts" in new):
        old.pop("conflicts", None)
        new.pop("conflicts", None)
    return old != new
