# ruff: noqa: PTH118
# Why: this module works on str names with os-level calls (openat, renameat, fstatat) on
# purpose: it is the commit's inner loop, measured against rsync.
"""Writes beneath a directory through descriptors: a path component swapped for a symlink
mid-operation can never redirect a write out of the tree (case 44; the fix rsync and syncthing
made for the same race, docs/fidelity.md "No write through a swapped path").

:class:`Beneath` holds a descriptor of a tree's top directory and opens every directory below
it component by component with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's
descriptor (``openat``), caching them; every change is then made with ``*at`` calls relative to
those descriptors (``renameat``/``renameat2``, ``unlinkat``, ``fstatat`` without following,
``fchmod``/``fchown``/``fsetxattr`` on an ``O_NOFOLLOW`` descriptor). A component that is a
symlink or no directory is refused as :class:`SwappedPathError` (nothing written through it).
:meth:`Beneath.moved` tells, at the end of an operation, whether a directory written into was
moved away meanwhile (its descriptor no longer sits at its path): the caller then undoes.

Used by :mod:`sandbox_core.tree.sync` and :mod:`sandbox_core.tree.staging` for the original
and for their staging areas alike.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import stat
from collections.abc import Callable

from sandbox_core.tree.guards import SwappedPathError

#: Test-only hook: called as ``fault_hook(call, rel)`` before every file-system call made
#: through a :class:`Beneath` (``"open"``, ``"stat"``, ``"rename"``, ``"meta"``), so a test can
#: swap a component at the k-th call. ``None`` in production.
fault_hook: Callable[[str, str], None] | None = None

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SWAP_ERRNOS = frozenset({errno.ELOOP, errno.ENOTDIR})
_RENAME_NOREPLACE = 1


def _load_renameat2() -> Callable[..., int] | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True) if name is not None else None
    function = getattr(libc, "renameat2", None) if libc is not None else None
    if function is None:
        return None
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


_RENAMEAT2 = _load_renameat2()
_noreplace_works = _RENAMEAT2 is not None


def _split(rel: str) -> tuple[str, str]:
    head, _, name = rel.rpartition("/")
    return head, name


class Beneath:
    """Descriptors of one directory tree, its top opened once (see the module docstring).

    ``root``: the tree's top directory; ``follow_root``: open it even when it is a symlink to
    a directory (an original given as a link; every component below is still never followed).
    Use as a context manager, or call :meth:`close`.

    Raises:
        SwappedPathError: ``root`` is a symlink (``follow_root`` False) or not a directory.
        FileNotFoundError: ``root`` is missing.
    """

    def __init__(self, root: str, *, follow_root: bool = False) -> None:
        self.root = root
        flags = _DIR_FLAGS if not follow_root else _DIR_FLAGS & ~os.O_NOFOLLOW
        try:
            fd = os.open(root, flags)
        except OSError as exc:
            if exc.errno in _SWAP_ERRNOS:
                raise SwappedPathError(root, ["."]) from exc
            raise
        self._fds: dict[str, int] = {"": fd}
        self._ids: dict[str, tuple[int, int]] = {}

    def __enter__(self) -> Beneath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every descriptor (idempotent)."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    @property
    def fd(self) -> int:
        """The top directory's descriptor."""
        return self._fds[""]

    def dir_fd(self, rel_dir: str) -> int:
        """The descriptor of directory ``rel_dir`` (``""``: the top), opened component by
        component with ``O_NOFOLLOW | O_DIRECTORY`` and cached.

        Raises:
            SwappedPathError: a component is a symlink or not a directory (``paths``: it).
            FileNotFoundError: a component is missing.
        """
        fd = self._fds.get(rel_dir)
        if fd is not None:
            return fd
        head, name = _split(rel_dir)
        parent = self.dir_fd(head)
        if fault_hook is not None:
            fault_hook("open", rel_dir)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in _SWAP_ERRNOS:
                raise SwappedPathError(self.root, [rel_dir]) from exc
            raise
        st = os.fstat(fd)
        self._fds[rel_dir] = fd
        self._ids[rel_dir] = (st.st_dev, st.st_ino)
        return fd

    def at(self, rel: str) -> tuple[int, str]:
        """``(descriptor of the parent directory, last name)`` of ``rel`` (not ``""``)."""
        head, name = _split(rel)
        return self.dir_fd(head), name

    def lstat(self, rel: str) -> os.stat_result | None:
        """The entry at ``rel`` without following it (the top for ``""``), or None when it is
        missing (also when a parent is missing).

        Raises:
            SwappedPathError: a parent component is a symlink or not a directory.
        """
        if not rel:
            return os.fstat(self.fd)
        try:
            parent, name = self.at(rel)
        except FileNotFoundError:
            return None
        if fault_hook is not None:
            fault_hook("stat", rel)
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def readlink(self, rel: str) -> str:
        """The target text of the symlink at ``rel``."""
        parent, name = self.at(rel)
        return os.readlink(name, dir_fd=parent)

    def forget(self, rel: str) -> None:
        """Drop the cached descriptors of ``rel`` and below (it was renamed away)."""
        if not rel:
            return
        prefix = rel + "/"
        for key in [k for k in self._fds if k == rel or k.startswith(prefix)]:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop(key))
            self._ids.pop(key, None)

    def moved(self) -> list[str]:
        """The cached directories no longer found at their path (moved away, or their path
        now leads somewhere else): a write made into them landed outside the tree's paths."""
        out: list[str] = []
        for rel, ident in list(self._ids.items()):
            head, name = _split(rel)
            parent = self._fds.get(head)
            try:
                st = (
                    os.stat(name, dir_fd=parent, follow_symlinks=False)
                    if parent is not None
                    else None
                )
            except OSError:
                st = None
            if st is None or (st.st_dev, st.st_ino) != ident:
                out.append(rel)
        return sorted(out)

    def open_dir(self, rel: str) -> int:
        """A new descriptor (the caller closes it) of directory ``rel`` itself (the top for
        ``""``), never through a symlink: for its own metadata (``fchmod``...)."""
        if not rel:
            return os.dup(self.fd)
        parent, name = self.at(rel)
        if fault_hook is not None:
            fault_hook("meta", rel)
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in _SWAP_ERRNOS:
                raise SwappedPathError(self.root, [rel]) from exc
            raise


