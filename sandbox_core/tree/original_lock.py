"""One durable lock per original, shared by every process of the product (docs/concurrency.md).

Two plans over one original are serialised: the second is **refused** (never queued) with
:class:`OriginalLockedError`, naming the plan that holds the original, unless the caller asks to
wait (``timeout_seconds``).

Where it lives. A lock file beside the original, on the same volume: ``<parent>/.<name>.
sandbox-lock`` for the original ``<parent>/<name>`` (its real path), the way two-phase staging
areas are hidden siblings of their original. Every process that can write the original - the
CLI, the manager, a workspace agent in a Pod, the operator's local executor - can open that
file, so containers sharing the volume see one lock. It is locked with Linux open-file-
description locks (``F_OFD_SETLK``): they belong to an open file, not a process, so two holders
in one process exclude each other; the kernel drops them when the last descriptor closes (a
crash, a killed container); and NFS forwards them to its server. A free lock's file is removed
(under its own lock; whoever locked a file that was removed meanwhile opens the new one), so
nothing is left beside an original that no plan holds.

What it holds (JSON in the file itself, rewritten under a byte-0 lock):
``{"holder", "plan_id", "txid", "sandboxes", "kind", "pid", "host", "since"}``.

Two kinds of hold:

- ``prepared``: a two-phase attempt, from the first participant's ``prepare`` to its
  ``apply_prepared`` or ``abort_prepared`` (also in recovery, possibly in another process).
  The holder is the transaction id; several participants of one attempt over one original
  share the hold (``sandboxes``) and the lock is free once the last of them is released. It is
  durable: a crash between prepare and apply keeps it, because the staged commit is still
  there to be rolled forward or aborted; recovery (which aborts or applies every step) frees
  it.
- ``process``: a one-shot commit, a rollback, a saga. The holding process also keeps an OFD
  lock on byte 1 of the file while the hold lasts; a hold whose byte 1 is unlocked belongs to a
  process that died, and is taken over (logged).

Only path originals are locked (a database serialises its own sessions): an original that is
not an absolute path gives no lock. When the original is the root of its volume (a mount point)
its lock lives on the parent's file system, which other containers may not share: mount the
claim one level above the original for the lock to be shared (docs/concurrency.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sandbox_core.errors import (
    SandboxCommitLockedError,
    SandboxError,
    SandboxLockedError,
    SandboxRollbackLockedError,
)
from sandbox_core.protocol import utc_now

__all__ = [
    "LOCK_SUFFIX",
    "LONE_WAIT_SECONDS",
    "Hold",
    "OriginalLock",
    "OriginalLockedError",
    "clear_if_free",
    "held_by_process",
    "held_here",
    "lock_path_for",
]

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".sandbox-lock"
_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
_F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)
_FLOCK = "hhqqi4x"  # struct flock (Linux, 64-bit): l_type, l_whence, l_start, l_len, l_pid
_RECORD_BYTE, _ALIVE_BYTE = 0, 1
_POLL_SECONDS = 0.05


class OriginalLockedError(SandboxCommitLockedError):
    """Another plan (or process) of the product holds the original; nothing was changed.

    ``holder`` is the lock's record (``plan_id``, ``txid``, ``sandboxes``, ``kind``, ``pid``,
    ``host``, ``since``); ``lock_path`` the lock file. What to do: wait for that plan to apply
    or abort (or recover it after a crash), then retry. CLI exit code 8 (a lock).
    """

    def __init__(self, message: str, *, holder: dict[str, Any], lock_path: str) -> None:
        super().__init__(message)
        self.holder = holder
        self.lock_path = lock_path


@dataclass(frozen=True)
class Hold:
    """Who takes the lock: ``holder`` is its identity (a txid, or ``saga:<plan>:<attempt>``)."""

    holder: str
    plan_id: str
    kind: str  # "prepared" | "process"
    sandbox_id: str = ""
    txid: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def lock_path_for(original: str) -> str | None:
    """The lock file of ``original`` (``<parent>/.<name>.sandbox-lock`` of its real path), or
    None when ``original`` is not an absolute path or is ``/``."""
    if not isinstance(original, str) or not original.startswith("/"):
        return None
    real = os.path.realpath(original)
    parent, name = os.path.split(real)
    if not name:
        return None
    return f"{parent.rstrip('/')}/.{name}{LOCK_SUFFIX}"


def _flock(fd: int, cmd: int, kind: int, start: int) -> tuple[int, int]:
    """One OFD lock call on the byte ``start``; returns ``(l_type, l_pid)`` (GETLK)."""
    raw = fcntl.fcntl(fd, cmd, struct.pack(_FLOCK, kind, os.SEEK_SET, start, 1, 0))
    l_type, _, _, _, l_pid = struct.unpack(_FLOCK, raw)
    return l_type, l_pid


def _same_file(fd: int, path: str) -> bool:
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


# Process-scoped holds of this process: (lock path, holder) -> [descriptor holding byte 1, count]
_ALIVE: dict[tuple[str, str], list[int]] = {}
_ALIVE_GUARD = threading.Lock()
# The lock files held by held_by_process in this call stack (a thread's or a task's context).
_HELD_HERE: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "sandbox_original_locks_held", default=frozenset()
)


class OriginalLock:
    """The lock of one original (module docstring).

    Args:
        original: the original's path.

    Raises:
        ValueError: ``original`` gives no lock file (:func:`lock_path_for`).
    """

    def __init__(self, original: str) -> None:
        path = lock_path_for(original)
        if path is None:
            raise ValueError(f"{original!r} is not an absolute path with a parent")
        self.original = original
        self.path = path

    @contextlib.contextmanager
    def _record_lock(self) -> Iterator[int]:
        """The lock file opened and its byte 0 locked (blocking: held for a read and a write)."""
        while True:
            try:
                fd = os.open(
                    self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
                )
            except OSError as exc:
                raise SandboxError(
                    f"cannot open the lock {self.path} of {self.original}: {exc}"
                ) from exc
            try:
                _flock(fd, _F_OFD_SETLKW, fcntl.F_WRLCK, _RECORD_BYTE)
                # A free lock's file is removed under this lock: the file this descriptor
                # locked may have been unlinked meanwhile; then lock the new one.
                if _same_file(fd, self.path):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        try:
            yield fd
        finally:
            os.close(fd)  # drops the OFD lock with the description

    @staticmethod
    def _read(fd: int) -> dict[str, Any] | None:
        data = os.pread(fd, 1 << 16, 0)
        if not data.strip():
            return None
        try:
            found = json.loads(data)
        except ValueError:
            logger.warning("unreadable original lock record; treating it as free")
            return None
        return found if isinstance(found, dict) else None

    @staticmethod
    def _write(fd: int, record: dict[str, Any] | None) -> None:
        data = b"" if record is None else json.dumps(record, sort_keys=True).encode()
        os.ftruncate(fd, 0)
        if data:
            os.pwrite(fd, data, 0)
        if record is not None and record.get("kind") == "prepared":
            # Only a prepared hold must outlive a crash of the machine; a process hold dies
            # with its process anyway (a lone commit spares the flush: docs/benchmarks.md).
            os.fsync(fd)

    def _free(self, fd: int) -> None:
        """Remove the file (under the byte-0 lock of ``fd``): a free lock leaves nothing beside
        the original. Removing needs no space, so it comes first (a full disk cannot leave the
        file behind); only when it cannot be removed is the record emptied in place. A waiter
        that locked the removed file sees it is no longer at the path and locks the new one."""
        try:
            os.unlink(self.path)  # noqa: PTH108 (the path is a str everywhere here)
        except FileNotFoundError:
            pass
        except OSError:
            self._write(fd, None)

    def _alive(self, fd: int, record: dict[str, Any]) -> bool:
        """Whether ``record`` still binds: a prepared hold always; a process hold while its
        process keeps byte 1 locked."""
        if record.get("kind") != "process":
            return True
        key = (self.path, str(record.get("holder")))
        with _ALIVE_GUARD:
            if key in _ALIVE:
                return True
        l_type, _ = _flock(fd, _F_OFD_GETLK, fcntl.F_WRLCK, _ALIVE_BYTE)
        return l_type != fcntl.F_UNLCK

    def holder(self) -> dict[str, Any] | None:
        """The live holder's record, or None when the lock is free (or its holder died)."""
        with self._record_lock() as fd:
            record = self._read(fd)
            if record is not None and self._alive(fd, record):
                return record
            self._free(fd)
            return None

    def acquire(
        self,
        hold: Hold,
        *,
        timeout_seconds: float = 0.0,
        process_wait_seconds: float = 0.0,
        error: type[SandboxLockedError] | None = None,
    ) -> None:
        """Take the lock for ``hold`` (again, when ``hold.holder`` has it: re-entrant).

        Args:
            hold: who takes it.
            timeout_seconds: how long to wait for another holder to let go (0: refuse at once).
            process_wait_seconds: how long to wait while the holder is a ``process`` hold (a
                commit or rollback under way, seconds at most), longer than ``timeout_seconds``
                when larger; a ``prepared`` hold (a plan awaiting its decision) is refused
                after ``timeout_seconds``.
            error: the class raised when refused (default :class:`OriginalLockedError`; a
                rollback passes ``SandboxRollbackLockedError``).

        Raises:
            OriginalLockedError: (or ``error``) another live holder has it; nothing changed.
            SandboxError: the lock file cannot be opened.
        """
        start = time.monotonic()
        while True:
            refusal = self._try(hold)
            if refusal is None:
                return
            message, record = refusal
            limit = timeout_seconds
            if record.get("kind") == "process":
                limit = max(limit, process_wait_seconds)
            if time.monotonic() - start >= limit:
                if error is None or error is OriginalLockedError:
                    raise OriginalLockedError(message, holder=record, lock_path=self.path)
                exc = (
                    error(message, refused=True)
                    if issubclass(error, SandboxRollbackLockedError)
                    else error(message)
                )
                exc.lock_path = self.path
                raise exc
            time.sleep(_POLL_SECONDS)

    def _try(self, hold: Hold) -> tuple[str, dict[str, Any]] | None:
        with self._record_lock() as fd:
            record = self._read(fd)
            if record is not None and record.get("holder") != hold.holder:
                if self._alive(fd, record):
                    return self._refusal(record), record
                logger.warning(
                    "original %s: taking over the lock of %s (its process %s on %s is gone)",
                    self.original,
                    record.get("holder"),
                    record.get("pid"),
                    record.get("host"),
                )
                record = None
            sandboxes = set(record.get("sandboxes") or []) if record else set()
            if hold.sandbox_id:
                sandboxes.add(hold.sandbox_id)
            alive = False
            try:
                if hold.kind == "process":
                    self._keep_alive(hold.holder)
                    alive = True
                self._write_hold(fd, hold, record, sandboxes)
            except BaseException:
                if alive:
                    self._drop_alive(hold.holder)  # not taken: this process keeps nothing alive
                if record is None:  # nothing of a live hold in it: leave nothing beside it
                    with contextlib.suppress(OSError):
                        self._free(fd)
                raise
        return None

    def _write_hold(
        self, fd: int, hold: Hold, record: dict[str, Any] | None, sandboxes: set[str]
    ) -> None:
        self._write(
            fd,
            {
                **hold.extra,
                "holder": hold.holder,
                "plan_id": hold.plan_id,
                "txid": hold.txid,
                "kind": hold.kind,
                "sandboxes": sorted(sandboxes),
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": (record or {}).get("since") or utc_now().isoformat(),
            },
        )

    def _refusal(self, record: dict[str, Any]) -> str:
        what = (
            f"plan {record.get('plan_id')} (txid {record.get('txid')}) prepared it"
            if record.get("kind") == "prepared"
            else f"plan {record.get('plan_id')} is committing or rolling back through it"
        )
        return (
            f"original {self.original} is locked: {what}, holder {record.get('holder')}, "
            f"sandboxes {', '.join(record.get('sandboxes') or []) or '-'}, process "
            f"{record.get('pid')} on {record.get('host')}, since {record.get('since')}; wait "
            "for it to apply or abort (recover it after a crash), then retry. Nothing was "
            f"changed (lock {self.path})"
        )

    def _keep_alive(self, holder: str) -> None:
        key = (self.path, holder)
        with _ALIVE_GUARD:
            kept = _ALIVE.get(key)
            if kept is not None:
                kept[1] += 1
                return
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                _flock(fd, _F_OFD_SETLK, fcntl.F_WRLCK, _ALIVE_BYTE)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise SandboxError(f"lock {self.path}: byte 1 is held elsewhere") from exc
                raise
            _ALIVE[key] = [fd, 1]

    def _drop_alive(self, holder: str) -> int:
        """One process hold of ``holder`` less; returns how many this process still has."""
        key = (self.path, holder)
        with _ALIVE_GUARD:
            kept = _ALIVE.get(key)
            if kept is None:
                return 0
            kept[1] -= 1
            if kept[1] > 0:
                return kept[1]
            os.close(kept[0])
            del _ALIVE[key]
            return 0

    def release(self, holder: str, sandbox_id: str | None = None) -> bool:
        """Let go of ``holder``'s hold (of ``sandbox_id`` only, when given: the lock is free
        once no sandbox of the hold is left). Idempotent; another holder's lock is left alone.

        Returns:
            True when the lock is free afterwards (of this holder).
        """
        try:
            return self._release(holder, sandbox_id)
        except BaseException:
            # The record cannot be reached (a full or read-only volume): this process keeps
            # the hold alive no longer, so the record is dead and the next lock operation on
            # this original (or the sandbox's cleanup) clears it.
            with _ALIVE_GUARD:
                kept = _ALIVE.pop((self.path, holder), None)
            if kept is not None:
                os.close(kept[0])
            raise

    def _release(self, holder: str, sandbox_id: str | None) -> bool:
        with self._record_lock() as fd:
            record = self._read(fd)
            if record is None or record.get("holder") != holder:
                self._drop_alive(holder)
                if record is None:
                    self._free(fd)
                return record is None
            if record.get("kind") == "process" and self._drop_alive(holder) > 0:
                return False  # re-entered by this process: its outer hold still binds
            left = set(record.get("sandboxes") or []) - ({sandbox_id} if sandbox_id else set())
            if sandbox_id and left:
                self._write(fd, {**record, "sandboxes": sorted(left)})
                return False
            self._free(fd)
            return True


