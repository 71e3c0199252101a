# ruff: noqa: PTH105, PTH118
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""Baselines of a copied tree: tell a copy's changes from its original's.

A :class:`Baseline` holds stamp snapshots (kind, ctime, inode, link count) of a full copy and
quick-check snapshots of its original, taken when the copy was made (:func:`copy_with_baseline`)
or reset (:func:`reset_copy`); :func:`pending_since` / :func:`read_touched` / :func:`drifted`
compare the trees with it in O(changes) after the walks. Used by copy_on_write and the
overlay's fallback. A baseline given as a function (:data:`BaselineSource`) is read while
``find`` walks.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import marshal
import os
import stat
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sandbox_core.tree.ops import backup_directory
from sandbox_core.tree.scan import StrPath, _ancestors, _entry, _is_excluded
from sandbox_core.tree.snapshot import (
    _OLD_STAMP,
    _snapshot_both,
    compute_changes_at,
    differing_paths,
    link_closure,
    refresh_snapshot,
    signature,
    snapshot_tree,
)
from sandbox_core.tree.sync import Meta, root_meta, sync_tree

_BASELINE_MAGIC_V1 = "sandbox-baseline-1"
_BASELINE_MAGIC = b"sandbox-baseline-2\n"


@dataclass
class Baseline:
    """Snapshots of an original (quick-check signatures) and of its full copy (stamps:
    ``snapshot_tree(stamps=True)``), taken when the copy was made or last reset. ``None`` when
    unknown (a record written by an older version): every path is then a candidate.

    The original's side has no stamps on purpose: undoing an interrupted sync renames entries
    back, which moves their ctime without changing them, and must not read as a change.
    """

    original: dict[str, str] | None
    copy: dict[str, str] | None
    #: The top directory's own metadata (:func:`root_meta`) when the copy was made or reset;
    #: ``None`` in a manifest of an older version (the top is then not committed).
    root: Meta | None = None

    def save(self, path: StrPath) -> None:
        """Write to ``path`` atomically (temp file + rename).

        Format: a magic line, then ``(original, copy, root)`` in :mod:`marshal`'s format,
        which reads and writes the two 13,000-path maps of a rollback in about 60% of the time
        of the NUL-separated text it replaces (and 10x less than JSON). The file is this
        sandbox's private cache: a manifest that cannot be read (another Python, a torn write)
        is reported by :meth:`load`, never trusted.

        Raises:
            ValueError: the baseline is unknown.
            OSError: the file cannot be written.
        """
        if self.original is None or self.copy is None:
            raise ValueError("an unknown baseline cannot be saved")
        tmp = os.fspath(path) + ".tmp"
        with open(tmp, "wb") as handle:
            handle.write(_BASELINE_MAGIC + marshal.dumps((self.original, self.copy, self.root)))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: StrPath) -> Baseline:
        """Read what :meth:`save` wrote (or the NUL-separated text of the previous version); a
        missing file or a manifest of an older version (JSON) gives an unknown baseline.

        Raises:
            OSError: the file cannot be read.
            ValueError: the manifest is corrupt (``"corrupt baseline manifest: <path>"``).
        """
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return cls(None, None)
        if data.startswith(_BASELINE_MAGIC):
            try:
                # Our own private file (the sandbox's directory), never input from a user.
                original, copy, root = marshal.loads(  # noqa: S302
                    memoryview(data)[len(_BASELINE_MAGIC) :]
                )
            except (EOFError, ValueError, TypeError) as exc:
                raise ValueError(f"corrupt baseline manifest: {os.fspath(path)}") from exc
            if not (isinstance(original, dict) and isinstance(copy, dict)):
                raise ValueError(f"corrupt baseline manifest: {os.fspath(path)}")
            return cls(original, copy, root)
        if data.startswith(_BASELINE_MAGIC_V1.encode() + b"\0"):
            return cls._load_v1(data.decode("utf-8", "surrogateescape"), path)
        return cls(None, None)

    @staticmethod
    def _restamp(old: dict[str, str]) -> dict[str, str]:
        """A copy side of the previous version (``"<signature> @<ctime> <inode> <links>"``) as
        :func:`_stamp` text (kind letter, ctime, inode, links, mode, owner, group[, size])."""
        return {rel: _restamp_one(sig) for rel, sig in old.items()}

    @classmethod
    def _load_v1(cls, data: str, path: StrPath) -> Baseline:
        """The NUL-separated fields of the previous version: a magic field, the original's
        ``path, signature`` pairs, an empty field, the copy's pairs, an empty field, the root
        metadata as JSON (or nothing)."""
        fields = data.split("\0")
        cut = fields.index("", 1)
        end = fields.index("", cut + 1)
        if cut % 2 == 0 or (end - cut) % 2 == 0:
            raise ValueError(f"corrupt baseline manifest: {os.fspath(path)}")
        tail = fields[end + 1 : end + 2]
        return cls(
            _pairs(fields, 1, cut),
            cls._restamp(_pairs(fields, cut + 1, end)),
            json.loads(tail[0]) if tail and tail[0] else None,
        )

    @classmethod
    def take(cls, original: StrPath, copy: StrPath, *, exclude: Iterable[str] = ()) -> Baseline:
        """Snapshot both trees now (two walks in parallel)."""
        return cls(*_snapshot_pair(original, copy, exclude))


