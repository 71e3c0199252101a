# ruff: noqa: PTH118
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""What guards an original before anything is written to it.

Refusals raised before a write (:class:`RefusedBeforeWriteError`: the sandbox stays ACTIVE with
the blocking paths as conflicts): entries with the immutable or append-only inode flag
(:class:`FlaggedEntriesError`), other file systems mounted inside the tree
(:class:`MountPointsInsideError`, :func:`refuse_mount_points`); the lock that serialises
committers of one original (:func:`lock_tree`); and the check of a two-phase staging key, which
becomes part of a file name (:func:`check_key`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator

from sandbox_core.tree.scan import StrPath


class RefusedBeforeWriteError(OSError):
    """A sync refused before anything was written; ``paths`` (relative to ``root``) are what
    blocks it. A commit or prepare refused this way keeps the sandbox ACTIVE with these paths
    as its conflicts."""

    root: str
    paths: list[str]

    def __init__(self, code: int, root: str, paths: list[str], why: str) -> None:
        """``why``: the message, with ``{root}`` and ``{shown}`` (the first 10 paths) filled in."""
        shown = ", ".join(paths[:10]) + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
        super().__init__(code, why.format(root=root, shown=shown), root)
        self.root = root
        self.paths = paths

    def __str__(self) -> str:
        return str(self.strerror)


class FlaggedEntriesError(RefusedBeforeWriteError):
    """Entries a sync must rename, or their directories, carry the immutable or append-only
    inode flag (``chattr +i``/``+a``): the kernel refuses the rename (``EPERM``)."""

    def __init__(self, root: str, paths: list[str]) -> None:
        super().__init__(
            errno.EPERM, root, paths,
            "{root} holds immutable or append-only entries at {shown}: the commit cannot "
            "replace them; clear the flag (chattr -i / -a) and commit again",
        )  # fmt: skip


_FS_IOC_GETFLAGS = 0x80086601
_IMMUTABLE_FL, _APPEND_FL = 0x10, 0x20


def _inode_flags(path: str) -> int:
    """The inode flags of a regular file or directory (0 for other types, or where the file
    system has none): never opens a FIFO, device or symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOATIME)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        buf = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 8)
    except OSError:
        return 0  # no inode flags on this file system
    finally:
        os.close(fd)
    return int.from_bytes(buf[:4], "little")


class MountPointsInsideError(RefusedBeforeWriteError):
    """A directory tree holds other mounted file systems (``errno`` ``EXDEV``).

    The policy of every directory strategy and mode (docs/fidelity.md, "Mount points inside the
    tree"): such a tree is refused at create, and a commit, prepare, apply or undo of a tree in
    which a mount appeared since is refused before anything is written, because an entry cannot
    be renamed across a mount point. ``paths`` are the mount points, relative to ``root``.
    """

    def __init__(self, root: str, paths: list[str]) -> None:
        super().__init__(
            errno.EXDEV, root, paths,
            "{root} holds other mounted file systems at {shown}: a commit cannot move entries "
            "across a mount point; sandbox each file system on its own (or unmount them)",
        )  # fmt: skip

    def __str__(self) -> str:
        return str(self.strerror)


_MOUNTINFO = "/proc/self/mountinfo"


def _unescape_mount_path(field: bytes) -> bytes:
    """``/proc/self/mountinfo`` writes space, tab, newline and backslash as ``\\ooo``."""
    if b"\\" not in field:
        return field
    out = bytearray()
    index = 0
    while index < len(field):
        if field[index : index + 1] == b"\\" and field[index + 1 : index + 4].isdigit():
            out.append(int(field[index + 1 : index + 4], 8))
            index += 4
        else:
            out += field[index : index + 1]
            index += 1
    return bytes(out)


def mount_points_inside(root: StrPath) -> list[str]:
    """Mount points strictly inside directory ``root`` (relative paths, sorted), bind mounts
    of the same file system included (a rename across them fails with ``EXDEV`` too).

    Read from ``/proc/self/mountinfo`` (this process's mount namespace); where that is not
    readable, a walk compares each directory's ``st_dev`` with its parent's (no bind mounts).
    """
    top = os.fsencode(os.path.realpath(root))
    prefix = top if top.endswith(b"/") else top + b"/"
    try:
        with open(_MOUNTINFO, "rb") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return _mount_points_by_device(os.fsdecode(top))
    found = set()
    for line in lines:
        fields = line.split(b" ")
        if len(fields) > 4:
            point = _unescape_mount_path(fields[4])
            if point.startswith(prefix):
                found.add(os.fsdecode(point[len(prefix) :]))
    return sorted(found)


def _mount_points_by_device(top: str) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, _ in os.walk(top):
        device = os.lstat(dirpath).st_dev
        for name in list(dirnames):
            path = os.path.join(dirpath, name)
            if os.lstat(path).st_dev != device:
                found.append(os.path.relpath(path, top))
                dirnames.remove(name)
    return sorted(found)


def refuse_mount_points(root: StrPath) -> None:
    """Raise :class:`MountPointsInsideError` when another file system is mounted inside
    ``root``; called at create and before a sync writes anything (docs/fidelity.md)."""
    found = mount_points_inside(root)
    if found:
        raise MountPointsInsideError(os.path.realpath(root), found)


@contextlib.contextmanager
def lock_tree(target: StrPath) -> Iterator[None]:
    """Hold an exclusive ``flock`` on directory ``target`` for a compare-then-sync sequence.

    Two committers of the same original serialise here, so neither syncs on a comparison the
    other made stale. The lock lives on the directory itself (no lock file is left beside it)
    and is released by the kernel if the process dies. :func:`sync_tree` does not take it: the
    caller holds it around its own comparison and the sync.

    Raises:
        OSError: ``target`` cannot be opened.
    """
    fd = os.open(os.fspath(target), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def check_key(key: str) -> None:
    """Refuse a staging key that is not ``[A-Za-z0-9._-]`` (at most 128 characters): it becomes
    part of one file name, so no ``/`` (path traversal) can get in.

    Raises:
        ValueError: the key is empty, too long or holds another character.
    """
    if not key or len(key) > 128 or not set(key) <= _KEY_CHARS:
        raise ValueError(f"invalid two-phase staging key {key!r}: [A-Za-z0-9._-], <= 128 chars")


class ChangedMeanwhileError(RefusedBeforeWriteError):
    """Paths of the original changed between the commit's check and its write (another writer
    wrote, created, removed or moved them: case 43): the commit is refused, everything it had
    renamed is put back, so no write it did not make is lost. ``paths``: the changed ones."""

    def __init__(self, root: str, paths: list[str]) -> None:
        super().__init__(
            errno.EBUSY, root, paths,
            "{root} changed at {shown} while the commit ran (another writer): nothing of "
            "theirs was replaced; commit again to see their change as a conflict or keep it",
        )  # fmt: skip


class SwappedPathError(RefusedBeforeWriteError):
    """A folder on the way to a path of the original is now a symlink or no folder (swapped
    mid-operation: case 44): nothing is written through it, everything renamed so far is put
    back. ``paths``: the swapped components."""

    def __init__(self, root: str, paths: list[str]) -> None:
        super().__init__(
            errno.ELOOP, root, paths,
            "{root}: the folder {shown} became a symlink or a file while the commit ran; "
            "nothing was written through it (commit again to see it as a conflict)",
        )  # fmt: skip
