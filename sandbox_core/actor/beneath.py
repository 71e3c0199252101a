"""Paths beneath a sandbox's root, resolved through directory descriptors (cases 44 and 06).

Every path an actor names is relative to the sandbox's root. It is split into components and
walked from a descriptor of the root, one ``openat(O_DIRECTORY | O_NOFOLLOW)`` per component,
so the kernel never resolves a name the walk did not check: a symlink anywhere on the way, even
one swapped in after a check, is refused (``ELOOP``/``ENOTDIR``), never followed. The last
component is opened, made, renamed or removed relative to its parent's descriptor, with
``O_NOFOLLOW`` where the call opens it.

Refused before anything is touched (:class:`~sandbox_core.errors.SandboxPathError`, message
``"Path traversal not allowed: ..."``): absolute paths, any ``..`` component, NUL bytes, and a
symlink met on the way. A path into a control path is refused for writes, at any depth
(:func:`sandbox_core.paths.is_control_name`): ``.git`` in any case or Unicode variant a
filesystem could alias to it (a worktree's ``.git`` points into the original's repository, a
copy's ``.git`` is the original's history, and its config runs commands), and the core's own
files beside an original (the lock ``.<name>.sandbox-lock``, staging areas, backups, overlay
work dirs), which a sandbox of a parent directory would otherwise see.

Symlinks inside the sandbox are reported (``stat``, listings) and can be removed, moved or
replaced, never followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_module
from collections.abc import Iterator
from contextlib import contextmanager

from sandbox_core.errors import SandboxError, SandboxFileNotFoundError, SandboxPathError
from sandbox_core.paths import CONTROL_DIRS, TRAVERSAL_MESSAGE, is_control_name

CONTROL_NAMES = CONTROL_DIRS
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HINT = "use a path relative to the sandbox's root, without '..' and without symlinks on the way"


def refused(rel: str, why: str) -> SandboxPathError:
    """The refusal of ``rel``, in words an agent can act on."""
    return SandboxPathError(f"{TRAVERSAL_MESSAGE}: {rel!r} {why}; {_HINT}")


def split(rel: str) -> tuple[str, ...]:
    """The components of ``rel`` (``""`` and ``"."`` are the root: ``()``).

    Raises:
        SandboxPathError: absolute, ``..``, or a NUL byte.
    """
    if not isinstance(rel, str):
        raise refused(str(rel), "is not a string")
    if "\x00" in rel:
        raise refused(rel, "holds a NUL byte")
    if rel.startswith("/"):
        raise refused(rel, "is absolute")
    parts = tuple(part for part in rel.split("/") if part not in ("", "."))
    if ".." in parts:
        raise refused(rel, "leaves the sandbox ('..')")
    return parts


def is_control(parts: tuple[str, ...]) -> bool:
    """Whether a path lies in (or is) a control path (``.git`` and its aliases, the core's own
    files: :func:`sandbox_core.paths.is_control_name`)."""
    return any(is_control_name(part) for part in parts)


def check_writable(
    rel: str, parts: tuple[str, ...], protected: frozenset[str] = frozenset()
) -> None:
    """Refuse a change under a control path, of a ``protected`` top-level name (a strategy's
    own file in the root, such as a transaction sandbox's statement log), or of the root.

    Raises:
        SandboxPathError: ``.git`` on the path, a protected name, or the root.
    """
    if not parts:
        raise refused(rel, "is the sandbox's root")
    if is_control(parts):
        raise refused(
            rel,
            "is under a control path (.git, or the sandbox's own lock, staging or work files) "
            "that no actor may change",
        )
    if parts[0] in protected:
        raise refused(rel, "is the sandbox's own bookkeeping, which only the sandbox writes")


class Beneath:
    """A sandbox root held open; every call resolves beneath it (see the module docstring).

    Use as a context manager (the root descriptor is closed on exit).

    Raises:
        SandboxFileNotFoundError: the root does not exist.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        try:
            self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise SandboxFileNotFoundError(f"the sandbox root {self.root} does not exist") from exc

    def close(self) -> None:
        """Close the root descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Beneath:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def open_dir(self, rel: str, parts: tuple[str, ...], *, create: bool = False) -> int:
        """A new descriptor of the directory ``parts`` (made, with its parents, when ``create``).

        Raises:
            SandboxPathError: a component is a symlink (or not a directory where one is needed).
            SandboxFileNotFoundError: a component is missing (and not ``create``).
        """
        fd = os.dup(self.fd)
        try:
            for index, part in enumerate(parts):
                try:
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        shown = "/".join(parts[: index + 1])
                        raise SandboxFileNotFoundError(
                            f"no directory {shown!r} in the sandbox (for {rel!r})"
                        ) from None
                    # Made meanwhile, or a dangling symlink: the open below decides.
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                    child = self._open_component(rel, part, fd)
                except OSError as exc:
                    raise self._translate(rel, exc) from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_component(self, rel: str, part: str, fd: int) -> int:
        try:
            return os.open(part, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise self._translate(rel, exc) from None

    @staticmethod
    def _translate(rel: str, exc: OSError) -> Exception:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            return refused(rel, "has a symlink or a file where a directory is needed")
        if exc.errno == errno.ENOENT:
            return SandboxFileNotFoundError(f"no such file or directory in the sandbox: {rel!r}")
        return SandboxError(f"resolving {rel!r} in the sandbox failed: {exc.strerror}")

    @contextmanager
    def parent(self, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """``(descriptor of the parent directory, last component)`` of ``rel``; the descriptor
        is closed on exit.

        Raises:
            SandboxPathError: ``rel`` is the root, or refused by :func:`split`/:meth:`open_dir`.
            SandboxFileNotFoundError: a parent is missing (and not ``create``).
        """
        parts = split(rel)
        if not parts:
            raise refused(rel, "is the sandbox's root")
        fd = self.open_dir(rel, parts[:-1], create=create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def lstat(self, rel: str) -> os.stat_result:
        """``lstat`` of ``rel`` (the root when ``"."``), never following a symlink.

        Raises:
            SandboxFileNotFoundError, SandboxPathError.
        """
        parts = split(rel)
        if not parts:
            return os.fstat(self.fd)
        with self.parent(rel) as (fd, name):
            try:
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise SandboxFileNotFoundError(f"no such file or directory: {rel!r}") from None

    def open_file(self, rel: str, flags: int, *, create_parents: bool = False) -> int:
        """A descriptor of the regular file ``rel`` opened with ``flags`` (``O_NOFOLLOW`` and
        ``O_NONBLOCK`` added: a FIFO never blocks the caller, a symlink is refused).

        Raises:
            SandboxPathError: the last component is a symlink.
            SandboxFileNotFoundError: missing (without ``O_CREAT``).
            IsADirectoryError, or ``SandboxFileOperationError`` from the caller's checks.
        """
        with self.parent(rel, create=create_parents) as (fd, name):
            try:
                opened = os.open(
                    name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666, dir_fd=fd
                )
            except FileNotFoundError:
                raise SandboxFileNotFoundError(f"no file {rel!r} in the sandbox") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise refused(rel, "is a symlink (never followed)") from None
                if exc.errno == errno.ENXIO:  # a FIFO without a reader
                    raise IsADirectoryError(errno.EISDIR, "not a regular file", rel) from None
                raise
        info = os.fstat(opened)
        if not stat_module.S_ISREG(info.st_mode):
            os.close(opened)
            raise IsADirectoryError(errno.EISDIR, "not a regular file", rel)
        os.set_blocking(opened, True)
        return opened
