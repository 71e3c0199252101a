"""Durable writes: a JSON record replaced atomically, and the fsync of a directory.

Readers of a record written here see the old file or the new one, never half of either; once
the call returns (with ``durable=True``), the new file and its name survive a power loss.
Every record of the core (sandbox records, plan journals, checkpoint metadata) goes through
:func:`write_json_atomic`, so there is one place that knows the order of fsyncs.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync the directory ``path``, so the names created or renamed in it are durable.

    Raises:
        OSError: ``path`` is not a directory that can be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(
    path: str | os.PathLike[str], data: Any, *, durable: bool = True, pretty: bool = True
) -> None:
    """Replace ``path`` by ``data`` as JSON through a renamed temporary file in its directory.

    Args:
        path: the record's path; its directory is created when missing.
        data: anything :func:`json.dumps` takes.
        durable: fsync the file before the rename and the directory after it (else the caller
            makes both durable, for example with one ``syncfs`` for many records).
        pretty: indent and sort keys (records people read); False writes compact JSON.

    Raises:
        OSError: the directory cannot be created or written; the temporary file is removed.
        TypeError: ``data`` is not JSON-serialisable; nothing is written.
    """
    target = Path(path)
    text = json.dumps(data, indent=2, sort_keys=True) if pretty else json.dumps(data)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(target.parent)