LONE_WAIT_SECONDS = 60.0
"""How long a lone commit or rollback waits for another process's commit or rollback of the same
original to end (docs/concurrency.md): lone commits queue; a plan's prepared hold refuses them."""


def held_here(original: str) -> bool:
    """Whether a :func:`held_by_process` of this call stack (this thread or task) holds the
    lock of ``original``."""
    path = lock_path_for(original)
    return path is not None and path in _HELD_HERE.get()


@contextlib.contextmanager
def held_by_process(
    originals: list[str],
    plan_id: str,
    holder: str,
    *,
    error: type[SandboxLockedError] | None = None,
    timeout_seconds: float = 0.0,
    process_wait_seconds: float = 0.0,
) -> Iterator[None]:
    """Hold the locks of ``originals`` (path originals only; others are skipped) for the body,
    as a ``process`` hold of ``holder``: a one-shot commit, a rollback, a saga.

    Two holds exclude each other, also in one process and one thread. While the body runs,
    :func:`held_here` tells the sandboxes it commits or rolls back (in this thread or task) that
    their original's lock is held for them (a saga around its commits, the agent around a
    commit): they take no hold of their own.

    Args:
        timeout_seconds / process_wait_seconds: as :meth:`OriginalLock.acquire`.

    Raises:
        OriginalLockedError: (or ``error``) one of them is held by another; none is kept.
    """
    already = _HELD_HERE.get()
    locks: dict[str, OriginalLock] = {}
    for original in originals:
        path = lock_path_for(original)
        if path is not None and path not in locks:
            locks[path] = OriginalLock(original)
    taken: list[OriginalLock] = []
    token: contextvars.Token[frozenset[str]] | None = None
    try:
        for path in sorted(locks):
            lock = locks[path]
            lock.acquire(
                Hold(holder=holder, plan_id=plan_id, kind="process"),
                timeout_seconds=timeout_seconds,
                process_wait_seconds=process_wait_seconds,
                error=error,
            )
            taken.append(lock)
        token = _HELD_HERE.set(already | set(locks))
        yield
    finally:
        if token is not None:
            _HELD_HERE.reset(token)
        for lock in reversed(taken):
            try:
                lock.release(holder)
            except (SandboxError, OSError):
                # A free lock file left by a full or read-only volume is cleared at cleanup
                # (clear_if_free); its holder no longer keeps it alive.
                logger.exception("cannot release the lock %s", lock.path)


def clear_if_free(original: str | None, sandbox_id: str | None = None) -> None:
    """At the cleanup of ``sandbox_id``: remove the lock file of ``original`` when no live hold
    is in it, and drop that sandbox's own prepared hold (a cleaned-up sandbox has nothing
    prepared any more). A release that a read-only or full volume stopped leaves the file; this
    clears it, so nothing of the product stays beside the original. Best effort; another
    holder's lock is kept.
    """
    path = lock_path_for(original) if original else None
    if path is None or original is None or not os.path.lexists(path):
        return
    with contextlib.suppress(OSError, SandboxError):
        lock = OriginalLock(original)
        record = lock.holder()
        if (
            record is not None
            and sandbox_id is not None
            and record.get("kind") == "prepared"
            and sandbox_id in (record.get("sandboxes") or [])
        ):
            lock.release(str(record.get("holder")), sandbox_id)
