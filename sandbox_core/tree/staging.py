# ruff: noqa: PTH100, PTH102, PTH112, PTH114, PTH116, PTH118, PTH120
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""Two-phase staging: a sync cut into a durable first half and a rename-only second.

:func:`stage_sync` copies the new entries into a staging area named after a key, on the
target's filesystem (:func:`prepared_dir_for`), fsynced, with the stamps of what it will
replace; :func:`verify_staged` tells whether the target changed there since;
:func:`apply_staged` does only the renames (rolled forward after a crash, never undone);
:func:`abort_staged` drops the area. :func:`~sandbox_core.tree.sync.recover_sync` never touches
these areas. :func:`change_digest` describes a change set without staging it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox_core import durable
from sandbox_core.durable import defer_durability, fsync_dir
from sandbox_core.tree import sync
from sandbox_core.tree.beneath import Beneath
from sandbox_core.tree.copy import LinkMap, copy_entry
from sandbox_core.tree.guards import (
    RefusedBeforeWriteError,
    check_key,
    mount_points_inside,
    refuse_mount_points,
)
from sandbox_core.tree.scan import (
    INNER_STAGING_PREFIX,
    StrPath,
    TreeChanges,
    _entry,
    _walk,
    read_xattrs,
)
from sandbox_core.tree.snapshot import link_closure
from sandbox_core.tree.stamps import Expected, take
from sandbox_core.tree.sync import (
    _JOURNAL,
    PREPARED_TAG,
    Meta,
    ProgressCallback,
    _apply,
    _dir_meta,
    _finish,
    _is_removed_area,
    _journal_meta,
    _journal_ops,
    _lock,
    _plan,
    _recover_one,
    _root_ops,
    _staging_dirs,
    _undo,
    _write_journal,
    refuse_flagged,
)

_STAGED = "staged-two-phase"
_APPLYING = "applying-two-phase"
_APPLIED = "applied"


@dataclass(frozen=True)
class StagedSync:
    """What :func:`stage_sync` staged: the staging area's path, the changes it holds and the
    :func:`change_digest`-style digest (``"sha256:<hex>"``) read back from the staged entries."""

    path: str
    changes: TreeChanges
    digest: str


def prepared_dir_for(target: StrPath, key: str) -> str:
    """Where :func:`stage_sync` puts the staging area of ``key`` for ``target``, on
    ``target``'s filesystem: ``<parent>/.<name>.sandbox-staging-prepared-<key>`` (a hidden
    child ``.sandbox-staging-prepared-<key>``, which scans ignore, when ``target`` is a mount
    point). Found again from the key alone, in any process.

    Raises:
        ValueError: ``key`` is not ``[A-Za-z0-9._-]`` (at most 128 characters).
    """
    check_key(key)
    target_s = os.path.abspath(target)
    parent, name = os.path.split(target_s)
    if os.stat(parent).st_dev == os.stat(target_s).st_dev:
        return os.path.join(parent, f".{name}.sandbox-staging-{PREPARED_TAG}{key}")
    return os.path.join(target_s, f"{INNER_STAGING_PREFIX}{PREPARED_TAG}{key}")


def find_prepared(target: StrPath, key: str) -> str | None:
    """The staging area of ``key`` for ``target`` when it exists (either location), else None."""
    check_key(key)
    target_s = os.path.abspath(target)
    parent, name = os.path.split(target_s)
    for path in (
        os.path.join(parent, f".{name}.sandbox-staging-{PREPARED_TAG}{key}"),
        os.path.join(target_s, f"{INNER_STAGING_PREFIX}{PREPARED_TAG}{key}"),
    ):
        if os.path.isdir(path) and not os.path.islink(path):
            return path
    return None


def prepared_keys(target: StrPath, suffix: str = "") -> list[str]:
    """Keys of every two-phase staging area of ``target`` (those ending in ``suffix``)."""
    target_s = os.path.abspath(target)
    parent, name = os.path.split(target_s)
    keys: list[str] = []
    for directory, prefix in (
        (parent, f".{name}.sandbox-staging-{PREPARED_TAG}"),
        (target_s, f"{INNER_STAGING_PREFIX}{PREPARED_TAG}"),
    ):
        with (
            contextlib.suppress(FileNotFoundError, NotADirectoryError),
            os.scandir(directory) as it,
        ):
            keys += [
                i.name[len(prefix) :]
                for i in it
                if i.name.startswith(prefix) and i.name.endswith(suffix)
            ]
    return sorted(keys)


def _replaced(ops: list[dict[str, Any]]) -> list[str]:
    """The paths ``ops`` replace (not those whose metadata alone they change)."""
    return [op["path"] for op in ops if _journal_meta(op) is None]


