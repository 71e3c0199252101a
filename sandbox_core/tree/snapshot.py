# ruff: noqa: PTH112, PTH118
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""Quick-check snapshots: a tree as ``{path: signature}`` from one C-speed walk, so that comparing
two trees is a set operation (:func:`differing_paths`) plus O(changes) work at the paths found
(:func:`compute_changes_at`), like ``rsync``; and the hard-link groups a sync keeps whole
(:func:`link_groups`, :func:`link_closure`, case 34).

GNU ``find`` does the walk and the ``lstat`` calls in C when it is installed; the Python walk of
:mod:`sandbox_core.tree.scan` gives the same text where it is not.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandbox_core.tree.scan import (
    INNER_STAGING_PREFIX,
    KIND_LETTERS,
    Entry,
    StrPath,
    TreeChanges,
    _ancestors,
    _entry,
    _kind,
    _walk,
    entries_differ,
)

_NS = 1_000_000_000
_GLOB_SPECIALS = "*?[]\\"
_OLD_STAMP = " @"  # the separator of a stamped signature in a manifest of the previous version


def _mtime_text(ns: int) -> str:
    """``st_mtime_ns`` as GNU find's ``%T@`` prints it (seconds, nine digits of ns, then 0)."""
    return f"{ns // _NS}.{ns % _NS:09d}0"


def signature(entry: Entry) -> str:
    """The quick-check signature of an entry: equal signatures mean "not changed".

    ``"f <mode> <uid> <gid> <size> <mtime>"`` for files, ``"l <mode> <uid> <gid> <target>"``
    for symlinks, ``"<letter> <mode> <uid> <gid>"`` for the other kinds (letters as in
    :data:`KIND_LETTERS`; directory mtimes are ignored: they move whenever a child does);
    modes in octal, mtime as :func:`_mtime_text`. Two entries with equal signatures never
    :func:`entries_differ` by type, mode, owner or (files) size and mtime; unequal signatures
    may still hold equal content (settled by :func:`compute_changes_at`).
    """
    head = f"{KIND_LETTERS[entry.kind]} {entry.mode:o} {entry.uid} {entry.gid}"
    if entry.kind == "file":
        return f"{head} {entry.size} {_mtime_text(entry.mtime_ns)}"
    if entry.kind == "symlink":
        return f"{head} {entry.target}"
    return head


def _stamp(st: os.stat_result) -> str:
    """What :func:`snapshot_tree` maps a path to with ``stamps=True``: the kind letter, then
    ctime, inode number, link count, mode, owner and group, and a file's size
    (``"f1733.0123456780 1234 1 644 0 0 17"``).

    ctime alone would show every change, but the kernel takes it from a clock that ticks every
    few milliseconds (seconds on some filesystems): a write in the same tick as the snapshot
    keeps it. Size, mode and owner still show such a write, a ``chmod`` or a ``chown``, as the
    full :func:`signature` did; only its mtime (as coarse as ctime) is left out.
    """
    kind = _kind(st.st_mode)
    head = f"{KIND_LETTERS[kind]}{_mtime_text(st.st_ctime_ns)} {st.st_ino} {st.st_nlink}"
    owner = f"{stat.S_IMODE(st.st_mode):o} {st.st_uid} {st.st_gid}"
    return f"{head} {owner} {st.st_size}" if kind == "file" else f"{head} {owner}"


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in _GLOB_SPECIALS else ch for ch in text)


def _prune_args(exclude: frozenset[str]) -> list[str]:
    prune: list[str] = ["-path", f"./{INNER_STAGING_PREFIX}*"]
    for rel in sorted(exclude):
        prune += ["-o", "-path", "./" + _glob_escape(rel)]
    return ["(", *prune, ")", "-prune"]


def _memory_file(name: str) -> Any:
    """An anonymous file in memory (``memfd``; a temporary file where there is none)."""
    if hasattr(os, "memfd_create"):
        return open(os.memfd_create(name, os.MFD_CLOEXEC), "w+b")
    return tempfile.TemporaryFile()


