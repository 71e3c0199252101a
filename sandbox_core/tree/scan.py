# ruff: noqa: PTH115, PTH118
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""The tree model: what a path is (:class:`Entry`), the walk (:func:`scan_tree`), and what
differs between two scans (:class:`TreeChanges`, :func:`diff_entries`).

Symlinks are recorded, never followed (case 06). Top-level entries whose name starts with
:data:`INNER_STAGING_PREFIX` are staging areas (:mod:`sandbox_core.tree.sync`) and invisible
to every walk.
"""

from __future__ import annotations

import errno
import filecmp
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

StrPath = str | os.PathLike[str]

INNER_STAGING_PREFIX = ".sandbox-staging-"


#: The file types a tree can hold, as ``Entry.kind`` names them, and their signature letters.
KIND_LETTERS = {
    "file": "f",
    "dir": "d",
    "symlink": "l",
    "fifo": "p",
    "socket": "s",
    "chardev": "c",
    "blockdev": "b",
}
SPECIAL_KINDS = frozenset({"fifo", "socket", "chardev", "blockdev"})
"""Special files: recreated as the same type (``mkfifo``/``mknod``) and never opened or read."""


@dataclass(frozen=True, slots=True)
class Entry:
    """What one path is, without following symlinks.

    ``kind`` is one of :data:`KIND_LETTERS` (``"file"``, ``"dir"``, ``"symlink"``, ``"fifo"``,
    ``"socket"``, ``"chardev"``, ``"blockdev"``); ``mode`` holds the permission bits including
    set-uid, set-gid and sticky; ``mtime_ns`` is nanoseconds since the epoch; ``target`` is the
    symlink's target text (``None`` for other kinds); ``uid``/``gid`` the owner; ``rdev`` the
    device number of a device node (0 otherwise).
    """

    kind: str
    mode: int
    size: int
    mtime_ns: int
    target: str | None = None
    uid: int = 0
    gid: int = 0
    rdev: int = 0

    def to_json(self) -> list[Any]:
        """Compact JSON form ``[kind, mode, size, mtime_ns, target, uid, gid, rdev]``."""
        return [
            self.kind, self.mode, self.size, self.mtime_ns, self.target,
            self.uid, self.gid, self.rdev,
        ]  # fmt: skip

    @classmethod
    def from_json(cls, data: list[Any]) -> Entry:
        """Inverse of :meth:`to_json` (also reads the older five-field form)."""
        extra = [int(value) for value in data[5:8]]
        return cls(str(data[0]), int(data[1]), int(data[2]), int(data[3]), data[4], *extra)


def _kind(st_mode: int) -> str:
    if stat.S_ISLNK(st_mode):
        return "symlink"
    if stat.S_ISDIR(st_mode):
        return "dir"
    if stat.S_ISREG(st_mode):
        return "file"
    if stat.S_ISFIFO(st_mode):
        return "fifo"
    if stat.S_ISSOCK(st_mode):
        return "socket"
    if stat.S_ISCHR(st_mode):
        return "chardev"
    return "blockdev"


def _entry(path: str, st: os.stat_result) -> Entry:
    kind = _kind(st.st_mode)
    return Entry(
        kind,
        stat.S_IMODE(st.st_mode),
        st.st_size,
        st.st_mtime_ns,
        os.readlink(path) if kind == "symlink" else None,
        st.st_uid,
        st.st_gid,
        st.st_rdev if kind in ("chardev", "blockdev") else 0,
    )


def entry_of(path: StrPath) -> Entry | None:
    """The :class:`Entry` of ``path`` (lstat), or ``None`` when nothing is there (also when an
    ancestor is not a directory)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return _entry(os.fspath(path), st)


def _is_excluded(rel: str, exclude: frozenset[str]) -> bool:
    if "/" not in rel and rel.startswith(INNER_STAGING_PREFIX):
        return True
    return any(rel == ex or rel.startswith(ex + "/") for ex in exclude)


