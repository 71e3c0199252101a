"""Directory trees: scan, compare, copy, restore and sync them (seed 002, "Filesystem Utilities").

Shared by the directory strategies (``copy_on_write``, ``overlay``) and by checkpoints. One job
a module; import the module you need (this package re-exports nothing, so importing one module
never loads the others):

- :mod:`~sandbox_core.tree.scan`: the tree model (:class:`~sandbox_core.tree.scan.Entry`,
  :class:`~sandbox_core.tree.scan.TreeChanges`) and the walk (:func:`scan_tree`).
- :mod:`~sandbox_core.tree.snapshot`: quick-check snapshots (:func:`snapshot_tree` /
  :func:`differing_paths` / :func:`compute_changes_at`: one C-speed walk per tree, then
  O(changes)), hard-link groups, and :func:`compute_changes`.
- :mod:`~sandbox_core.tree.textdiff`: :func:`compute_diff` (unified diff text) and
  :func:`change_stats` (lines and bytes of a change set).
- :mod:`~sandbox_core.tree.copy`: exact copies (:func:`copy_entry` / :func:`copy_file` /
  :func:`copy_metadata`).
- :mod:`~sandbox_core.tree.ops`: whole-directory operations: :func:`backup_directory` copies a
  tree exactly; :func:`safe_restore` puts a backup in place with renames (case 09: EXDEV-safe).
- :mod:`~sandbox_core.tree.guards`: what is refused before a write (mount points inside a
  tree, errors that keep the sandbox ACTIVE), :func:`lock_tree`, staging key checks.
- :mod:`~sandbox_core.tree.beneath`: :class:`Beneath`, the directory descriptors every change
  to a tree is made through (``O_NOFOLLOW`` component by component: case 44).
- :mod:`~sandbox_core.tree.original_lock`: :class:`OriginalLock`, the durable lock beside an
  original that every writer of the product takes (docs/concurrency.md).
- :mod:`~sandbox_core.tree.stamps`: the stamps of what a sync replaces, taken at check time and
  compared right before each rename (case 43).
- :mod:`~sandbox_core.tree.sync`: :func:`sync_tree` makes a target tree equal to a source tree,
  crash-safe and O(changes); :func:`recover_sync` finishes or undoes a sync interrupted by a
  crash; :func:`undo_sync` reverts a finished sync from the backup it kept.
- :mod:`~sandbox_core.tree.baseline`: :class:`Baseline` / :func:`pending_since` /
  :func:`reset_copy` / :func:`read_touched` tell a copy's changes from the original's.
- :mod:`~sandbox_core.tree.staging`: two-phase commit (:func:`stage_sync` /
  :func:`verify_staged` / :func:`apply_staged` / :func:`abort_staged`, :func:`change_digest`).

The public, stable names :func:`backup_directory`, :func:`safe_restore` and :func:`compute_diff`
are re-exported by ``sandbox_core``. Fidelity (docs/fidelity.md): copies keep owner
before mode so set-uid/set-gid survive (case 24), xattrs and POSIX ACLs, holes, FIFOs, sockets
and devices (recreated, never read: cases 36, 37) and hard links (case 34).

Conventions: paths in results are POSIX paths relative to the tree root, sorted. Symlinks are
never followed (case 06). File equality uses rsync's quick check: equal size and mtime (ns) mean
equal; equal size with a different mtime is settled by comparing content
(``filecmp.cmp(shallow=False)``). Directory mtimes are ignored (they move whenever a child does).
Top-level entries whose name starts with ``.sandbox-staging-`` are this package's own staging
areas and are invisible to scans.
"""
