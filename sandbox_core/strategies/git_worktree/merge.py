"""Writing a sandbox's commit into the original: plan, check, write, move the ref.

The second layer of :class:`~sandbox_core.strategies.git_worktree.GitWorktreeSandbox`. A commit
is decided with the original untouched (:meth:`MergeBack._plan`: the snapshot commit of the
worktree, the merge with the original's current tip, the paths it changes, the user's
uncommitted work on them, whether git may write them), then applied (:meth:`MergeBack._apply`:
files and index of the changed paths with a two-tree ``read-tree -m -u``, owners and modes kept,
then the target ref by compare-and-swap in one ref transaction). The same two steps undo a
commit (:meth:`MergeBack._undo_commit`). The one-shot commit runs them back to back under the
repository lock (:meth:`MergeBack._merge_back`); the two-phase side runs them apart.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_core._path_limits import refuse_what_git_skipped
from sandbox_core.durable import write_json_atomic
from sandbox_core.errors import (
    SandboxCommitError,
    SandboxConflictError,
    SandboxError,
    SandboxRollbackError,
)
from sandbox_core.protocol import CommitResult
from sandbox_core.strategies.git_worktree.git import (
    GitCommand,
    GitFailure,
    GitResult,
    failure_kind,
    read_gitdir_file,
    repository_lock,
    worktree_entry,
)
from sandbox_core.strategies.git_worktree.worktree import WorktreeBase, _error, logger

_CAS_ATTEMPTS = 3
# Above this many paths a full status scan is cheaper than matching every pathspec.
_MAX_PATHSPECS = 2000

_NOT_UPTODATE = "not uptodate. Cannot merge."
# read-tree stopped while writing the working tree (git's words, reason not always given).
_WRITE_FAILED = re.compile(
    r"unable to (?:write|create) (?:file|symlink)|unable to unlink|cannot create directory"
)
# Bytes kept free beyond the files and the index a merge writes: ref locks, reflog lines.
_SPACE_MARGIN = 64 * 1024
_MOVING_MARKER = "sandbox-moving.json"


@dataclass(frozen=True)
class _Snapshot:
    """The sandbox branch after ``add -A`` + commit: its tip, the tip's tree, and the commit the
    tip was made on when the snapshot made a new commit (None when the tree was unchanged)."""

    tip: str
    tree: str
    parent: str | None


@dataclass(frozen=True)
class _Heads:
    """Read in one ``rev-parse`` under the repository lock: the ref a commit moves (``ref``:
    the branch the original's HEAD was on at create, or ``HEAD`` when detached) and its commit
    (``target``), and the sandbox branch's tip and that tip's tree."""

    ref: str
    target: str
    branch_tip: str
    branch_tree: str


@dataclass(frozen=True)
class _Change:
    """Paths one commit-to-commit move adds, changes and deletes (sorted), and the regular
    files whose executable bit it flips (``100644`` <-> ``100755``)."""

    added: list[str]
    changed: list[str]
    deleted: list[str]
    executable: set[str]

    @property
    def paths(self) -> list[str]:
        return sorted([*self.added, *self.changed, *self.deleted])

    @property
    def tracked_before(self) -> list[str]:
        """Paths the first commit has (changed or deleted by the move)."""
        return [*self.changed, *self.deleted]


_NO_CHANGE = _Change([], [], [], set())


@dataclass(frozen=True)
class _Plan:
    """What a commit will do, decided with the original untouched (``prepare``): move ``ref``
    from ``old`` to ``new`` (``how``: no-op, fast-forward or merge), writing the paths of
    ``change``; ``half_written``: paths an interrupted earlier apply left half-written, put back
    before they are written again (None: the original's working tree was not checked yet)."""

    ref: str
    old: str
    new: str
    how: str
    change: _Change
    half_written: list[str] | None

    @property
    def paths(self) -> list[str]:
        return self.change.paths


def _can_write(directory: str, uid: int, gids: set[int]) -> bool:
    """Whether ``uid`` (with ``gids``) may create and remove entries in ``directory``.

    Mode bits only (no ACLs); root always may, except on a read-only file system.
    """
    try:
        info = Path(directory).stat()
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    if read_only:
        return False
    if uid == 0:
        return True
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IWUSR and info.st_mode & stat.S_IXUSR)
    if info.st_gid in gids:
        return bool(info.st_mode & stat.S_IWGRP and info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IWOTH and info.st_mode & stat.S_IXOTH)


def _existing_ancestor(top: Path, rel: str) -> tuple[Path, list[Path]]:
    """(deepest existing directory above ``top/rel``, the missing directories below it)."""
    missing: list[Path] = []
    current = (top / rel).parent
    while current != top and not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    return current, missing


class _Owners:
    """Owner, group and permission bits of the paths a merge writes, put back after git wrote.

    git replaces a file by unlink + create, so the new file belongs to whoever runs git, with
    the umask's mode. Policy: a file written back keeps the owner, group and
    permission bits it had; git's executable bit wins when the commit changes it. A new file or
    directory takes the owner and group of the directory it is created in.
    """

    def __init__(self, top: Path, paths: list[str], executable: set[str]) -> None:
        self._top = top
        self._executable = executable  # paths whose executable bit the commit changes
        self._before: dict[str, os.stat_result] = {}
        self._parents: dict[str, tuple[os.stat_result, list[Path]]] = {}
        for rel in paths:
            try:
                self._before[rel] = os.lstat(top / rel)
            except FileNotFoundError:
                parent, missing = _existing_ancestor(top, rel)
                try:
                    self._parents[rel] = (parent.stat(), missing)
                except OSError:
                    continue
            except OSError:
                continue

    def restore(self) -> None:
        """Put owners and modes back; failures are logged (a non-root user cannot chown)."""
        for rel, old in self._before.items():
            self._fix(self._top / rel, old.st_uid, old.st_gid, old.st_mode, rel in self._executable)
        for rel, (parent, missing) in self._parents.items():
            for created in [*missing, self._top / rel]:
                self._fix(created, parent.st_uid, parent.st_gid, None, False)

    def created_folders(self) -> list[Path]:
        """Folders that did not exist before, for the new paths (innermost first)."""
        folders = {folder for _parent, missing in self._parents.values() for folder in missing}
        return sorted(folders, key=lambda folder: len(folder.parts), reverse=True)

    def put_back_times(self, paths: list[str]) -> None:
        """Put back the access and modification times the ``paths`` had."""
        for rel in paths:
            if rel in self._before:
                old = self._before[rel]
                with contextlib.suppress(OSError):
                    times = (old.st_atime_ns, old.st_mtime_ns)
                    os.utime(self._top / rel, ns=times, follow_symlinks=False)

    @staticmethod
    def _fix(path: Path, uid: int, gid: int, old_mode: int | None, executable: bool) -> None:
        try:
            now = os.lstat(path)
            if (now.st_uid, now.st_gid) != (uid, gid):
                os.lchown(path, uid, gid)  # clears set-uid/set-gid: the chmod below restores
                now = os.lstat(path)
            if old_mode is None or stat.S_ISLNK(now.st_mode):
                return
            if not (stat.S_ISREG(now.st_mode) and stat.S_ISREG(old_mode)):
                return
            wanted = stat.S_IMODE(old_mode)
            if executable:  # the commit changed the git mode: git's executable bit wins
                wanted = stat.S_IMODE(now.st_mode)
            if stat.S_IMODE(now.st_mode) != wanted:
                path.chmod(wanted)
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.warning("cannot keep owner/mode of %s: %s", path, exc)


def _collisions(paths: list[str], dirty: set[str]) -> list[str]:
    """Paths of ``paths`` equal to, inside, or containing a path of ``dirty``."""
    dirty_parents: set[str] = set()
    for entry in dirty:
        parts = entry.split("/")
        dirty_parents.update("/".join(parts[:i]) for i in range(1, len(parts)))
    hits = []
    for path in paths:
        parts = path.split("/")
        ancestors = {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if ancestors & dirty or path in dirty_parents:
            hits.append(path)
    return sorted(hits)


def _blocked_by_ignored_dir(path: str, folder: str, top: Path) -> bool:
    """True when writing ``path`` replaces the ignored ``folder`` (``"dir/"``) or a file in it."""
    name = folder.rstrip("/")
    if path == name or name.startswith(path + "/"):
        return True
    return path.startswith(folder) and ((top / path).is_symlink() or (top / path).exists())


class MergeBack(WorktreeBase):
    """The merge-back layer of :class:`GitWorktreeSandbox`: a commit planned with the original
    untouched, then applied (or undone) path by path and ref by compare-and-swap."""

    # Set once the original's files may have been written by the current commit/rollback
    # (initialised by GitWorktreeSandbox.__init__).
    _touched: bool

    def _merge_back(self, message: str | None) -> CommitResult:
        """One-shot commit: the two-phase steps back to back under one repository lock.

        Outside the lock the worktree is staged (``add -A``, ``write-tree``) and its change from
        the base listed (``diff-tree``). Under the lock: one ``rev-parse`` reads the target and
        the sandbox branch, ``commit-tree`` makes the snapshot commit, :meth:`_plan` computes
        the merge (none for a fast-forward), then :meth:`_apply` writes the changed paths
        (``read-tree -m -u``, which refuses local work on them before writing anything) and
        moves the sandbox branch, the ``committed`` and ``pre-commit`` tags and the target in
        one ref transaction. The overlap check that prepare runs (``status``) runs here only
        when the merge refused, or when ``read-tree`` alone could not see the user's work
        (:meth:`_needs_status`).
        """
        context = self._require_context()
        meta = context.metadata
        text = message or f"Apply sandbox {self.sandbox_id} of plan {context.plan_id}"
        original = self._original_git("commit")
        worktree = self._worktree_git_or(SandboxCommitError, "commit")
        self._check_worktree_head(worktree)
        tree = self._stage(worktree)
        base = str(meta["base_commit"])
        from_base = self._classify(original, base, tree)
        snap: _Snapshot | None = None
        with repository_lock(str(meta["git_common_dir"])):
            for _attempt in range(_CAS_ATTEMPTS):
                heads = self._read_heads(original, SandboxCommitError)
                if snap is None or heads.branch_tip not in (snap.tip, snap.parent):
                    snap = self._snapshot(original, tree, heads, text)
                plan = self._plan(original, snap, heads, text, from_base, verify=False)
                updates = [
                    *self._snapshot_updates(snap, heads),
                    *self._replay_updates(plan),
                    f"update {self._tag('pre-commit')} {plan.old}\n",
                ]
                if plan.new == plan.old:
                    self._update_refs(original, updates)
                    break
                if self._apply(
                    original,
                    plan.ref,
                    plan.old,
                    plan.new,
                    SandboxCommitError,
                    plan.change,
                    checked=plan.half_written,
                    updates=updates,
                ):
                    break
            else:
                raise SandboxCommitError(f"{plan.ref} kept moving during the commit; retry later")
        lists = (from_base.added, from_base.changed, from_base.deleted)
        return self._result(plan, snap.tip, lists, text)

    def _result(
        self,
        plan: _Plan,
        tip: str,
        lists: tuple[list[str], list[str], list[str]],
        text: str,
        **extra: Any,
    ) -> CommitResult:
        meta = self._meta()
        added, changed, deleted = lists
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            commit_ref=plan.new,
            changed_files=changed,
            added_files=added,
            deleted_files=deleted,
            metadata={
                "strategy": self.strategy,
                "branch": meta["target_ref"] or "HEAD",
                "sandbox_branch": meta["branch"],
                "sandbox_commit": tip,
                "pre_commit_sha": plan.old,
                "pre_commit_tag": self._tag("pre-commit"),
                "landed_as": plan.how,
                "message": text,
                **extra,
            },
        )

    def _plan(
        self,
        original: GitCommand,
        snap: _Snapshot,
        heads: _Heads,
        text: str,
        from_base: _Change,
        after: str | None = None,
        *,
        verify: bool = True,
    ) -> _Plan:
        """Everything of a commit that can fail, with the original untouched (prepare).

        Moves ``heads.ref`` from its tip (``after`` instead when another prepared commit of the
        same transaction lands there first), computes the merge (writing the merge commit object
        only) and the paths it changes; with ``verify``, refuses uncommitted work on them and
        checks that git may write them (otherwise :meth:`_apply` does, and
        ``half_written`` is None).

        Raises:
            SandboxConflictError: a merge conflict or overlapping local work;
                :class:`SandboxPermissionError`.
            GitFailure: git failed.
        """
        base = str(self._meta()["base_commit"])
        old = after or heads.target
        new, how = self._merge_result(original, base, snap, old, text)
        # A fast-forward from the base writes exactly the paths the sandbox changed.
        if new == old:
            change = _NO_CHANGE
        elif (old, new) == (base, snap.tip):
            change = from_base
        else:
            change = self._classify(original, old, new)
        half: list[str] | None = None
        if verify:
            half = []
            if change.paths:
                conflicts, half = self._overlap(original, old, new, change.paths)
                if conflicts:
                    raise self._overlap_error(SandboxCommitError, conflicts)
                top = Path(str(self._meta()["original_toplevel"]))
                self._check_writable(original, top, change.paths, SandboxCommitError)
                self._check_space(original, top, change)
        return _Plan(heads.ref, old, new, how, change, half)

    def _check_worktree_head(self, worktree: GitCommand) -> None:
        """Refuse when an actor switched the sandbox worktree to another branch.

        The worktree's ``HEAD`` file names its branch (read without a process); only when it
        does not say exactly ``ref: <our branch>`` (another branch, detached, or a ref backend
        that keeps HEAD elsewhere) is git asked, and git's answer decides.

        Raises:
            SandboxCommitError: the worktree is on another ref.
        """
        branch = f"refs/heads/{self._meta()['branch']}"
        try:
            content = (Path(worktree.git_dir) / "HEAD").read_text(encoding="utf-8").strip()
        except OSError:
            content = ""
        if content == f"ref: {branch}":
            return
        symbolic = worktree.run("rev-parse", "--symbolic-full-name", "HEAD").out
        if symbolic != branch:
            raise SandboxCommitError(
                f"sandbox {self.sandbox_id} worktree is on {symbolic!r}, not {branch!r}"
            )

    @staticmethod
    def _stage(worktree: GitCommand) -> str:
        """Stage everything in the sandbox worktree (``add -A``); the staged tree's id.

        Raises:
            OSError: ``ENAMETOOLONG``, a path git skipped (longer than PATH_MAX).
        """
        refuse_what_git_skipped(worktree.run("add", "-A").stderr)
        return worktree.run("write-tree").out

    def _read_heads(
        self,
        original: GitCommand,
        error: type[SandboxCommitError] | type[SandboxRollbackError],
    ) -> _Heads:
        """The target and the sandbox branch, in one ``rev-parse``; the original's HEAD must
        be where it was at create (on the same branch, or detached).

        Raises:
            SandboxCommitError / SandboxRollbackError (``error``): HEAD moved to another ref.
            GitFailure: git failed (e.g. the sandbox branch is gone).
        """
        meta = self._meta()
        branch = f"refs/heads/{meta['branch']}"
        target, tip, tree, symbolic = original.run(
            "rev-parse", "HEAD", branch, f"{branch}^{{tree}}", "--symbolic-full-name", "HEAD"
        ).out.splitlines()[:4]
        self._expect_target(symbolic, error)
        return _Heads(symbolic, target, tip, tree)

    def _snapshot(self, original: GitCommand, tree: str, heads: _Heads, message: str) -> _Snapshot:
        """The sandbox commit of ``tree``: the branch tip when its tree is already ``tree``,
        else a new commit object on it (``commit-tree``). No ref moves here: the branch and the
        ``committed`` tag move with the caller's ref transaction (:meth:`_snapshot_updates`)."""
        if tree == heads.branch_tree:
            return _Snapshot(heads.branch_tip, tree, None)
        new = original.run("commit-tree", tree, "-p", heads.branch_tip, "-m", message).out
        return _Snapshot(new, tree, heads.branch_tip)

    def _snapshot_updates(self, snap: _Snapshot, heads: _Heads) -> list[str]:
        """``update-ref --stdin`` lines that move the sandbox branch to the snapshot (compare
        and swap against the tip it was made on) and the ``committed`` tag to it."""
        updates = []
        if snap.parent is not None:
            branch = f"refs/heads/{self._meta()['branch']}"
            updates.append(f"update {branch} {snap.tip} {heads.branch_tip}\n")
        updates.append(f"update {self._tag('committed')} {snap.tip}\n")
        return updates

    def _replay_updates(self, plan: _Plan) -> list[str]:
        """The ``update-ref --stdin`` line of the ``replayed`` tag (the commit a replay lands:
        the sandbox commit itself is not in the target's history then, see
        :meth:`GitWorktreeSandbox.commit_landed`); none for other merges."""
        if plan.how != "replay":
            return []
        return [f"update {self._tag('replayed')} {plan.new}\n"]

    def _update_refs(
        self,
        original: GitCommand,
        updates: list[str],
        message: str | None = None,
        ok: tuple[int, ...] = (0,),
    ) -> GitResult:
        """Run ``updates`` (``update-ref --stdin`` lines) as one ref transaction, in their
        order (git renames the locked refs in the order given)."""
        return original.run(
            "update-ref",
            "-m",
            message or f"sandbox-core: sandbox {self.sandbox_id}",
            "--stdin",
            stdin="".join(updates),
            ok=ok,
        )

    def _apply(
        self,
        original: GitCommand,
        ref: str,
        old: str,
        new: str,
        error: type[SandboxCommitError] | type[SandboxRollbackError],
        change: _Change | None = None,
        *,
        checked: list[str] | None = None,
        updates: list[str] | None = None,
    ) -> bool:
        """:meth:`_apply_files_then_ref`, with a marker naming the move while it runs.

        The marker (``sandbox-moving.json`` in the worktree's admin directory) says
        the original's files may be anywhere between ``old`` and ``new``: a crash leaves it,
        and ``finish_interrupted`` (run first by rollback and cleanup) puts the half-moved
        paths back. Every in-process failure of the move leaves the original as it was (or
        never wrote), so the marker is removed then too.
        """
        try:
            self._mark_moving(old, new)
        except OSError as exc:
            # Nothing of the original was written yet: a read-only or full volume is the
            # phase's permission or space error, as the checks below would say.
            kind = {errno.EROFS: "permission", errno.ENOSPC: "space", errno.EDQUOT: "space"}
            if exc.errno not in kind:
                raise
            phase = "commit" if error is SandboxCommitError else "rollback"
            raise _error(
                phase,
                kind[exc.errno],
                f"sandbox {self.sandbox_id} cannot be applied to {self.original_path}: "
                f"{os.strerror(exc.errno)} at {exc.filename}. Nothing was changed; retry once "
                "the volume is writable and has room.",
            ) from exc
        try:
            moved = self._apply_files_then_ref(
                original, ref, old, new, error, change, checked=checked, updates=updates
            )
        except Exception:
            self._unmark_moving()
            raise
        self._unmark_moving()
        return moved

    def _apply_files_then_ref(
        self,
        original: GitCommand,
        ref: str,
        old: str,
        new: str,
        error: type[SandboxCommitError] | type[SandboxRollbackError],
        change: _Change | None = None,
        *,
        checked: list[str] | None = None,
        updates: list[str] | None = None,
    ) -> bool:
        """Move the original from ``old`` to ``new``: files, index, then ref (compare-and-swap).

        Only the paths that differ between the two commits are written (``change`` when the
        caller knows them). ``checked``: the caller has just checked the original's working
        tree and writability under the repository lock (prepare), and these are the
        half-written paths it found; None: this method checks. ``updates``: more
        ``update-ref --stdin`` lines (tags, the sandbox branch) that move in the same ref
        transaction as the target, before it.

        Uncommitted work on a written path refuses the move with the original untouched.
        ``read-tree -m -u`` checks every path it writes before it writes any (a modified,
        staged or untracked file in the way); so, unless :meth:`_needs_status` says it cannot
        see the user's work, the merge runs first and the path-limited ``status`` runs only
        when it refused, to tell the user's work (a conflict) from a trace of an interrupted
        earlier attempt (put back from the index, then written again) and from stale stat data
        (refreshed, never a conflict: case 29). Owners and modes of the written files are kept.
        Returns False when a ref moved concurrently (the files are put back first).
        """
        if change is None:
            change = self._classify(original, old, new)
        paths = change.paths
        top = Path(str(self._meta()["original_toplevel"]))
        half = checked
        merge_first = False
        if half is None:
            merge_first = not self._needs_status(top, change)
            half = [] if merge_first else self._checked_overlap(original, old, new, paths, error)
            self._check_writable(original, top, paths, error)
            if error is SandboxCommitError:
                self._check_space(original, top, change)
        # Refuse before writing files that a failed ref move would revert.
        self._refuse_ref_locks(original, [*(line.split()[1] for line in updates or []), ref])

        def merge(half: list[str]) -> tuple[_Owners, Any]:
            """Put back a half-written earlier attempt's paths, then merge into the original."""
            if half:
                self._touched = True
                self._restore_from_index(original, half)
            owners = _Owners(top, paths, change.executable)
            self._touched = True
            return owners, original.run(
                "read-tree", "-m", "-u", old, new, ok=(0, 128), wait_index_lock=True
            )

        owners, updated = merge(half)
        if updated.status != 0 and merge_first and self._refused(updated):
            # Nothing was written: find out why, as prepare would, then merge again.
            self._touched = False
            owners, updated = merge(
                self._checked_overlap(original, old, new, paths, error, updated.stderr)
            )
        if updated.status != 0 and _NOT_UPTODATE in updated.stderr:
            # The paths were checked clean by content just above: only the index's stat data is
            # stale (touch, chown -R, an fsGroup pass). Refresh it, as `git status` would.
            # `--refresh` skips entries flagged assume-unchanged or skip-worktree: their flags
            # are lifted for the written paths (the merge replaces those entries, flags and
            # all, as git's own merge does) and put back if the merge still refuses.
            self._touched = False
            flagged = self._index_flags(original, paths)
            self._set_index_flags(original, flagged, lift=True)
            original.run("update-index", "-q", "--refresh", ok=(0, 1), wait_index_lock=True)
            self._touched = True
            updated = original.run(
                "read-tree", "-m", "-u", old, new, ok=(0, 128), wait_index_lock=True
            )
            if updated.status != 0:
                self._set_index_flags(original, flagged, lift=False)
        if updated.status != 0:
            failure = GitFailure(["read-tree", "-m", "-u", old, new], 128, updated.stderr)
            kind = failure_kind(failure).kind
            wrote = kind in ("permission", "space") or bool(_WRITE_FAILED.search(updated.stderr))
            if kind == "lock" or _NOT_UPTODATE in updated.stderr:
                self._touched = False  # read-tree checks everything before writing
            elif wrote:
                # A file git could not replace, or a full file system, part-way.
                self._touched = not self._put_back_partial_update(original, paths, owners)
                if kind == "other" and not self._touched and error is SandboxCommitError:
                    # git says "unable to write file" without the reason: a full file
                    # system is told by the space it leaves (raises the space error).
                    short = self._space_shortfall(original, top, change)
                    if short is not None:
                        raise short
            if kind != "other" or wrote:
                raise failure
            raise self._overlap_error(error, paths, updated.stderr)  # a change appeared since
        owners.restore()
        target = [*(updates or []), *(["option no-deref\n"] if ref == "HEAD" else [])]
        target.append(f"update {ref} {new} {old}\n")
        moved = self._update_refs(original, target, ok=(0, 1, 128))
        if moved.status == 0:
            self._move_submodules(original, top, old, new, paths)
            return True
        original.run("read-tree", "-m", "-u", new, old, wait_index_lock=True)
        owners.restore()
        failure = GitFailure(["update-ref", ref], moved.status, moved.stderr)
        if failure_kind(failure).kind != "other":
            self._touched = False  # the files were put back
            raise failure
        return False  # a ref moved concurrently: the caller retries

    # -- interrupted moves ---------------------------------------------------------------------

    def _moving_marker(self) -> Path:
        return Path(str(self._meta()["worktree_admin_dir"])) / _MOVING_MARKER

    def _mark_moving(self, old: str, new: str) -> None:
        txid = getattr(self, "_moving_txid", None)
        # Not fsynced: it guards against a crash of this process (the page cache outlives it),
        # as git itself writes the original's files without fsync (core.fsync's default).
        write_json_atomic(
            self._moving_marker(),
            {"old": old, "new": new, "txid": txid},
            durable=False,
            pretty=False,
        )

    def _unmark_moving(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._moving_marker().unlink()

    def _finish_interrupted_move(self) -> None:
        """Finish or undo a move of the original that a crash cut between its files and its
        ref (the marker of :meth:`_apply`); nothing without a marker (one ``stat``).

        The ref still at the marker's ``old``: a two-phase apply (the marker names its txid)
        is rolled forward (the plan decided); any other move (a one-shot commit, or the undo
        of a rollback from COMMITTED) is put back: index entries and files that already hold
        ``new``'s version of a path the move changes get ``old``'s again (the user's own work
        on other paths, or in another state, is left alone). The ref elsewhere: the move
        landed (or someone moved on since); only the marker goes.

        Raises:
            GitFailure: git failed (the marker stays; retry).
        """
        try:
            marker = json.loads(self._moving_marker().read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except ValueError:
            marker = {}  # torn: written before any file of the original was touched
        old, new, txid = marker.get("old"), marker.get("new"), marker.get("txid")
        original = self._original_git("rollback")
        if old and new:
            with repository_lock(str(self._meta()["git_common_dir"])):
                current = original.run("rev-parse", "--verify", "HEAD").out
                if current == old and not txid:
                    self._put_back_moved_paths(original, str(old), str(new))
            if current == old and txid:
                self._roll_forward_apply(str(txid))  # removes the marker when it lands
        self._unmark_moving()

    def _put_back_moved_paths(self, original: GitCommand, old: str, new: str) -> None:
        """Give every path of the ``old`` -> ``new`` move whose index entry or file holds
        ``new``'s version ``old``'s version again (index, then files)."""
        paths = self._classify(original, old, new).paths
        if not paths:
            return
        wanted = self._tree_entries(original, new, paths)
        before = self._tree_entries(original, old, paths)
        staged: dict[str, tuple[str, str]] = {}
        for entry in original.run(
            "--literal-pathspecs", "ls-files", "-s", "-z", "--", *paths
        ).nul_fields():
            info, _, rel = entry.partition("\t")
            mode, oid, stage = info.split()[:3]
            if stage == "0":
                staged[rel] = (mode, oid)
        top = Path(str(self._meta()["original_toplevel"]))
        index_back: list[str] = []
        files_back: list[str] = []
        for rel in paths:
            target, was = wanted.get(rel), before.get(rel)  # None: absent on that side
            if target == was:
                continue
            if staged.get(rel) == target:
                index_back.append(rel)
            if target is None:
                at_new = not os.path.lexists(top / rel)
            else:
                at_new = target[0] != "160000" and worktree_entry(top / rel, len(old)) == target
            if at_new:
                files_back.append(rel)
        if index_back:
            original.run("--literal-pathspecs", "reset", "-q", old, "--", *index_back)
        if files_back:
            self._restore_from_index(original, files_back)

    @staticmethod
    def _refuse_ref_locks(original: GitCommand, refs: list[str]) -> None:
        """Raise git's own lock message when a lock file of one of ``refs`` exists (left by a
        running or crashed git), before anything is written.

        Raises:
            GitFailure: classified as a lock by :func:`failure_kind`.
        """
        for name in refs:
            admin = original.git_dir if name == "HEAD" else original.common_dir
            lock = Path(admin) / f"{name}.lock"
            if lock.exists():
                message = f"Unable to create '{lock}': File exists."
                raise GitFailure(["update-ref", name], 128, message)

    @staticmethod
    def _refused(updated: GitResult) -> bool:
        """True when a failed ``read-tree -m -u`` refused for the working tree or the index
        (not a lock or a permission problem, which have their own handling)."""
        failure = GitFailure(["read-tree"], updated.status, updated.stderr)
        if _WRITE_FAILED.search(updated.stderr):
            return False  # it stopped part-way while writing, it did not refuse
        return failure_kind(failure).kind == "other"

    def _checked_overlap(
        self,
        original: GitCommand,
        old: str,
        new: str,
        paths: list[str],
        error: type[SandboxCommitError] | type[SandboxRollbackError],
        detail: str = "",
    ) -> list[str]:
        """:meth:`_overlap`, raising the overlap error for the user's work; returns the
        half-written paths."""
        conflicts, half = self._overlap(original, old, new, paths)
        if conflicts:
            raise self._overlap_error(error, conflicts, detail)
        return half

    @staticmethod
    def _needs_status(top: Path, change: _Change) -> bool:
        """True when ``read-tree -m -u`` alone could miss the user's work on ``change``'s paths.

        read-tree refuses, before writing anything, a file it would overwrite that differs from
        the index (modified, type changed), an index entry that differs from the old commit
        (staged), and an untracked file in the way. It does not see: a tracked file the user
        deleted (it writes the new version), a file in the way that ``.gitignore`` matches
        (git treats ignored files as expendable), and work inside a submodule's checkout. So
        the path-limited ``status`` runs first when a path the old commit has is missing, when
        a path the old commit lacks already exists, when a path is a populated submodule, or
        when a folder on a path is not a plain directory. A few ``lstat`` calls, no process.
        """
        for rel in change.tracked_before:
            if not os.path.lexists(top / rel):
                return True
        for rel in change.added:
            if os.path.lexists(top / rel):
                return True
        for rel in change.paths:
            if os.path.lexists(top / rel / ".git"):
                return True
            parts = rel.split("/")
            for depth in range(1, len(parts)):
                folder = top.joinpath(*parts[:depth])
                if folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir()):
                    return True
        return False

    def _merge_result(
        self, original: GitCommand, base: str, snap: _Snapshot, old: str, message: str
    ) -> tuple[str, str]:
        """(commit the target should point at, how): no-op, fast-forward, merge or replay.

        When the target no longer contains the base (the branch was rewritten since create:
        ``reset``, ``commit --amend``, ``rebase``, a forced ref move), the sandbox's own change
        is replayed onto it (:meth:`_replayed`), so no commit the rewrite dropped comes back.

        Raises:
            SandboxConflictError: the merge conflicts (nothing touched).
        """
        tip = snap.tip
        if tip == base:
            return old, "no-op"
        if old == base and snap.parent == base:
            return tip, "fast-forward"  # the snapshot's parent is the base: no merge-base needed
        common = original.run("merge-base", old, tip, ok=(0, 1)).out
        if common == tip:
            return old, "no-op"  # it already landed (never commit twice)
        if self._rewritten(original, base, old, common):
            return self._replayed(original, base, tip, old, message)
        if common == old:
            return tip, "fast-forward"
        status, fields = self._merge_trees(original, base, old, tip, rewritten=False)
        if status == 1:
            conflicts = sorted(set(fields[1:]))
            raise SandboxConflictError(
                f"sandbox {self.sandbox_id} conflicts with the original in: "
                f"{', '.join(conflicts)}; resolve them in {self.original_path} (or discard the "
                "sandbox's version) and retry",
                conflicts=conflicts,
            )
        commit = original.run("commit-tree", fields[0], "-p", old, "-p", tip, "-m", message)
        return commit.out, "merge"

    @staticmethod
    def _rewritten(original: GitCommand, base: str, old: str, common: str | None = None) -> bool:
        """True when ``old`` (the target's commit) does not contain ``base`` (the commit the
        sandbox was made from): its branch was rewritten since.

        ``common``: the merge base of ``old`` and the sandbox's tip when known. It equals
        ``base`` whenever the branch only moved forward, so the usual answer costs no process;
        otherwise one ``merge-base --is-ancestor``.
        """
        if old == base or common == base:
            return False
        found = original.run("merge-base", "--is-ancestor", base, old, ok=(0, 1, 128))
        return found.status != 0

    @staticmethod
    def _merge_trees(
        original: GitCommand, base: str, old: str, theirs: str, *, rewritten: bool
    ) -> tuple[int, list[str]]:
        """``merge-tree --write-tree`` of ``old`` and ``theirs`` (a commit on ``base``): its exit
        status (1: conflicts) and its ``-z --name-only`` fields (tree id, conflicted paths).

        When the branch was rewritten (``rewritten``: ``old`` lacks ``base``) the merge base
        is forced to ``base``: ``old``'s tree is merged as a throw-away commit whose only
        parent is ``base`` (git 2.39 has no ``--merge-base``), so exactly the change ``base``
        -> ``theirs`` is applied to ``old``; what the rewrite dropped stays dropped. Objects
        only.
        """
        ours = old
        if rewritten:
            ours = original.run(
                "commit-tree", f"{old}^{{tree}}", "-p", base, "-m", "sandbox-core replay base"
            ).out
        merged = original.run(
            "merge-tree",
            "--write-tree",
            "--name-only",
            "--no-messages",
            "-z",
            ours,
            theirs,
            ok=(0, 1),
        )
        return merged.status, merged.nul_fields()

    def _replayed(
        self, original: GitCommand, base: str, tip: str, old: str, message: str
    ) -> tuple[str, str]:
        """(commit, ``"replay"``): the sandbox's own change (``base`` -> ``tip``) applied onto the
        rewritten target ``old`` as one commit whose only parent is ``old``; (``old``,
        ``"no-op"``) when ``old`` already holds it.

        Raises:
            SandboxConflictError: the change overlaps what the rewrite changed (``conflicts``);
                the message names the base and the target's current commit.
        """
        status, fields = self._merge_trees(original, base, old, tip, rewritten=True)
        ref = self._meta()["target_ref"] or "HEAD"
        if status == 1:
            conflicts = sorted(set(fields[1:]))
            raise SandboxConflictError(
                f"{ref} was rewritten since sandbox {self.sandbox_id} was created: it no longer "
                f"contains the sandbox's base {base} (it is now at {old}). The sandbox's own "
                f"change, replayed onto it, conflicts in: {', '.join(conflicts)}. Nothing was "
                f"changed. Resolve them in {self.original_path} (or discard the sandbox's "
                "version) and retry.",
                conflicts=conflicts,
            )
        if fields[0] == original.run("rev-parse", f"{old}^{{tree}}").out:
            return old, "no-op"
        logger.info(
            "%s was rewritten since sandbox %s was created (base %s, now %s): replaying its "
            "own change only",
            ref,
            self.sandbox_id,
            base,
            old,
        )
        commit = original.run("commit-tree", fields[0], "-p", old, "-m", message)
        return commit.out, "replay"

    def _put_back_partial_update(
        self, original: GitCommand, paths: list[str], owners: _Owners
    ) -> bool:
        """Undo the files a failed ``read-tree -m -u`` wrote before it stopped (an immutable or
        unwritable file, or a full file system, part-way): it writes the index last, so the
        index still holds the original's state; tracked paths are checked out from it, new
        files are removed. True when every such path is back (checked again after)."""
        written = sorted(self._local_changes(original, paths) & set(paths))
        if not written:
            return True
        self._restore_from_index(original, written)
        for folder in owners.created_folders():
            with contextlib.suppress(OSError):
                folder.rmdir()  # only the empty folders read-tree made
        owners.restore()
        owners.put_back_times(written)
        left = sorted(self._local_changes(original, written) & set(written))
        if left:
            logger.error("sandbox %s: could not put back %s", self.sandbox_id, ", ".join(left))
        return not left

    def _move_submodules(
        self, original: GitCommand, top: Path, old: str, new: str, paths: list[str]
    ) -> None:
        """Check out the new pinned commit in each populated submodule of the original.

        Only a submodule that is clean at the old pinned commit is moved, detached, as
        ``git submodule update`` does; any other is left as it is, and ``git status`` shows it
        as having new commits. Best effort: a failure is logged, never raised, since
        the superproject's commit has landed.
        """
        # os.path.exists: a path git cannot name (ENAMETOOLONG) is no submodule, and this runs
        # after the ref moved, where nothing may raise.
        candidates = [p for p in paths if os.path.exists(top / p / ".git")]  # noqa: PTH110
        if not candidates:
            return
        raw = original.run(
            "--literal-pathspecs",
            "diff-tree",
            "-r",
            "-z",
            "--no-renames",
            old,
            new,
            "--",
            *candidates,
        ).nul_fields()
        for info, rel in zip(raw[0::2], raw[1::2], strict=True):
            old_mode, new_mode, old_sha, new_sha = info.lstrip(":").split()[:4]
            if old_mode != "160000" or new_mode != "160000":
                continue
            where = top / rel
            admin = read_gitdir_file(where) or str(where / ".git")
            try:
                common = (Path(admin) / "commondir").read_text(encoding="utf-8").strip()
                common = str((Path(admin) / common).resolve())
            except OSError:
                common = admin
            sub = GitCommand(
                admin, common, str(where), trusted=original.trusted, run_as=original.run_as
            )
            try:
                head = sub.run("rev-parse", "HEAD").out
                dirty = sub.run("--no-optional-locks", "status", "--porcelain", "-uno").out
                if head != old_sha or dirty:
                    logger.info("submodule %s is not clean at %s: left as it is", rel, old_sha)
                    continue
                sub.run("checkout", "-q", "--detach", new_sha)
            except GitFailure as exc:
                logger.warning("submodule %s not moved to %s: %s", rel, new_sha, exc)

    def _check_writable(
        self,
        original: GitCommand,
        top: Path,
        paths: list[str],
        error: type[SandboxCommitError] | type[SandboxRollbackError],
    ) -> None:
        """Refuse up front (nothing touched) when git could not write every path it must."""
        if original.run_as is not None:
            uid, gids = original.run_as.uid, {original.run_as.gid}
        else:
            uid, gids = os.geteuid(), {os.getegid(), *os.getgroups()}
        folders = {original.git_dir}
        for rel in paths:
            folders.add(str(_existing_ancestor(top, rel)[0]))
        denied = sorted(folder for folder in folders if not _can_write(folder, uid, gids))
        if denied:
            phase = "commit" if error is SandboxCommitError else "rollback"
            raise _error(
                phase,
                "permission",
                f"uid {uid} cannot write {', '.join(denied)} (read-only file system, or owner, "
                f"group and mode deny it), so sandbox {self.sandbox_id} cannot be applied to "
                f"{self.original_path}. Nothing was changed. Give that user write access, or "
                "trust the repository's owner (option trust_repository_owner=true), and retry.",
            )

    def _check_space(self, original: GitCommand, top: Path, change: _Change) -> None:
        """Refuse up front (nothing touched) when the file system of the original cannot hold
        what the merge writes.

        Every object the commit needs is already in the repository's object store (written
        by ``add -A``, ``commit-tree``, ``merge-tree``: git's private area); what is left to
        write is the files of the changed paths and a new index. git replaces a file by
        unlink + create, so the need is bounded by the growth of each file (its size in the
        sandbox, rounded up to blocks, less the blocks of the file it replaces) plus the index
        and a margin for ref locks and reflogs, compared with the space free to the user git
        runs as (``statvfs``). A few ``lstat`` calls, no process. A file system that fills up
        anyway during the merge is handled by putting back what was written (:meth:`_apply`).

        Raises:
            SandboxCommitError: ``retryable``; not enough space, nothing changed.
        """
        short = self._space_shortfall(original, top, change)
        if short is not None:
            raise short

    def _space_shortfall(
        self, original: GitCommand, top: Path, change: _Change
    ) -> SandboxError | None:
        """The error :meth:`_check_space` raises when space is short now, else None."""
        sandbox = Path(self._sandbox_dir())
        block = 4096
        need = _SPACE_MARGIN
        for rel in [*change.added, *change.changed]:
            try:
                size = os.lstat(sandbox / rel).st_size
            except OSError:
                size = 0
            try:
                old = os.lstat(top / rel).st_blocks * 512
            except OSError:
                old = 0
            need += max(0, -(-size // block) * block - old)
        index = Path(original.git_dir) / "index"
        try:
            index_size = index.stat().st_size
        except OSError:
            index_size = 0
        root = (original.run_as.uid if original.run_as else os.geteuid()) == 0
        checks = [(str(top), need)]
        try:
            same = top.stat().st_dev == Path(original.git_dir).stat().st_dev
        except OSError:
            same = True
        if same:
            checks[0] = (str(top), need + index_size)
        else:
            checks.append((original.git_dir, index_size + _SPACE_MARGIN))
        for where, wanted in checks:
            try:
                info = os.statvfs(where)
            except OSError:
                continue
            free = (info.f_bfree if root else info.f_bavail) * info.f_frsize
            if free < wanted:
                return _error(
                    "commit",
                    "space",
                    f"not enough space on the file system of {where}: writing sandbox "
                    f"{self.sandbox_id} into {self.original_path} needs about {wanted} bytes, "
                    f"{free} are free. Nothing was changed. Free space on that volume (or grow "
                    "it) and retry.",
                )
        return None

    def _restore_from_index(self, original: GitCommand, paths: list[str]) -> None:
        """Put ``paths`` back as the original's index has them: tracked paths are checked out
        from it, files it does not track are removed (they hold what a merge wrote)."""
        listed = original.run("--literal-pathspecs", "ls-files", "-z", "--", *paths)
        tracked = set(listed.nul_fields())
        top = Path(str(self._meta()["original_toplevel"]))
        # New files first: on a full file system they hold the space the checkout needs.
        for rel in paths:
            if rel not in tracked and os.path.lexists(top / rel) and not (top / rel).is_dir():
                (top / rel).unlink()
        restore = "\0".join(rel for rel in paths if rel in tracked)
        if restore:
            original.run(
                "checkout-index",
                "-f",
                "-q",
                "-z",
                "--stdin",
                stdin=restore,
                ok=(0, 1, 128),
                wait_index_lock=True,
            )

    def _overlap(
        self, original: GitCommand, old: str, new: str, paths: list[str]
    ) -> tuple[list[str], list[str]]:
        """(paths with the user's uncommitted work, paths an interrupted apply half-wrote).

        Read-only (no lock, the index file is not written): a ``status`` limited to ``paths``
        (content compared where stat data is stale), then, for the paths it lists, the trace
        of an earlier interrupted attempt is told from the user's work by content (see
        :meth:`_trace_split`).
        """
        overlap = _collisions(paths, self._local_changes(original, paths))
        if not overlap:
            return [], []
        return self._trace_split(original, old, new, overlap)

    def _trace_split(
        self, original: GitCommand, old: str, new: str, paths: list[str]
    ) -> tuple[list[str], list[str]]:
        """Split changed ``paths`` into (the user's work, half-written by an earlier attempt).

        A path whose file already holds ``new``'s content and mode is the trace of an earlier
        attempt that was interrupted (crash recovery): done when its index entry is ``new``'s
        too (``read-tree`` finished, the ref did not move), half-written when the index still
        has ``old``'s entry (``read-tree`` stopped before writing the index). Anything else is
        the user's work. Compared by content without git's stat cache, so nothing is written.
        """
        wanted = self._tree_entries(original, new, paths)
        before = self._tree_entries(original, old, paths)
        staged: dict[str, tuple[str, str] | None] = {}
        for entry in original.run(
            "--literal-pathspecs", "ls-files", "-s", "-z", "--", *paths
        ).nul_fields():
            info, _, rel = entry.partition("\t")
            mode, oid, stage = info.split()[:3]
            # An unmerged path (stages 1-3) is never a trace of ours.
            staged[rel] = (mode, oid) if stage == "0" and rel not in staged else ("", "unmerged")
        top = Path(str(self._meta()["original_toplevel"]))
        id_length = len(old)
        user: list[str] = []
        half: list[str] = []
        for rel in paths:
            target = wanted.get(rel)
            if target is not None and target[0] == "160000":
                on_disk = target if staged.get(rel) == target else None  # gitlink: index only
            else:
                on_disk = worktree_entry(top / rel, id_length)
            if on_disk != target:
                user.append(rel)
            elif staged.get(rel) == target:
                continue  # done: index and file already at new
            elif staged.get(rel) == before.get(rel):
                half.append(rel)
            else:
                user.append(rel)
        return sorted(user), sorted(half)

    @staticmethod
    def _tree_entries(
        original: GitCommand, treeish: str, paths: list[str]
    ) -> dict[str, tuple[str, str]]:
        """{path: (mode, object id)} of ``paths`` in ``treeish`` (absent paths left out)."""
        listed = original.run(
            "--literal-pathspecs", "ls-tree", "-r", "--full-tree", "-z", treeish, "--", *paths
        )
        entries: dict[str, tuple[str, str]] = {}
        for entry in listed.nul_fields():
            info, _, rel = entry.partition("\t")
            mode, _kind, oid = info.split()[:3]
            entries[rel] = (mode, oid)
        return entries

    def _overlap_error(
        self,
        error: type[SandboxCommitError] | type[SandboxRollbackError],
        paths: list[str],
        detail: str = "",
    ) -> SandboxError:
        text = (
            f"uncommitted changes in {self.original_path} overlap sandbox {self.sandbox_id} "
            f"in: {', '.join(paths)}; commit or stash them and retry"
            + (f" ({detail.strip()})" if detail else "")
        )
        if error is SandboxCommitError:
            return SandboxConflictError(text, conflicts=paths)
        return SandboxRollbackError(text, refused=True)

    def _local_changes(self, original: GitCommand, paths: list[str]) -> set[str]:
        """Paths with uncommitted changes in the original: modified, staged, untracked, ignored.

        Only ``paths`` are looked at (a pathspec-limited ``status``, which compares content
        where stat data is stale), plus their parent folders: a file or symlink in the way of
        a folder counts as a change. An ignored directory (listed as ``dir/``) counts only
        through the files of ``paths`` that already exist inside it, so a new file in, say,
        ``build/`` is not a collision.
        """
        top = Path(str(self._meta()["original_toplevel"]))
        limit = ["--", *paths] if len(paths) <= _MAX_PATHSPECS else []
        status = original.run(
            "--no-optional-locks",
            "--literal-pathspecs",
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignored=matching",
            "--no-renames",
            *limit,
        )
        dirty: set[str] = set()
        ignored_dirs: list[str] = []
        for entry in status.nul_fields():
            path = entry[3:]
            if path.endswith("/"):
                ignored_dirs.append(path)
            elif path:
                dirty.add(path)
        if ignored_dirs:
            dirty.update(
                path
                for path in paths
                if any(_blocked_by_ignored_dir(path, folder, top) for folder in ignored_dirs)
            )
        dirty.update(self._hidden_changes(original, top, limit))
        listed = set(paths)
        folders = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
        for folder in folders - listed:
            where = top / folder
            if where.is_symlink() or (os.path.lexists(where) and not where.is_dir()):
                dirty.add(folder)
        return dirty

    @staticmethod
    def _index_flags(original: GitCommand, paths: list[str]) -> dict[str, str]:
        """{path: ``ls-files -v`` tag} of the entries among ``paths`` flagged assume-unchanged
        (lowercase tag) or skip-worktree (``S``/``s``)."""
        listed = original.run("--literal-pathspecs", "ls-files", "-v", "-z", "--", *paths)
        flagged = {}
        for entry in listed.nul_fields():
            tag, _, rel = entry.partition(" ")
            if tag.islower() or tag == "S":
                flagged[rel] = tag
        return flagged

    @staticmethod
    def _set_index_flags(original: GitCommand, flagged: dict[str, str], *, lift: bool) -> None:
        """Lift (``lift``) or put back the flags :meth:`_index_flags` found."""
        assumed = sorted(rel for rel, tag in flagged.items() if tag.islower())
        skipped = sorted(rel for rel, tag in flagged.items() if tag in ("S", "s"))
        for option, chosen in (("assume-unchanged", assumed), ("skip-worktree", skipped)):
            if chosen:
                flag = f"--no-{option}" if lift else f"--{option}"
                original.run("update-index", flag, "-z", "--stdin", stdin="\0".join(chosen),
                             wait_index_lock=True)  # fmt: skip

    @staticmethod
    def _hidden_changes(original: GitCommand, top: Path, limit: list[str]) -> set[str]:
        """Paths whose index entry hides local work from ``status`` (case 40).

        ``status`` trusts the index flags ``assume-unchanged`` (``update-index
        --assume-unchanged``) and ``skip-worktree`` (``--skip-worktree``, sparse checkout) and
        never looks at such files, while ``read-tree -m -u`` does look and refuses. So every
        flagged entry among the paths (``limit``: a pathspec, or empty for all) is compared by
        content with the file (hashed, no git process, nothing written): a file whose content
        or type differs is the user's work; a missing file is too, except for a skip-worktree
        entry (a sparse checkout leaves such files out on purpose). Gitlinks are left to the
        submodule checks. One ``ls-files -v -s``.
        """
        listed = original.run("--literal-pathspecs", "ls-files", "-v", "-s", "-z", *limit)
        hidden: set[str] = set()
        for entry in listed.nul_fields():
            info, _, rel = entry.partition("\t")
            fields = info.split()
            if len(fields) < 4 or fields[0] not in ("h", "s", "S") or fields[1] == "160000":
                continue
            tag, mode, oid = fields[:3]
            on_disk = worktree_entry(top / rel, len(oid))
            if on_disk is None:
                if tag != "S" or os.path.lexists(top / rel):
                    hidden.add(rel)  # deleted under assume-unchanged, or another file type
                continue
            if on_disk[1] != oid or (on_disk[0] == "120000") != (mode == "120000"):
                hidden.add(rel)
        return hidden

    @staticmethod
    def _classify(original: GitCommand, base: str, tip: str) -> _Change:
        """What moving from ``base`` to ``tip`` (commits or trees) adds, changes and deletes."""
        diff = original.run("diff-tree", "-r", "--no-renames", "-z", base, tip)
        fields = diff.nul_fields()
        added: list[str] = []
        changed: list[str] = []
        deleted: list[str] = []
        executable: set[str] = set()
        for raw, path in zip(fields[0::2], fields[1::2], strict=True):
            old_mode, new_mode, *_ids, status = raw.lstrip(":").split()
            {"A": added, "D": deleted}.get(status[0], changed).append(path)
            if {old_mode, new_mode} == {"100644", "100755"}:
                executable.add(path)
        return _Change(sorted(added), sorted(changed), sorted(deleted), executable)

    def _expect_target(
        self, symbolic: str, error: type[SandboxCommitError] | type[SandboxRollbackError]
    ) -> None:
        """Refuse when the original's HEAD (``symbolic``: its full ref name, or ``HEAD`` when
        detached) is not where it was at create."""
        expected = self._require_context().metadata["target_ref"] or "HEAD"
        if symbolic != expected:
            raise error(
                f"the original's HEAD is now {symbolic!r}, not {expected!r} as when sandbox "
                f"{self.sandbox_id} was created; check out {expected!r} again and retry"
            )

    def _current_target(
        self,
        original: GitCommand,
        error: type[SandboxCommitError] | type[SandboxRollbackError],
    ) -> tuple[str, str]:
        """(ref to update, its commit); the original's HEAD must be where it was at create."""
        sha, symbolic = original.run(
            "rev-parse", "HEAD", "--symbolic-full-name", "HEAD"
        ).out.splitlines()[:2]
        self._expect_target(symbolic, error)
        return symbolic, sha

    def _undo_commit(self, original: GitCommand, merged: str) -> None:
        """Move the original back from ``merged`` to the pre-commit tag, if it is still there."""
        pre, current, ref = original.run(
            "rev-parse",
            f"{self._tag('pre-commit')}^{{commit}}",
            "HEAD",
            "--symbolic-full-name",
            "HEAD",
        ).out.splitlines()[:3]
        if merged == pre:
            return  # the commit changed nothing in the original
        self._expect_target(ref, SandboxRollbackError)
        if current == pre:
            return  # already undone: a compensation retried after a later step failed (case 21)
        if current != merged:
            raise SandboxRollbackError(
                f"{ref} moved from {merged} to {current} after sandbox "
                f"{self.sandbox_id} was committed; refusing to roll back",
                refused=True,
            )
        if not self._apply(original, ref, merged, pre, SandboxRollbackError):
            raise SandboxRollbackError(f"{ref} moved during the rollback")