def _run_find(find: str, root: str, args: list[str]) -> list[str]:
    # find prints into files in memory, not pipes: a pipe holds 64 KiB, and while another
    # thread holds the GIL (reading a manifest, parsing the other walk) nobody drains it, so
    # find would stop walking until then (and the walks set a rollback's time).
    with _memory_file("find-out") as out, _memory_file("find-err") as err:
        code = subprocess.run(
            [find, ".", "-mindepth", "1", *args], cwd=root, stdout=out, stderr=err, check=False
        ).returncode
        if code != 0:
            err.seek(0)
            message = os.fsdecode(err.read()).strip()
            raise OSError(errno.EIO, f"find failed: {message}", root)
        out.seek(0)
        text = out.read()
    fields = os.fsdecode(text).split("\0")
    fields.pop()  # the text ends with a separator
    return fields


# ``-type f`` first: most entries are files, and find tries the branches in order.
_FIND_LETTERS = "fdlpscb"


def _find_formats(letter: str) -> tuple[str, str]:
    """``find -printf`` formats of a :func:`signature` and of a :func:`_stamp` of an entry of
    kind ``letter`` (the same text as the Python functions give)."""
    extra = {"l": " %l", "f": " %s %T@"}.get(letter, "")
    size = " %s" if letter == "f" else ""
    return f"{letter} %m %U %G{extra}", f"{letter}%C@ %i %n %m %U %G{size}"


def _snapshot_with_find(
    find: str, root: str, exclude: frozenset[str], *, stamps: bool
) -> dict[str, str]:
    printf: list[str] = []
    for letter in _FIND_LETTERS:
        fmt = _find_formats(letter)[1 if stamps else 0]
        printf += ["-o", "-type", letter, "-printf", f"%P\\0{fmt}\\0"]
    fields = _run_find(find, root, [*_prune_args(exclude), *printf])
    pairs = iter(fields)
    return dict(zip(pairs, pairs, strict=True))


def _snapshot_both(root: StrPath) -> tuple[dict[str, str], dict[str, str]]:
    """``(snapshot_tree(root), snapshot_tree(root, stamps=True))`` from one walk.

    Raises:
        OSError: ``root`` is missing or a directory in it cannot be read.
    """
    root_s = os.fspath(root)
    if not os.path.isdir(root_s):
        raise FileNotFoundError(errno.ENOENT, "directory not found", root_s)
    find = shutil.which("find")
    if find is None:
        walked = [(rel, path, st) for rel, path, st in _walk(root_s, ())]
        return (
            {rel: signature(_entry(path, st)) for rel, path, st in walked},
            {rel: _stamp(st) for rel, _, st in walked},
        )
    printf: list[str] = []
    for letter in _FIND_LETTERS:
        sig, stamp = _find_formats(letter)
        printf += ["-o", "-type", letter, "-printf", f"%P\\0{sig}\\0{stamp}\\0"]
    fields = _run_find(find, root_s, [*_prune_args(frozenset()), *printf])
    if len(fields) % 3:
        raise OSError(errno.EIO, "find printed a torn listing", root_s)
    paths = fields[::3]
    return (
        dict(zip(paths, itertools.islice(fields, 1, None, 3), strict=True)),
        dict(zip(paths, itertools.islice(fields, 2, None, 3), strict=True)),
    )


def snapshot_tree(
    root: StrPath, *, exclude: Iterable[str] = (), stamps: bool = False
) -> dict[str, str]:
    """Map every path below ``root`` to its :func:`signature`, without following symlinks.

    The same paths as :func:`scan_tree`, in about half its time on large trees: GNU ``find``
    does the walk and the ``lstat`` calls in C when it is installed (falls back to
    :func:`scan_tree`). Comparing two snapshots is a set operation (:func:`differing_paths`), so
    a commit costs one C-speed walk per tree plus O(changes) Python work, like ``rsync``.

    With ``stamps`` each path maps to its :func:`_stamp` instead (kind, ctime, inode number,
    link count, mode, owner, a file's size): the kernel moves an inode's ctime on every change
    to it (content, mode, owner, xattrs, ACLs, links) and a rename over a path brings another
    inode, so any change shows; only stamp snapshots of the *same* tree taken at different
    times can be compared. (No mtime: ``find`` formats it slowly, and it is as coarse as ctime.)

    Raises:
        OSError: ``root`` is missing or a directory in it cannot be read.
    """
    root_s = os.fspath(root)
    if not os.path.isdir(root_s):
        raise FileNotFoundError(errno.ENOENT, "directory not found", root_s)
    excluded = frozenset(exclude)
    find = shutil.which("find")
    if find is not None:
        return _snapshot_with_find(find, root_s, excluded, stamps=stamps)
    return {
        rel: _stamp(st) if stamps else signature(_entry(path, st))
        for rel, path, st in _walk(root_s, excluded)
    }


