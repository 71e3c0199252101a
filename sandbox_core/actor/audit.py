"""The audit log of one sandbox: every actor operation, appended durably, read back bounded.

Layout: ``<state_dir>/actor/<sandbox_id>/audit.jsonl``, one JSON object per line, appended with
:func:`sandbox_core.durable.append_json_line` (one ``O_APPEND`` write and an ``fsync`` per entry;
a crash leaves at most a partial last line, which :meth:`AuditLog.read` skips). The state
directory is never visible to an actor's command (:mod:`sandbox_core.actor.jail`), so an actor
cannot rewrite what it did.

An entry is ``{"seq", "time", "op", ...}``: ``seq`` counts from 1 per sandbox, ``time`` is UTC
ISO 8601, ``op`` names the operation. What each operation adds:

- ``exec``: ``command`` (the argv list, or ``shell``: the shell line), ``cwd``, ``exit_code``,
  ``signal``, ``timed_out``, ``cancelled``, ``truncated``, ``stdout_bytes``, ``stderr_bytes``,
  ``duration_seconds``, ``exec_id``. Environment values and stdin are never recorded (they may
  hold secrets): only the environment's names.
- file writes, deletes and moves (``write``, ``delete``, ``move``: ``path``, ``to``, ``bytes``)
  and SQL (``sql``: ``kind``, ``rowcount``) are appended by the operations that do them.

Long strings are cut to :data:`MAX_FIELD_CHARS` characters (``"...[cut]"`` at the end).
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandbox_core.durable import append_json_line
from sandbox_core.errors import SandboxError

__all__ = ["DEFAULT_SUMMARY_ENTRIES", "MAX_FIELD_CHARS", "AuditLog", "audit_dir"]

MAX_FIELD_CHARS = 4096
"""Longest string kept in an entry (a command line, a path)."""
DEFAULT_SUMMARY_ENTRIES = 20
"""How many of the latest entries :meth:`AuditLog.summary` (the review) shows by default."""
MAX_READ_ENTRIES = 1000
"""Most entries one :meth:`AuditLog.read` returns."""
TAIL_CHUNK_BYTES = 64 * 1024
"""How much of the log's end :meth:`AuditLog.append` reads at a time to find the last ``seq``."""

_LOCK = threading.Lock()  # one appender at a time per process (seq numbers stay unique)


def audit_dir(state_dir: str | Path, sandbox_id: str) -> Path:
    """``<state_dir>/actor/<sandbox_id>``: the actor's own state of one sandbox.

    Raises:
        SandboxError: ``sandbox_id`` is empty, has a ``/`` or starts with a dot.
    """
    if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
        raise SandboxError(f"invalid sandbox id {sandbox_id!r}")
    return Path(state_dir) / "actor" / sandbox_id


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + "...[cut]"
    if isinstance(value, list | tuple):
        return [_cut(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _cut(item) for key, item in value.items()}
    return value


def _seq_of(line: bytes) -> int | None:
    """The ``seq`` of one line of the log, or None when it is not a whole entry."""
    if not line.strip():
        return None
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    seq = entry.get("seq") if isinstance(entry, dict) else None
    return seq if isinstance(seq, int) else None


class AuditLog:
    """The audit log of ``sandbox_id`` kept under ``state_dir`` (module docstring)."""

    def __init__(self, state_dir: str | Path, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.path = audit_dir(state_dir, sandbox_id) / "audit.jsonl"

    def append(self, op: str, **fields: Any) -> dict[str, Any]:
        """Append one entry durably and return it (with its ``seq`` and ``time``).

        Raises:
            SandboxError: the log cannot be written (the operation it records is not undone).
        """
        with _LOCK:
            seq = self._last_seq() + 1
            entry = {
                "seq": seq,
                "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "op": op,
                **{key: _cut(value) for key, value in fields.items()},
            }
            try:
                append_json_line(self.path, entry)
            except OSError as exc:
                raise SandboxError(f"cannot append to the audit log: {exc}") from exc
        return entry

    def _last_seq(self) -> int:
        """The ``seq`` of the last whole entry (0 when none), read from the end of the file
        backwards, :data:`TAIL_CHUNK_BYTES` at a time: an append costs the same at the
        thousandth entry as at the first. Lines that do not parse (a partial last line after a
        crash) are skipped, as :meth:`read` skips them.

        Raises:
            SandboxError: the log cannot be read.
        """
        try:
            with open(self.path, "rb") as log:
                position = log.seek(0, os.SEEK_END)
                head = b""  # the start of a line whose beginning lies before ``position``
                while position > 0:
                    step = min(TAIL_CHUNK_BYTES, position)
                    position -= step
                    log.seek(position)
                    lines = (log.read(step) + head).split(b"\n")
                    head = lines.pop(0) if position > 0 else b""
                    for line in reversed(lines):
                        seq = _seq_of(line)
                        if seq is not None:
                            return seq
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise SandboxError(f"cannot read the audit log: {exc}") from exc
        return 0

    def _entries(self) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SandboxError(f"cannot read the audit log: {exc}") from exc
        entries = []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a partial last line after a crash
            if isinstance(entry, dict) and isinstance(entry.get("seq"), int):
                entries.append(entry)
        return entries

    def read(self, after: int = 0, limit: int = 100) -> dict[str, Any]:
        """Entries with ``seq > after``, at most ``limit`` (capped at :data:`MAX_READ_ENTRIES`).

        Returns:
            ``{"sandbox_id", "entries", "total", "next"}``: ``next`` is the ``after`` that
            continues the listing, or None when nothing more follows.

        Raises:
            ValueError: ``after`` or ``limit`` is negative.
            SandboxError: the log cannot be read.
        """
        if after < 0 or limit < 0:
            raise ValueError("after and limit cannot be negative")
        limit = min(limit, MAX_READ_ENTRIES)
        entries = self._entries()
        following = [entry for entry in entries if entry["seq"] > after]
        page = following[:limit]
        more = len(following) > len(page)
        return {
            "sandbox_id": self.sandbox_id,
            "entries": page,
            "total": len(entries),
            "next": page[-1]["seq"] if more and page else (after if more else None),
        }

    def summary(self, max_entries: int = DEFAULT_SUMMARY_ENTRIES) -> dict[str, Any]:
        """The bounded view shown in a review: ``{"total", "entries"}`` (the latest
        ``max_entries``, oldest first) and ``truncated`` (older entries left out).

        Raises:
            ValueError: ``max_entries`` is negative.
            SandboxError: the log cannot be read.
        """
        if max_entries < 0:
            raise ValueError("max_entries cannot be negative")
        entries = self._entries()
        shown = entries[-max_entries:] if max_entries else []
        return {"total": len(entries), "entries": shown, "truncated": len(shown) < len(entries)}
