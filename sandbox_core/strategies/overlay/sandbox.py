"""``OverlaySandbox``: strategy ``overlay`` (seed 002, "OverlaySandbox"; seed 003).

Layout under ``<sandbox_root>/overlay/<sandbox_id>/`` (seed 003, "upper, work, and merged
directories"): ``lower`` (a symlink to the original), ``upper``, ``work``, ``merged`` and
``commit`` (staging and the pre-commit backup; a hidden sibling of the original instead when
the sandbox root is on another filesystem, so that the backup can be renamed back).

Two modes, recorded in ``context.metadata["overlay_mode"]``:

- ``kernel``: a real OverlayFS mount, original as the lower layer. Nothing ever writes into the
  lower layer while it is mounted (undefined behaviour in OverlayFS): commit reads the changed
  paths from the upper layer (whiteouts, opaque and redirected dirs: case 11, case 12), copies
  their final state out of the merged view into ``commit/stage``, unmounts, applies them with
  ``tree.sync.sync_tree`` (per-path rename swaps, journaled, undone on error, recovered after a
  crash), and remounts with an empty upper layer.
- ``fallback``: ``merged`` is a full, exact copy of the original (``cp -a``, as
  ``copy_on_write``), with a :class:`~sandbox_core.tree.baseline.Baseline` in ``manifest.json``;
  commit syncs the paths the sandbox changed (``sync_tree(merged, original)``; paths changed
  only in the original since create are kept, as the kernel mode keeps lower-layer changes) and
  rollback syncs the differing paths back (``reset_copy``). Used when the process may not mount
  (``mode="auto"`` falls back on EPERM, ENODEV, ...; the reason is kept in
  ``metadata["fallback_reason"]``).

Fidelity (docs/fidelity.md), both modes: content with holes, file types (FIFOs, sockets and
device nodes are recreated, never read), permission bits with set-uid/set-gid/sticky, owner and
group, xattrs and POSIX ACLs, hard-link groups and the mtime of untouched files are kept across
create, commit, rollback from COMMITTED and checkpoint restore.

Both modes keep the replaced entries in ``commit/backup`` for rollback from COMMITTED
(``undo_sync``) and report ``CommitResult`` file lists as ``tree.scan.TreeChanges`` (the same
path-level lists as ``copy_on_write``: directories included, a type swap is "changed").

Two-phase plan commit (``strategies._directory``), both modes: ``review`` and
``prepare`` read the same change set as ``commit`` (kernel: the paths the upper layer names,
read through the merged view while mounted; fallback: the paths the sandbox touched); prepare
stages them on the original's filesystem (a hidden sibling named after the txid and the sandbox
id, never in the upper layer's filesystem) without unmounting; ``apply_prepared`` re-checks the
staged paths (a concurrent change refuses with nothing touched), then unmounts (kernel), renames,
remounts over an empty upper layer, keeping ``commit/backup`` for rollback from COMMITTED. A
kernel-mode original that is a mount point cannot prepare (its staging area would be written
inside the mounted lower directory): ``TwoPhaseUnavailableError``. Overlay commits report no
conflicts (the sandbox's paths win, as in the one-shot commit).

Checkpoints (seed 002, "snapshot of the upper layer"): :meth:`OverlaySandbox.
create_checkpoint_snapshot` / :meth:`OverlaySandbox.restore_checkpoint_snapshot`, called by
``CheckpointManager`` for the ``overlay_snapshot`` kind.

Options: ``sandbox_root`` (str); ``mode`` = ``"auto"`` (default) | ``"kernel"`` | ``"fallback"``;
``redirect_dir`` (str, the OverlayFS mount option, e.g. ``"on"``; default: the kernel's);
``userxattr`` (bool; default: on exactly when running inside a child user namespace).

Policy (case 05): a source tree holding a ``.git`` *file* whose git dir lies outside the tree (a
linked worktree, or a submodule with an absolute git dir) is refused at create: git commands in
the sandbox would write to the original's index and refs. Use ``git_worktree`` for such trees.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox_core._path_limits import short_alias
from sandbox_core.durable import write_json_atomic
from sandbox_core.errors import (
    SandboxCreationError,
    SandboxError,
    SandboxForkError,
    SandboxStateError,
    TwoPhaseUnavailableError,
)
from sandbox_core.protocol import (
    ChangeSummary,
    CommitResult,
    ForkSource,
    PreparedCommit,
    SandboxContext,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies import _directory
from sandbox_core.strategies.base import BaseSandbox, logger
from sandbox_core.strategies.overlay import mount as kernel
from sandbox_core.strategies.overlay.mount import LayerChange, OverlayLayout
from sandbox_core.strategies.resource_faults import resource_error, resource_fault
from sandbox_core.tree.baseline import (
    Baseline,
    copy_with_baseline,
    pending_since,
    read_touched,
    reset_copy,
)
from sandbox_core.tree.control import refuse_control_changes
from sandbox_core.tree.copy import LinkMap, copy_entry, copy_metadata
from sandbox_core.tree.guards import lock_tree, refuse_mount_points
from sandbox_core.tree.ops import backup_directory
from sandbox_core.tree.scan import Entry, TreeChanges, diff_entries, entry_of, scan_tree
from sandbox_core.tree.snapshot import compute_changes_at, link_closure
from sandbox_core.tree.staging import change_digest
from sandbox_core.tree.sync import Meta, recover_sync, root_change, root_meta, sync_tree, undo_sync

MODES = ("auto", "kernel", "fallback")
_MANIFEST = "manifest.json"
_ROOT_META = "root-meta.json"  # the top's own metadata when the kernel view was last made
_CHECKPOINT_FILE = "overlay-checkpoint.json"
_SNAPSHOT_STATES = (SandboxStatus.CREATED, SandboxStatus.ACTIVE, SandboxStatus.ROLLED_BACK)


class OverlaySandbox(BaseSandbox):
    """Strategy ``overlay``: OverlayFS layers over the original, or a userspace fallback.

    See the module docstring for layout, modes, options and the linked-worktree policy.

    Raises:
        ValueError: ``mode`` is not one of ``auto``, ``kernel``, ``fallback``.
    """

    strategy = "overlay"
    layout_folder = "overlay"
    rollbackable = True
    forkable = True
    undoes_resource_faults = True

    def __init__(self, resource_id: str, original_path: str, **options: Any) -> None:
        super().__init__(resource_id, original_path, **options)
        mode = self._options.get("mode", "auto")
        if mode not in MODES:
            raise ValueError(f"overlay mode must be one of {', '.join(MODES)}, not {mode!r}")
        self._merged_dir: Path | None = None

    # -- layout -----------------------------------------------------------------------------

    @property
    def base_path(self) -> Path:
        """``<sandbox_root>/overlay/<sandbox_id>``: every artefact of this sandbox lives here."""
        return self.sandbox_root / "overlay" / self.sandbox_id

    @property
    def upper_dir(self) -> Path:
        """Upper layer (kernel mode); empty in fallback mode."""
        return self.base_path / "upper"

    @property
    def work_dir(self) -> Path:
        """OverlayFS work directory (kernel mode); empty in fallback mode."""
        return self.base_path / "work"

    @property
    def merged_dir(self) -> Path | None:
        """The merged view actors write to; ``None`` before create."""
        return self._merged_dir

    @property
    def overlay_mode(self) -> str | None:
        """``"kernel"`` or ``"fallback"`` once created, else ``None``."""
        mode = self._meta("overlay_mode")
        return str(mode) if mode else None

    def _meta(self, key: str) -> Any:
        return self._context.metadata.get(key) if self._context else None

    def _original(self) -> Path:
        return Path(self.original_path).absolute()

    def _layout(self) -> OverlayLayout:
        return OverlayLayout(
            lower=self.base_path / "lower",
            upper=self.upper_dir,
            work=self.work_dir,
            merged=self.base_path / "merged",
            redirect_dir=self._options.get("redirect_dir"),
            userxattr=bool(self._meta("userxattr")),
        )

    def _commit_area(self) -> Path:
        area = self._meta("commit_area")
        return Path(area) if area else self.base_path / "commit"

    def _path_root(self) -> str:
        """``get_path`` resolves in the merged dir (seed 003).

        Raises:
            SandboxStateError: ``"merged directory not set"``.
        """
        if self._merged_dir is None:
            raise SandboxStateError("merged directory not set")
        return str(self._merged_dir)

    # -- create -----------------------------------------------------------------------------

    def _do_create(self, plan_id: str) -> SandboxContext:
        original = self._original()
        if not original.is_dir():
            raise SandboxCreationError(f"original path {original} is not an existing directory")
        base, resolved = self.base_path.resolve(), original.resolve()
        if base == resolved or resolved in base.parents:
            raise SandboxCreationError(
                f"sandbox root {self.sandbox_root} lies inside the original {original}"
            )
        # docs/fidelity.md: renames cannot cross a mount point, and the kernel's overlay does not
        # show what is mounted inside its lower directory.
        refuse_mount_points(original)
        if self._options.get("mode", "auto") != "fallback":
            _refuse_external_gitfiles(original)  # fallback: checked beside its copy (_build)
        try:
            return self._build(plan_id, original)
        except BaseException:
            self._discard_artefacts()
            raise

    def _build(self, plan_id: str, original: Path) -> SandboxContext:
        base = self.base_path
        for directory in (self.upper_dir, self.work_dir, base / "merged"):
            directory.mkdir(parents=True)
        self._match_root(self.upper_dir)
        (base / "lower").symlink_to(original, target_is_directory=True)
        metadata: dict[str, Any] = {
            "strategy": self.strategy,
            "base_path": str(base),
            "upper_dir": str(self.upper_dir),
            "work_dir": str(self.work_dir),
            "merged_dir": str(base / "merged"),
            "commit_area": str(_choose_commit_area(base, original, self.sandbox_id)),
            "lower_generation": 0,
        }
        mode = self._options.get("mode", "auto")
        reason = "mode=fallback requested" if mode == "fallback" else None
        if mode != "fallback":
            userxattr = self._options.get("userxattr")
            if userxattr is None:
                userxattr = not kernel.in_initial_user_namespace()
            layout = dataclasses.replace(self._layout(), userxattr=bool(userxattr))
            try:
                kernel.mount_overlay(layout)
            except OSError as exc:
                if mode == "kernel" or exc.errno not in kernel.UNAVAILABLE_ERRNOS:
                    raise SandboxCreationError(f"OverlayFS mount failed: {exc}") from exc
                reason = f"kernel OverlayFS unavailable: {exc}"
            else:
                metadata.update(
                    overlay_mode="kernel",
                    userxattr=layout.userxattr,
                    xattr_namespace=layout.xattr_namespace,
                    redirect_dir=layout.redirect_dir,
                )
        if reason is not None:
            logger.info(
                "overlay sandbox %s uses the userspace fallback: %s", self.sandbox_id, reason
            )
            # An exact copy (cp -a: owners, special files, links, holes, xattrs) and the
            # baseline of both sides from one walk of the copy (copy_with_baseline).
            (base / "merged").rmdir()
            baseline = copy_with_baseline(original, base / "merged")
            if mode == "fallback" and baseline.original is not None:
                # The case-05 policy check on the ``.git`` files the walk found, instead of a
                # scan of its own; a refusal discards the copy (_do_create).
                _refuse_listed_gitfiles(original, baseline.original)
            baseline.save(base / _MANIFEST)
            metadata.update(overlay_mode="fallback", fallback_reason=reason)
        self._merged_dir = base / "merged"
        return SandboxContext(
            sandbox_id=self.sandbox_id,
            sandbox_path=str(base / "merged"),
            original_path=self.original_path,
            resource_id=self.resource_id,
            plan_id=plan_id,
            metadata=metadata,
        )

    # -- commit -----------------------------------------------------------------------------

    def _do_commit(self, message: str | None) -> CommitResult:
        original = self._original()
        merged = self.base_path / "merged"
        area = self._commit_area()
        try:
            _reset_dir(area)
            if self.overlay_mode == "kernel":
                self._require_mounted()
                root = self._root_to_commit(original)  # read from the view while it is mounted
                changes = self._commit_kernel(original, merged, area, root)
            else:
                changes, root = self._commit_fallback(original, merged, area / "backup")
        except Exception as exc:
            if resource_fault(exc) is not None:
                # docs/fidelity.md, "Resource faults": the original is as before (the sync
                # undid its renames); nothing of the commit stays beside it, the view is kept.
                shutil.rmtree(area, ignore_errors=True)
            raise
        if not changes.is_empty or root is not None:
            self._set_meta(lower_generation=int(self._meta("lower_generation") or 0) + 1)
            _directory.record_committed(area / "backup", original)  # for a rollback (case 43 B)
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            changed_files=changes.changed,
            added_files=changes.added,
            deleted_files=changes.deleted,
            metadata={
                "strategy": self.strategy,
                "overlay_mode": self.overlay_mode,
                "message": message,
            },
        )

    def _commit_fallback(
        self, original: Path, merged: Path, backup: Path
    ) -> tuple[TreeChanges, Meta | None]:
        """Fallback mode: sync the paths the sandbox touched (the original's own changes are
        kept); returns the changes and the metadata given to the original's top."""
        recover_sync(original)  # a sync interrupted by a crash is repaired first
        baseline, touched = self._touched(original, merged)
        changes = compute_changes_at(original, merged, touched)
        refuse_control_changes(changes, original, self.sandbox_id)  # nothing written yet
        root = self._root_to_commit(original, baseline)
        if not changes.is_empty or root is not None:
            try:
                sync_tree(merged, original, changes=changes, backup_dir=backup, root=root)
            except Exception as exc:
                if resource_fault(exc) is None:
                    raise
                if not _directory.landed(merged, original, changes, root):
                    _directory.tidy_after_fault(original)
                    raise
                logger.warning("commit of sandbox %s landed; then: %s", self.sandbox_id, exc)
        return changes, root

    def _touched(self, original: Path, merged: Path) -> tuple[Baseline, set[str]]:
        """Fallback mode: the manifest and the paths the sandbox changed since create (or the
        last reset), from one walk of the copy alone (the manifest is read meanwhile); the
        original is not walked, since its own changes are kept whatever they are. An unknown
        baseline (older manifest) walks both trees."""
        baseline, touched = read_touched(lambda: Baseline.load(self.base_path / _MANIFEST), merged)
        if touched is None:
            touched = pending_since(baseline, original, merged).touched
        return baseline, touched

    def _root_base(self) -> Meta | None:
        """The top directory's own metadata when the view was last made (None: unknown)."""
        if self.overlay_mode == "kernel":
            try:
                found: Meta = json.loads((self.base_path / _ROOT_META).read_text("utf-8"))
            except (FileNotFoundError, ValueError):
                return None  # a sandbox of an older version: its top is not committed
            return found
        return Baseline.load(self.base_path / _MANIFEST).root

    def _root_to_commit(self, original: Path, baseline: Baseline | None = None) -> Meta | None:
        """The metadata the sandbox gave its top directory since the view was made, which a
        commit gives the original's top (None: unchanged; the sandbox wins, as for paths).
        ``baseline``: the fallback's manifest when the caller loaded it already."""
        base = baseline.root if baseline is not None else self._root_base()
        root, _ = root_change(base, original, self.base_path / "merged")
        return root

    def _commit_kernel(
        self, original: Path, merged: Path, area: Path, root: Meta | None = None
    ) -> TreeChanges:
        """Read changes from the upper layer, stage them, unmount, sync, remount empty.

        The lower directory is written only while unmounted. A failure at any step leaves the
        original as it was (``sync_tree`` undoes its swaps; a failed remount undoes the sync)
        and the sandbox showing its uncommitted work again.
        """
        self._require_mounted()
        layer_changes = kernel.changes_from_upper(
            self.upper_dir, original, str(self._meta("xattr_namespace")), merged
        )
        stage_dir = area / "stage"
        stage_dir.mkdir()
        # The stage mirror is named through a short alias: its paths are then no longer than
        # the view's, whatever the length of the commit area's own path (PATH_MAX).
        try:
            with short_alias(stage_dir) as stage:
                changes = self._stage_and_sync(layer_changes, original, merged, stage, area, root)
        finally:
            # The stage is on the original's volume when the sandbox root is not (case 42).
            shutil.rmtree(stage_dir, ignore_errors=True)
        return changes

    def _stage_and_sync(
        self,
        layer_changes: list[LayerChange],
        original: Path,
        merged: Path,
        stage: Path,
        area: Path,
        root: Meta | None,
    ) -> TreeChanges:
        """The body of :meth:`_commit_kernel` once its stage mirror exists at ``stage``."""
        links: LinkMap = {}  # shared by both staging passes: one inode per link group
        stage_layer_changes(layer_changes, merged, stage, links)
        changes = tree_changes_of(layer_changes, original, stage)
        # A name whose hard-link group changed (``ln`` in the sandbox) is a change too; the
        # merged view and the lower are only read while mounted.
        replaced = [c.path for c in layer_changes if c.kind == "replace"]
        changes = _union(changes, compute_changes_at(original, merged, replaced))
        refuse_control_changes(changes, original, self.sandbox_id)  # still mounted, unwritten
        # Names sharing an inode with a changed one are staged too, from the merged view, so
        # the sync replaces whole hard-link groups (case 34).
        roots = set(replaced)
        staged = roots | {c.path for c in layer_changes} | set(changes.paths)
        extra = sorted(
            rel
            for rel in link_closure(merged, original, changes.paths) - staged
            if not any(anc in roots for anc in _ancestors(rel))
        )
        stage_layer_changes([LayerChange(rel, "replace") for rel in extra], merged, stage, links)
        if not changes.is_empty or root is not None:
            kernel.unmount(merged)
            synced = _union(changes, TreeChanges(changed=extra))
            try:
                sync_tree(
                    stage, original, changes=synced, backup_dir=area / "backup",
                    expand_links=False, root=root,
                )  # fmt: skip
            except BaseException as exc:
                if resource_fault(exc) is None or not _directory.landed(
                    stage, original, synced, root
                ):
                    if resource_fault(exc) is not None:
                        _directory.tidy_after_fault(original)  # the lower is unmounted
                    kernel.mount_overlay(self._layout())
                    raise
                logger.warning("commit of sandbox %s landed; then: %s", self.sandbox_id, exc)
            self._swap_in_empty_upper(original, area / "backup")
        elif any(self.upper_dir.iterdir()):
            # Copied-up but unchanged entries: nothing to write, start from a clean layer.
            kernel.unmount(merged)
            self._remount_empty()
        return changes

    # -- two-phase plan commit --------------------------------------------------------------

    def _change_set(self, original: Path) -> tuple[TreeChanges, TreeChanges, bool, Meta | None]:
        """``(changes, staged, expand_links, root)``: the changes a commit reports, the paths it
        stages (kernel mode adds the other names of changed hard-link groups, as
        :meth:`_commit_kernel` does), and whether staging still expands link groups. Read from
        the merged view (kernel: only the paths the upper layer names; fallback: the paths the
        sandbox touched since create, so the original's own changes are kept), and the metadata
        the original's top directory gets (:meth:`_root_to_commit`). Nothing is written."""
        merged = self.base_path / "merged"
        if self.overlay_mode != "kernel":
            baseline, touched = self._touched(original, merged)
            changes = compute_changes_at(original, merged, touched)
            return changes, changes, True, self._root_to_commit(original, baseline)
        self._require_mounted()
        layer_changes = kernel.changes_from_upper(
            self.upper_dir, original, str(self._meta("xattr_namespace")), merged
        )
        # The merged view stands in for the stage mirror of the one-shot commit: it holds
        # exactly what that mirror copies out of it.
        changes = tree_changes_of(layer_changes, original, merged)
        replaced = [c.path for c in layer_changes if c.kind == "replace"]
        changes = _union(changes, compute_changes_at(original, merged, replaced))
        roots = set(replaced)
        covered = roots | {c.path for c in layer_changes} | set(changes.paths)
        extra = sorted(
            rel
            for rel in link_closure(merged, original, changes.paths) - covered
            if not any(anc in roots for anc in _ancestors(rel))
        )
        staged = _union(changes, TreeChanges(changed=extra))
        return changes, staged, False, self._root_to_commit(original)

    def _do_review(self) -> ChangeSummary:
        """What a commit would land now and its digest; overlay commits have no conflicts (the
        sandbox's paths win, the original's other changes are kept). Nothing is written."""
        original = self._original()
        merged = self.base_path / "merged"
        changes, staged, expand, root = self._change_set(original)
        digest = change_digest(merged, original, staged, expand_links=expand, root=root)
        return _directory.summary(self, original, merged, changes, digest, [])

    def _do_prepare(self, txid: str, message: str | None) -> PreparedCommit:
        """Stage the commit on the original's filesystem (beside it, not in the upper layer's
        filesystem), named after ``txid``, fsynced; the original and the mount are untouched.

        Raises:
            TwoPhaseUnavailableError: kernel mode and the original is a mount point: its staging
                area would be a child of the mounted lower directory, which is never written
                while mounted (the plan falls back to the saga, or fails up front).
            SandboxError: kernel mode and the overlay is not mounted.
        """
        original = self._original()
        if self.overlay_mode == "kernel" and (
            original.parent.stat().st_dev != original.stat().st_dev
        ):
            raise TwoPhaseUnavailableError(
                f"overlay sandbox {self.sandbox_id}: the original {original} is a mount point; "
                "a kernel-mode prepare would write into the mounted lower directory"
            )
        with lock_tree(original):
            if self.overlay_mode != "kernel":
                recover_sync(original)  # never while a lower directory is mounted
            changes, staged, expand, root = self._change_set(original)
            refuse_control_changes(staged, original, self.sandbox_id)
            return _directory.prepare(
                self, self.base_path, txid, original, self.base_path / "merged", staged,
                backup_dir=self._commit_area() / "backup", expand_links=expand,
                result=self._result(changes, message), root=root,
            )  # fmt: skip

    def _do_apply_prepared(self, txid: str) -> CommitResult:
        """Renames only (kernel mode: unmounted around them, then remounted over an empty upper
        layer); refused with nothing touched when a staged path changed in the original since
        prepare; idempotent after a crash (see :mod:`sandbox_core.strategies._directory`)."""
        merged = self.base_path / "merged"
        kernel_mode = self.overlay_mode == "kernel"

        def before() -> None:
            self._commit_area().mkdir(parents=True, exist_ok=True)
            if kernel_mode and kernel.is_overlay_mounted(merged):
                kernel.unmount(merged)  # the lower directory is written only while unmounted

        def after() -> None:
            if kernel_mode:
                self._remount_empty()

        def refused() -> None:  # put back: the view shows the sandbox's work again
            if kernel_mode and not kernel.is_overlay_mounted(merged):
                kernel.mount_overlay(self._layout())

        result = _directory.apply(
            self, self.base_path, txid, self._original(),
            backup_dir=self._commit_area() / "backup", before=before, after=after,
            refused=refused,
        )  # fmt: skip
        changed = result.changed_files or result.added_files or result.deleted_files
        # Keyed by the txid: a roll-forward (apply again after a crash) never bumps twice.
        if changed and self._meta("lower_generation_txid") != txid:
            self._set_meta(
                lower_generation=int(self._meta("lower_generation") or 0) + 1,
                lower_generation_txid=txid,
            )
        return result

    def _do_abort_prepared(self, txid: str) -> None:
        _directory.abort(self, self.base_path, txid, self._original())

    def _result(self, changes: TreeChanges, message: str | None) -> CommitResult:
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            changed_files=changes.changed,
            added_files=changes.added,
            deleted_files=changes.deleted,
            metadata={
                "strategy": self.strategy,
                "overlay_mode": self.overlay_mode,
                "message": message,
            },
        )

    def _swap_in_empty_upper(self, original: Path, backup: Path) -> None:
        layout = self._layout()
        kept = [(d, d.with_name(d.name + ".old")) for d in (self.upper_dir, self.work_dir)]
        try:
            for current, old in kept:
                current.rename(old)
                current.mkdir()
            self._match_root(self.upper_dir)
            kernel.mount_overlay(layout)
        except BaseException:
            undo_sync(backup, original)  # all or nothing: the commit did not happen
            for current, old in kept:
                if old.exists():
                    shutil.rmtree(current, ignore_errors=True)
                    old.rename(current)
            self._match_root_meta()  # the view's top is the old one again
            kernel.mount_overlay(layout)
            raise
        for _, old in kept:
            shutil.rmtree(old)

    # -- rollback ---------------------------------------------------------------------------

    def _do_rollback(self) -> None:
        """Discard the changes: empty the upper layer and remount, or re-copy (fallback).
        Refused as busy while a process uses the view (item 5 of docs/concurrency.md)."""
        if self.overlay_mode == "kernel":
            self._reset_view(unmounted=self._refuse_if_busy("rollback"))
        else:  # checked while the trees are walked, before anything is written
            self._reset_view(check=self._refuse_if_copy_busy)

    def _refuse_if_busy(self, operation: str) -> bool:
        """Kernel mode unmounts the view (a lazy detach would leave its users writing into a
        layer that is then thrown away): any user refuses. Fallback mode keeps the directory:
        only files open for writing refuse (their entries are replaced).

        A kernel-mode rollback asks the kernel first: a plain unmount of the view succeeds
        only when no process uses it (:func:`~sandbox_core.strategies.overlay.mount.
        unmount_if_unused`); the check and the unmount are one step, so no user can come in
        between (a scan of ``/proc`` followed by the unmount left that gap). The view then
        stays unmounted, as the rollback needs it next. Only a busy view is looked up in
        ``/proc``, to name its users.

        Returns:
            Whether the view was unmounted here (a kernel-mode rollback, nothing using it).

        Raises:
            SandboxRollbackError: ``refused``: a process uses the view; nothing was changed
                (the view stays mounted).
        """
        merged = self.base_path / "merged"
        rollback = operation == "rollback"  # a restore copies its layer with the view shown
        if self.overlay_mode == "kernel" and rollback and kernel.unmount_if_unused(merged):
            return True
        _directory.refuse_if_busy(
            self,
            merged,
            operation,
            writers_only=self.overlay_mode != "kernel" and rollback,
        )
        return False

    def _refuse_if_copy_busy(self) -> None:
        """The fallback rollback's busy check (:meth:`_refuse_if_busy`), run by the reset."""
        self._refuse_if_busy("rollback")

    def _do_rollback_committed(self) -> None:
        """Restore the original from the pre-commit backup, then reset the view (seed 003).
        Refused, nothing changed, when the original moved since the commit at a path the undo
        puts back (case 43 B: ``SandboxRollbackConflictError``)."""
        area = self._commit_area()
        _directory.refuse_if_moved(self, area / "backup", self._original())
        kernel_mode = self.overlay_mode == "kernel"
        # Kernel mode: last, as it may unmount the view. Fallback: while the trees are walked.
        unmounted = kernel_mode and self._refuse_if_busy("rollback")

        def undo_commit(restored: Callable[[], None]) -> None:
            # Kernel: runs unmounted; fallback: while the copy is walked. A commit killed
            # mid-sync is finished or undone first (case 20): only a finished one leaves an
            # undo record in the backup. Each path is compared right before it is put back: a
            # write of another writer since the commit, also one made while this runs, is a
            # conflict (case 43 B).
            if _directory.undo_commit(self, area / "backup", self._original(), restored):
                generation = int(self._meta("lower_generation") or 1)
                self._set_meta(lower_generation=generation - 1, lower_generation_txid=None)

        def drop_commit_area() -> None:
            if area.exists():
                shutil.rmtree(area)

        self._reset_view(
            restore_original=undo_commit,
            meanwhile=drop_commit_area,
            unmounted=unmounted,
            check=None if kernel_mode else self._refuse_if_copy_busy,
        )

    def _reset_view(
        self,
        *,
        restore_original: Callable[[Callable[[], None]], None] | None = None,
        meanwhile: Callable[[], None] | None = None,
        unmounted: bool = False,
        check: Callable[[], None] | None = None,
    ) -> None:
        """Empty the upper layer and remount (kernel), or sync the differing paths of the copy
        back (fallback; ``restore_original`` and ``meanwhile`` as in
        :func:`~sandbox_core.tree.baseline.reset_copy`). ``unmounted``: the kernel view was
        just unmounted by the busy check. ``check``: the fallback's busy check, run by
        ``reset_copy`` while it walks the trees, before anything is written."""

        def restore(restored: Callable[[], None]) -> None:
            if restore_original is not None:
                restore_original(restored)
            _directory.forget_applied(self.base_path)  # undone: no apply may answer with it again

        merged = self.base_path / "merged"
        if self.overlay_mode == "kernel":
            if not unmounted:
                kernel.unmount(merged)  # never write a mounted lower dir
            try:
                restore(lambda: None)
                if meanwhile is not None:
                    meanwhile()
                self._remount_empty()
            except BaseException:
                # A full file system stopped it before the old layers were dropped: the view
                # is shown again as it was (docs/fidelity.md, "Resource faults").
                if self.upper_dir.is_dir() and self.work_dir.is_dir():
                    with contextlib.suppress(OSError):
                        kernel.mount_overlay(self._layout())
                raise
        else:
            # O(changes) copies: only the paths where the copy differs from the original are
            # synced back (one C-speed walk of each tree), instead of re-copying the whole tree.
            # The journaled sync discards the replaced entries with shutil.rmtree (seed 003,
            # "Rollback wraps OSError").
            manifest = self.base_path / _MANIFEST
            # The manifest is read while both trees are walked.
            baseline = reset_copy(
                lambda: Baseline.load(manifest),
                self._original(),
                merged,
                restore_original=restore,
                meanwhile=meanwhile,
                check=check,
            )
            _directory.save_reset_baseline(baseline, manifest, self.sandbox_id)

    def _match_root(self, upper: Path) -> None:
        """The merged root shows the upper root's mode, owner and xattrs: give it the
        original's, so new files get the group a set-gid original gives them (case 10). What
        it got is the base a commit compares the view's top with (:meth:`_root_to_commit`)."""
        copy_metadata(self._original(), upper)
        self._match_root_meta()

    def _match_root_meta(self) -> None:
        """Record the original's top metadata as the base of the view's top."""
        write_json_atomic(
            self.base_path / _ROOT_META,
            root_meta(self._original()),
            durable=False,
            pretty=False,
            tmp_suffix=".tmp",
        )

    def _remount_empty(self) -> None:
        """Mount over a new empty upper layer. The empty layers are made first and swapped in
        by renames, so a full file system stops this with the old layers in place
        (remountable as they were)."""
        layers = [self.upper_dir, self.work_dir]
        fresh = [d.with_name(d.name + ".empty") for d in layers]
        for directory in fresh:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
        self._match_root(fresh[0])
        dropped = _swap_dirs(layers, fresh)
        kernel.mount_overlay(self._layout())
        for directory in dropped:
            shutil.rmtree(directory, ignore_errors=True)

    # -- cleanup and reopen -----------------------------------------------------------------

    def _has_interrupted(self) -> bool:
        return _directory.has_interrupted(self, self.base_path, self._original())

    def _do_finish_interrupted(self) -> None:
        """A decided apply is rolled forward (it unmounts and remounts itself); an interrupted
        one-shot sync is finished or undone, never while the lower directory is mounted (the
        kernel commit unmounts before it writes, and ``reopen`` recovers it before remounting)."""
        merged = self.base_path / "merged"
        mounted = self.overlay_mode == "kernel" and kernel.is_overlay_mounted(merged)
        _directory.finish_interrupted(
            self, self.base_path, self._original(), self._roll_forward_apply, syncs=not mounted
        )

    def _do_cleanup(self) -> None:
        # Staged two-phase commits whose plan journal was lost are this sandbox's to remove.
        _directory.discard_all(self, self._original())
        self._discard_artefacts()
        self._merged_dir = None

    def _discard_artefacts(self) -> None:
        merged = self.base_path / "merged"
        if kernel.is_overlay_mounted(merged):
            kernel.unmount(merged)
        if kernel.is_overlay_mounted(merged):
            # Never delete through a live mount: that would write whiteouts, not free space.
            raise SandboxError(f"cannot unmount {merged}; artefacts left in place")
        area = self._meta("commit_area")
        if area and not Path(area).is_relative_to(self.base_path):
            shutil.rmtree(area, ignore_errors=True)
        if self.base_path.exists() or self.base_path.is_symlink():
            shutil.rmtree(self.base_path)

    def _on_reopen(self) -> None:
        """Re-attach after a restart: a mount outlives its process but not a reboot.

        Before remounting, a commit interrupted by a crash (the overlay is unmounted while the
        original is written) is finished or undone by ``recover_sync``, so the lower directory
        is consistent before it is mounted again. After a crash in the middle of a decided
        two-phase apply nothing is remounted: ``apply_prepared`` finishes the renames and
        remounts over an empty upper layer.
        """
        self._merged_dir = self.base_path / "merged"
        live = (*_SNAPSHOT_STATES, SandboxStatus.COMMITTED)
        if self.overlay_mode != "kernel" or self._status not in live:
            return
        if _directory.apply_begun(self, self.base_path, self._original()):
            return  # a decided two-phase apply was cut short: apply_prepared remounts after it
        if not kernel.is_overlay_mounted(self._merged_dir):
            try:
                recover_sync(self._original())
                kernel.mount_overlay(self._layout())
            except OSError as exc:
                raise SandboxError(
                    f"cannot remount overlay sandbox {self.sandbox_id}: {exc}"
                ) from exc

    def _require_mounted(self) -> None:
        merged = self.base_path / "merged"
        if not kernel.is_overlay_mounted(merged):
            raise SandboxError(f"overlay of sandbox {self.sandbox_id} is not mounted at {merged}")

    def _set_meta(self, **values: Any) -> None:
        context = self._require_context()
        self._context = dataclasses.replace(context, metadata={**context.metadata, **values})

    # -- checkpoints ------------------------------------------------------------------------

    def create_checkpoint_snapshot(self, destination: str | os.PathLike[str]) -> dict[str, Any]:
        """Snapshot the sandbox's state into ``destination`` (must not exist yet).

        Seed 002, "Checkpoint: snapshot of the upper layer": kernel mode copies the upper layer
        with its whiteouts and overlay xattrs; fallback mode copies the merged directory.
        ``destination`` gets ``layer/`` and ``overlay-checkpoint.json`` (the returned dict).
        Allowed in CREATED, ACTIVE and ROLLED_BACK; the sandbox is not changed.

        Raises:
            SandboxStateError: in another status.
            SandboxError: the copy failed (the partial destination is removed).
        """
        with self._lock:
            self._require_snapshot_state("snapshot")
            target = Path(destination)
            kernel_mode = self.overlay_mode == "kernel"
            source = self.upper_dir if kernel_mode else self.base_path / "merged"
            info: dict[str, Any] = {
                "sandbox_id": self.sandbox_id,
                "original_path": self.original_path,
                "overlay_mode": self.overlay_mode,
                "layer": "upper" if kernel_mode else "merged",
                "xattr_namespace": self._meta("xattr_namespace"),
                "lower_generation": self._meta("lower_generation"),
            }
            try:
                target.mkdir(parents=True)
                if kernel_mode:  # small: an exact Python copy keeps whiteouts and xattrs
                    copy_entry(source, target / "layer")
                else:
                    backup_directory(source, target / "layer")
                (target / _CHECKPOINT_FILE).write_text(json.dumps(info), encoding="utf-8")
            except OSError as exc:
                shutil.rmtree(target, ignore_errors=True)
                raise SandboxError(f"snapshot of sandbox {self.sandbox_id} failed: {exc}") from exc
            return info

    def restore_checkpoint_snapshot(self, source: str | os.PathLike[str]) -> None:
        """Make the sandbox show exactly what it showed when ``source`` was snapshotted.

        Kernel mode unmounts, replaces the upper layer (and empties work) with the snapshot and
        remounts; fallback mode replaces the merged directory. The original is not touched.
        The status is kept (CREATED, ACTIVE or ROLLED_BACK).

        Raises:
            SandboxStateError: wrong status, or the snapshot belongs to another sandbox, mode or
                original, or was taken before a commit still in force (an upper layer only
                applies to the lower it was taken against).
            SandboxNoSpaceError, SandboxPermissionError: the file system is full or read-only;
                the view is as it was and the status is kept (retry once the cause is gone).
            SandboxError: the restore failed; the sandbox becomes ERRORED.
        """
        with self._lock:
            self._require_snapshot_state("restore")
            snapshot = Path(source)
            info = json.loads((snapshot / _CHECKPOINT_FILE).read_text(encoding="utf-8"))
            expected = {
                "sandbox_id": self.sandbox_id,
                "original_path": self.original_path,
                "overlay_mode": self.overlay_mode,
                "xattr_namespace": self._meta("xattr_namespace"),
                "lower_generation": self._meta("lower_generation"),
            }
            mismatched = sorted(key for key, value in expected.items() if info.get(key) != value)
            if mismatched:
                raise SandboxStateError(
                    f"checkpoint {snapshot} does not fit sandbox {self.sandbox_id}: "
                    f"{', '.join(mismatched)} differ"
                )
            self._refuse_if_busy("restore")  # the view is replaced: any user is refused
            try:
                self._restore_layer(snapshot / "layer")
            except OSError as exc:
                fault = resource_fault(exc)
                if fault is not None:  # the copy is made first: the view is as it was
                    raise resource_error("restore", self.sandbox_id, fault) from exc
                self._status = SandboxStatus.ERRORED
                raise SandboxError(f"restore of sandbox {self.sandbox_id} failed: {exc}") from exc

    # -- fork (BaseSandbox.start_from) -------------------------------------------------------

    def baseline_manifest(self) -> Path | None:
        """Fallback mode: the baseline of the original this sandbox was made from (kept with a
        checkpoint, so a fork carries only this sandbox's own change; docs/forks.md)."""
        manifest = self.base_path / _MANIFEST
        return manifest if self.overlay_mode == "fallback" and manifest.is_file() else None

    def _do_start_from(self, source: ForkSource) -> None:
        """Kernel mode: the parent's upper layer (exactly its own change, whiteouts and
        xattrs) becomes this sandbox's upper layer over the same lower, the original.
        Fallback mode: the parent's changed paths are synced into this copy
        (:func:`~sandbox_core.strategies._directory.start_copy_from`).

        Raises:
            SandboxForkError: not an overlay checkpoint of this original in this mode, or (in
                fallback mode) an overlap with what the original changed since the parent was
                made.
        """
        snapshot = Path(source.snapshot_path) if source.snapshot_path else None
        info_file = snapshot / _CHECKPOINT_FILE if snapshot is not None else None
        if source.kind != "overlay_snapshot" or info_file is None or not info_file.is_file():
            raise SandboxForkError(
                f"checkpoint {source.checkpoint_id} is a {source.kind} checkpoint; an overlay "
                "sandbox starts only from an overlay checkpoint"
            )
        info = json.loads(info_file.read_text(encoding="utf-8"))
        if os.path.realpath(str(info.get("original_path"))) != os.path.realpath(self.original_path):
            raise SandboxForkError(
                f"checkpoint {source.checkpoint_id} is of another original "
                f"({info.get('original_path')}), not {self.original_path}"
            )
        if info.get("overlay_mode") != self.overlay_mode:
            raise SandboxForkError(
                f"checkpoint {source.checkpoint_id} was taken in overlay mode "
                f"{info.get('overlay_mode')}, this sandbox runs in {self.overlay_mode}; set the "
                "option mode to the same"
            )
        assert snapshot is not None  # narrowed above (info_file is not None)
        if self.overlay_mode == "kernel":
            self._restore_layer(snapshot / "layer")
            return
        _directory.start_copy_from(
            self, source, snapshot / "layer", self._original(), self.base_path / "merged"
        )

    def _restore_layer(self, layer: Path) -> None:
        """Copy ``layer`` beside the view's layer first, then swap them by renames: a full or
        read-only file system stops the copy with the view as it was (its copy removed)."""
        merged = self.base_path / "merged"
        kernel_mode = self.overlay_mode == "kernel"
        layers = [self.upper_dir, self.work_dir] if kernel_mode else [merged]
        swaps = [(d, d.with_name(d.name + ".restore"), d.with_name(d.name + ".replaced"))
                 for d in layers]  # fmt: skip
        for _, fresh, old in swaps:
            shutil.rmtree(fresh, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
        try:
            if kernel_mode:
                copy_entry(layer, swaps[0][1])
                swaps[1][1].mkdir()  # an empty work directory
            else:
                # The copy's inodes are all new, so the baseline's stamps no longer match:
                # every path is compared at the next commit (correct, slower).
                backup_directory(layer, swaps[0][1])
        except BaseException:
            for _, fresh, _ in swaps:
                shutil.rmtree(fresh, ignore_errors=True)
            raise
        if kernel_mode:
            kernel.unmount(merged)
        try:
            for current, fresh, old in swaps:
                current.rename(old)
                fresh.rename(current)
        except BaseException:
            for current, fresh, old in swaps:
                if old.exists():
                    if current.exists():
                        current.rename(fresh)
                    old.rename(current)
                shutil.rmtree(fresh, ignore_errors=True)
            if kernel_mode:
                kernel.mount_overlay(self._layout())
            raise
        if kernel_mode:
            kernel.mount_overlay(self._layout())
        for _, _, old in swaps:
            shutil.rmtree(old, ignore_errors=True)

    def _require_snapshot_state(self, operation: str) -> None:
        if self._status not in _SNAPSHOT_STATES:
            raise SandboxStateError(
                f"cannot {operation} checkpoint of sandbox {self.sandbox_id} "
                f"in status {self._status.value}"
            )


# -- policy -------------------------------------------------------------------------------------


def _refuse_external_gitfiles(root: Path) -> None:
    """Refuse trees whose ``.git`` files point outside the tree (case 05: no shared index).

    Every directory must be listed (a submodule's ``.git`` file may sit anywhere), but no entry
    is ``stat``-ed: ``scandir``'s d_type answers "directory?", and paths are plain strings
    (``Path`` objects per directory cost more than the listing). ``.git`` directories are not
    entered. Measured: about 10-30 ms on an 11,000-file tree, most of a kernel-mode create.
    """
    pending = [os.fspath(root)]
    while pending:
        directory = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name == ".git":
                    if entry.is_file(follow_symlinks=False):
                        _check_gitfile(root, Path(entry.path))
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)


