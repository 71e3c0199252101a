"""Kernel OverlayFS mechanics for the overlay strategy (private; seed 002, "OverlaySandbox").

- :func:`mount_overlay` / :func:`unmount`: mount(2) and umount2(2) called through libc, the same
  syscalls as ``mount -t overlay overlay -o lowerdir=..,upperdir=..,workdir=.. merged``, but the
  caller gets the errno (EPERM, ENODEV, ...) that decides whether to fall back to userspace.
- :func:`is_overlay_mounted`: whether a directory is an overlay mount point in this process's
  mount namespace (``/proc/self/mountinfo``). A mount outlives the process that made it, not a
  reboot.
- :func:`changes_from_upper`: the set of changed paths, read from the upper layer without touching
  the lower one: whiteouts are deletions, opaque and redirected directories replace a whole
  subtree, other directories are recursed into (case 11, case 12).

Copies (staging, checkpoints of the upper layer with its whiteouts and ``*.overlay.*`` xattrs)
use the exact ``tree.copy.copy_entry``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sandbox_core.tree.scan import read_xattrs

MNT_DETACH = 2
"""umount2 flag: detach now, release when the last user is gone (lazy unmount)."""

UNAVAILABLE_ERRNOS = frozenset(
    {
        errno.EPERM,  # no CAP_SYS_ADMIN (unprivileged container)
        errno.EACCES,
        errno.ENODEV,  # overlay filesystem not in this kernel
        errno.ENOSYS,
        errno.EOPNOTSUPP,
        errno.EINVAL,  # layers the kernel refuses (e.g. upper on a filesystem without xattrs)
        errno.ELOOP,  # overlapping layers
    }
)
"""mount errnos meaning "OverlayFS cannot be used here": ``mode="auto"`` falls back on these."""

# Characters the kernel's overlay option parser treats as separators or escapes.
_OPTION_SPECIALS = frozenset(",:\\\n")

_libc: Any = None


def _get_libc() -> Any:
    global _libc  # loaded once, on first mount
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


@dataclass(frozen=True)
class OverlayLayout:
    """The four directories of one overlay mount.

    ``lower`` may be a symlink to the original: the kernel follows it, and it keeps user paths
    with ``,`` or ``:`` out of the option string.
    """

    lower: Path
    upper: Path
    work: Path
    merged: Path
    redirect_dir: str | None = None
    userxattr: bool = False

    @property
    def xattr_namespace(self) -> str:
        """``"user"`` with ``userxattr`` (user-namespace mounts), else ``"trusted"``."""
        return "user" if self.userxattr else "trusted"

    def mount_data(self) -> str:
        """The overlay option string passed to mount(2).

        Raises:
            OSError: EINVAL when a layer path holds a character the option parser splits on.
        """
        for path in (self.lower, self.upper, self.work):
            if _OPTION_SPECIALS.intersection(str(path)):
                raise OSError(errno.EINVAL, f"overlay layer path needs escaping: {path}")
        options = [f"lowerdir={self.lower}", f"upperdir={self.upper}", f"workdir={self.work}"]
        if self.redirect_dir:
            options.append(f"redirect_dir={self.redirect_dir}")
        if self.userxattr:
            options.append("userxattr")
        return ",".join(options)


def in_initial_user_namespace() -> bool:
    """True unless this process runs in a child user namespace (``unshare -U``, rootless pods).

    In a child namespace ``trusted.*`` xattrs are out of reach, so the mount needs ``userxattr``.
    """
    try:
        fields = Path("/proc/self/uid_map").read_text(encoding="ascii").split()
    except OSError:
        return True
    return fields[:3] == ["0", "0", "4294967295"]


def mount_overlay(layout: OverlayLayout) -> None:
    """Mount ``layout`` at ``layout.merged``.

    Raises:
        OSError: with the errno of mount(2); see :data:`UNAVAILABLE_ERRNOS`.
    """
    data = layout.mount_data()
    result = _get_libc().mount(
        b"overlay", os.fsencode(layout.merged), b"overlay", ctypes.c_ulong(0), data.encode()
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount -t overlay on {layout.merged}: {os.strerror(code)}")


def unmount_if_unused(target: Path) -> bool:
    """Unmount ``target`` only if nothing uses it: ``umount2(2)`` without ``MNT_DETACH``,
    which the kernel refuses with ``EBUSY`` while any process has its working directory, root,
    an open file or a mapping below it (or something is mounted inside). One system call.

    Returns:
        True when ``target`` was unmounted; False when it is busy, not mounted, or cannot be
        unmounted (nothing changed then).
    """
    return bool(_get_libc().umount2(os.fsencode(target), 0) == 0)


def unmount(target: Path) -> None:
    """Unmount ``target``; when it is busy, detach it lazily (MNT_DETACH). No-op if not mounted.

    Raises:
        OSError: umount2(2) failed for another reason.
    """
    libc = _get_libc()
    if libc.umount2(os.fsencode(target), 0) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EINVAL and not is_overlay_mounted(target):
        return
    if code == errno.EBUSY and libc.umount2(os.fsencode(target), MNT_DETACH) == 0:
        return
    code = ctypes.get_errno() or code
    raise OSError(code, f"umount {target}: {os.strerror(code)}")


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape_mountinfo(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def is_overlay_mounted(target: Path) -> bool:
    """True when an overlay filesystem is mounted at ``target`` in this mount namespace."""
    wanted = os.path.realpath(target)
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields = head.split()
        if (
            len(fields) >= 5
            and tail.split(" ", 1)[0] == "overlay"
            and _unescape_mountinfo(fields[4]) == wanted
        ):
            return True
    return False


# -- reading the upper layer ------------------------------------------------------------------


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None


def is_whiteout(path: str, st: os.stat_result, namespace: str) -> bool:
    """A 0/0 character device, or a zero-size file marked ``<ns>.overlay.whiteout``."""
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return True
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_size == 0
        and _xattr(path, f"{namespace}.overlay.whiteout") is not None
    )


def replaces_lower_dir(path: str, namespace: str) -> bool:
    """True for an opaque (``overlay.opaque = y``) or redirected (``overlay.redirect``) dir.

    Either way the merged directory's content does not come from the lower directory of the same
    name, so the whole subtree must be read from the merged view (case 11, case 12).
    """
    if _xattr(path, f"{namespace}.overlay.opaque") == b"y":
        return True
    return _xattr(path, f"{namespace}.overlay.redirect") is not None


@dataclass(frozen=True)
class LayerChange:
    """One changed path, resource-relative POSIX.

    ``delete``: the path is gone from the merged view. ``replace``: the merged view's entry
    (file, link, or whole directory subtree) replaces whatever the original has there.
    ``meta``: a directory present on both sides whose permission bits changed (its children
    are reported separately).
    """

    path: str
    kind: Literal["delete", "replace", "meta"]


def _own_meta(path: Path, st: os.stat_result) -> tuple[int, int, int, dict[str, bytes]]:
    return (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, read_xattrs(path))


def changes_from_upper(
    upper: Path, lower: Path, namespace: str, merged: Path | None = None
) -> list[LayerChange]:
    """Changed paths of an overlay, derived from its upper layer (lower is only read).

    A directory present in both layers is ``meta`` when its mode, owner or (with ``merged``
    given, compared through the merged view, which hides the overlay's own xattrs) xattrs
    differ. Returns disjoint paths (no entry lies under another), sorted depth-first by name.
    """
    changes: list[LayerChange] = []

    def walk(relative: str) -> None:
        with os.scandir(upper / relative if relative else upper) as entries:
            ordered = sorted(entries, key=lambda entry: entry.name)
        for entry in ordered:
            child = f"{relative}/{entry.name}" if relative else entry.name
            st = entry.stat(follow_symlinks=False)
            if is_whiteout(entry.path, st, namespace):
                changes.append(LayerChange(child, "delete"))
            elif stat.S_ISDIR(st.st_mode):
                try:
                    lower_st: os.stat_result | None = os.lstat(lower / child)
                except FileNotFoundError:
                    lower_st = None
                if (
                    lower_st is not None
                    and stat.S_ISDIR(lower_st.st_mode)
                    and not replaces_lower_dir(entry.path, namespace)
                ):
                    view = merged / child if merged is not None else None
                    upper_meta = _own_meta(view, os.lstat(view)) if view else None
                    lower_meta = _own_meta(lower / child, lower_st) if view else None
                    if (
                        (stat.S_IMODE(lower_st.st_mode), lower_st.st_uid, lower_st.st_gid)
                        != (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
                    ) or upper_meta != lower_meta:
                        changes.append(LayerChange(child, "meta"))
                    walk(child)
                else:
                    changes.append(LayerChange(child, "replace"))
            else:
                changes.append(LayerChange(child, "replace"))

    walk("")
    return changes
