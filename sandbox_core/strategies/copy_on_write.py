"""``CopyOnWriteSandbox``: a full copy of a directory (seed 002, "CopyOnWriteSandbox").

Layout under ``<sandbox_root>/cow/<sandbox_id>/``:

- ``tree/``: the copy the actor writes to (``get_path`` resolves here);
- ``manifest.json``: a :class:`~sandbox_core.tree.baseline.Baseline`: snapshots of the original
  (per path: type, mode, owner, size, mtime, link target) and of the copy (the same plus
  ctime, inode and link count, so any change shows, xattrs and links included) at create, so
  that commit can tell the sandbox's changes from concurrent changes to the original;
- ``precommit/``: the entries a commit replaced (``old/`` + ``undo.json``) and the stamps of
  what it wrote (``written.json``: a rollback refuses when the original moved since, checked
  up front and again right before each path is put back, case 43), for rollback from
  COMMITTED;
- ``git-admin/``: private git admin state when the original is a linked git worktree (case 05).

Policies:

- Fidelity (docs/fidelity.md): the copy is ``cp -a``; commit and rollback replace only the
  changed paths, keeping content with its holes, file types (FIFOs, sockets and devices are
  recreated, never read), permission bits with set-uid/set-gid/sticky, owner and group, xattrs
  and POSIX ACLs, hard-link groups (case 34) and the mtime of untouched files.
- Commit applies only the paths the sandbox changed, with the journaled, crash-safe
  :func:`~sandbox_core.tree.sync.sync_tree` (case 09). A path changed both in the sandbox and in
  the original since create is a conflict: nothing is written and
  ``SandboxCommitError(conflicts=[...])`` is raised (the sandbox stays ACTIVE). Paths changed
  only in the original are kept.
- Two-phase plan commit (:mod:`sandbox_core.strategies._directory`): ``review`` reports the
  changes, their text lines and bytes, the conflicts above and a digest over the exact change
  (content, type, mode, owner, xattrs, link targets, hard-link groups, deletions); ``prepare``
  applies the same conflict rules and stages the new entries beside the original under
  ``.<name>.sandbox-staging-prepared-<txid>.<sandbox_id>`` (fsynced, its digest equal to the
  review's when nothing changed in between); ``apply_prepared`` re-checks the staged paths'
  stamps under ``lock_tree`` (a concurrent change refuses with nothing touched), then only
  renames, keeping ``precommit/`` as the one-shot commit does; ``abort_prepared`` drops the
  area. ``cleanup`` removes areas whose plan journal was lost.
- Linked git worktree (``.git`` is a file, case 05): the copy gets its own admin directory
  (its own index and a detached HEAD at the source's commit, sharing only the object store), so
  ``git add``/``git commit`` in the sandbox never touch the source's index or branch. ``.git`` is
  excluded from commits. A main worktree (``.git`` directory) is copied whole and is thus already
  private; its ``.git`` is committed back like any other directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from sandbox_core.errors import SandboxCommitError, SandboxCreationError, SandboxForkError
from sandbox_core.protocol import (
    ChangeSummary,
    CommitResult,
    ForkSource,
    PreparedCommit,
    SandboxContext,
)
from sandbox_core.strategies import _directory
from sandbox_core.strategies.base import BaseSandbox, logger
from sandbox_core.strategies.resource_faults import resource_fault
from sandbox_core.tree.baseline import (
    Baseline,
    copy_with_baseline,
    drifted,
    pending_since,
    read_touched,
    reset_copy,
)
from sandbox_core.tree.control import refuse_control_changes
from sandbox_core.tree.guards import lock_tree, refuse_mount_points
from sandbox_core.tree.scan import TreeChanges
from sandbox_core.tree.snapshot import compute_changes_at, link_closure
from sandbox_core.tree.staging import change_digest
from sandbox_core.tree.sync import Meta, recover_sync, root_change, sync_tree

GIT_ADMIN_PRIVATE = "private"


class CopyOnWriteSandbox(BaseSandbox):
    """Strategy ``copy_on_write``: writes go to a full copy; commit syncs the changes back.

    Options: ``sandbox_root`` (str), where ``cow/<sandbox_id>`` is made. Rollbackable: a
    COMMITTED sandbox can be undone from its pre-commit backup.
    """

    strategy = "copy_on_write"
    layout_folder = "cow"
    rollbackable = True
    forkable = True
    undoes_resource_faults = True

    # -- layout -----------------------------------------------------------------------------

    @property
    def base_dir(self) -> Path:
        """``<sandbox_root>/cow/<sandbox_id>``: every artefact of this sandbox.

        Once created, taken from the context, so a sandbox reopened in a process whose default
        root differs (another ``$TMPDIR`` or ``$SANDBOX_CORE_ROOT``) still finds its files.
        """
        if self._context is not None:
            return Path(self._context.sandbox_path).parent
        return self.sandbox_root / "cow" / self.sandbox_id

    @property
    def tree_dir(self) -> Path:
        """The copy that actors write to."""
        return self.base_dir / "tree"

    @property
    def _manifest_path(self) -> Path:
        return self.base_dir / "manifest.json"

    @property
    def _backup_dir(self) -> Path:
        return self.base_dir / "precommit"

    @property
    def _git_admin_dir(self) -> Path:
        return self.base_dir / "git-admin"

    def _source(self) -> Path:
        """The original directory, symlinks resolved (staging goes beside the real one)."""
        return Path(os.path.realpath(self.original_path))

    def _exclude(self) -> list[str]:
        context = self._context
        if context is not None and context.metadata.get("git_admin") == GIT_ADMIN_PRIVATE:
            return [".git"]
        return []

    # -- hooks ------------------------------------------------------------------------------

    def _do_create(self, plan_id: str) -> SandboxContext:
        source = self._source()
        if not source.exists():
            raise SandboxCreationError(f"original path does not exist: {self.original_path}")
        if not source.is_dir():
            raise SandboxCreationError(f"original path is not a directory: {self.original_path}")
        root = Path(os.path.realpath(self.sandbox_root))
        if root == source or source in root.parents:
            raise SandboxCreationError(
                f"sandbox root {root} is inside the original {source}; choose another root"
            )
        refuse_mount_points(source)  # docs/fidelity.md: renames cannot cross a mount point
        self.base_dir.mkdir(parents=True)
        try:
            # Both snapshots from one walk of the copy (as root; see copy_with_baseline): a
            # change made to the original meanwhile shows as drift at commit, never as the
            # sandbox's own change.
            baseline = copy_with_baseline(source, self.tree_dir)
            git_admin = self._isolate_linked_worktree(source)
            if git_admin and baseline.original is not None and baseline.copy is not None:
                baseline = Baseline(
                    _outside_git(baseline.original), _outside_git(baseline.copy), baseline.root
                )
            self._write_manifest(baseline)
        except BaseException:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            raise
        return SandboxContext(
            sandbox_id=self.sandbox_id,
            sandbox_path=str(self.tree_dir),
            original_path=self.original_path,
            resource_id=self.resource_id,
            plan_id=plan_id,
            metadata={
                "strategy": self.strategy,
                "tree": str(self.tree_dir),
                "manifest": str(self._manifest_path),
                "git_admin": git_admin,
            },
        )

    def baseline_manifest(self) -> Path | None:
        """The baseline of the original this sandbox was made from (kept with a checkpoint, so
        a fork carries only this sandbox's own change; docs/forks.md)."""
        return self._manifest_path if self._manifest_path.is_file() else None

    def _do_start_from(self, source: ForkSource) -> None:
        if source.kind != "directory" or not source.snapshot_path:
            raise SandboxForkError(
                f"checkpoint {source.checkpoint_id} is a {source.kind} checkpoint; a "
                "copy_on_write sandbox starts only from a copy_on_write checkpoint"
            )
        _directory.start_copy_from(
            self,
            source,
            Path(source.snapshot_path),
            self._source(),
            self.tree_dir,
            exclude=self._exclude(),
        )

    def _do_commit(self, message: str | None) -> CommitResult:
        source = self._source()
        with lock_tree(source):
            recover_sync(source)  # a crashed earlier sync must be repaired before comparing
            changes, root = self._changes_to_apply(source)
            if self._backup_dir.exists():
                shutil.rmtree(self._backup_dir)
            try:
                sync_tree(
                    self.tree_dir, source, changes=changes, backup_dir=self._backup_dir, root=root
                )
            except Exception as exc:
                # A full or read-only file system: the sync undid its renames and removed its
                # staging (docs/fidelity.md, "Resource faults"); the commit stands only when the
                # fault came after its last rename (the hand-over of the replaced entries is
                # then finished by the next recover_sync).
                if resource_fault(exc) is None or not _directory.landed(
                    self.tree_dir, source, changes, root
                ):
                    if resource_fault(exc) is not None:
                        _directory.tidy_after_fault(source)
                    shutil.rmtree(self._backup_dir, ignore_errors=True)
                    raise
                logger.warning("commit of sandbox %s landed; then: %s", self.sandbox_id, exc)
            _directory.record_committed(self._backup_dir, source)  # for a rollback (case 43)
        return self._result(changes, message)

    def _result(self, changes: TreeChanges, message: str | None) -> CommitResult:
        metadata: dict[str, object] = {"strategy": self.strategy}
        if message:
            metadata["message"] = message
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            changed_files=changes.changed,
            added_files=changes.added,
            deleted_files=changes.deleted,
            metadata=metadata,
        )

    # -- two-phase plan commit --------------------------------------------------------------

    def _do_review(self) -> ChangeSummary:
        """The sandbox's own changes, the conflicts a commit would refuse now, and their
        digest (:func:`~sandbox_core.tree.staging.change_digest`); no lock, nothing written."""
        source = self._source()
        changes, conflicts, root = self._split_changes(source)
        digest = change_digest(self.tree_dir, source, changes, root=root)
        return _directory.summary(self, source, self.tree_dir, changes, digest, conflicts)

    def _do_prepare(self, txid: str, message: str | None) -> PreparedCommit:
        """Stage the commit beside the original (same filesystem), named after ``txid`` and
        this sandbox's id, with a fsynced journal; see :mod:`sandbox_core.strategies._directory`.

        Raises:
            SandboxCommitError: a conflict (``conflicts`` set; nothing staged) or staging failed.
        """
        source = self._source()
        with lock_tree(source):
            recover_sync(source)
            changes, root = self._changes_to_apply(source)
            return _directory.prepare(
                self, self.base_dir, txid, source, self.tree_dir, changes,
                backup_dir=self._backup_dir, result=self._result(changes, message), root=root,
            )  # fmt: skip

    def commit_landed(self) -> bool:
        """Did a commit whose outcome was lost (the process died inside it) reach the original?

        Crash recovery (``sandbox_core.plan.saga``): an interrupted sync is finished or
        undone first (:func:`~sandbox_core.tree.sync.recover_sync`, so the original is exactly
        old or exactly new), then the commit landed when the original holds every change the
        sandbox made and nothing conflicts: what a commit now would write is empty. A sandbox
        that changed nothing answers True (there is nothing to land either way).

        Raises:
            OSError: the trees cannot be read or the interrupted sync cannot be recovered.
        """
        source = self._source()
        with lock_tree(source):
            recover_sync(source)
            changes, conflicts, root = self._split_changes(source)
        return not changes.paths and not conflicts and root is None

    def _do_apply_prepared(self, txid: str) -> CommitResult:
        """Renames only; a concurrent change to a staged path refuses with nothing touched;
        idempotent after a crash (see :mod:`sandbox_core.strategies._directory`)."""
        source = self._source()
        return _directory.apply(self, self.base_dir, txid, source, backup_dir=self._backup_dir)

    def _do_abort_prepared(self, txid: str) -> None:
        _directory.abort(self, self.base_dir, txid, self._source())

    def _do_rollback(self) -> None:
        self._reset_tree(check=self._refuse_if_busy)

    def _refuse_if_busy(self) -> None:
        """The copy stays in place (a working directory inside keeps working); a file open for
        writing in it would keep writing into a replaced entry: refused as busy. Run by the
        reset while it walks the trees, before it writes anything."""
        _directory.refuse_if_busy(self, self.tree_dir, "rollback", writers_only=True)

    def _do_rollback_committed(self) -> None:
        source = self._source()
        # The original moved since the commit at a path the undo puts back: refuse (case 43 B).
        _directory.refuse_if_moved(self, self._backup_dir, source)

        def undo_commit(restored: Callable[[], None]) -> None:  # while the copy is walked
            with lock_tree(source):
                # A commit killed mid-sync is finished or undone first (its backup then says
                # what to undo); else the reset would copy a half-applied original (case 20).
                # Each path is compared right before it is put back: a write of another writer
                # since the commit, also one made while this runs, is a conflict (case 43 B).
                _directory.undo_commit(self, self._backup_dir, source, restored)

        def drop_backup() -> None:
            if self._backup_dir.exists():
                shutil.rmtree(self._backup_dir)

        self._reset_tree(
            restore_original=undo_commit, meanwhile=drop_backup, check=self._refuse_if_busy
        )

    def _has_interrupted(self) -> bool:
        return _directory.has_interrupted(self, self.base_dir, self._source())

    def _do_finish_interrupted(self) -> None:
        _directory.finish_interrupted(self, self.base_dir, self._source(), self._roll_forward_apply)

    def _do_cleanup(self) -> None:
        # Staged two-phase commits whose plan journal was lost are this sandbox's to remove.
        _directory.discard_all(self, self._source())
        if self.base_dir.exists():
            shutil.rmtree(self.base_dir)

    # -- commit helpers ---------------------------------------------------------------------

    def _changes_to_apply(self, source: Path) -> tuple[TreeChanges, Meta | None]:
        """The sandbox's own changes and the metadata to give the original's top directory
        (``None``: unchanged); raise on paths changed on both sides since create.

        One C-speed walk of each tree (:func:`~sandbox_core.tree.snapshot.snapshot_tree`), compared
        with the manifest by set operations; only the differing paths are then looked at (and
        their content compared when size and mode agree but the mtime moved), as ``rsync`` does.

        Raises:
            SandboxCommitError: with ``conflicts`` (sorted relative paths; ``"."`` for the top
                directory) when a path changed both in the sandbox and in the original, or
                the paths of control files the commit must not write
                (:mod:`sandbox_core.tree.control`).
        """
        changes, conflicts, root = self._split_changes(source)
        refuse_control_changes(changes, source, self.sandbox_id)  # .git, the core's own files
        if conflicts:
            raise SandboxCommitError(
                f"commit of sandbox {self.sandbox_id} refused: {len(conflicts)} path(s) changed "
                f"in both the sandbox and the original: {', '.join(conflicts[:10])}",
                conflicts=conflicts,
            )
        return changes, root

    def _split_changes(self, source: Path) -> tuple[TreeChanges, list[str], Meta | None]:
        """The sandbox's own changes (paths changed only in the original left out), the
        conflicts (paths changed on both sides since create, sorted; ``"."`` when both changed
        the top directory's own metadata) and the metadata the top directory gets (or None)."""
        exclude = self._exclude()
        # The manifest (2.4 MB on 11,000 paths) is read while ``find`` walks the copy.
        baseline, touched = read_touched(self._read_manifest, self.tree_dir, exclude=exclude)
        if touched is None:  # unknown baseline: every path of both trees is looked at
            pending = pending_since(baseline, source, self.tree_dir, exclude=exclude)
            touched = pending.candidates
        # Only the copy is walked: paths changed only in the original are kept anyway, so the
        # original is looked at (one lstat each) only where the sandbox changed something.
        changes = compute_changes_at(source, self.tree_dir, touched)
        drift = drifted(baseline, source, changes.paths, exclude=exclude)
        ours = [p for p in changes.paths if p not in drift]
        closure = link_closure(self.tree_dir, source, ours) - set(ours)
        drift |= drifted(baseline, source, closure, exclude=exclude)
        root, root_clash = root_change(baseline.root, source, self.tree_dir)
        top = ["."] if root_clash else []
        if not drift:
            return changes, top, root
        # A path the original changed since create: a conflict when the sandbox changed it
        # too (or it shares an inode with a path the commit replaces).
        conflicts = sorted(rel for rel in changes.paths if rel in drift)
        conflicts += sorted(closure & drift)
        kept = TreeChanges(
            added=[p for p in changes.added if p not in drift],
            changed=[p for p in changes.changed if p not in drift],
            deleted=[p for p in changes.deleted if p not in drift],
        )
        return kept, top + conflicts, root

    def _reset_tree(
        self,
        *,
        restore_original: Callable[[Callable[[], None]], None] | None = None,
        meanwhile: Callable[[], None] | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        """Make the copy equal to the original again and re-take the manifest
        (:func:`~sandbox_core.tree.baseline.reset_copy`; ``restore_original``, ``meanwhile``
        and ``check`` as there).

        One walk of each tree; only differing paths are copied (O(changes)), and the manifest
        is updated at those paths instead of being re-taken by a third walk.
        """

        def restore(restored: Callable[[], None]) -> None:
            if restore_original is not None:
                restore_original(restored)
            _directory.forget_applied(self.base_dir)  # undone: no apply may answer with it again

        baseline = reset_copy(  # the manifest is read while both trees are walked
            self._read_manifest,
            self._source(),
            self.tree_dir,
            exclude=self._exclude(),
            restore_original=restore,
            meanwhile=meanwhile,
            check=check,
        )
        _directory.save_reset_baseline(baseline, self._manifest_path, self.sandbox_id)

    def _write_manifest(self, baseline: Baseline) -> None:
        baseline.save(self._manifest_path)

    def _read_manifest(self) -> Baseline:
        """The baseline; a manifest of an older version gives an unknown baseline (every path
        of the copy is then compared with the original)."""
        return Baseline.load(self._manifest_path)

    # -- linked git worktrees (case 05) -----------------------------------------------------

    def _isolate_linked_worktree(self, source: Path) -> str | None:
        """Give a copied linked worktree its own git admin dir; ``"private"`` when done.

        The copy's ``.git`` file would otherwise point at the source's admin dir, so ``git add``
        in the sandbox would write the source's index (case 05).
        """
        dotgit = self.tree_dir / ".git"
        if dotgit.is_symlink() or not dotgit.is_file():
            return None
        text = dotgit.read_text(encoding="utf-8").strip()
        if not text.startswith("gitdir:"):
            return None
        admin = Path(text.removeprefix("gitdir:").strip())
        if not admin.is_absolute():
            admin = source / admin
        commondir_file = admin / "commondir"
        if commondir_file.exists():
            common = admin / commondir_file.read_text(encoding="utf-8").strip()
        else:
            common = admin  # ``--separate-git-dir`` repository: the admin dir is the common dir
        head = self._source_head(source, admin)
        private = self._git_admin_dir
        private.mkdir()
        (private / "HEAD").write_text(head + "\n", encoding="utf-8")
        (private / "commondir").write_text(f"{os.path.realpath(common)}\n", encoding="utf-8")
        (private / "gitdir").write_text(f"{dotgit}\n", encoding="utf-8")
        for name in ("index", "config.worktree"):
            if (admin / name).is_file():
                shutil.copy2(admin / name, private / name)
        dotgit.write_text(f"gitdir: {private}\n", encoding="utf-8")
        return GIT_ADMIN_PRIVATE

    @staticmethod
    def _source_head(source: Path, admin: Path) -> str:
        """Commit id of the source's HEAD (detached in the copy, so its commits move no
        branch of the source); the raw HEAD text when the branch has no commit yet."""
        proc = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--verify", "-q", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0:
            return proc.stdout.strip()
        return (admin / "HEAD").read_text(encoding="utf-8").strip()


def _outside_git(snapshot: dict[str, str]) -> dict[str, str]:
    return {rel: sig for rel, sig in snapshot.items() if not _under(rel, ".git")}


def _under(rel: str, top: str) -> bool:
    return rel == top or rel.startswith(top + "/")