def _refuse_listed_gitfiles(root: Path, snapshot: dict[str, str]) -> None:
    """:func:`_refuse_external_gitfiles` over the paths of a snapshot of ``root`` (or of its
    exact copy): every ``.git`` regular file outside a ``.git`` directory, as the scan finds."""
    for rel, sig in snapshot.items():
        if not rel.endswith(".git"):  # C-speed filter: a split of 11,000 paths cost 5-15 ms
            continue
        parts = rel.split("/")
        if parts[-1] == ".git" and sig.startswith("f ") and ".git" not in parts[:-1]:
            _check_gitfile(root, root / rel)


def _check_gitfile(root: Path, gitfile: Path) -> None:
    gitdir = _gitfile_target(gitfile)
    if gitdir is not None and not gitdir.is_relative_to(root):
        raise SandboxCreationError(
            f"{gitfile} is a git file pointing outside the tree "
            f"(gitdir: {gitdir}); git in an overlay sandbox would share that "
            "index and refs with the original. Use the git_worktree strategy."
        )


def _gitfile_target(gitfile: Path) -> Path | None:
    try:
        text = gitfile.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    target = Path(text.removeprefix("gitdir:").strip())
    return Path(os.path.normpath(gitfile.parent / target))


def _choose_commit_area(base: Path, original: Path, sandbox_id: str) -> Path:
    """Staging and backup must share the original's filesystem so that swaps are renames."""
    device = original.stat().st_dev
    if base.stat().st_dev == device:
        return base / "commit"
    sibling = original.parent / f".{original.name}.overlay-{sandbox_id}"
    if original.parent.stat().st_dev == device:
        return sibling
    return base / "commit"  # no rename possible: shutil.move copies