def _guard_mismatches(target: str, journal: dict[str, Any]) -> list[str]:
    ops: list[dict[str, Any]] = journal["ops"]
    now = take(target, _replaced(ops))
    before: dict[str, Any] = journal["guard"]
    changed = {rel for rel in now.keys() | before.keys() if now.get(rel) != before.get(rel)}
    parents: dict[str, bool] = {}  # many ops share a parent: one stat each
    for op in ops:
        meta = _journal_meta(op)
        dest = os.path.join(target, op["path"])
        if meta is not None:
            if not os.path.isdir(dest) or _dir_meta(dest) != meta[0]:
                changed.add(op["path"])
            continue
        parent = os.path.dirname(dest)
        if parent not in parents:
            parents[parent] = os.path.isdir(parent)
        if not parents[parent]:
            changed.add(op["path"])
    return sorted(changed)


def _fsync_tree(root: str) -> None:
    """Make every file and directory below ``root`` durable (staged data first, so the journal
    that names it is never durable before it): one ``syncfs`` of its filesystem, which costs
    one flush instead of one per staged file, else an fsync of each. Inside
    :func:`deferred_syncfs` the ``syncfs`` is left to its ``flush()``."""
    if defer_durability(os.path.dirname(root)):
        return
    if durable.syncfs(root):
        return
    for _, path, st in _walk(root, ()):
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(root)


def _hash_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest_ops(ops: list[dict[str, Any]], new_root_of: Callable[[int], str]) -> str:
    """``"sha256:<hex>"`` over the exact change ``ops`` make: for each op (in order) the
    directory metadata it sets, or the deletion, or every entry it puts in place with its type,
    mode, owner, device number, link target, xattrs (POSIX ACLs included) and content, plus
    the hard-link groups among the new entries. Times are not part of it (a ``touch`` that
    changes nothing else is no change). Read from ``new_root_of(index)`` for replace ops."""
    records: list[list[Any]] = []
    inodes: dict[tuple[int, int], list[str]] = {}
    for index, op in enumerate(ops):
        meta = _journal_meta(op)
        if meta is not None:
            records.append(["M", op["path"], meta[1]])
            continue
        records.append(["R", op["path"], bool(op["old"]), bool(op["new"])])
        if not op["new"]:
            continue
        root = new_root_of(index)
        walked = [("", root, os.lstat(root))]
        if os.path.isdir(root) and not os.path.islink(root):
            walked += sorted(_walk(root, ()))
        for sub, path, st in walked:
            rel = f"{op['path']}/{sub}" if sub else op["path"]
            entry = _entry(path, st)
            xattrs = sorted((k, v.hex()) for k, v in read_xattrs(path).items())
            content = _hash_file(path) if entry.kind == "file" else None
            records.append(
                ["E", rel, entry.kind, entry.mode, entry.uid, entry.gid, entry.rdev,
                 entry.target, xattrs, content]
            )  # fmt: skip
            if entry.kind != "dir" and st.st_nlink > 1:
                inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
    groups = sorted(sorted(names) for names in inodes.values() if len(names) > 1)
    payload = json.dumps([records, groups], sort_keys=True, ensure_ascii=True,
                         default=str, separators=(",", ":"))  # fmt: skip
    return "sha256:" + hashlib.sha256(payload.encode("utf-8", "surrogateescape")).hexdigest()


def change_digest(
    source: StrPath,
    target: StrPath,
    changes: TreeChanges,
    *,
    expand_links: bool = True,
    root: Meta | None = None,
) -> str:
    """The digest :func:`stage_sync` would return for the same arguments, read from
    ``source`` without staging anything (a plan's review): equal when nothing changed in
    between. A content, type, mode, owner, xattr, link target, hard-link or deletion change
    gives another digest; an mtime alone does not.

    Raises:
        OSError: a tree cannot be read.
    """
    source_s, target_s = os.path.abspath(source), os.path.abspath(target)
    paths = link_closure(source_s, target_s, changes.paths) if expand_links else changes.paths
    ops = _journal_ops(_plan(source_s, target_s, paths) + _root_ops(target_s, root))
    return _digest_ops(ops, lambda index: os.path.join(source_s, ops[index]["path"]))


