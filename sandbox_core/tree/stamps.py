# ruff: noqa: PTH115, PTH118
# Why: str paths and os-level calls on purpose (the commit's inner loop, measured against rsync).
"""What the original held where a sync will write, taken when the commit checks it, and the
comparison made right before each replacement (case 43: a write of another writer that lands
between the check and the rename is a conflict, never lost).

A *guard* maps each path a sync replaces (and every path below a replaced directory) to its
stamp: the quick-check :func:`~sandbox_core.tree.snapshot.signature` plus ctime, inode and link
count (:func:`~sandbox_core.tree.snapshot._stamp`), so any write, rename over, chmod or chown
shows; ``None`` where nothing is (a path the sync creates). :func:`take` reads it by path when
the commit plans (one-shot) or prepares (two-phase, kept in the staging journal);
:class:`Expected` compares it through a :class:`~sandbox_core.tree.beneath.Beneath` right before
each replacement.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sandbox_core.tree.beneath import Beneath
from sandbox_core.tree.scan import Entry, _ancestors, _kind, _walk
from sandbox_core.tree.snapshot import _stamp, signature

Guard = dict[str, Any]
"""``{relative path: stamp text or None}`` (JSON-ready: kept in a two-phase journal)."""


def stamp_text(st: os.stat_result, link: Callable[[], str]) -> str:
    """The stamp of an entry from its ``lstat`` (``link`` reads a symlink's target)."""
    kind = _kind(st.st_mode)
    entry = Entry(
        kind,
        stat.S_IMODE(st.st_mode),
        st.st_size,
        st.st_mtime_ns,
        link() if kind == "symlink" else None,
        st.st_uid,
        st.st_gid,
        st.st_rdev if kind in ("chardev", "blockdev") else 0,
    )
    return signature(entry) + _stamp(st)


def _own_dir_text(st: os.stat_result) -> str:
    """A directory's own stamp: type, mode, owner and inode (not its size, mtime, ctime or
    link count, which move whenever a child is added or removed)."""
    return f"d {stat.S_IMODE(st.st_mode):o} {st.st_uid} {st.st_gid} {st.st_ino}"


def _text(st: os.stat_result, link: Callable[[], str], own_dirs: bool) -> str:
    if own_dirs and stat.S_ISDIR(st.st_mode):
        return _own_dir_text(st)
    return stamp_text(st, link)


def take(target: str, paths: Iterable[str], *, own_dirs: bool = False) -> Guard:
    """The guard of ``paths`` (the replace roots of a sync) in ``target``, read by path: each
    path's stamp (``None`` when missing) and, below a directory, every entry's. ``own_dirs``:
    a directory's stamp is its own only (:func:`_own_dir_text`), so a child it gains or
    loses shows at that child alone (the undo of a sync names the child; pass the same to
    :class:`Expected`).

    Raises:
        OSError: a path cannot be read.
    """
    guard: Guard = {}
    for rel in paths:
        path = os.path.join(target, rel)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            guard[rel] = None
            continue
        guard[rel] = _text(st, lambda p=path: os.readlink(p), own_dirs)  # type: ignore[misc]
        if stat.S_ISDIR(st.st_mode):
            for sub, sub_path, sub_st in _walk(path, ()):
                guard[f"{rel}/{sub}"] = _text(
                    sub_st,
                    lambda p=sub_path: os.readlink(p),  # type: ignore[misc]
                    own_dirs,
                )
    return guard


def _walk_at(fd: int, prefix: str) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """``(rel, parent fd, name, lstat)`` below the directory open as ``fd``, through
    descriptors (never following a symlink)."""
    with os.scandir(fd) as it:
        items = [(item.name, item.stat(follow_symlinks=False)) for item in it]
    for name, st in items:
        yield f"{prefix}{name}", fd, name, st
        if stat.S_ISDIR(st.st_mode):
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                yield from _walk_at(child, f"{prefix}{name}/")
            finally:
                os.close(child)


class Expected:
    """A guard ready to be compared: ``roots`` are the paths replaced (each checked on its
    own, right before its replacement), the guard's other paths lie below them.
    ``own_dirs``: the guard was taken with it (:func:`take`)."""

    def __init__(self, guard: Guard, roots: Iterable[str], *, own_dirs: bool = False) -> None:
        self._own_dirs = own_dirs
        self._top: dict[str, str | None] = {}
        self._below: dict[str, dict[str, str]] = {}
        self._renamed: set[tuple[int, int]] = set()  # hard-linked inodes this sync moved
        for rel in roots:
            self._top[rel] = guard.get(rel)
        if len(guard) > len(self._top):
            for key, value in guard.items():
                if key in self._top:
                    continue
                for anc in _ancestors(key):
                    if anc in self._top:
                        self._below.setdefault(anc, {})[key] = value
                        break

    def _same_but_ctime(self, st: os.stat_result, now: str | None, was: str | None) -> bool:
        """Whether ``now`` and ``was`` differ only by the ctime of an inode whose other name
        this sync renamed (a rename moves the inode's ctime)."""
        if now is None or was is None or (st.st_dev, st.st_ino) not in self._renamed:
            return False
        head = now[: -len(_stamp(st))]  # the signature part
        if not was.startswith(head):
            return False
        ours, theirs = now[len(head) :].split(" "), was[len(head) :].split(" ")
        return ours[0][:1] == theirs[0][:1] and ours[1:] == theirs[1:]

    def changed(self, fds: Beneath, rel: str) -> list[str]:
        """The paths at and below ``rel`` whose stamp differs now (read through ``fds``).
        Call right before ``rel`` is replaced: a hard-linked file checked here is remembered,
        so that the ctime its other names get from that rename is not taken for a change.

        Raises:
            SwappedPathError: a parent of ``rel`` is a symlink or no directory.
        """
        st = fds.lstat(rel)
        now = None if st is None else _text(st, lambda: fds.readlink(rel), self._own_dirs)
        was = self._top.get(rel)
        if now != was and not (st is not None and self._same_but_ctime(st, now, was)):
            return [rel]
        if st is None or not stat.S_ISDIR(st.st_mode):
            if st is not None and st.st_nlink > 1:
                self._renamed.add((st.st_dev, st.st_ino))
            return []
        below = self._below.get(rel)
        fd = fds.open_dir(rel)
        try:
            seen = {
                sub: _text(
                    sub_st,
                    lambda p=parent, n=name: os.readlink(n, dir_fd=p),  # type: ignore[misc]
                    self._own_dirs,
                )
                for sub, parent, name, sub_st in _walk_at(fd, f"{rel}/")
            }
        finally:
            os.close(fd)
        expected = below or {}
        return sorted(k for k in seen.keys() | expected.keys() if seen.get(k) != expected.get(k))
