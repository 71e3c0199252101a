# ruff: noqa: PTH101, PTH102, PTH104, PTH108, PTH115, PTH118, PTH211
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""Exact copies of single paths (docs/fidelity.md): :func:`copy_entry` copies a file (holes
kept), a symlink (as a link), a special file (recreated, never read) or a whole directory, with
owner, mode, xattrs, POSIX ACLs and times; :func:`copy_metadata` copies only the metadata.

Owner before mode, so set-uid/set-gid survive (case 24); hard links within a copy stay links
(case 34). Also the two primitives the other tree modules move and remove entries with.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator

from sandbox_core.tree.scan import StrPath, read_xattrs

_SKIPPED_XATTR_ERRNOS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EACCES})
_CHUNK = 1 << 30


def _copy_metadata(src: str, dst: str, st: os.stat_result) -> None:
    """Owner, xattrs (POSIX ACLs included), mode and timestamps of ``src`` onto ``dst``.

    The order matters (case 24): ``chown`` clears set-uid/set-gid (and file capabilities), so it
    comes first; then the xattrs; the mode last but the times. Ownership and xattrs the process
    may not set (not root) are skipped, as ``cp -a`` does.
    """
    with contextlib.suppress(PermissionError):
        os.lchown(dst, st.st_uid, st.st_gid)
    wanted = read_xattrs(src)
    current = read_xattrs(dst)
    for name in current.keys() - wanted.keys():  # inherited default ACLs, for example
        with contextlib.suppress(OSError):
            os.removexattr(dst, name, follow_symlinks=False)
    for name, value in wanted.items():
        if current.get(name) == value:
            continue
        try:
            os.setxattr(dst, name, value, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in _SKIPPED_XATTR_ERRNOS:
                raise
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _copy_range(fd_in: int, fd_out: int, start: int, end: int) -> None:
    offset = start
    while offset < end:
        count = min(end - offset, _CHUNK)
        try:
            done = os.copy_file_range(fd_in, fd_out, count, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            data = os.pread(fd_in, min(count, 1 << 20), offset)
            done = os.pwrite(fd_out, data, offset)
        if done == 0:
            break  # the file shrank while it was copied
        offset += done


def _data_segments(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each data segment; holes are skipped (``SEEK_DATA``/``SEEK_HOLE``)."""
    position = 0
    while position < size:
        try:
            start = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # only a hole is left
            if exc.errno == errno.EINVAL:  # no hole support here: all data
                yield position, size
                return
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, min(end, size)
        position = end


def copy_file(src: StrPath, dst: StrPath) -> None:
    """Copy a regular file's data to the new file ``dst`` (must not exist), keeping holes:
    only the data segments are copied (``copy_file_range``), then the size is set, so a sparse
    file stays sparse. Metadata is not copied (see :func:`copy_entry`).

    Raises:
        OSError: on any I/O failure (``dst`` may be left partial).
    """
    fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            size = os.fstat(fd_in).st_size
            for start, end in _data_segments(fd_in, size):
                _copy_range(fd_in, fd_out, start, end)
            os.ftruncate(fd_out, size)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


LinkMap = dict[tuple[int, int], str]
"""``(st_dev, st_ino)`` of a source inode -> the first destination path it was copied to."""


def copy_entry(src: StrPath, dst: StrPath, links: LinkMap | None = None) -> None:
    """Copy one path exactly to ``dst`` (must not exist): a file (holes kept), a symlink (as a
    link), a FIFO, socket or device node (recreated with ``mkfifo``/``mknod``, never opened:
    the special-file policy), or a whole directory tree. Owner, group, permission bits
    (set-uid/set-gid/sticky), xattrs, POSIX ACLs and times are kept.

    Hard links: names of one source inode are copied once and linked, within one call and
    across calls that pass the same ``links`` map (case 34). Pure Python, used for small copies
    (staging of changed paths).

    Raises:
        OSError: on any I/O failure, e.g. ``EPERM`` for a device node without ``CAP_MKNOD``.
    """
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    seen: LinkMap = {} if links is None else links
    st = os.lstat(src_s)
    if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
        first = seen.get((st.st_dev, st.st_ino))
        if first is not None:
            os.link(first, dst_s, follow_symlinks=False)
            return
        seen[(st.st_dev, st.st_ino)] = dst_s
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src_s), dst_s)
    elif stat.S_ISREG(st.st_mode):
        copy_file(src_s, dst_s)
    elif stat.S_ISDIR(st.st_mode):
        os.mkdir(dst_s, 0o700)
        with os.scandir(src_s) as it:
            children = [item.name for item in it]
        for name in children:
            copy_entry(os.path.join(src_s, name), os.path.join(dst_s, name), seen)
        # Metadata last: children change the directory's mtime, and a read-only mode would
        # stop them from being written.
    elif stat.S_ISFIFO(st.st_mode):
        os.mkfifo(dst_s, 0o600)
    else:  # socket, character or block device: mknod makes the same type, nothing is read
        os.mknod(dst_s, stat.S_IFMT(st.st_mode) | 0o600, st.st_rdev)
    _copy_metadata(src_s, dst_s, st)


def copy_metadata(src: StrPath, dst: StrPath) -> None:
    """Owner, xattrs, ACLs, permission bits and times of ``src`` onto the existing ``dst``, in
    the order that keeps set-uid/set-gid (case 24).

    Raises:
        OSError: ``src`` or ``dst`` is missing, or a value cannot be set.
    """
    _copy_metadata(os.fspath(src), os.fspath(dst), os.lstat(src))


def _remove(path: str) -> None:
    """Remove whatever is at ``path`` (file, link, or tree); missing is fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _move(src: str, dst: str) -> None:
    """Rename, or copy + remove when ``dst`` is on another filesystem (EXDEV)."""
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _remove(dst)
        copy_entry(src, dst)
        _remove(src)