# -- staging (kernel mode) ---------------------------------------------------------------------


def stage_layer_changes(
    changes: list[LayerChange], merged: Path, stage: Path, links: LinkMap | None = None
) -> None:
    """Copy each replaced path's final state out of the merged view to the same path in
    ``stage`` (a partial mirror), so the overlay can be unmounted before the original is written.

    Entries are copied exactly with :func:`~sandbox_core.tree.copy.copy_entry` (owners,
    set-uid/set-gid, xattrs, holes, special files recreated; symlinks stay links: case 06), one
    link map for all, so names of one merged inode are staged as one inode (case 34).

    Raises:
        OSError: a copy failed; the original has not been touched.
    """
    links = {} if links is None else links
    for change in changes:
        if change.kind != "replace" or not os.path.lexists(merged / change.path):
            continue
        target = stage / change.path
        target.parent.mkdir(parents=True, exist_ok=True)
        copy_entry(merged / change.path, target, links)
    # Directory metadata last: a read-only directory must not stop its children being staged.
    for change in changes:
        if change.kind == "meta":
            target = stage / change.path
            target.mkdir(parents=True, exist_ok=True)
            copy_metadata(merged / change.path, target)


def tree_changes_of(changes: list[LayerChange], original: Path, stage: Path) -> TreeChanges:
    """Path-level :class:`TreeChanges` (as ``compute_changes`` reports them) for the subtrees
    named by ``changes``: the original's entries there against the staged ones."""
    old: dict[str, Entry] = {}
    new: dict[str, Entry] = {}
    for change in changes:
        if change.kind == "meta":
            old[change.path] = _require_entry(original / change.path)
            new[change.path] = _require_entry(stage / change.path)
            continue
        _collect(original, change.path, old)
        if change.kind == "replace":
            _collect(stage, change.path, new)
    return diff_entries(old, new, old_root=original, new_root=stage)


