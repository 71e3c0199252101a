# ruff: noqa: PTH100, PTH102, PTH103, PTH104, PTH108, PTH110, PTH112, PTH116, PTH118, PTH120
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""The sync engine: :func:`sync_tree` makes a target tree equal to a source tree, crash-safe and
in O(changes); :func:`recover_sync` finishes or undoes a sync cut by a crash (case 09 variant
C); :func:`undo_sync` reverts a finished sync from the backup it kept.

A sync plans disjoint replace roots plus directory metadata changes (:func:`_plan`), copies the
new entries into a staging area on the target's filesystem (:func:`staging_dir_for`), writes a
journal, then swaps each path in with two renames, keeping the replaced entry. The two-phase
commit (:mod:`sandbox_core.tree.staging`) runs the same plan and renames in two halves.

Every rename and metadata change of the target (and of the staging area) goes through
directory descriptors (:class:`~sandbox_core.tree.beneath.Beneath`: no write through a folder
swapped for a symlink, case 44), and each replaced path's stamp, taken when the sync planned
(:mod:`sandbox_core.tree.stamps`), is compared right before its rename: another writer's change
since refuses the sync with everything put back (case 43).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ulid import ULID

from sandbox_core.durable import fsync_dir, write_json_atomic
from sandbox_core.tree import beneath
from sandbox_core.tree.beneath import Beneath
from sandbox_core.tree.copy import _SKIPPED_XATTR_ERRNOS, LinkMap, _move, _remove, copy_entry
from sandbox_core.tree.guards import (
    _APPEND_FL,
    _IMMUTABLE_FL,
    ChangedMeanwhileError,
    FlaggedEntriesError,
    RefusedBeforeWriteError,
    SwappedPathError,
    _inode_flags,
    refuse_mount_points,
)
from sandbox_core.tree.ops import _sibling
from sandbox_core.tree.scan import (
    INNER_STAGING_PREFIX,
    StrPath,
    TreeChanges,
    _ancestors,
    entry_of,
    read_xattrs,
)
from sandbox_core.tree.snapshot import compute_changes, link_closure
from sandbox_core.tree.stamps import Expected, Guard, take

_STAGING_WORD = "sandbox-staging-"
_REMOVED_TAG = "removed-"  # an applied area being removed (_drop_area)
PREPARED_TAG = "prepared-"
"""Follows the staging prefix in the name of a two-phase (prepared) staging area."""
_JOURNAL = "journal.json"
_LOCK = "lock"
_UNDO = "undo.json"
_KEPT = "old"
"""In a sync's ``backup_dir``: the replaced entries, named by the index of their op."""
WRITTEN = "written.json"
"""In a sync's ``backup_dir``: the stamps of what the sync wrote (:func:`record_written`)."""

#: Test-only fault hook: called with the relative path after each path is swapped into the target
#: by :func:`sync_tree`, and with ``""`` once the journal says every path is in (case 09 variant C
#: kills the process from here); :func:`~sandbox_core.tree.staging.apply_staged` calls it from
#: here too. ``None`` in production.
fault_hook: Callable[[str], None] | None = None

ProgressCallback = Callable[[int, int], None]


def _write_journal(path: str, data: object, *, durable: bool = True) -> None:
    """Replace ``path`` by ``data`` as compact JSON via ``path + ".tmp"``
    (:func:`~sandbox_core.durable.write_json_atomic`); ``durable``: fsync the file and its
    directory (else the caller makes them durable, e.g. one ``syncfs``)."""
    write_json_atomic(path, data, durable=durable, pretty=False, tmp_suffix=".tmp")


Meta = dict[str, Any]
"""A directory's own metadata in a journal: ``{"mode", "uid", "gid", "xattrs": {name: hex}}``."""


@dataclass(frozen=True)
class _Op:
    """One step of a sync: replace the entry at ``path`` (with ``new_src`` or nothing), or only
    change a directory's own metadata (``meta`` = (old, new): mode, owner, xattrs)."""

    path: str
    new_src: str | None = None
    had_old: bool = False
    meta: tuple[Meta, Meta] | None = None


def _dir_meta(path: str) -> Meta:
    st = os.lstat(path)
    return {
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "xattrs": {name: value.hex() for name, value in read_xattrs(path).items()},
    }


