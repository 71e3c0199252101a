"""Durable writes: a JSON record replaced atomically, and the fsync of a directory.

Readers of a record written here see the old file or the new one, never half of either; once
the call returns (with ``durable=True``), the new file and its name survive a power loss.
Every record of the core (sandbox records, plan journals, checkpoint metadata) goes through
:func:`write_json_atomic`, so there is one place that knows the order of fsyncs.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name is not None else None


_LIBC = _load_libc()


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
    path: str | os.PathLike[str],
    data: Any,
    *,
    durable: bool = True,
    pretty: bool = True,
    tmp_suffix: str | None = None,
) -> None:
    """Replace ``path`` by ``data`` as JSON through a renamed temporary file in its directory.

    Args:
        path: the record's path; its directory is created when missing.
        data: anything :func:`json.dumps` takes.
        durable: fsync the file before the rename and the directory after it (else the caller
            makes both durable, for example with one ``syncfs`` for many records).
        pretty: indent and sort keys (records people read); False writes compact JSON (the C
            encoder: the journals of a sync are written on the commit's path).
        tmp_suffix: write through the fixed name ``path + tmp_suffix`` instead of a unique
            hidden one: a crash then leaves at most that one file, which the next write
            replaces (the staging journals and two-phase records, whose directories are
            listed by recovery and by tests, keep the name ``<name>.tmp``).

    Raises:
        OSError: the directory cannot be created or written; the temporary file is removed.
        TypeError: ``data`` is not JSON-serialisable; nothing is written.
    """
    text = json.dumps(data, indent=2, sort_keys=True) if pretty else json.dumps(data)
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable, tmp_suffix=tmp_suffix)


def write_bytes_atomic(
    path: str | os.PathLike[str],
    content: bytes,
    *,
    durable: bool = True,
    tmp_suffix: str | None = None,
) -> None:
    """Replace ``path`` by ``content`` through a renamed temporary file in its directory: what
    :func:`write_json_atomic` does once the record is encoded (same arguments, same order of
    fsyncs), for a caller that holds the encoded bytes already.

    Raises:
        OSError: the directory cannot be created or written; the temporary file is removed.
    """
    target = Path(path)

    def stage() -> tuple[int, str]:
        if tmp_suffix is None:
            return tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        staged = os.fspath(target) + tmp_suffix
        return os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666), staged

    try:
        fd, tmp = stage()
    except FileNotFoundError:  # the directory is made the first time only
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = stage()
    try:
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(target.parent)


def has_syncfs() -> bool:
    return _LIBC is not None and getattr(_LIBC, "syncfs", None) is not None


def syncfs(path: str) -> bool:
    """``syncfs(2)`` of the filesystem holding ``path``: one call makes everything written to
    it durable. False where the C library has no ``syncfs`` (the caller fsyncs file by file)."""
    syncfs = getattr(_LIBC, "syncfs", None) if _LIBC is not None else None
    if syncfs is None:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)
    return True


_DEFERRED_SYNCFS: contextvars.ContextVar[dict[int, list[str]] | None] = contextvars.ContextVar(
    "sandbox_core_deferred_syncfs", default=None
)


@contextlib.contextmanager
def deferred_syncfs() -> Iterator[Callable[[], None]]:
    """Within the block, :func:`stage_sync` (in this context and the threads it is copied to)
    does not ``syncfs`` its staging area: the filesystem is remembered, and the yielded
    ``flush()`` runs one ``syncfs`` per filesystem for all of them (a two-phase plan calls it
    once, before its decision record). Without ``syncfs`` nothing is deferred.

    Raises (from ``flush``):
        OSError: a ``syncfs`` failed (what is still pending stays pending).
    """
    pending: dict[int, list[str]] = {}
    token = _DEFERRED_SYNCFS.set(pending)

    def flush() -> None:
        for dev in list(pending):
            for path in pending[dev]:  # any still existing directory of that filesystem
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    syncfs(path)
                    break
            del pending[dev]

    try:
        yield flush
    finally:
        _DEFERRED_SYNCFS.reset(token)


def defer_durability(path: str | os.PathLike[str]) -> bool:
    """Inside :func:`deferred_syncfs` (with ``syncfs``): remember the filesystem of ``path`` (an
    existing directory) for the block's ``flush()`` and return True, so the caller may skip its
    own fsyncs of what it writes there; else False (the caller fsyncs as usual)."""
    pending = _DEFERRED_SYNCFS.get()
    if pending is None or not has_syncfs():
        return False
    path_s = os.fspath(path)
    pending.setdefault(Path(path_s).stat().st_dev, []).append(path_s)
    return True


def append_json_line(path: str | os.PathLike[str], data: Any) -> None:
    """Append ``data`` as one line of compact JSON to ``path``, durably (a journal of lines).

    One ``write`` of the whole line to a file opened with ``O_APPEND`` (so lines of concurrent
    writers never interleave), then ``fsync`` of the file; when the call made the file, the
    directory is fsynced too, so its name survives a power loss. A crash in the middle leaves at
    most a partial last line, which a reader skips (it does not parse as JSON).

    Raises:
        OSError: the directory cannot be created or the file written.
        TypeError: ``data`` is not JSON-serialisable; nothing is written.
    """
    target = Path(path)
    line = (json.dumps(data, separators=(",", ":"), default=str) + "\n").encode("utf-8")
    created = False
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except FileNotFoundError:  # the first line: make the directory and the file
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd, created = os.open(target, flags, 0o600), True
        except FileExistsError:  # another writer made it in between
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        view = memoryview(line)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(target.parent)