def snapshot_trees(
    *roots: StrPath, exclude: Iterable[str] = (), stamps: bool = False
) -> list[dict[str, str]]:
    """:func:`snapshot_tree` of several trees at once, one thread (and ``find``) per tree, as
    ``rsync`` walks sender and receiver side in two processes.

    Raises:
        OSError: a tree cannot be read.
    """
    excluded = list(exclude)
    if len(roots) < 2:  # no thread for a single walk
        return [snapshot_tree(root, exclude=excluded, stamps=stamps) for root in roots]
    with ThreadPoolExecutor(max_workers=len(roots)) as pool:
        futures = [
            pool.submit(snapshot_tree, root, exclude=excluded, stamps=stamps) for root in roots
        ]
        return [future.result() for future in futures]


def differing_paths(a: dict[str, str], b: dict[str, str]) -> set[str]:
    """Paths present in only one snapshot or with different signatures in the two."""
    if a == b:  # C-speed, and the common case for the side that did not change
        return set()
    # Dict lookups on the (hash-cached) path strings: 3-10x faster on 11,000 paths than the
    # symmetric difference of two item sets, which builds and hashes a tuple per path.
    out = {rel for rel, sig in a.items() if b.get(rel) != sig}
    out.update(b.keys() - a.keys())
    return out


def refresh_snapshot(snapshot: dict[str, str], root: StrPath, paths: Iterable[str]) -> None:
    """Update a ``stamps=True`` snapshot of ``root`` in place at ``paths`` (their subtrees and
    the entries of their parent directories included), after they were changed: O(paths +
    their subtrees), no walk of the tree."""
    root_s = os.fspath(root)
    replaced = set(paths)
    parents = {anc for rel in replaced for anc in _ancestors(rel)} - replaced
    # Only a path that was a directory has entries below it in a walk's snapshot: the scan of
    # every key (O(tree)) is needed only then, not for the usual replaced files.
    prefixes = tuple(rel + "/" for rel in replaced if snapshot.get(rel, "").startswith("d"))
    if prefixes:
        for key in [k for k in snapshot if k.startswith(prefixes)]:
            del snapshot[key]
    for rel in sorted(replaced | parents):
        path = os.path.join(root_s, rel)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            snapshot.pop(rel, None)
            continue
        snapshot[rel] = _stamp(st)
        if rel in replaced and stat.S_ISDIR(st.st_mode):
            for sub, _, sub_st in _walk(path, ()):
                snapshot[f"{rel}/{sub}"] = _stamp(sub_st)


def link_groups(root: StrPath, *, exclude: Iterable[str] = ()) -> list[list[str]]:
    """The hard-link groups of ``root``: for every inode with two or more names inside the tree,
    the sorted list of those names (directories never count). One C-speed walk."""
    root_s = os.fspath(root)
    excluded = frozenset(exclude)
    by_inode: dict[str, list[str]] = {}
    find = shutil.which("find")
    if find is not None:
        fields = _run_find(
            find, root_s, [*_prune_args(excluded), "-o", "!", "-type", "d", "-links", "+1",
                           "-printf", "%i\\0%P\\0"]
        )  # fmt: skip
        pairs = iter(fields)
        for inode, rel in zip(pairs, pairs, strict=True):
            by_inode.setdefault(inode, []).append(rel)
    else:
        for rel, _, st in _walk(root_s, excluded):
            if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                by_inode.setdefault(str(st.st_ino), []).append(rel)
    return sorted(sorted(names) for names in by_inode.values() if len(names) > 1)