def _restamp_one(old: str) -> str:
    sig, _, stamp = old.rpartition(_OLD_STAMP)
    fields = sig.split(" ")  # kind, mode, uid, gid[, size, mtime | link target]
    size = f" {fields[4]}" if fields[0] == "f" else ""
    return f"{fields[0]}{stamp} {fields[1]} {fields[2]} {fields[3]}{size}"


def _pairs(fields: list[str], start: int, stop: int) -> dict[str, str]:
    """``fields[start:stop]`` read as ``key, value`` pairs, without copying the list."""
    keys = itertools.islice(fields, start, stop, 2)
    return dict(zip(keys, itertools.islice(fields, start + 1, stop, 2), strict=True))


BaselineSource = Baseline | Callable[[], Baseline]
"""A :class:`Baseline`, or a function that reads one (e.g. ``lambda: Baseline.load(path)``):
then it is read while the walks run (``find`` works in its own process, so reading a 2.4 MB
manifest costs no wall time beside it)."""


def copy_and_snapshot(src: StrPath, dst: StrPath) -> dict[str, str]:
    """:func:`backup_directory` of ``src`` to ``dst`` and, in parallel (``find`` beside ``cp``),
    the quick-check snapshot of ``src`` that a :class:`Baseline` keeps as its original side.

    Taken during the copy: a change to ``src`` meanwhile is then either in the copy and the
    snapshot (nothing to do), or in neither (the original's own change, kept at commit), or in
    one of them (read as the original's change: kept, or a conflict if the sandbox changes it).

    Raises:
        OSError: as :func:`backup_directory` or :func:`snapshot_tree`.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        snapshot = pool.submit(snapshot_tree, src)
        backup_directory(src, dst)
        return snapshot.result()


def copy_with_baseline(src: StrPath, dst: StrPath) -> Baseline:
    """:func:`backup_directory` of ``src`` to ``dst`` and the :class:`Baseline` of the pair.

    As root ``cp -a`` keeps everything a quick-check :func:`signature` holds (type, mode, owner,
    size, mtime, link target), so both sides come from one walk of the copy after the copy,
    which prints each entry's signature and its stamp (one walk instead of two, and no walk
    competing with ``cp`` for the CPU). A change made to ``src`` during the copy is then
    in both the copy and the snapshot (nothing to do) or in neither (the original's own change:
    kept at commit, a conflict if the sandbox changes it too). A sample of the derived
    signatures is checked against the original (``lstat``); when the copy's filesystem lost a
    field (coarser timestamps, squashed owners) the original is walked after all. Without root
    (owners are not kept) the original is walked beside ``cp`` (:func:`copy_and_snapshot`).

    Raises:
        OSError: as :func:`backup_directory` or :func:`snapshot_tree`.
    """
    if os.geteuid() != 0:
        original = copy_and_snapshot(src, dst)
        return Baseline(original, snapshot_tree(dst, stamps=True), root_meta(dst))
    backup_directory(src, dst)
    derived, copy = _snapshot_both(dst)
    if not _signatures_hold(src, derived):
        # The copy's filesystem does not keep every field (coarser timestamps, squashed or
        # mapped owners): walk the original itself.
        derived = snapshot_tree(src)
    return Baseline(derived, copy, root_meta(dst))


_SAMPLE = 64


def _signatures_hold(root: StrPath, snapshot: dict[str, str]) -> bool:
    """Whether the first entries of ``snapshot`` (a sample) have those signatures in ``root``:
    a filesystem that loses a field loses it for every entry, so a sample shows it."""
    root_s = os.fspath(root)
    for rel, sig in itertools.islice(snapshot.items(), _SAMPLE):
        path = os.path.join(root_s, rel)
        try:
            if signature(_entry(path, os.lstat(path))) != sig:
                return False
        except (FileNotFoundError, NotADirectoryError):
            return False
    return True


def _snapshot_pair(
    original: StrPath, copy: StrPath, exclude: Iterable[str]
) -> tuple[dict[str, str], dict[str, str]]:
    excluded = list(exclude)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(snapshot_tree, original, exclude=excluded)
        second = pool.submit(snapshot_tree, copy, exclude=excluded, stamps=True)
        return first.result(), second.result()


def _read_baseline(baseline: BaselineSource) -> Baseline:
    return baseline if isinstance(baseline, Baseline) else baseline()


@dataclass(frozen=True)
class Pending:
    """What changed since a :class:`Baseline`: ``drift`` (paths changed in the original),
    ``touched`` (paths changed in the copy), and the current stamped snapshots."""

    drift: set[str]
    touched: set[str]
    original: dict[str, str]
    copy: dict[str, str]

    @property
    def candidates(self) -> set[str]:
        """Every path that may differ between the two trees now."""
        return self.drift | self.touched


def pending_since(
    baseline: BaselineSource,
    original: StrPath,
    copy: StrPath,
    *,
    exclude: Iterable[str] = (),
    restore_original: Callable[[Callable[[], None]], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
    check: Callable[[], None] | None = None,
) -> Pending:
    """One C-speed walk of each tree, compared with ``baseline`` by set operations: O(changes)
    after the walks. An unknown baseline counts every path of the copy as touched. A
    ``baseline`` given as a function is read while the walks run; ``restore_original``,
    ``meanwhile`` and ``check`` as in :func:`reset_copy`.

    Raises:
        OSError: a tree cannot be read (or the baseline, when read here), or
            ``restore_original`` failed.
        Exception: whatever ``check`` raised (nothing was written).
    """
    excluded = list(exclude)
    with ThreadPoolExecutor(max_workers=2) as pool:  # ``find`` runs in its own process
        copy_walk = pool.submit(snapshot_tree, copy, exclude=excluded, stamps=True)
        original_walk: list[Future[dict[str, str]]] = []

        def walk_original() -> None:
            if not original_walk:
                original_walk.append(pool.submit(snapshot_tree, original, exclude=excluded))

        if restore_original is None:
            walk_original()
        if check is not None:
            check()  # while the walks run; before anything is written
        if restore_original is not None:
            restore_original(walk_original)
        walk_original()
        if meanwhile is not None:
            meanwhile()
        loaded = _read_baseline(baseline)
        now_original, now_copy = original_walk[0].result(), copy_walk.result()
    if loaded.original is None or loaded.copy is None:
        return Pending(set(), set(now_original) | set(now_copy), now_original, now_copy)
    return Pending(
        differing_paths(loaded.original, now_original),
        differing_paths(loaded.copy, now_copy),
        now_original,
        now_copy,
    )


def touched_since(
    baseline: Baseline, copy: StrPath, *, exclude: Iterable[str] = ()
) -> set[str] | None:
    """Paths changed in ``copy`` since ``baseline`` (its stamped side): one C-speed walk of the
    copy alone, the ``touched`` of :func:`pending_since` without walking the original (a commit
    needs the original only at these paths, see :func:`drifted`). ``None`` when the baseline is
    unknown (then use :func:`pending_since`, which counts every path of both trees).

    Raises:
        OSError: the copy cannot be read.
    """
    if baseline.original is None or baseline.copy is None:
        return None
    return differing_paths(baseline.copy, snapshot_tree(copy, exclude=exclude, stamps=True))


def read_touched(
    baseline: BaselineSource, copy: StrPath, *, exclude: Iterable[str] = ()
) -> tuple[Baseline, set[str] | None]:
    """:func:`touched_since` with ``baseline`` read while the copy is walked; returns the
    baseline read too.

    Raises:
        OSError: the copy (or the baseline) cannot be read.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        walk = pool.submit(snapshot_tree, copy, exclude=list(exclude), stamps=True)
        loaded = _read_baseline(baseline)
        now = walk.result()
    if loaded.original is None or loaded.copy is None:
        return loaded, None
    return loaded, differing_paths(loaded.copy, now)


