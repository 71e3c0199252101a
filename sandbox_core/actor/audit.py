"""The per-sandbox audit log: one JSON line per actor operation, appended durably.

The interface is one function, :func:`append_audit` (the command runner and the file and SQL
operations call it alike). The log is ``<sandbox_state_dir>/audit.jsonl``; each line is the
caller's record plus ``"at"`` (UTC, ISO 8601). A record never holds file contents, SQL text or
parameter values: only what was done (``kind``, ``op``, paths, sizes, statement kind, row count).

Durability: the line is written with one ``write`` on an ``O_APPEND`` descriptor and fsynced
before the call returns (a crash keeps whole lines; a torn last line is skipped by
:func:`read_audit`).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

AUDIT_FILE = "audit.jsonl"


def audit_dir(state_dir: str | os.PathLike[str], sandbox_id: str) -> Path:
    """The audit directory of ``sandbox_id`` under a host's state directory:
    ``<state_dir>/audit/<sandbox_id>``."""
    return Path(state_dir) / "audit" / sandbox_id


def append_audit(sandbox_state_dir: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append ``record`` (JSON-serialisable) to ``<sandbox_state_dir>/audit.jsonl``, durably.

    Raises:
        OSError: the directory cannot be made or the line cannot be written.
    """
    directory = Path(sandbox_state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    line = {"at": datetime.now(UTC).isoformat(timespec="milliseconds"), **record}
    data = (json.dumps(line, default=str, separators=(",", ":")) + "\n").encode()
    fd = os.open(
        directory / AUDIT_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
    )
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_audit(sandbox_state_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of ``<sandbox_state_dir>/audit.jsonl``, oldest first (``[]`` when none)."""
    try:
        text = (Path(sandbox_state_dir) / AUDIT_FILE).read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line torn by a crash
    return records