def stage_sync(
    source: StrPath,
    target: StrPath,
    key: str,
    *,
    changes: TreeChanges,
    backup_dir: StrPath | None = None,
    expand_links: bool = True,
    root: Meta | None = None,
) -> StagedSync:
    """The durable first half of :func:`sync_tree` (two-phase plan commit): copy every new
    entry of ``changes`` into the staging area :func:`prepared_dir_for` ``(target, key)`` on
    ``target``'s filesystem, record the stamps of what the apply will replace, write the
    journal (state ``"staged-two-phase"``) and fsync files, journal and directories.
    ``target`` is not touched.

    The area survives :func:`recover_sync` (which only repairs one-shot syncs): it is applied
    by :func:`apply_staged` or removed by :func:`abort_staged` of the same ``key`` only. The
    caller owns its lifetime (the sandboxes remove theirs in ``cleanup``). An area of ``key``
    that was only staged before is replaced; a failure leaves nothing staged.

    Args: as :func:`sync_tree`; ``key`` names the area (``[A-Za-z0-9._-]``); ``backup_dir``
        (need not be empty now: :func:`apply_staged` fills it) receives the replaced entries
        and ``undo.json`` for :func:`undo_sync`.

    Returns:
        :class:`StagedSync` (its digest is read back from the staged copies).

    Raises:
        FileNotFoundError: ``source`` or ``target`` is missing.
        FileExistsError: an area of ``key`` is being applied or was applied.
        OSError: staging failed (nothing is left staged).
    """
    source_s, target_s = os.path.abspath(source), os.path.abspath(target)
    for path in (source_s, target_s):
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, "directory not found", path)
    refuse_mount_points(target_s)
    existing = find_prepared(target_s, key)
    if existing is not None:
        abort_staged(target_s, key)  # raises FileExistsError once an apply has begun
    paths = link_closure(source_s, target_s, changes.paths) if expand_links else changes.paths
    ops = _plan(source_s, target_s, paths) + _root_ops(target_s, root)
    # What was checked, read before anything else opens the original's entries or copies
    # them: a write of another writer that lands from here on differs from it at apply
    # (docs/concurrency.md).
    guard = take(target_s, [op.path for op in ops if op.meta is None])
    refuse_flagged(target_s, ops)
    staging = prepared_dir_for(target_s, key)
    os.mkdir(staging, 0o700)
    try:
        os.mkdir(os.path.join(staging, "new"))
        os.mkdir(os.path.join(staging, "old"))
        links: LinkMap = {}
        for index, op in enumerate(ops):
            if op.new_src is not None:
                copy_entry(op.new_src, os.path.join(staging, "new", str(index)), links)
        journal_ops = _journal_ops(ops)
        digest = _digest_ops(journal_ops, lambda i: os.path.join(staging, "new", str(i)))
        journal: dict[str, Any] = {
            "version": 1,
            "target": target_s,
            "state": _STAGED,
            "key": key,
            "keep_backup": os.path.abspath(backup_dir) if backup_dir is not None else None,
            "ops": journal_ops,
            "guard": guard,
            "digest": digest,
            "changes": changes.to_dict(),
        }
        _fsync_tree(staging)
        # Inside deferred_syncfs the journal and the area's name become durable with the
        # staged files by the one flush before the decision record; until then recovery only
        # aborts, and abort_staged removes an area whose journal did not reach the disk whole.
        durable = not defer_durability(os.path.dirname(staging))
        _write_journal(os.path.join(staging, _JOURNAL), journal, durable=durable)
        if durable:
            fsync_dir(os.path.dirname(staging))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return StagedSync(staging, changes, digest)


def _read_journal(staging: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(staging, _JOURNAL), encoding="utf-8") as handle:
            data: dict[str, Any] = json.load(handle)
    except FileNotFoundError:
        return None
    return data


def _read_journal_or_staged(staging: str) -> dict[str, Any] | None:
    """The area's journal; one that cannot be parsed counts as only staged: every journal
    written once an apply may begin (``applying``, ``applied``) is fsynced before its rename,
    and the staged one is durable before any decision (deferred: :func:`defer_durability`),
    so a torn journal is one of an area cut before the decision (abort it)."""
    try:
        return _read_journal(staging)
    except ValueError:
        return {"state": _STAGED}


def verify_staged(target: StrPath, key: str) -> list[str]:
    """Paths of ``target`` that changed since :func:`stage_sync` staged ``key`` (stamps:
    content, metadata, links, a rename over them; a new path that now exists; a directory
    whose metadata changed): the apply would overwrite them, so the caller refuses it. Empty
    when nothing changed or the apply has already begun (it is then only rolled forward).
    Call under :func:`lock_tree`.

    Raises:
        FileNotFoundError: nothing is staged under ``key``.
    """
    target_s = os.path.abspath(target)
    staging = find_prepared(target_s, key)
    journal = _read_journal(staging) if staging is not None else None
    if staging is None or journal is None:
        raise FileNotFoundError(errno.ENOENT, f"nothing staged under {key}", target_s)
    if journal["state"] != _STAGED:
        return []
    # A file system mounted inside since prepare: the renames could not cross it (EXDEV).
    mounts = mount_points_inside(target_s)
    return _guard_mismatches(target_s, journal) + mounts