def drifted(
    baseline: Baseline, original: StrPath, paths: Iterable[str], *, exclude: Iterable[str] = ()
) -> set[str]:
    """Those of ``paths`` changed in ``original`` since ``baseline``: the ``drift`` of
    :func:`pending_since` restricted to ``paths``, by one ``lstat`` per path instead of a walk of
    the whole original (the quick-check :func:`signature` computed here equals ``find``'s).
    An unknown baseline counts nothing as drift (as :func:`pending_since` does).

    Raises:
        OSError: a path of ``original`` cannot be examined.
    """
    if baseline.original is None:
        return set()
    excluded = frozenset(exclude)
    root = os.fspath(original)
    real_dirs: dict[str, bool] = {}

    def real_dir(rel: str) -> bool:  # a walk enters only real directories, never symlinks
        if rel not in real_dirs:
            try:
                real_dirs[rel] = stat.S_ISDIR(os.lstat(os.path.join(root, rel)).st_mode)
            except (FileNotFoundError, NotADirectoryError):
                real_dirs[rel] = False
        return real_dirs[rel]

    out: set[str] = set()
    for rel in paths:
        if _is_excluded(rel, excluded):
            continue  # never walked, so never drift
        path = os.path.join(root, rel)
        now: str | None = None
        if all(real_dir(anc) for anc in _ancestors(rel)):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                now = signature(_entry(path, os.lstat(path)))
        if baseline.original.get(rel) != now:
            out.add(rel)
    return out