def rename(src: Beneath, src_rel: str, dst: Beneath, dst_rel: str, *, replace: bool) -> None:
    """Rename ``src_rel`` of tree ``src`` to ``dst_rel`` of tree ``dst`` through their parents'
    descriptors (``renameat``). ``replace`` False never replaces an entry at ``dst_rel``
    (``renameat2(RENAME_NOREPLACE)``; where the file system lacks it, a check right before).

    Raises:
        FileExistsError: ``replace`` False and ``dst_rel`` exists.
        SwappedPathError: a parent component is a symlink or not a directory.
        OSError: the rename failed.
    """
    global _noreplace_works  # learnt once per process
    src_fd, src_name = src.at(src_rel)
    dst_fd, dst_name = dst.at(dst_rel)
    if fault_hook is not None:
        fault_hook("rename", dst_rel)
    if not replace and _noreplace_works and _RENAMEAT2 is not None:
        rc = _RENAMEAT2(src_fd, os.fsencode(src_name), dst_fd, os.fsencode(dst_name),
                        _RENAME_NOREPLACE)  # fmt: skip
        if rc == 0:
            src.forget(src_rel)
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), os.path.join(dst.root, dst_rel))
        _noreplace_works = False
    if not replace:
        with contextlib.suppress(FileNotFoundError):
            os.stat(dst_name, dir_fd=dst_fd, follow_symlinks=False)
            raise FileExistsError(errno.EEXIST, "entry exists", os.path.join(dst.root, dst_rel))
    os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    src.forget(src_rel)


def is_dir(st: os.stat_result | None) -> bool:
    """Whether ``st`` (from :meth:`Beneath.lstat`) is a real directory."""
    return st is not None and stat.S_ISDIR(st.st_mode)