def _has_links(root: str, paths: Iterable[str]) -> bool:
    for rel in paths:
        try:
            st = os.lstat(os.path.join(root, rel))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            return True
        if stat.S_ISDIR(st.st_mode) and any(  # a whole subtree: O(subtree), copied anyway
            sub.st_nlink > 1 and not stat.S_ISDIR(sub.st_mode)
            for _, _, sub in _walk(os.path.join(root, rel), ())
        ):
            return True
    return False


def _covered(rel: str, roots: set[str]) -> bool:
    return rel in roots or any(anc in roots for anc in _ancestors(rel))


def link_closure(source: StrPath, target: StrPath, paths: Iterable[str]) -> set[str]:
    """``paths`` plus every name that shares an inode, inside ``source`` or inside ``target``,
    with a path in the set (or below a directory in it), until nothing is added (case 34).

    Replacing this whole set keeps hard-link groups intact, like ``rsync -H``: a group is
    re-staged as one inode with all its names. Costs one walk per tree only when a path in the
    set has hard links or is a directory.
    """
    result = set(paths)
    source_s, target_s = os.fspath(source), os.fspath(target)
    if not _has_links(source_s, result) and not _has_links(target_s, result):
        return result
    groups = [*link_groups(source_s), *link_groups(target_s)]
    grown = True
    while grown:
        grown = False
        for names in groups:
            if any(_covered(rel, result) for rel in names) and not set(names) <= result:
                result.update(names)
                grown = True
    return result


def _group_of(rel: str, groups: list[list[str]]) -> tuple[str, ...]:
    for names in groups:
        if rel in names:
            return tuple(names)
    return (rel,)


def compute_changes_at(original: StrPath, modified: StrPath, paths: Iterable[str]) -> TreeChanges:
    """:class:`TreeChanges` from ``original`` to ``modified``, looking only at ``paths``.

    Each path is compared as itself (``lstat`` of both sides, xattrs, content when the quick
    check is not enough), not its subtree: pass every path that may differ, e.g. the
    :func:`differing_paths` of two snapshots. A name whose hard-link group (the other names of
    its inode inside the tree) differs between the two trees is changed too. O(len(paths)).

    Raises:
        OSError: a path cannot be read.
    """
    added: list[str] = []
    changed: list[str] = []
    deleted: list[str] = []
    linked: list[str] = []
    for rel in paths:
        old_path, new_path = os.path.join(original, rel), os.path.join(modified, rel)
        try:
            old_st: os.stat_result | None = os.lstat(old_path)
        except (FileNotFoundError, NotADirectoryError):
            old_st = None
        try:
            new_st: os.stat_result | None = os.lstat(new_path)
        except (FileNotFoundError, NotADirectoryError):
            new_st = None
        if old_st is None and new_st is not None:
            added.append(rel)
        elif new_st is None and old_st is not None:
            deleted.append(rel)
        elif old_st is not None and new_st is not None:
            old, new = _entry(old_path, old_st), _entry(new_path, new_st)
            if entries_differ(old, new, old_path, new_path):
                changed.append(rel)
            elif old.kind != "dir" and max(old_st.st_nlink, new_st.st_nlink) > 1:
                linked.append(rel)
    if linked:
        old_groups, new_groups = link_groups(original), link_groups(modified)
        changed += [
            rel for rel in linked if _group_of(rel, old_groups) != _group_of(rel, new_groups)
        ]
    return TreeChanges(sorted(added), sorted(changed), sorted(deleted))


def compute_changes(
    original: StrPath, modified: StrPath, *, exclude: Iterable[str] = ()
) -> TreeChanges:
    """Structured differences from ``original`` to ``modified`` (both directories).

    Raises:
        OSError: either tree cannot be read.
    """
    excluded = list(exclude)
    old, new = snapshot_trees(original, modified, exclude=excluded)
    return compute_changes_at(original, modified, differing_paths(old, new))