def reset_copy(
    baseline: BaselineSource,
    original: StrPath,
    copy: StrPath,
    *,
    exclude: Iterable[str] = (),
    restore_original: Callable[[Callable[[], None]], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
    check: Callable[[], None] | None = None,
) -> Baseline:
    """Make ``copy`` equal to ``original`` again (rollback of a copy-based sandbox) and return
    the new baseline. Only the paths that differ are synced (O(changes) copies), and the copy's
    snapshot is refreshed at those paths instead of being re-taken by a third walk. A
    ``baseline`` given as a function is read while the walks run.

    Rollback from COMMITTED passes the undo of the commit as ``restore_original``: it changes
    only the original, so it runs while the copy is walked. It is called with a function to
    call as soon as the original holds its restored state (``undo_sync``'s ``on_applied``):
    the original's walk starts then (else when ``restore_original`` returns), while the undo
    journals and tidies up. ``meanwhile`` (e.g. removing the used backup) runs once
    ``restore_original`` returned, while the original is walked (the walks, not the undo,
    set a rollback's time). ``check`` (e.g. the busy check of a rollback: a scan of
    ``/proc``) runs while the walks run, before ``restore_original`` and before anything is
    written: what it raises stops the reset with nothing changed.

    Raises:
        OSError: a tree cannot be read, ``restore_original`` failed (the copy is then
            untouched) or the sync failed (the copy is then unchanged).
    """
    pending = pending_since(
        baseline,
        original,
        copy,
        exclude=exclude,
        restore_original=restore_original,
        meanwhile=meanwhile,
        check=check,
    )
    changes = compute_changes_at(copy, original, pending.candidates)
    top = root_meta(original)
    if not changes.is_empty or root_meta(copy) != top:
        replaced = link_closure(original, copy, changes.paths)
        sync_tree(original, copy, changes=changes, root=top)
        refresh_snapshot(pending.copy, copy, replaced)
    return Baseline(pending.original, pending.copy, top)