def _walk(root: StrPath, exclude: Iterable[str]) -> Iterator[tuple[str, str, os.stat_result]]:
    """``(rel, path, lstat)`` of every path below ``root``; symlinks never followed."""
    excluded = frozenset(exclude)
    stack: list[tuple[str, str]] = [(os.fspath(root), "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as it:
            items = list(it)
        for item in items:
            rel = prefix + item.name
            if _is_excluded(rel, excluded):
                continue
            st = item.stat(follow_symlinks=False)
            yield rel, item.path, st
            if stat.S_ISDIR(st.st_mode):
                stack.append((item.path, rel + "/"))


def scan_tree(root: StrPath, *, exclude: Iterable[str] = ()) -> dict[str, Entry]:
    """Map every path below ``root`` (not ``root`` itself) to its :class:`Entry`.

    Symlinks are recorded, never followed, so link loops cost nothing (case 06). ``exclude`` lists
    relative paths whose subtrees are skipped (e.g. ``[".git"]``).

    Raises:
        OSError: ``root`` is missing or unreadable.
    """
    return {rel: _entry(path, st) for rel, path, st in _walk(root, exclude)}


def read_xattrs(path: StrPath) -> dict[str, bytes]:
    """Every extended attribute of ``path`` (not following symlinks), POSIX ACLs included
    (``system.posix_acl_access``/``_default``). Names the kernel refuses to read are skipped;
    a filesystem without xattrs gives ``{}``."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.ENOENT):
            return {}
        raise
    values: dict[str, bytes] = {}
    for name in names:
        try:
            values[name] = os.getxattr(path, name, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.EPERM, errno.ENOTSUP, errno.EACCES):
                raise
    return values


def entries_differ(
    a: Entry, b: Entry, path_a: StrPath | None, path_b: StrPath | None, *, xattrs: bool = True
) -> bool:
    """True when two entries are different (see module docstring for the rules).

    Type, permission bits (set-uid/set-gid/sticky included), owner, group, device number and
    link target are compared; with ``path_a``/``path_b`` given also the extended attributes
    (POSIX ACLs included) and, for files of equal size but different mtime, the content.
    Without paths such files count as different.
    """
    if (a.kind, a.mode, a.uid, a.gid, a.rdev) != (b.kind, b.mode, b.uid, b.gid, b.rdev):
        return True
    if a.kind == "symlink" and a.target != b.target:
        return True
    if a.kind == "file" and a.size != b.size:
        return True
    if path_a is None or path_b is None:
        return a.kind == "file" and a.mtime_ns != b.mtime_ns
    if xattrs and read_xattrs(path_a) != read_xattrs(path_b):
        return True
    if a.kind == "file" and a.mtime_ns != b.mtime_ns:
        return not filecmp.cmp(path_a, path_b, shallow=False)
    return False


@dataclass(frozen=True)
class TreeChanges:
    """Differences from an original tree to a modified one (seed 002, "compute_diff").

    Each list holds sorted POSIX paths relative to the tree roots, directories included:
    ``added`` exist only in the modified tree (a new directory and everything in it),
    ``deleted`` only in the original, ``changed`` in both with a different type, mode, symlink
    target or content. A type swap (file <-> dir <-> symlink) lists the path as changed and the
    old/new children as deleted/added (case 08). A directory whose children changed is not
    itself changed.
    """

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        """True when the trees are equal."""
        return not (self.added or self.changed or self.deleted)

    @property
    def paths(self) -> list[str]:
        """Every touched path, sorted."""
        return sorted({*self.added, *self.changed, *self.deleted})

    def to_dict(self) -> dict[str, list[str]]:
        """JSON-ready form."""
        return {"added": self.added, "changed": self.changed, "deleted": self.deleted}


def diff_entries(
    old: dict[str, Entry],
    new: dict[str, Entry],
    *,
    old_root: StrPath | None = None,
    new_root: StrPath | None = None,
    xattrs: bool = True,
) -> TreeChanges:
    """:class:`TreeChanges` between two scans; roots enable content (and, with ``xattrs``,
    extended attribute) comparison."""
    added = [p for p in new if p not in old]
    deleted = [p for p in old if p not in new]
    changed = [
        p
        for p, entry in new.items()
        if p in old
        and entries_differ(
            old[p],
            entry,
            os.path.join(old_root, p) if old_root is not None else None,
            os.path.join(new_root, p) if new_root is not None else None,
            xattrs=xattrs,
        )
    ]
    return TreeChanges(sorted(added), sorted(changed), sorted(deleted))


def _ancestors(rel: str) -> Iterable[str]:
    while "/" in rel:
        rel = rel.rsplit("/", 1)[0]
        yield rel
