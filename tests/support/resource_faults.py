"""Full and read-only file systems for the resource-fault tests (docs/fidelity.md, "Resource
faults"): :func:`small_volume` mounts a real tmpfs of a given size (grown, bound read-only and
back by :class:`Volume`), and :class:`WriteFaults` raises ``OSError(ENOSPC | EROFS)`` at the
k-th write-class system call made through :mod:`os` (the system-call boundary), counting them
when no ``k`` is given.

Write-class calls: ``os.open``/``open`` for writing or creating, ``mkdir``, ``rename``,
``replace``, ``symlink``, ``link``, ``mkfifo``, ``mknod``, ``copy_file_range``, ``sendfile``,
``write``, ``pwrite``, ``ftruncate``, ``chmod``, ``lchown``, ``chown``, ``setxattr`` and
``utime``. Removals (``unlink``, ``rmdir``) never fail for lack of space and are not counted.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CALLS = (
    "mkdir", "rename", "replace", "symlink", "link", "mkfifo", "mknod", "copy_file_range",
    "sendfile", "write", "pwrite", "ftruncate", "chmod", "lchown", "chown", "setxattr", "utime",
)  # fmt: skip


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@dataclass
class Volume:
    """A tmpfs mounted at ``path`` (its own file system, ``size_mib`` big)."""

    path: Path
    bound: bool = False

    def resize(self, size_mib: int) -> None:
        _run("mount", "-o", f"remount,size={size_mib}m", str(self.path))

    def read_only(self, on: bool) -> None:
        """Flip the volume read-only (a bind mount of itself, remounted ``ro``) or back."""
        if not self.bound:
            _run("mount", "--bind", str(self.path), str(self.path))
            self.bound = True
        _run("mount", "-o", f"remount,bind,{'ro' if on else 'rw'}", str(self.path))

    def free_blocks(self) -> int:
        return os.statvfs(self.path).f_bfree


@contextlib.contextmanager
def small_volume(path: Path, size_mib: int) -> Iterator[Volume]:
    """Mount a tmpfs of ``size_mib`` MiB at ``path`` (made if missing); unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path))
    volume = Volume(path)
    try:
        yield volume
    finally:
        if volume.bound:
            _run("umount", "-l", str(path))
        _run("umount", "-l", str(path))


@dataclass
class WriteFaults:
    """Raise ``OSError(errno_)`` at the ``fail_at``-th write-class call (1-based; None: only
    count). ``calls`` counts every write-class call made while active; ``fired`` says whether
    the fault was raised; ``where`` names the call that got it."""

    fail_at: int | None = None
    errno_: int = errno.ENOSPC
    calls: int = 0
    fired: bool = False
    where: str = ""
    _saved: dict[tuple[Any, str], Any] = field(default_factory=dict)

    def _hit(self, name: str, args: tuple[Any, ...]) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            self.fired = True
            target = args[0] if args and isinstance(args[0], str | bytes | os.PathLike) else None
            self.where = f"{name}({target!r})"
            raise OSError(self.errno_, os.strerror(self.errno_), target)

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._hit(name, args)
            return real(*args, **kwargs)

        return call

    def _wrap_open(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
            if flags & _WRITE_FLAGS:
                self._hit("open", (path,))
            return real(path, flags, *args, **kwargs)

        return call

    def _wrap_file_open(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, str | bytes | os.PathLike) and set(mode) & set("wax+"):
                self._hit("open", (file,))
            return real(file, mode, *args, **kwargs)

        return call

    def __enter__(self) -> WriteFaults:
        for name in _CALLS:
            real = getattr(os, name, None)
            if real is not None:
                self._saved[(os, name)] = real
                setattr(os, name, self._wrap(name, real))
        self._saved[(os, "open")] = os.open
        os.open = self._wrap_open(os.open)  # type: ignore[assignment]
        for module in (builtins, io):
            self._saved[(module, "open")] = module.open
            module.open = self._wrap_file_open(module.open)  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for (module, name), real in self._saved.items():
            setattr(module, name, real)
        self._saved.clear()