def staged_state(target: StrPath, key: str) -> str | None:
    """The journal state of ``key``'s area (``"staged-two-phase"``, ``"applying-two-phase"``,
    ``"applied"``), or None when there is no complete area."""
    staging = find_prepared(target, key)
    journal = _read_journal_or_staged(staging) if staging is not None else None
    return str(journal["state"]) if journal is not None else None


def apply_staged(
    target: StrPath,
    key: str,
    *,
    on_progress: ProgressCallback | None = None,
    on_applied: Callable[[], None] | None = None,
) -> bool:
    """The second half: swap the entries staged under ``key`` into ``target`` with renames
    (directory metadata last), hand the replaced entries to the backup, remove the area.

    Idempotent: the journal says ``"applying-two-phase"`` before the first rename and every
    rename is skipped once done, so a call after a crash at any point finishes the apply
    exactly (rolls forward; it is never undone: the decision was taken). Call
    :func:`verify_staged` first, under :func:`lock_tree`; each replaced path's stamp is also
    compared with the prepare's right before its rename, through directory descriptors: a
    change there (another writer, a folder swapped for a symlink: cases 43, 44) puts back what
    was renamed, sets the area back to staged and raises the refusal.

    ``on_applied`` runs once every rename is done and the journal says so, before the
    replaced entries are handed over and the area is dropped (again on a resumed call, so it
    must be idempotent): the caller records the apply there, so that an area that is gone
    was always recorded applied first.

    Returns:
        True when an area was applied or finished; False when none exists (already applied,
        or never staged).

    Raises:
        ChangedMeanwhileError: a replaced path changed since prepare (nothing left changed).
        SwappedPathError: a folder became a symlink or moved (nothing left changed).
        OSError: a rename failed (retry; the apply resumes where it stopped).
    """
    target_s = os.path.abspath(target)
    staging = find_prepared(target_s, key)
    if staging is None:
        # Applied before; a crash may have cut the removal of its area (_drop_area).
        for area in _staging_dirs(target_s):
            if _is_removed_area(area):
                _recover_one(target_s, area)
        return False
    lock_fd = _lock(staging, blocking=True)
    try:
        journal = _read_journal(staging)
        if journal is None:
            raise FileNotFoundError(errno.ENOENT, f"staging of {key} is incomplete", staging)
        if journal["state"] == _STAGED:
            journal["state"] = _APPLYING
            _write_journal(os.path.join(staging, _JOURNAL), journal)
        if journal["state"] == _APPLYING:
            _apply_checked(target_s, staging, journal, on_progress)
            journal["state"] = _APPLIED
            _write_journal(os.path.join(staging, _JOURNAL), journal)
            if sync.fault_hook is not None:
                sync.fault_hook("")
        if on_applied is not None:
            on_applied()
        # _finish -> _drop_area renames the area away and fsyncs its parent (a prepared
        # area's name always is renamed): nothing more to make durable here.
        _finish(staging, journal)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
    return True


def _apply_checked(
    target: str, staging: str, journal: dict[str, Any], progress: ProgressCallback | None
) -> None:
    """The renames of an apply, through descriptors, each replaced path's stamp compared with
    the prepare's right before its rename. A change found (another writer since
    :func:`verify_staged`, a folder swapped for a symlink) puts back what was renamed, sets the
    journal back to staged and re-raises the refusal (:class:`RefusedBeforeWriteError`): the
    original is as it was, and the area can be aborted."""
    ops: list[dict[str, Any]] = journal["ops"]
    with Beneath(target, follow_root=True) as fds, Beneath(staging) as area:
        try:
            _apply(fds, area, ops, progress, Expected(journal["guard"], _replaced(ops)))
        except RefusedBeforeWriteError:
            try:
                _undo(fds, area, ops)
            except Exception as undo_exc:
                raise OSError(
                    errno.EIO,
                    f"the apply to {target} was refused mid-way and its undo "
                    f"failed: {undo_exc}; apply again to finish it",
                ) from undo_exc
            journal["state"] = _STAGED
            _write_journal(os.path.join(staging, _JOURNAL), journal)
            raise


def abort_staged(target: StrPath, key: str) -> bool:
    """Remove the staging area of ``key``; ``target`` is untouched. Idempotent.

    Returns:
        True when an area was removed, False when there was none.

    Raises:
        FileExistsError: the area's apply has begun (only :func:`apply_staged` may finish it).
        OSError: the area could not be removed (retry).
    """
    staging = find_prepared(target, key)
    if staging is None:
        return False
    journal = _read_journal_or_staged(staging)
    if journal is not None and journal["state"] != _STAGED:
        raise FileExistsError(
            errno.EEXIST, f"the staged commit {key} is being applied; apply it to finish", staging
        )
    shutil.rmtree(staging)
    fsync_dir(os.path.dirname(staging))
    return True