def _require_entry(path: Path) -> Entry:
    entry = entry_of(path)
    if entry is None:
        raise FileNotFoundError(2, "vanished during commit", str(path))
    return entry


def _collect(root: Path, relative: str, into: dict[str, Entry]) -> None:
    entry = entry_of(root / relative)
    if entry is None:
        return
    into[relative] = entry
    if entry.kind == "dir":
        for below, sub_entry in scan_tree(root / relative).items():
            into[f"{relative}/{below}"] = sub_entry


def _swap_dirs(current: list[Path], fresh: list[Path]) -> list[Path]:
    """Put each ``fresh`` directory in the place of its ``current`` one (which may be missing)
    by renames, all or none: on a failure every rename made is undone. Returns the replaced
    directories (``<name>.dropped``), for the caller to remove."""
    done: list[tuple[Path, Path, Path]] = []
    try:
        for directory, new in zip(current, fresh, strict=True):
            old = directory.with_name(directory.name + ".dropped")
            shutil.rmtree(old, ignore_errors=True)
            if directory.exists():
                directory.rename(old)
            done.append((directory, new, old))
            new.rename(directory)
    except BaseException:
        for directory, new, old in reversed(done):
            if not new.exists() and directory.exists():
                directory.rename(new)
            if old.exists():
                old.rename(directory)
        raise
    return [old for _, _, old in done if old.exists()]


def _reset_dir(directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)


def _ancestors(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _union(a: TreeChanges, b: TreeChanges) -> TreeChanges:
    """Both change sets; a path added or deleted in one and changed in the other stays added or
    deleted."""
    added, deleted = set(a.added) | set(b.added), set(a.deleted) | set(b.deleted)
    changed = (set(a.changed) | set(b.changed)) - added - deleted
    return TreeChanges(sorted(added), sorted(changed), sorted(deleted))