def _journal_meta(op: dict[str, Any]) -> tuple[Meta, Meta] | None:
    """The (old, new) metadata of a journaled op; journals of older versions hold ``chmod``."""
    if op.get("meta"):
        old, new = op["meta"]
        return old, new
    if op.get("chmod"):
        old_mode, new_mode = op["chmod"]
        return {"mode": old_mode}, {"mode": new_mode}
    return None


def _dir_meta_fd(fd: int) -> Meta:
    """:func:`_dir_meta` of the directory open as ``fd``."""
    st = os.fstat(fd)
    try:
        names = os.listxattr(fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.ENOENT):
            raise
        names = []
    xattrs: dict[str, str] = {}
    for name in names:
        try:
            xattrs[name] = os.getxattr(fd, name).hex()
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.EPERM, errno.ENOTSUP, errno.EACCES):
                raise
    return {"mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid, "xattrs": xattrs}


def _set_dir_meta_fd(fd: int, meta: Meta) -> None:
    """:func:`_set_dir_meta` on the directory open as ``fd`` (never through a symlink)."""
    if set(meta) != {"mode"}:
        with contextlib.suppress(PermissionError):
            os.fchown(fd, meta["uid"], meta["gid"])
        wanted = {name: bytes.fromhex(value) for name, value in meta["xattrs"].items()}
        current = {name: bytes.fromhex(value) for name, value in _dir_meta_fd(fd)["xattrs"].items()}
        for name in current.keys() - wanted.keys():
            with contextlib.suppress(OSError):
                os.removexattr(fd, name)
        for name, value in wanted.items():
            if current.get(name) != value:
                try:
                    os.setxattr(fd, name, value)
                except OSError as exc:
                    if exc.errno not in _SKIPPED_XATTR_ERRNOS:
                        raise
    os.fchmod(fd, meta["mode"])


def _meta_at(fds: Beneath, rel: str, meta: Meta, *, expect: Meta | None = None) -> None:
    """Give directory ``rel`` of ``fds`` the metadata ``meta`` through an ``O_NOFOLLOW``
    descriptor; with ``expect``, first check that it still has those values (else
    :class:`ChangedMeanwhileError`: another writer changed it since the check)."""
    fd = fds.open_dir(rel)
    try:
        if expect is not None:
            now = _dir_meta_fd(fd)
            if {key: now.get(key) for key in expect} != expect:
                raise ChangedMeanwhileError(fds.root, [rel or "."])
        _set_dir_meta_fd(fd, meta)
    finally:
        os.close(fd)


def root_meta(path: StrPath) -> Meta:
    """The own metadata of directory ``path`` (mode, owner and group, xattrs and POSIX ACLs)
    that a commit gives the original's top directory (docs/fidelity.md). An original given as
    a symlink to a directory is read through the link (the trailing slash), as the ops write it."""
    return _dir_meta(os.path.join(os.fspath(path), ""))


def root_change(base: Meta | None, original: StrPath, copy: StrPath) -> tuple[Meta | None, bool]:
    """What a commit does to the original's top directory: ``(meta, conflict)``.

    ``meta`` is the copy's top metadata when the sandbox changed it since ``base`` (the top's
    metadata when the copy was made or reset), else ``None`` (the original's own change, if
    any, is kept). ``conflict`` is True when the original's top changed since ``base`` too, to
    something else (copy_on_write refuses such a commit; the overlay's sandbox wins).
    """
    if base is None:
        return None, False
    ours = root_meta(copy)
    if ours == base:
        return None, False
    theirs = root_meta(original)
    return ours, theirs not in (base, ours)


def _root_ops(target: str, root: Meta | None) -> list[_Op]:
    """The op giving ``target`` itself the metadata ``root`` (none when it has it already)."""
    if root is None:
        return []
    now = root_meta(target)
    return [] if now == root else [_Op("", meta=(now, root))]


def refuse_flagged(target: str, ops: list[_Op]) -> None:
    """Raise :class:`FlaggedEntriesError` when a rename or metadata change of ``ops`` would
    meet an immutable or append-only entry (the entry itself, or the directory it leaves or
    enters), before anything is written."""
    blocked: set[str] = set()
    for op in ops:
        dest = os.path.join(target, op.path) if op.path else target
        if _inode_flags(dest) & (_IMMUTABLE_FL | _APPEND_FL) and (op.had_old or op.meta):
            blocked.add(op.path or ".")
        if op.path and op.meta is None:
            parent = os.path.dirname(dest)
            flags = _inode_flags(parent)
            if flags & _IMMUTABLE_FL or (flags & _APPEND_FL and op.had_old):
                blocked.add(os.path.dirname(op.path) or ".")
    if blocked:
        raise FlaggedEntriesError(target, sorted(blocked))


def staging_dir_for(target: StrPath) -> str:
    """Path for a new staging area of ``target``, on the same filesystem as ``target``.

    A hidden sibling ``<parent>/.<name>.sandbox-staging-<ulid>``; when ``target`` is a mount
    point (its parent is another filesystem) a hidden child ``.sandbox-staging-<ulid>`` instead,
    which scans ignore.
    """
    target_s = os.path.abspath(target)
    if os.stat(os.path.dirname(target_s)).st_dev == os.stat(target_s).st_dev:
        return _sibling(target_s, "staging")
    return os.path.join(target_s, f"{INNER_STAGING_PREFIX}{ULID()}")


def _staging_dirs(target: str) -> list[str]:
    parent, name = os.path.split(target)
    found: list[str] = []
    for folder, prefix, missing in (
        (parent, f".{name}.sandbox-staging-", (FileNotFoundError,)),
        (target, INNER_STAGING_PREFIX, (FileNotFoundError, NotADirectoryError)),
    ):
        # One listing of names (no per-entry objects): the parent of an original may hold
        # thousands of entries, and every rollback and commit lists it.
        with contextlib.suppress(*missing):
            found += [
                os.path.join(folder, entry)
                for entry in os.listdir(folder)  # noqa: PTH208
                if entry.startswith(prefix) and _is_one_shot(entry, prefix)
            ]
    return sorted(found)


def _is_one_shot(name: str, prefix: str) -> bool:
    """A one-shot sync's staging area; two-phase areas (``...-prepared-<key>``) are only ever
    applied or removed by :func:`apply_staged` / :func:`abort_staged` of their key."""
    return name.startswith(prefix) and not name.startswith(prefix + PREPARED_TAG)


def _detour(target: str, rel: str) -> str | None:
    """The highest ancestor of ``rel`` that exists in ``target`` but is not a real directory (a
    symlink or a file put there since the copy was made), else None."""
    found = None
    for anc in _ancestors(rel):
        try:
            st = os.lstat(os.path.join(target, anc))
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            found = anc
    return found


def _plan(source: str, target: str, paths: Iterable[str]) -> list[_Op]:
    """Reduce changed paths to disjoint replace roots plus directory metadata changes."""
    roots: set[str] = set()
    ops: list[_Op] = []
    for rel in sorted(paths):
        if any(a in roots for a in _ancestors(rel)):
            continue
        detour = _detour(target, rel)
        if detour is not None:
            # The target's ancestor is now a symlink or a file: writing below it would follow
            # it out of the tree; the source's ancestor replaces it whole (the source wins).
            if detour not in roots:
                roots.add(detour)
                src_path = os.path.join(source, detour)
                ops.append(
                    _Op(detour, new_src=src_path if os.path.lexists(src_path) else None,
                        had_old=True)
                )  # fmt: skip
            continue
        new, old = entry_of(os.path.join(source, rel)), entry_of(os.path.join(target, rel))
        if new is None and old is None:
            continue
        if new is not None and old is not None and new.kind == old.kind == "dir":
            old_meta = _dir_meta(os.path.join(target, rel))
            new_meta = _dir_meta(os.path.join(source, rel))
            if new_meta != old_meta:
                ops.append(_Op(rel, meta=(old_meta, new_meta)))
            continue
        # A new path whose parent is missing in the target: replace the highest missing
        # ancestor instead, so every rename lands in an existing directory.
        root = rel
        for anc in _ancestors(rel):
            if os.path.lexists(os.path.join(target, anc)):
                break
            root = anc
        if root in roots:
            continue
        roots.add(root)
        src_path = os.path.join(source, root)
        ops.append(
            _Op(
                root,
                new_src=src_path if os.path.lexists(src_path) else None,
                had_old=os.path.lexists(os.path.join(target, root)),
            )
        )
    # Drop ops nested under a root that was promoted after them. Mode changes go last so that a
    # directory made read-only does not block renames into it.
    kept = [op for op in ops if not any(a in roots for a in _ancestors(op.path))]
    return [op for op in kept if op.meta is None] + [op for op in kept if op.meta is not None]


def _journal_ops(ops: list[_Op]) -> list[dict[str, Any]]:
    return [
        {
            "path": op.path,
            "new": op.new_src is not None,
            "old": op.had_old,
            "meta": list(op.meta) if op.meta else None,
        }
        for op in ops
    ]


def _lock(staging: str, *, blocking: bool) -> int | None:
    fd = os.open(os.path.join(staging, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _apply(
    fds: Beneath,
    area: Beneath,
    ops: list[dict[str, Any]],
    progress: ProgressCallback | None,
    expected: Expected | None,
) -> None:
    """Swap each op's paths in, through descriptors (``fds``: the target, ``area``: the staging
    area; no write follows a swapped component). With ``expected``, each replaced path's stamp
    is compared right before its replacement (:class:`ChangedMeanwhileError` on a change, and
    nothing of it replaced); a new entry never replaces one that appeared meanwhile. At the end,
    a directory written into that was moved away meanwhile raises :class:`SwappedPathError`
    (the caller undoes)."""
    total = len(ops)
    for index, op in enumerate(ops):
        rel = op["path"]
        meta = _journal_meta(op)
        if meta is not None:
            _meta_at(fds, rel, meta[1], expect=meta[0] if expected is not None else None)
        else:
            # Each rename is skipped once done, so a two-phase apply resumed after a crash
            # rolls forward from where it stopped (a one-shot sync never meets a done one).
            kept_old, staged_new = f"{_KEPT}/{index}", f"new/{index}"
            old_pending = op["old"] and area.lstat(kept_old) is None
            new_pending = op["new"] and area.lstat(staged_new) is not None
            if expected is not None and (old_pending or (new_pending and not op["old"])):
                changed = expected.changed(fds, rel)
                if changed:
                    raise ChangedMeanwhileError(fds.root, changed)
            if old_pending:
                beneath.rename(fds, rel, area, kept_old, replace=True)
            if new_pending:
                try:
                    beneath.rename(area, staged_new, fds, rel, replace=False)
                except FileExistsError as exc:  # created by another writer since the check
                    raise ChangedMeanwhileError(fds.root, [rel]) from exc
        if fault_hook is not None:
            fault_hook(rel)
        if progress is not None:
            progress(index + 1, total)
    moved = fds.moved()
    if moved:
        raise SwappedPathError(fds.root, moved)


def _undo(fds: Beneath, area: Beneath, ops: list[dict[str, Any]]) -> list[str]:
    """Put every op of an interrupted apply back, newest first (idempotent), through the same
    kind of descriptors as :func:`_apply` (the directories it wrote into, wherever they are).
    Returns the paths whose replaced entry it moved back into ``fds`` (their ctimes moved)."""
    back: list[str] = []
    for index in reversed(range(len(ops))):
        op = ops[index]
        rel = op["path"]
        meta = _journal_meta(op)
        if meta is not None:
            if beneath.is_dir(fds.lstat(rel)):
                _meta_at(fds, rel, meta[0])
            continue
        staged_new, kept_old = f"new/{index}", f"{_KEPT}/{index}"
        if op["new"] and area.lstat(staged_new) is None and fds.lstat(rel) is not None:
            # The new entry was swapped in: move it back (not delete), so a second undo of the
            # same journal sees it staged again and leaves the restored old entry alone.
            beneath.rename(fds, rel, area, staged_new, replace=True)
        if op["old"] and area.lstat(kept_old) is not None:
            beneath.rename(area, kept_old, fds, rel, replace=True)
            back.append(rel)
    return back


def _finish(staging: str, journal: dict[str, Any]) -> None:
    """After a complete apply: hand the replaced entries to ``keep_backup``, drop staging."""
    keep = journal.get("keep_backup")
    ops: list[dict[str, Any]] = journal["ops"]
    if keep:
        # The replaced entries stay named by op index (``old/<index>``): one rename hands them
        # all over, instead of a rename per entry and a mkdir per parent of its path. Redone
        # whole after a crash in between (the staging area still holds ``old``).
        kept_old, dest = os.path.join(staging, "old"), os.path.join(keep, _KEPT)
        if os.path.isdir(kept_old):
            os.makedirs(keep, exist_ok=True)
            _remove(dest)
            _move(kept_old, dest)
        record = {"version": 2, "layout": _KEPT, "ops": ops}
        _write_journal(os.path.join(keep, _UNDO), record)
    _drop_area(staging)


def _is_removed_area(staging: str) -> bool:
    """An applied area whose removal began (:func:`_drop_area` renamed it)."""
    return os.path.split(staging)[1].split(_STAGING_WORD, 1)[-1].startswith(_REMOVED_TAG)


def _drop_area(staging: str) -> None:
    """Remove an applied staging area crash-safely. It is first renamed (one atomic step) to a
    one-shot area's name: a crash in the middle of the removal would otherwise leave a
    two-phase area that has lost its journal but not its name, which :func:`apply_staged`
    cannot tell from a broken one. The renamed area keeps its ``applied`` journal and lock, so
    :func:`recover_sync` finishes its removal after a crash."""
    parent, name = os.path.split(staging)
    head = name[: name.index(_STAGING_WORD) + len(_STAGING_WORD)] if _STAGING_WORD in name else ""
    if head and name.startswith(head + PREPARED_TAG):
        doomed = os.path.join(parent, f"{head}{_REMOVED_TAG}{ULID()}")
        os.rename(staging, doomed)
        fsync_dir(parent)
        staging = doomed
    shutil.rmtree(staging)


def _run(
    target: str,
    ops: list[_Op],
    *,
    keep_backup: str | None,
    progress: ProgressCallback | None,
    expected: Expected,
    on_applied: Callable[[], None] | None = None,
    renew: str | None = None,
) -> None:
    """Stage, journal, apply, finish; on an error undo to the old state and re-raise.
    ``expected``: the stamps of the replaced paths at check time (:func:`stamps.take`),
    compared right before each replacement. ``on_applied`` is called once every path is
    swapped in (``target`` then holds its new state), before the journal records it and the
    staging area is removed. ``renew``: the backup whose kept stamps (:func:`record_written`)
    are renewed for the entries an undo of this run moves back (:func:`undo_sync`; the
    journal names it, so an undo after a crash renews them too)."""
    fds = Beneath(target, follow_root=True)
    try:
        staging = staging_dir_for(target)
        os.mkdir(staging, 0o700)
        area = Beneath(staging)
    except BaseException:
        fds.close()
        raise
    lock_fd = _lock(staging, blocking=True)
    try:
        os.mkdir(os.path.join(staging, "new"))
        os.mkdir(os.path.join(staging, _KEPT))
        links: LinkMap = {}  # one map for every op: a hard-link group is staged as one inode
        for index, op in enumerate(ops):
            if op.new_src is not None:
                copy_entry(op.new_src, os.path.join(staging, "new", str(index)), links)
        journal: dict[str, Any] = {
            "version": 1,
            "target": target,
            "state": "prepared",
            "keep_backup": keep_backup,
            "ops": _journal_ops(ops),
        }
        if renew is not None:
            journal["renew"] = renew
        _write_journal(os.path.join(staging, _JOURNAL), journal)
        _apply(fds, area, journal["ops"], progress, expected)
        if on_applied is not None:
            on_applied()
        journal["state"] = "applied"
        _write_journal(os.path.join(staging, _JOURNAL), journal)
        if fault_hook is not None:
            fault_hook("")
        _finish(staging, journal)
    except BaseException as exc:
        if os.path.isdir(staging):
            _undo_or_fail(
                target, staging, fds, area, refused=isinstance(exc, RefusedBeforeWriteError)
            )
        raise
    finally:
        fds.close()
        area.close()
        if lock_fd is not None:
            os.close(lock_fd)


def _undo_or_fail(target: str, staging: str, fds: Beneath, area: Beneath, *, refused: bool) -> None:
    """Undo an interrupted :func:`_run` through its own descriptors. An undo that fails after
    a refusal is no refusal any more (the target may be half written): it raises a plain
    ``OSError`` saying so, and the journal left behind lets :func:`recover_sync` finish it."""
    try:
        _recover_one(target, staging, locked=True, fds=fds, area=area)
    except Exception as undo_exc:
        if not refused:
            raise
        raise OSError(
            errno.EIO, f"the sync of {target} was refused mid-way and its undo failed: {undo_exc}"
        ) from undo_exc


def _recover_one(
    target: str,
    staging: str,
    *,
    locked: bool = False,
    fds: Beneath | None = None,
    area: Beneath | None = None,
) -> str | None:
    """Recover one staging area; returns what was done or None when a live sync holds it.
    ``fds``/``area``: the descriptors of the interrupted sync, when it is this process's."""
    lock_fd = None
    if not locked:
        if not os.path.exists(os.path.join(staging, _LOCK)):
            shutil.rmtree(staging)
            return "completed" if _is_removed_area(staging) else "discarded"
        lock_fd = _lock(staging, blocking=False)
        if lock_fd is None:
            return None
    try:
        if _is_removed_area(staging):
            shutil.rmtree(staging)  # applied and handed over already: only its removal was cut
            return "completed"
        try:
            with open(os.path.join(staging, _JOURNAL), encoding="utf-8") as handle:
                journal = json.load(handle)
        except FileNotFoundError:
            shutil.rmtree(staging)  # crashed while staging: the target was never touched
            return "discarded"
        if journal["state"] == "applied":
            _finish(staging, journal)
            return "completed"
        with contextlib.ExitStack() as stack:
            if fds is None:
                fds = stack.enter_context(Beneath(target, follow_root=True))
            if area is None:
                area = stack.enter_context(Beneath(staging))
            back = _undo(fds, area, journal["ops"])
        if journal.get("renew") and back:
            _renew_written(journal["renew"], target, back)
        shutil.rmtree(staging)
        return "rolled_back"
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def pending_syncs(target: StrPath) -> list[str]:
    """The staging areas of one-shot syncs of ``target`` that :func:`recover_sync` would look
    at (an interrupted sync, or one running now), sorted; two directory listings."""
    return _staging_dirs(os.path.abspath(target))


def recover_sync(target: StrPath) -> list[str]:
    """Finish or undo every interrupted :func:`sync_tree` of ``target`` (case 09 variant C).

    Reads the on-disk journal of each staging area of ``target``: a sync that had swapped in all
    its paths is completed (its backups handed over, staging removed); one interrupted while
    swapping is undone path by path, so ``target`` ends exactly old or exactly new; one that
    crashed while staging is discarded. Staging areas locked by a live sync are left alone.

    Returns:
        One outcome per staging area found: ``"completed"``, ``"rolled_back"`` or
        ``"discarded"`` (empty when there was nothing to recover).

    Raises:
        OSError: recovery itself failed (safe to retry).
    """
    target_s = os.path.abspath(target)
    outcomes: list[str] = []
    for staging in _staging_dirs(target_s):
        outcome = _recover_one(target_s, staging)
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes


def sync_tree(
    source: StrPath,
    target: StrPath,
    *,
    changes: TreeChanges | None = None,
    on_progress: ProgressCallback | None = None,
    backup_dir: StrPath | None = None,
    exclude: Iterable[str] = (),
    expand_links: bool = True,
    root: Meta | None = None,
) -> TreeChanges:
    """Make directory ``target`` equal to directory ``source``, crash-safe, in O(changes).

    Files, directories, symlinks (as links), special files (recreated, never read), content
    with its holes, permission bits, owners, xattrs and ACLs, deletions and type swaps are
    applied; hard-link groups are kept (case 34: the names of an inode that has a changed name,
    in either tree, are replaced together by one new inode, see :func:`link_closure`). The
    new entries are first copied into a staging area on ``target``'s filesystem (see
    :func:`staging_dir_for`, so a ``source`` on another filesystem is fine: case 09); a journal is
    written; then each changed path is swapped in with two renames, keeping the replaced entry in
    the staging area. An error undoes the swaps already made; a crash is repaired by
    :func:`recover_sync` (called first by every sync). Nothing is left beside ``target``.

    Args:
        source: the tree to copy from.
        target: the existing directory to update.
        changes: the paths to apply (default :func:`compute_changes` of ``target`` ->
            ``source``). Passing a subset syncs only those paths, leaving the rest of
            ``target`` as it is.
        on_progress: called as ``on_progress(done, total)`` after each swapped path.
        backup_dir: when given (must not exist yet), the replaced entries are kept there
            (``old/<op index>`` plus ``undo.json``) so that :func:`undo_sync` can revert the sync.
        exclude: relative paths ignored when computing ``changes``.
        expand_links: add :func:`link_closure` to the changed paths. Pass ``False`` only
            when ``source`` is a partial mirror and the caller already staged the closure
            (a name missing from ``source`` would otherwise be deleted from ``target``).
        root: when given, ``target`` itself gets this metadata (:func:`root_meta`: mode, owner,
            xattrs), journaled and undone like a directory's (see :func:`root_change`).

    Returns:
        The applied :class:`TreeChanges`.

    Raises:
        FileNotFoundError: ``source`` or ``target`` is missing.
        FileExistsError: ``backup_dir`` exists.
        ChangedMeanwhileError: a replaced path changed after the sync planned (another writer,
            case 43); ``target`` is as that writer left it.
        SwappedPathError: a folder of ``target`` became a symlink or was moved away while the
            sync ran (case 44); nothing was written through it, the renames are put back.
        OSError: the sync failed; ``target`` is unchanged.
    """
    source_s, target_s = os.path.abspath(source), os.path.abspath(target)
    for path in (source_s, target_s):
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, "directory not found", path)
    keep = os.path.abspath(backup_dir) if backup_dir is not None else None
    if keep is not None and os.path.lexists(keep):
        raise FileExistsError(errno.EEXIST, "backup directory exists", keep)
    refuse_mount_points(target_s)  # before anything is written: renames cannot cross them
    recover_sync(target_s)
    if changes is None:
        changes = compute_changes(target_s, source_s, exclude=exclude)
    paths = link_closure(source_s, target_s, changes.paths) if expand_links else changes.paths
    ops = _plan(source_s, target_s, paths) + _root_ops(target_s, root)
    # What was checked, read before the entries are opened (refuse_flagged) or copied.
    guard = take(target_s, [op.path for op in ops if op.meta is None])
    refuse_flagged(target_s, ops)
    if keep is not None:
        os.makedirs(keep)
    expected = Expected(guard, [op.path for op in ops if op.meta is None])
    _run(target_s, ops, keep_backup=keep, progress=on_progress, expected=expected)
    return changes


def undo_sync(
    backup_dir: StrPath,
    target: StrPath,
    *,
    on_applied: Callable[[], None] | None = None,
    recovered: bool = False,
) -> None:
    """Revert the :func:`sync_tree` that filled ``backup_dir``: replaced entries come back,
    added ones go, directory modes are reset. Crash-safe like :func:`sync_tree`; the backup is
    left in place (remove it when done). ``on_applied`` is called as soon as ``target`` holds
    its restored state (before the journal records it): a caller may start reading ``target``
    then (see :func:`reset_copy`).

    When :func:`record_written` kept the stamps of what the sync wrote, each path is compared
    with them right before the undo replaces or removes it (through directory descriptors,
    never following a link): a write of another writer since the sync, also one made while
    the undo runs, stops the undo with :class:`ChangedMeanwhileError`, and what the undo had
    already put back is undone in turn, so ``target`` is exactly as the sync left it plus that
    write (docs/concurrency.md). The kept stamps of the entries it moved back are renewed
    (a rename moves an entry's ctime), so a retry compares them again. Without kept stamps the
    stamps are read when the undo starts. An interrupted sync of ``target`` is finished or
    undone first (:func:`recover_sync`), unless ``recovered``: the caller just did so, under
    the same lock (one listing of the original's parent less).

    Raises:
        FileNotFoundError: ``backup_dir`` holds no ``undo.json``.
        ChangedMeanwhileError: a path the undo would replace changed since the sync (its
            ``paths``, relative to ``target``); ``target`` is as the sync left it.
        SwappedPathError: a folder of ``target`` became a symlink or moved while the undo ran;
            nothing was written through it, ``target`` is as the sync left it.
        OSError: the undo failed; ``target`` is unchanged.
    """
    keep, target_s = os.path.abspath(backup_dir), os.path.abspath(target)
    with open(os.path.join(keep, _UNDO), encoding="utf-8") as handle:
        record = json.load(handle)
    refuse_mount_points(target_s)
    if not recovered:
        recover_sync(target_s)
    ops: list[_Op] = []
    by_index = record.get("layout") == _KEPT  # version 1 backups: ``tree/<path>``
    for index in reversed(range(len(record["ops"]))):
        op = record["ops"][index]
        meta = _journal_meta(op)
        if meta is not None:
            ops.append(_Op(op["path"], meta=(meta[1], meta[0])))
            continue
        kept = (
            os.path.join(keep, _KEPT, str(index))
            if by_index
            else os.path.join(keep, "tree", op["path"])
        )
        ops.append(
            _Op(
                op["path"],
                new_src=kept if op["old"] else None,
                had_old=os.path.lexists(os.path.join(target_s, op["path"])),
            )
        )
    # Metadata last, as in a sync: a directory made read-only must not block the renames.
    ops = [op for op in ops if op.meta is None] + [op for op in ops if op.meta is not None]
    roots = [op.path for op in ops if op.meta is None]
    written = _read_written(keep)
    if written is None:
        expected = Expected(take(target_s, roots), roots)
    else:
        expected = Expected(written, roots, own_dirs=True)
    _run(
        target_s, ops, keep_backup=None, progress=None, expected=expected,
        on_applied=on_applied, renew=keep if written is not None else None,
    )  # fmt: skip


def record_written(backup_dir: StrPath, target: StrPath, *, again: bool = False) -> bool:
    """Keep, in ``backup_dir``, the stamps of what the :func:`sync_tree` that filled it wrote
    into ``target`` (:func:`~sandbox_core.tree.stamps.take` of every path it replaced, and of
    every entry below a folder it put in place; a folder's own stamp leaves out what moves
    with its children, so a later write inside shows at that child): :func:`undo_sync`
    compares each path with them right before it undoes it, and :func:`moved_since` tells a
    caller up front. Call right after the sync. One ``lstat`` per entry written.

    Returns:
        False when there is nothing to keep (no undo record), or the stamps are already kept
        and ``again`` is not set.

    Raises:
        OSError: the stamps cannot be read or written.
    """
    keep, target_s = os.path.abspath(backup_dir), os.path.abspath(target)
    record_path, kept = os.path.join(keep, _UNDO), os.path.join(keep, WRITTEN)
    if not os.path.exists(record_path) or (os.path.exists(kept) and not again):
        return False
    with open(record_path, encoding="utf-8") as handle:
        record = json.load(handle)
    roots = [op["path"] for op in record["ops"] if _journal_meta(op) is None]
    _write_journal(kept, take(target_s, roots, own_dirs=True), durable=False)
    return True


def moved_since(backup_dir: StrPath, target: StrPath) -> list[str] | None:
    """The paths of ``target`` changed since :func:`record_written` kept the stamps of the sync
    that filled ``backup_dir`` (sorted, relative; below a folder the sync put in place too),
    or None when no stamps were kept. Reads the same entries by path, one ``lstat`` each.

    Raises:
        OSError: a path cannot be read.
    """
    keep, target_s = os.path.abspath(backup_dir), os.path.abspath(target)
    then = _read_written(keep)
    if then is None:
        return None
    with open(os.path.join(keep, _UNDO), encoding="utf-8") as handle:
        record = json.load(handle)
    roots = [op["path"] for op in record["ops"] if _journal_meta(op) is None]
    now = take(target_s, roots, own_dirs=True)
    return sorted(rel for rel in then.keys() | now.keys() if then.get(rel) != now.get(rel))


def forget_written(backup_dir: StrPath) -> None:
    """Drop the stamps :func:`record_written` kept (the sync was undone: nothing to compare)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(os.path.abspath(backup_dir), WRITTEN))


def _read_written(keep: str) -> Guard | None:
    try:
        with open(os.path.join(keep, WRITTEN), encoding="utf-8") as handle:
            found: Guard = json.load(handle)
    except FileNotFoundError:
        return None
    return found


def _renew_written(keep: str, target: str, roots: list[str]) -> None:
    """After an undo of :func:`undo_sync` put the entries at ``roots`` back as the sync left
    them: their kept stamps (and those below them) are read again, since the renames moved
    their ctimes; a write of another writer elsewhere keeps its old stamp, so a retry still
    sees it. Best effort: a failure only makes the retry refuse these paths too."""
    written = _read_written(keep)
    if written is None:
        return
    again = set(roots)
    renewed = {
        rel: value
        for rel, value in written.items()
        if rel not in again and not any(anc in again for anc in _ancestors(rel))
    }
    try:
        renewed.update(take(target, roots, own_dirs=True))
        _write_journal(os.path.join(keep, WRITTEN), renewed, durable=False)
    except OSError:
        return
