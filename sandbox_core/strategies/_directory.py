"""Two-phase commit of the directory strategies: the sandbox's side.

``copy_on_write`` and ``overlay`` (both modes) prepare, apply and abort through these functions;
the filesystem work is :func:`~sandbox_core.tree.staging.stage_sync` /
:func:`~sandbox_core.tree.staging.apply_staged` / :func:`~sandbox_core.tree.staging.abort_staged`.

Names: the staging area is ``prepared_dir_for(original, "<txid>.<sandbox_id>")``, a hidden
sibling of the original on its filesystem (a hidden child when the original is a mount point),
so two sandboxes of one original in one plan never share one. The sandbox keeps a record
``<sandbox dir>/prepared-<txid>.json`` (``state``: ``prepared`` -> ``applied``, the staged
``digest`` and the ``CommitResult``), written atomically, so that apply and abort work from the
txid alone in a fresh process (reopened sandbox). Durable ordering:

- prepare: stage, then write the record ``prepared``; a failure removes both. Alone, each is
  fsynced; inside a plan's ``deferred_syncfs`` block (the two-phase coordinator) neither pays
  its own fsync: the plan's one ``syncfs`` per filesystem (staging areas' and records') before
  its decision record makes them durable. A crash before that may leave a torn staging journal
  or record: abort, a new prepare and cleanup take it for ``prepared`` (nothing was applied).
- apply: under ``lock_tree(original)``, while the area's journal says it is only staged, the
  original is first checked (stamps of every path the apply replaces, taken at prepare: a
  concurrent change refuses with ``SandboxCommitError(conflicts=[...])`` and nothing touched)
  and the old pre-commit backup is dropped; then ``apply_staged`` writes its journal
  ``applying`` (fsynced) before the first rename, renames (rolled forward after a crash),
  writes ``applied``, and only then the record says ``applied`` (fsynced), before the replaced
  entries are handed over and the area is dropped: an area gone under a ``prepared`` record
  was never applied. An ``applied`` record returns its result (finishing the area's removal
  if a crash cut it). A record ``applying`` of an earlier version is rolled forward the same.
  The replaced entries are kept in the strategy's pre-commit backup exactly as the one-shot
  commit keeps them, so ``rollback()`` from COMMITTED (compensation) works the same.
- abort: removes the area and the record; idempotent; refused (``SandboxError``) once the apply
  has begun (after the decision only apply may finish it).
- ``recover_sync`` (run by every one-shot sync and commit) never touches these areas. When the
  plan's journal is lost, the sandbox's ``cleanup()`` removes its staged areas (and finishes
  the bookkeeping of one whose renames all landed); a half-applied one makes cleanup fail with
  a ``SandboxError`` naming the txid to apply.
- interrupted, then rolled back or cleaned up: :func:`finish_interrupted` (run first by the
  sandbox's ``rollback()`` and ``cleanup()``) rolls forward every apply of the sandbox that
  began (:func:`unfinished_applies`: the decision was taken), then finishes or undoes an
  interrupted one-shot sync of the original (``recover_sync``), so neither leaves the original
  half-committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox_core.durable import defer_durability, write_json_atomic
from sandbox_core.errors import (
    SandboxCommitError,
    SandboxError,
    SandboxForkError,
    SandboxRollbackConflictError,
    SandboxRollbackError,
    SandboxStateError,
)
from sandbox_core.protocol import ChangeSummary, CommitResult, ForkSource, PreparedCommit
from sandbox_core.strategies.base import BaseSandbox, logger
from sandbox_core.strategies.resource_faults import resource_fault
from sandbox_core.tree.baseline import Baseline
from sandbox_core.tree.guards import RefusedBeforeWriteError, check_key, lock_tree
from sandbox_core.tree.scan import TreeChanges
from sandbox_core.tree.snapshot import compute_changes_at, differing_paths, snapshot_tree
from sandbox_core.tree.staging import (
    abort_staged,
    apply_staged,
    prepared_keys,
    stage_sync,
    staged_state,
    verify_staged,
)
from sandbox_core.tree.sync import (
    WRITTEN,
    Meta,
    forget_written,
    moved_since,
    pending_syncs,
    record_written,
    recover_sync,
    root_meta,
    sync_tree,
    undo_sync,
)
from sandbox_core.tree.textdiff import change_stats

PREPARED, APPLYING, APPLIED = "prepared", "applying", "applied"
_AREA_STAGED = "staged-two-phase"  # staged_state() of an area whose apply has not begun

fault_hook: Callable[[str], None] | None = None
"""Tests only: called with ``"before_applied_record"`` once the renames and ``after`` (the
kernel overlay's remount) are done, before the ``applied`` record is written (a crash point)."""
_RECORD_PREFIX = "prepared-"


def key_for(sandbox: BaseSandbox, txid: str) -> str:
    """The staging key of ``txid`` for this sandbox: ``<txid>.<sandbox_id>``.

    Raises:
        ValueError: ``txid`` is not ``[A-Za-z0-9._-]`` (path traversal refused).
    """
    key = f"{txid}.{sandbox.sandbox_id}"
    check_key(key)
    return key


def _record_path(home: Path, txid: str) -> Path:
    return home / f"{_RECORD_PREFIX}{txid}.json"


def read_record(home: Path, txid: str) -> dict[str, Any] | None:
    """The sandbox's record of ``txid``, or None."""
    try:
        data: dict[str, Any] = json.loads(_record_path(home, txid).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return data


def _read_record_or_prepared(home: Path, txid: str) -> dict[str, Any] | None:
    """The record of ``txid``; one that cannot be parsed counts as ``prepared``: the records
    written once an apply may begin are fsynced before their rename, and the ``prepared`` one
    is durable before any decision (deferred: see :func:`prepare`), so a torn record is one of
    a prepare cut before the decision (only abort or a new prepare may follow)."""
    try:
        return read_record(home, txid)
    except ValueError:
        return {"txid": txid, "state": PREPARED}


def _write_record(home: Path, txid: str, record: dict[str, Any], *, durable: bool = True) -> None:
    """Write the record atomically; ``durable``: fsync it and ``home`` (else the caller's
    ``deferred_syncfs`` flush makes it durable)."""
    write_json_atomic(
        _record_path(home, txid), record, durable=durable, pretty=False, tmp_suffix=".tmp"
    )


def txids_in(home: Path, state: str) -> list[str]:
    """Txids whose record in ``home`` has ``state``, sorted."""
    return _txids_by_state(home).get(state, [])


def _txids_by_state(home: Path) -> dict[str, list[str]]:
    """Every txid with a readable record in ``home``, by the record's state (each sorted); one
    listing of ``home``."""
    found: dict[str, list[str]] = {}
    try:
        names = os.listdir(home)  # noqa: PTH208
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return found
    for name in sorted(names):
        if not (name.startswith(_RECORD_PREFIX) and name.endswith(".json")):
            continue
        txid = name[len(_RECORD_PREFIX) : -len(".json")]
        try:
            record = read_record(home, txid)
        except ValueError:
            continue  # torn: a prepare cut before its decision, never applied
        if record is not None:
            found.setdefault(str(record.get("state")), []).append(txid)
    return found


def apply_begun(sandbox: BaseSandbox, home: Path, original: Path) -> list[str]:
    """Txids of this sandbox whose apply has begun and is not recorded ``applied`` (a decided
    apply cut short: only ``apply_prepared`` may finish it), sorted."""
    records = _txids_by_state(home)
    found = list(records.get(APPLYING, []))  # a record of an earlier version
    for txid in records.get(PREPARED, []):
        try:
            key = key_for(sandbox, txid)
        except ValueError:
            continue
        state = staged_state(original, key)
        if state is not None and state != _AREA_STAGED:
            found.append(txid)
    return sorted(found)


def summary(
    sandbox: BaseSandbox,
    old_root: Path,
    new_root: Path,
    changes: TreeChanges,
    digest: str,
    conflicts: list[str],
    *,
    count_lines: bool = True,
) -> ChangeSummary:
    """The :class:`ChangeSummary` of ``changes`` (``old_root``: the original; ``new_root``: the
    tree whose content would land); ``count_lines=False`` leaves the line counts at 0."""
    lines_added, lines_removed, size = change_stats(old_root, new_root, changes, lines=count_lines)
    return ChangeSummary(
        sandbox_id=sandbox.sandbox_id,
        resource_id=sandbox.resource_id,
        strategy=sandbox.strategy,
        digest=digest,
        added=list(changes.added),
        changed=list(changes.changed),
        deleted=list(changes.deleted),
        lines_added=lines_added,
        lines_removed=lines_removed,
        bytes_changed=size,
        conflicts=list(conflicts),
    )


def prepare(
    sandbox: BaseSandbox,
    home: Path,
    txid: str,
    original: Path,
    source: Path,
    changes: TreeChanges,
    *,
    backup_dir: Path,
    result: CommitResult,
    expand_links: bool = True,
    root: Meta | None = None,
) -> PreparedCommit:
    """Stage ``changes`` from ``source`` for ``original`` under ``txid`` and record it;
    ``root``: the metadata ``original`` itself gets (``stage_sync``), or None.

    Raises:
        SandboxStateError: ``txid`` is already being applied or was applied.
        OSError: staging failed (nothing is left staged).
    """
    key = key_for(sandbox, txid)  # validates txid before it names a file
    record = _read_record_or_prepared(home, txid)
    if record is not None and record.get("state") != PREPARED:
        raise SandboxStateError(
            f"commit {txid} of sandbox {sandbox.sandbox_id} is already {record.get('state')}"
        )
    try:
        staged = stage_sync(
            source, original, key, changes=changes, backup_dir=backup_dir,
            expand_links=expand_links, root=root,
        )  # fmt: skip
    except FileExistsError as exc:
        raise SandboxStateError(f"commit {txid} of sandbox {sandbox.sandbox_id}: {exc}") from exc
    try:
        # Paths and bytes only: the line counts are the review's figures (sandbox.review());
        # counting them here re-read both sides of every changed file on the commit's path.
        review = summary(sandbox, original, source, changes, staged.digest, [], count_lines=False)
        # Inside a plan's deferred_syncfs the record is made durable with the staged files by
        # the one flush before the decision record (until the decision only abort may follow,
        # and abort takes a torn record for a prepared one).
        _write_record(
            home, txid,
            {"txid": txid, "state": PREPARED, "digest": staged.digest,
             "staging": staged.path, "result": result.to_dict()},
            durable=not defer_durability(home),
        )  # fmt: skip
    except BaseException:
        abort_staged(original, key)
        _record_path(home, txid).unlink(missing_ok=True)
        raise
    return PreparedCommit(
        sandbox_id=sandbox.sandbox_id,
        txid=txid,
        digest=staged.digest,
        summary=review,
        details={"strategy": sandbox.strategy, "staging": staged.path},
    )


def apply(
    sandbox: BaseSandbox,
    home: Path,
    txid: str,
    original: Path,
    *,
    backup_dir: Path,
    before: Callable[[], None] | None = None,
    after: Callable[[], None] | None = None,
    refused: Callable[[], None] | None = None,
) -> CommitResult:
    """Apply the commit staged under ``txid`` (see the module docstring). ``before`` runs
    right before the renames and ``after`` right after them (the kernel overlay unmounts and
    remounts there); both must be idempotent. ``refused`` runs when the renames were refused
    and put back (the kernel overlay remounts its layers as they were).

    Raises:
        SandboxCommitError: nothing prepared under ``txid``, or a staged path changed in the
            original since prepare, also right before its rename (``conflicts``; nothing
            touched).
        OSError: a step failed (retry: the apply resumes).
    """
    key = key_for(sandbox, txid)  # validates txid before it names a file
    record = read_record(home, txid)
    if record is None:
        raise SandboxCommitError(
            f"nothing is prepared under {txid} for sandbox {sandbox.sandbox_id}"
        )
    result = CommitResult.from_dict(record["result"])
    if record["state"] == APPLIED:
        with lock_tree(original):
            # A crash may have cut the hand-over or the area's removal: only those are redone.
            apply_staged(original, key)
        return result

    def applied() -> None:
        if after is not None:
            after()
        if fault_hook is not None:
            fault_hook("before_applied_record")
        if record["state"] != APPLIED:
            record["state"] = APPLIED
            _write_record(home, txid, record)

    with lock_tree(original):
        # The staging journal (fsynced ``applying`` before the first rename) says whether the
        # apply has begun; the record only says ``applied``, written before the area is
        # dropped, so an area gone under a ``prepared`` record was never applied.
        if record["state"] == PREPARED and staged_state(original, key) in (None, _AREA_STAGED):
            try:
                changed = verify_staged(original, key)
            except FileNotFoundError as exc:
                raise SandboxCommitError(
                    f"the staged commit {txid} of sandbox {sandbox.sandbox_id} is gone: {exc}"
                ) from exc
            if changed:
                raise SandboxCommitError(
                    f"apply of {txid} to sandbox {sandbox.sandbox_id} refused: {len(changed)} "
                    f"path(s) changed in the original since prepare: {', '.join(changed[:10])}",
                    conflicts=changed,
                )
            if backup_dir.exists():
                shutil.rmtree(backup_dir)  # a previous commit's, as the one-shot commit drops it
        if before is not None:
            before()
        try:
            landed = apply_staged(original, key, on_applied=applied)
        except RefusedBeforeWriteError as exc:
            # Another writer or a swapped folder met right before a rename: everything was
            # put back and the area is staged again (cases 43, 44).
            if refused is not None:
                refused()
            raise SandboxCommitError(
                f"apply of {txid} to sandbox {sandbox.sandbox_id} refused: {exc}",
                conflicts=exc.paths,
            ) from exc
        if not landed:
            applied()  # an ``applying`` record of an earlier version whose area was dropped
        record_committed(backup_dir, original)  # for a rollback from COMMITTED (case 43 B)
    return result


def abort(sandbox: BaseSandbox, home: Path, txid: str, original: Path) -> None:
    """Remove what ``prepare`` staged under ``txid`` and its record; idempotent.

    Raises:
        SandboxError: the apply has begun (only apply may finish it).
    """
    key = key_for(sandbox, txid)  # validates txid before it names a file
    record = _read_record_or_prepared(home, txid)
    if record is not None and record.get("state") != PREPARED:
        raise SandboxError(
            f"commit {txid} of sandbox {sandbox.sandbox_id} is {record.get('state')}: "
            "it can only be applied (apply_prepared)"
        )
    try:
        abort_staged(original, key)
    except FileExistsError as exc:
        raise SandboxError(f"cannot abort {txid}: {exc}") from exc
    _record_path(home, txid).unlink(missing_ok=True)


def unfinished_applies(sandbox: BaseSandbox, home: Path, original: Path) -> list[str]:
    """Txids to roll forward before a rollback or cleanup: applies that began and are not
    recorded ``applied`` (:func:`apply_begun`), and, while the sandbox is still CREATED or
    ACTIVE, applies recorded ``applied`` whose sandbox never heard of it (the process died
    before saving COMMITTED; ``rollback()`` from COMMITTED forgets the records it undid)."""
    found = set(apply_begun(sandbox, home, original))
    if sandbox.status.can_commit:
        found.update(txids_in(home, APPLIED))
    return sorted(found)


def finish_interrupted(
    sandbox: BaseSandbox,
    home: Path,
    original: Path,
    roll_forward: Callable[[str], None],
    *,
    syncs: bool = True,
) -> None:
    """Finish what an interrupted commit of ``sandbox`` left in ``original`` (see the module
    docstring): ``roll_forward(txid)`` for each of :func:`unfinished_applies`, then, with
    ``syncs``, ``recover_sync(original)`` under ``lock_tree`` (the kernel overlay passes False
    while its lower directory is mounted: it is never written then). Nothing when the original
    is gone.

    Raises:
        OSError: an interrupted sync could not be finished nor undone (safe to retry).
        SandboxError: an apply could not be rolled forward (safe to retry).
    """
    if not original.is_dir():
        return
    for txid in unfinished_applies(sandbox, home, original):
        roll_forward(txid)
    if syncs:
        with lock_tree(original):
            recover_sync(original)


def has_interrupted(sandbox: BaseSandbox, home: Path, original: Path) -> bool:
    """Whether :func:`finish_interrupted` may write ``original``: an apply to roll forward
    (:func:`unfinished_applies`) or a one-shot sync's staging area beside it."""
    if not original.is_dir():
        return False
    return bool(pending_syncs(original) or unfinished_applies(sandbox, home, original))


def discard_all(sandbox: BaseSandbox, original: Path) -> None:
    """Cleanup: remove every staged area of this sandbox (a plan journal lost); one whose
    renames all landed only has its bookkeeping finished.

    Raises:
        SandboxError: an area is half applied (apply its txid first).
    """
    suffix = f".{sandbox.sandbox_id}"
    for key in prepared_keys(original, suffix):
        state = staged_state(original, key)
        if state == APPLIED:
            apply_staged(original, key)  # only moves kept entries and drops the area
        elif state is not None and state != _AREA_STAGED:
            raise SandboxError(
                f"sandbox {sandbox.sandbox_id}: commit {key.removesuffix(suffix)} is half "
                "applied to the original; apply_prepared it (or recover the plan) first"
            )
        else:
            abort_staged(original, key)


def forget_applied(home: Path) -> None:
    """Drop the records of applied commits (their effect was just undone by a rollback from
    COMMITTED, so a later apply of the same txid must not answer with the old result)."""
    for txid in txids_in(home, APPLIED):
        _record_path(home, txid).unlink(missing_ok=True)


def landed(source: Path, original: Path, changes: TreeChanges, root: Meta | None) -> bool:
    """After a one-shot sync of ``changes`` from ``source`` that raised: does ``original`` hold
    every change (the fault came after the last rename, while the replaced entries were handed
    over, so the commit stands)? False when the sync was undone, or cut in the middle with its
    undo cut too (its journal then makes the next ``recover_sync`` undo it).

    Raises:
        OSError: a tree cannot be read.
    """
    if changes.paths and not compute_changes_at(original, source, changes.paths).is_empty:
        return False
    return root is None or root_meta(original) == root


def save_reset_baseline(baseline: Baseline, path: Path, sandbox_id: str) -> None:
    """Save the baseline a rollback re-took once the copy was reset. A full or read-only
    file system at this point keeps the previous manifest (the tmp file removed): the reset
    has landed, and the older manifest only makes the next commit compare more paths (a path
    the original changed before the reset can show as a conflict, never as a lost write).

    Raises:
        OSError: any other failure to write it.
    """
    try:
        baseline.save(path)
    except OSError as exc:
        if resource_fault(exc) is None:
            raise
        Path(f"{path}.tmp").unlink(missing_ok=True)
        logger.warning("sandbox %s rolled back; its manifest was kept: %s", sandbox_id, exc)


def tidy_after_fault(original: Path) -> None:
    """After a one-shot sync stopped by a full or read-only file system: finish what it left
    beside ``original`` (:func:`~sandbox_core.tree.sync.recover_sync`: an area cut before its
    lock or journal is removed, one cut mid-swap is undone), so nothing stays on the volume.
    Best effort: a volume still read-only keeps the area for the next sync to recover. Call
    with the original's lock held and, in kernel mode, while the overlay is unmounted."""
    with contextlib.suppress(OSError):
        recover_sync(original)


# -- rollback from COMMITTED: has the original moved since the commit? (case 43 B) --------------
#
# Right after a commit (one-shot or two-phase apply) the stamps of every path it wrote are kept
# beside its undo record (``written.json`` in the backup: ``tree.sync.record_written``). A
# rollback from COMMITTED compares them with the original first and refuses, naming the paths,
# when any moved; the undo then compares each path with them again right before it replaces
# or removes it (``tree.sync.undo_sync``), so a write made while the undo runs is a conflict
# too: what the undo had put back is undone in turn, the original is as the commit left it
# plus that write, and the sandbox stays COMMITTED (docs/concurrency.md).

LEGACY_STAMPS = "committed.json"
"""The stamps an earlier version kept (a different format): compared up front only."""
_UNDO_RECORD = "undo.json"


def record_committed(backup_dir: Path, original: Path) -> None:
    """Keep the stamps of what the commit whose undo record is in ``backup_dir`` wrote (call
    right after the commit; nothing when it kept no undo record, or kept them already)."""
    try:
        record_written(backup_dir, original)
    except OSError as exc:
        # The commit has landed; a full or read-only disk only costs the later rollback its
        # checks for writes made since (it then goes on, as for a commit that kept no stamps).
        if resource_fault(exc) is None:
            raise
        with contextlib.suppress(OSError):
            Path(backup_dir, f"{WRITTEN}.tmp").unlink(missing_ok=True)
        logger.warning("stamps of the commit into %s not kept: %s", original, exc)


def _conflict(sandbox: BaseSandbox, original: Path, moved: list[str], when: str, then: str) -> None:
    raise SandboxRollbackConflictError(
        f"rollback of sandbox {sandbox.sandbox_id} refused: {len(moved)} path(s) of "
        f"{original} changed {when}: {', '.join(moved[:10])}; undoing the commit would "
        f"discard those later writes. {then}; the sandbox stays COMMITTED",
        conflicts=moved,
    )


def refuse_if_moved(sandbox: BaseSandbox, backup_dir: Path, original: Path) -> None:
    """Refuse a rollback from COMMITTED when the original moved since the commit at a path the
    undo would put back (case 43 B). Nothing to compare (no stamps: an older sandbox, or a
    commit that wrote nothing) lets the rollback go on.

    Raises:
        SandboxRollbackConflictError: ``conflicts`` are the moved paths; nothing was changed.
    """
    if not (backup_dir / _UNDO_RECORD).exists():
        return
    moved = moved_since(backup_dir, original)
    if moved is None:
        moved = _legacy_moved(backup_dir, original)
    if moved:
        _conflict(sandbox, original, moved, "since the commit", "Nothing was changed")


def undo_commit(
    sandbox: BaseSandbox, backup_dir: Path, original: Path, restored: Callable[[], None]
) -> bool:
    """Undo the commit whose backup is ``backup_dir`` (``tree.sync.undo_sync``; ``restored``
    as its ``on_applied``), first finishing or undoing a sync of ``original`` a crash cut
    (case 20: only a finished one leaves an undo record). Call with nothing mounted on
    ``original``. Returns whether a commit was undone (False: it kept no undo record).

    Raises:
        SandboxRollbackConflictError: another writer changed, created or removed a path the
            undo puts back, found right before that path was replaced (also while the undo
            ran); what the undo had put back was undone in turn: the original is as the
            commit left it plus that write (``conflicts``: the paths).
        OSError: the undo failed and was undone (the original as the commit left it).
    """
    recover_sync(original)
    if not (backup_dir / _UNDO_RECORD).exists():
        return False
    try:
        undo_sync(backup_dir, original, on_applied=restored, recovered=True)
    except RefusedBeforeWriteError as exc:
        _conflict(
            sandbox, original, list(exc.paths), "while the rollback ran",
            "What the rollback had put back was undone again: the original is as the commit "
            "left it, with those writes",
        )  # fmt: skip
    # Undone: a retry (the backup's removal failed) must not compare again.
    forget_written(backup_dir)
    (backup_dir / LEGACY_STAMPS).unlink(missing_ok=True)
    return True


Stamp = list[Any]


def _legacy_stamp(st: os.stat_result) -> Stamp:
    if stat.S_ISDIR(st.st_mode):
        return ["d", st.st_mode, st.st_uid, st.st_gid]
    return ["f", st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _legacy_moved(backup_dir: Path, original: Path) -> list[str]:
    """The moved paths by the stamps of an earlier version (``committed.json``), if any."""
    kept = backup_dir / LEGACY_STAMPS
    if not kept.exists():
        return []
    then: dict[str, Stamp | None] = json.loads(kept.read_text("utf-8"))
    now: dict[str, Stamp | None] = {}
    top = str(original).rstrip("/")
    for op in json.loads((backup_dir / _UNDO_RECORD).read_text("utf-8")).get("ops", []):
        rel = str(op["path"])
        try:
            st = os.lstat(f"{top}/{rel}")
        except FileNotFoundError:
            now[rel] = None
            continue
        now[rel] = _legacy_stamp(st)
        if op.get("meta") or op.get("chmod") or not stat.S_ISDIR(st.st_mode):
            continue
        for parent, dirs, files in os.walk(f"{top}/{rel}"):
            for name in dirs + files:
                path = f"{parent}/{name}"
                now[os.path.relpath(path, top)] = _legacy_stamp(os.lstat(path))
    return sorted(rel for rel in set(then) | set(now) if then.get(rel) != now.get(rel))


# -- sandboxes in use ------------------------------------------------------------------------
#
# A process whose working directory, root or open files are inside a sandbox's view keeps
# working on the live sandbox, or the operation that would throw that view away is refused as
# busy, naming it: never does it write into a view that is then discarded.


def users_of(view: Path, *, writers_only: bool = False) -> list[str]:
    """The processes (other than this one) using ``view``: ``"<pid> (<command>): <what>"``,
    where ``what`` is ``cwd``, ``root`` or ``open file <path>``.

    Read from ``/proc`` (processes of this PID namespace that this process may inspect: in a
    workspace Pod, the actors' commands). ``writers_only`` counts only files open for writing
    (a working directory that stays in place is harmless then).
    """
    top = os.path.realpath(view)
    inside = (top, top.rstrip("/") + "/")
    found: list[str] = []
    me = os.getpid()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]  # noqa: PTH208
    except OSError:
        return found
    for pid in pids:
        if pid == me:
            continue
        base = f"/proc/{pid}"
        uses: list[str] = []
        links = [] if writers_only else [("cwd", f"{base}/cwd"), ("root", f"{base}/root")]
        try:
            fds = os.listdir(f"{base}/fd")  # noqa: PTH208
        except OSError:
            fds = []
        links += [(f"fd {fd}", f"{base}/fd/{fd}") for fd in fds]
        for what, link in links:
            try:
                target = os.readlink(link)  # noqa: PTH115
            except OSError:
                continue
            if not (target == inside[0] or target.startswith(inside[1])):
                continue
            if what.startswith("fd"):
                if writers_only and not _open_for_writing(f"{base}/fdinfo/{what[3:]}"):
                    continue
                what = f"open file {target}"
            uses.append(what)
        if uses:
            found.append(f"{pid} ({_command(pid)}): {', '.join(sorted(set(uses)))}")
    return found


def _open_for_writing(fdinfo: str) -> bool:
    try:
        with open(fdinfo, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & (os.O_WRONLY | os.O_RDWR) != 0
    except (OSError, ValueError):
        return False
    return False


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def refuse_if_busy(
    sandbox: BaseSandbox, view: Path, operation: str, *, writers_only: bool = False
) -> None:
    """Refuse ``operation`` (``"rollback"``, ``"restore"``) while a process uses ``view``
    (:func:`users_of`); nothing was changed.

    Raises:
        SandboxRollbackError: ``refused``; the message names every process found.
    """
    users = users_of(view, writers_only=writers_only)
    if users:
        raise SandboxRollbackError(
            f"{operation} of sandbox {sandbox.sandbox_id} refused: busy: {'; '.join(users)} "
            f"{'has files open for writing' if writers_only else 'uses'} in {view}, which the "
            f"{operation} would replace. Nothing was changed; stop or move those processes "
            "out of the sandbox, then retry",
            refused=True,
        )


def start_copy_from(
    sandbox: BaseSandbox,
    source: ForkSource,
    snapshot: Path,
    original: Path,
    copy: Path,
    *,
    exclude: list[str] | None = None,
) -> TreeChanges:
    """Carry the parent's own change into ``copy``, a fresh full copy of ``original`` (a fork
    of a copy-based sandbox: copy_on_write, the overlay's fallback; docs/forks.md).

    The parent's change is the set of paths whose quick-check signature in ``snapshot`` (the
    parent's tree at the checkpoint) differs from the parent's baseline of the original
    (``source.baseline_path``); without a baseline, every path differing from ``copy``. Only
    those paths are synced into ``copy`` (:func:`~sandbox_core.tree.sync.sync_tree`), so what
    the original changed since the parent was made stays in the fork.

    Returns:
        The changes applied to ``copy``.

    Raises:
        SandboxForkError: a path the parent changed was also changed in the original since the
            parent was made, to something else (``conflicts``; ``copy`` untouched).
        OSError: a tree cannot be read or written.
    """
    excluded = list(exclude or [])
    taken = snapshot_tree(snapshot, exclude=excluded)
    parent_base: dict[str, str] | None = None
    if source.baseline_path and Path(source.baseline_path).is_file():
        parent_base = Baseline.load(source.baseline_path).original
    now = snapshot_tree(original, exclude=excluded)
    if parent_base is None:
        candidates = differing_paths(now, taken)
    else:
        candidates = differing_paths(parent_base, taken)
        conflicts = sorted(
            rel
            for rel in candidates
            if now.get(rel) != parent_base.get(rel) and now.get(rel) != taken.get(rel)
        )
        if conflicts:
            raise SandboxForkError(
                f"sandbox {sandbox.sandbox_id} cannot start from checkpoint "
                f"{source.checkpoint_id}: its change overlaps what {sandbox.original_path} "
                f"changed since sandbox {source.sandbox_id} was made, in: "
                f"{', '.join(conflicts[:10])}. Take a checkpoint of a sandbox made after that "
                "change, or resolve it in the original",
                conflicts=conflicts,
            )
    changes = compute_changes_at(copy, snapshot, candidates)
    if changes.is_empty:
        return changes
    return sync_tree(snapshot, copy, changes=changes, exclude=excluded)
