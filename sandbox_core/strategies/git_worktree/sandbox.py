"""``GitWorktreeSandbox``: a linked worktree on a fresh branch per sandbox (seed 002).

Layout and naming:

- worktree directory: ``<sandbox_root>/git/<sandbox_id>`` (never under the original's ``.git``;
  the source may itself be a linked worktree whose ``.git`` is a file, case 05);
- branch: ``sandbox/<plan>/<sandbox_id>`` made from the original's HEAD commit. An existing branch
  of that name (crash residue, or someone else's) is never adopted: the next free
  ``...-2``, ``...-3`` is used instead (case 01);
- tags: ``sandbox/<sandbox_id>/pre-commit`` (the original before the merge),
  ``sandbox/<sandbox_id>/committed`` (the sandbox commit being merged, written before the merge) and
  ``sandbox/<sandbox_id>/ckpt/<name>`` (checkpoints).

Policies (each tested in ``tests/core/strategies/git_worktree/test_field_cases.py``):

- Content: the sandbox starts from the original's HEAD commit; uncommitted work of the original is
  not visible in it. git tracks files, symlinks and the executable bit; **empty directories are not
  carried** in either direction, and files matched by ``.gitignore`` are not committed back.
- Commit stages everything (``add -A``), commits on the sandbox branch with the product's identity
  (no hooks run), checks for conflicts with ``git merge-tree --write-tree`` (nothing touched), then
  updates the original branch: its index and working tree change only for the paths the merge
  changes (two-tree ``read-tree -m -u``), and the ref moves by compare-and-swap. If a path the
  sandbox changes has uncommitted changes in the original (modified, staged, untracked or ignored),
  the commit is refused with ``conflicts`` and the original is untouched (case 03).
- The original's HEAD must still be where it was at create: on the same branch, or detached (then
  the commit moves the detached HEAD). Otherwise commit refuses.
- The base commit is recorded at create (``base_commit``). A branch rewritten since (reset,
  amend, rebase, forced move: the target no longer contains the base) gets only the sandbox's
  own change, replayed as one commit on the target; no dropped commit comes back, and an
  overlap with the rewrite is a conflict naming base and current commit.
- Local work hidden from ``status`` by ``assume-unchanged`` / ``skip-worktree`` is found by
  content in every check (review, prepare, commit, rollback), so prepare refuses what apply
  would (case 40).
- A full or read-only file system during a commit leaves the original as it was and the
  sandbox ACTIVE (space checked before the files are written; a partial write put back).
- Rollback from COMMITTED restores the original branch to the pre-commit commit only while the
  branch still points at the sandbox's merge result, with the same two-tree method (uncommitted
  work elsewhere survives); otherwise :class:`SandboxRollbackError`.
- ``get_path`` refuses any ``.git`` component, and the product's own git commands address the
  worktree by ``--git-dir``/``--work-tree``, so a rewritten ``.git`` file cannot redirect them.
- The repository is the user's: the product's git commands run no hooks, no
  fsmonitor, no filter/diff/merge driver and no credential helper (:mod:`.git`); a
  repository owned by another user is refused unless the option ``trust_repository_owner`` is
  true (then, as root, git runs as the owner); files written back keep the owner, group and
  permission bits they had (new files take their directory's owner). Stale stat data in the
  original's index (``touch``, ``chown -R``, an fsGroup pass) is refreshed, never a conflict.
  Only the product's own worktree registrations are ever removed (never a repository-wide
  ``git worktree prune``, case 02). Submodules are populated at their pinned commits as linked
  worktrees of the original's module store (``.git/modules``), offline; commit keeps gitlinks.
- Failures are classified: a leftover lock (:class:`SandboxLockedError`), a permission problem
  (:class:`SandboxPermissionError`) and a real conflict (:class:`SandboxConflictError`); a
  commit refused for any of them leaves the original untouched and the sandbox ACTIVE.
- Merge-backs and undos of one repository are serialised by a ``flock`` in its common dir. The
  original's files are written before its ref moves; a commit interrupted in between completes
  when retried, and :meth:`GitWorktreeSandbox.commit_landed` tells crash recovery whether the
  ref moved.

- Two-phase plan commit (``docs/git-worktree.md``): ``review`` stages the worktree into
  a throw-away index (nothing moves; digest = sha256 over base commit and tree), ``prepare``
  commits the sandbox branch and merges with the original untouched, recording
  ``refs/sandbox/prepared/<txid>/<sandbox_id>/{new,old,tip}``; ``apply_prepared`` writes the
  changed paths and moves the target by compare-and-swap (idempotent after a crash);
  ``abort_prepared`` and ``cleanup`` delete the prepared refs. The one-shot commit is the same
  plan + apply under one lock.

Extras beyond the protocol: ``create_checkpoint_ref`` / ``restore_checkpoint_ref`` /
``delete_checkpoint_ref`` / ``checkpoint_names`` (CheckpointManager), ``commit_landed`` (saga
recovery), ``diff`` (CLI) and ``missing_artifacts`` (after reopen).

The class is built in layers, one module each, every layer a base class of the next:
:mod:`.worktree` (create, the git commands of the original and of the worktree, the refs the
sandbox owns), :mod:`.merge` (a commit planned with the original untouched, then written),
:mod:`.prepared` (the two-phase side) and this module (the class: its public extras and its
lifecycle). :mod:`.git` runs git; GitPython is imported there alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sandbox_core.errors import (
    SandboxError,
    SandboxForkError,
    SandboxLockedError,
    SandboxPermissionError,
    SandboxRollbackError,
)
from sandbox_core.paths import TRAVERSAL_MESSAGE
from sandbox_core.protocol import CommitResult, ForkSource, SandboxContext
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies import _directory
from sandbox_core.strategies.git_worktree.git import (
    GitCommand,
    GitFailure,
    read_gitdir_file,
    repository_lock,
)
from sandbox_core.strategies.git_worktree.prepared import PreparedMergeBack
from sandbox_core.strategies.git_worktree.worktree import _translate, logger


class GitWorktreeSandbox(PreparedMergeBack):
    """Strategy ``git_worktree``. See the module docstring for naming and policies.

    Args:
        resource_id: id of the sandboxed resource.
        original_path: top level of a git working tree (main checkout or linked worktree) whose
            HEAD has at least one commit.
        **options: ``sandbox_root`` (str), ``sandbox_id`` (str, letters, digits, ``._-``),
            ``trust_repository_owner`` (bool, or ``"true"`` from the CLI; default false):
            accept a repository owned by another user.
    """

    strategy = "git_worktree"
    layout_folder = "git"
    rollbackable = True
    forkable = True

    def __init__(self, resource_id: str, original_path: str, **options: Any) -> None:
        super().__init__(resource_id, original_path, **options)
        self._missing: list[str] = []
        # Set once the original's files may have been written by the current commit/rollback.
        self._touched = False

    # -- public extras ----------------------------------------------------------------------

    @property
    def missing_artifacts(self) -> list[str]:
        """What :meth:`reopen` found missing (``"worktree"``, ``"branch"``); empty when whole."""
        return list(self._missing)

    def get_path(self, resource_path: str) -> str:
        """As :meth:`BaseSandbox.get_path`, also refusing any ``.git`` component.

        Raises:
            ValueError: ``"Path traversal not allowed"`` (also for ``.git`` paths: the worktree's
                ``.git`` file links it to the original's repository).
            SandboxStateError: the sandbox is not CREATED, ACTIVE or ROLLED_BACK.
        """
        if any(part.lower() == ".git" for part in Path(resource_path).parts):
            raise ValueError(TRAVERSAL_MESSAGE)
        return super().get_path(resource_path)

    def commit_landed(self) -> bool:
        """True when this sandbox's commit is contained in the original's target.

        Reads the ``sandbox/<id>/committed`` tag written before every merge, so a fresh process
        (crash recovery) can tell whether an in-flight commit landed. The target is the branch
        recorded at create (or the original's HEAD when it was detached). A commit replayed onto
        a rewritten branch is told by its ``replayed`` tag. False when no commit was ever
        attempted.

        Raises:
            SandboxStateError: the sandbox was never created.
            SandboxError: git cannot be queried.
        """
        meta = self._meta()
        original = self._original_git()
        try:
            tagged = original.run(
                "rev-parse", "--verify", "-q", f"{self._tag('committed')}^{{commit}}", ok=(0, 1)
            )
            if tagged.status != 0:
                return False
            target = meta["target_ref"] or "HEAD"
            current = original.run("rev-parse", "--verify", f"{target}^{{commit}}").out
            landed = original.run("merge-base", "--is-ancestor", tagged.out, current, ok=(0, 1))
            if landed.status != 0:
                # Replayed onto a rewritten branch: the replayed commit is what lands.
                landed = original.run(
                    "merge-base", "--is-ancestor", self._tag("replayed"), current, ok=(0, 1, 128)
                )
        except GitFailure as exc:
            raise SandboxError(f"cannot check commit of sandbox {self.sandbox_id}: {exc}") from exc
        return landed.status == 0

    def _rebuild_landed_commit(self) -> CommitResult | None:
        """Result of a commit that landed but was never recorded (crash recovery, case 20).

        The merged commit is taken to be the target's current tip: if anything moved the target
        after our merge, the later rollback refuses (``_undo_commit``) rather than guess.
        """
        if not self.commit_landed():
            return None
        meta = self._meta()
        original = self._original_git()
        try:
            tip = original.run("rev-parse", "--verify", f"{self._tag('committed')}^{{commit}}").out
            pre = original.run(
                "rev-parse", "--verify", "-q", f"{self._tag('pre-commit')}^{{commit}}", ok=(0, 1)
            )
            target = str(meta["target_ref"] or "HEAD")
            merged = original.run("rev-parse", "--verify", f"{target}^{{commit}}").out
            change = self._classify(original, str(meta["base_commit"]), tip)
        except GitFailure as exc:
            message = f"cannot rebuild commit of sandbox {self.sandbox_id}: {exc}"
            raise SandboxError(message) from exc
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            commit_ref=merged,
            changed_files=change.changed,
            added_files=change.added,
            deleted_files=change.deleted,
            metadata={
                "strategy": self.strategy,
                "branch": target,
                "sandbox_commit": tip,
                "pre_commit_sha": pre.out if pre.status == 0 else None,
                "pre_commit_tag": self._tag("pre-commit"),
                "landed_as": "recovered",
            },
        )

    def diff(self) -> str:
        """Unified diff (git format, binary files summarised) of the sandbox against its base.

        Covers everything the next :meth:`commit` would carry, untracked files included; empty
        when there is nothing to commit. Used by the CLI's ``diff`` command.

        Raises:
            SandboxStateError: the sandbox is not CREATED, ACTIVE or ROLLED_BACK.
            SandboxError: the worktree is missing or git failed.
        """
        with self._lock:
            worktree = self._live_worktree_git("diff")
            base = str(self._meta()["base_commit"])
            try:
                worktree.run("add", "-A")
                return worktree.run(
                    "diff", "--cached", "--no-color", "--no-ext-diff", "--no-textconv", base
                ).stdout
            except GitFailure as exc:
                raise _translate(
                    exc, "other", f"diff of sandbox {self.sandbox_id}", self._sandbox_dir()
                ) from exc

    # -- checkpoints (called by the CheckpointManager) --------------------------------------

    def create_checkpoint_ref(self, name: str) -> str:
        """Snapshot the worktree as commit + tag ``sandbox/<id>/ckpt/<name>``; returns its sha.

        The sandbox branch does not move (the commit's parent is the branch tip). Cost is
        O(changed files): ``add -A`` reuses the index stat cache. Replaces an existing checkpoint
        of the same name. Seed 002, "Checkpoint: git tag on the worktree branch".

        Raises:
            ValueError: ``name`` is not letters, digits and ``._-``.
            SandboxStateError: the sandbox is not CREATED, ACTIVE or ROLLED_BACK.
            SandboxError: git failed or the worktree is missing.
        """
        ref = self._checkpoint_ref(name)
        with self._lock:
            worktree = self._live_worktree_git("checkpoint")
            try:
                tree = self._stage(worktree)
                sha = worktree.run(
                    "commit-tree", tree, "-p", "HEAD", "-m", f"sandbox-core checkpoint {name}"
                ).out
                worktree.run("update-ref", ref, sha)
            except GitFailure as exc:
                raise _translate(
                    exc,
                    "other",
                    f"checkpoint {name!r} of sandbox {self.sandbox_id}",
                    self._sandbox_dir(),
                ) from exc
            return sha

    def restore_checkpoint_ref(self, name: str) -> None:
        """Make the worktree's files exactly the checkpoint's (files added since are removed).

        The sandbox branch does not move; O(changed files) apart from git's directory scan.

        Raises:
            ValueError: invalid ``name``.
            SandboxStateError: the sandbox is not CREATED, ACTIVE or ROLLED_BACK.
            SandboxError: no such checkpoint, or git failed.
        """
        ref = self._checkpoint_ref(name)
        with self._lock:
            worktree = self._live_worktree_git("restore a checkpoint of")
            self._refuse_if_busy("restore")
            try:
                found = worktree.run("rev-parse", "--verify", "-q", f"{ref}^{{commit}}", ok=(0, 1))
                if found.status != 0:
                    raise SandboxError(
                        f"checkpoint {name!r} of sandbox {self.sandbox_id} not found"
                    )
                self._adopt_worktree(worktree)
                # Track every current file first so that read-tree -u removes those the
                # checkpoint does not have; clean then drops what is left (ignored files).
                worktree.run("add", "-A")
                worktree.run("read-tree", "-u", "--reset", found.out)
                worktree.run("clean", "-fdqx")
            except GitFailure as exc:
                raise _translate(
                    exc, "other", f"restore of checkpoint {name!r}", self._sandbox_dir()
                ) from exc

    def delete_checkpoint_ref(self, name: str) -> None:
        """Delete the checkpoint tag; idempotent.

        Raises:
            ValueError: invalid ``name``.
            SandboxError: git failed.
        """
        ref = self._checkpoint_ref(name)
        try:
            self._original_git().run("update-ref", "-d", ref)
        except GitFailure as exc:
            raise _translate(
                exc, "other", f"delete of checkpoint {name!r}", self.original_path
            ) from exc

    def checkpoint_names(self) -> list[str]:
        """Names of this sandbox's checkpoints, sorted."""
        prefix = f"refs/tags/sandbox/{self.sandbox_id}/ckpt/"
        try:
            refs = self._original_git().run("for-each-ref", "--format=%(refname)", prefix)
        except GitFailure as exc:
            raise _translate(exc, "other", "cannot list checkpoints", self.original_path) from exc
        return sorted(line[len(prefix) :] for line in refs.out.splitlines() if line)

    # -- fork (BaseSandbox.start_from) -------------------------------------------------------

    def _do_start_from(self, source: ForkSource) -> None:
        """The parent's change (its base commit -> the checkpoint's commit) applied onto this
        worktree's base (the original's HEAD now) as uncommitted files, with git's three-way
        tree merge (objects only). The branch does not move: the fork's diff is against the
        original like any sandbox's.

        Raises:
            SandboxForkError: not a ``git_ref`` checkpoint, its commit is not in this
                repository, or the parent's change overlaps a change the original made since
                (``conflicts``; the worktree is left as created).
        """
        if source.kind != "git_ref" or not source.commit:
            raise SandboxForkError(
                f"checkpoint {source.checkpoint_id} is a {source.kind or 'metadata-only'} "
                "checkpoint; a git_worktree sandbox starts only from a git_worktree checkpoint"
            )
        worktree = self._live_worktree_git("fork")
        original = self._original_git()
        base = str(self._meta()["base_commit"])
        try:
            found = original.run(
                "rev-parse", "--verify", "-q", f"{source.commit}^{{commit}}", ok=(0, 1)
            )
            if found.status != 0:
                raise SandboxForkError(
                    f"checkpoint {source.checkpoint_id}: commit {source.commit} is not in "
                    f"{self.original_path} (another repository, or the checkpoint was deleted)"
                )
            parent_base = str(source.parent_metadata.get("base_commit") or "")
            if not parent_base:
                parent_base = original.run("rev-parse", f"{found.out}^").out
            if parent_base == base:
                tree = original.run("rev-parse", f"{found.out}^{{tree}}").out
            else:
                status, fields = self._merge_trees(
                    original, parent_base, base, found.out, rewritten=True
                )
                if status == 1:
                    conflicts = sorted(set(fields[1:]))
                    raise SandboxForkError(
                        f"sandbox {self.sandbox_id} cannot start from checkpoint "
                        f"{source.checkpoint_id}: its change overlaps what {self.original_path} "
                        f"changed since sandbox {source.sandbox_id} was made, in: "
                        f"{', '.join(conflicts)}. Take a new checkpoint of a sandbox made "
                        "after that change, or resolve it in the original",
                        conflicts=conflicts,
                    )
                tree = fields[0]
            worktree.run("read-tree", "-u", "--reset", tree)
        except GitFailure as exc:
            raise _translate(
                exc, "other", f"fork from checkpoint {source.checkpoint_id}", self._sandbox_dir()
            ) from exc

    # -- create -----------------------------------------------------------------------------

    def _do_create(self, plan_id: str) -> SandboxContext:
        try:
            return self._create_worktree(plan_id)
        except GitFailure as exc:
            raise _translate(
                exc,
                "create",
                f"cannot create git_worktree sandbox for {self.original_path}",
                self.original_path,
            ) from exc

    # -- commit -----------------------------------------------------------------------------

    def commit(self, message: str | None = None) -> CommitResult:
        """As :meth:`BaseSandbox.commit`; see the module docstring for the merge-back.

        Raises:
            SandboxConflictError: the changes overlap changes in the original (``conflicts``).
            SandboxCommitLockedError: a leftover git lock file (``lock_path``) blocks it.
            SandboxCommitPermissionError: the original cannot be written (also a read-only
                file system), or its owner is another user who is not trusted.
            SandboxCommitError with ``retryable`` True: the file system of the repository is
                full (ENOSPC, EDQUOT); nothing was changed (what git had written is put back).
            SandboxCommitError: any other failure (status becomes ERRORED).

        The three refusals above leave the original untouched and the sandbox ACTIVE, so the
        commit can be retried once the cause is gone.
        """
        with self._lock:
            self._touched = False
            try:
                return super().commit(message)
            except (SandboxLockedError, SandboxPermissionError):
                if not self._touched and self._status is SandboxStatus.ERRORED:
                    self._status = SandboxStatus.ACTIVE  # refused before anything changed
                raise
            except SandboxError as exc:
                # A full file system met before the original changed, or undone: retry later.
                full = getattr(exc, "retryable", False)
                if full and not self._touched and self._status is SandboxStatus.ERRORED:
                    self._status = SandboxStatus.ACTIVE
                raise

    def _do_commit(self, message: str | None) -> CommitResult:
        try:
            return self._merge_back(message)
        except GitFailure as exc:
            raise _translate(
                exc,
                "commit",
                f"commit of sandbox {self.sandbox_id} failed",
                self.original_path,
                untouched=not self._touched,
            ) from exc

    # -- rollback ---------------------------------------------------------------------------

    def _do_rollback(self, *, checked: bool = False) -> None:
        """Reset the worktree to the commit it was made from. Refused as busy while a process
        has a file of the worktree open for writing (``checked``: the caller refused already)."""
        if not checked:
            self._refuse_if_busy("rollback")
        worktree = self._worktree_git_or(SandboxRollbackError, "roll back")
        base = str(self._require_context().metadata["base_commit"])
        self._adopt_worktree(worktree)
        try:
            worktree.run("reset", "-q", "--hard", base)
            worktree.run("clean", "-fdqx")
        except GitFailure as exc:
            raise _translate(
                exc, "rollback", f"rollback of sandbox {self.sandbox_id}", self._sandbox_dir()
            ) from exc

    def _refuse_if_busy(self, operation: str) -> None:
        """Refuse ``operation`` (``"rollback"``, ``"restore"``) while another process has a file
        of the worktree open for writing (docs/concurrency.md, "A shell in the sandbox"): git
        writes a file it resets or checks out as a new inode, so the writer's later writes would
        go to a file no longer in the sandbox. A working directory inside is harmless (git keeps
        the directories that still hold tracked files) and does not refuse.

        Raises:
            SandboxRollbackError: ``refused``; names every such process; nothing was changed.
        """
        context = self._context
        if context is not None and Path(context.sandbox_path).is_dir():
            _directory.refuse_if_busy(
                self, Path(context.sandbox_path), operation, writers_only=True
            )

    def _do_rollback_committed(self) -> None:
        last = self._last_commit
        if last is None or last.commit_ref is None:
            raise SandboxRollbackError(f"sandbox {self.sandbox_id} has no recorded commit")
        self._refuse_if_busy("rollback")  # before the original is touched
        original = self._original_git("rollback")
        self._touched = False
        try:
            with repository_lock(str(self._meta()["git_common_dir"])):
                self._undo_commit(original, last.commit_ref)
        except GitFailure as exc:
            raise _translate(
                exc,
                "rollback",
                f"rollback of sandbox {self.sandbox_id}",
                self.original_path,
                untouched=not self._touched,
            ) from exc
        if Path(self._require_context().sandbox_path).is_dir():
            # The sandbox itself is clean again, as after an ACTIVE rollback.
            self._do_rollback(checked=True)

    # -- interrupted moves ------------------------------------------------------------------

    def _has_interrupted(self) -> bool:
        """A move of the original was cut: its marker is there (one ``stat``)."""
        if not Path(str(self._meta()["git_common_dir"])).is_dir():
            return False
        return self._moving_marker().exists()

    def _do_finish_interrupted(self) -> None:
        """A commit, apply or undo cut between the original's files and its ref is put back
        (or, a decided two-phase apply, rolled forward): see ``_finish_interrupted_move``."""
        if not Path(str(self._meta()["git_common_dir"])).is_dir():
            return  # the repository is gone: nothing of it can be half moved
        try:
            self._finish_interrupted_move()
        except GitFailure as exc:
            raise _translate(
                exc,
                "rollback",
                f"sandbox {self.sandbox_id}: cannot finish an interrupted commit",
                self.original_path,
            ) from exc

    # -- cleanup and reopen -----------------------------------------------------------------

    def _do_cleanup(self) -> None:
        context = self._context
        if context is None:
            return  # never created, or the failed create already undid itself
        path = Path(context.sandbox_path)
        meta = context.metadata
        common = str(meta["git_common_dir"])
        if not Path(common).is_dir():
            shutil.rmtree(path, ignore_errors=True)  # repository gone: only our directory is left
            return
        # Addressed by the common dir: works even when the original checkout (for example a
        # linked worktree, case 05) has been removed since.
        trusted, run_as = self._trust("other")
        original = GitCommand(common, common, trusted=trusted, run_as=run_as)
        try:
            with repository_lock(common):
                self._remove_registrations(original, path, list(meta.get("submodules") or []))
                self._delete_refs(original, f"refs/heads/{meta['branch']}")
        except GitFailure as exc:
            raise _translate(
                exc, "other", f"cleanup of sandbox {self.sandbox_id} failed", common
            ) from exc

    def _do_cleanup_interrupted_create(self) -> None:
        try:
            self._cleanup_interrupted_worktree()
        except GitFailure as exc:
            raise _translate(
                exc,
                "other",
                f"cleanup of the interrupted create of sandbox {self.sandbox_id} failed",
                self.original_path,
            ) from exc

    def _on_reopen(self) -> None:
        """Record what is missing; nothing is created or removed (seed 002, reopen)."""
        context = self._context
        if context is None:
            return
        required = (
            "branch",
            "base_commit",
            "original_toplevel",
            "git_common_dir",
            "original_git_dir",
            "worktree_admin_dir",
            "target_ref",
        )
        absent = [key for key in required if key not in context.metadata]
        if absent:
            raise SandboxError(f"git_worktree record lacks metadata: {', '.join(absent)}")
        missing = []
        admin = read_gitdir_file(context.sandbox_path)
        if admin is None or Path(admin).resolve() != Path(context.metadata["worktree_admin_dir"]):
            missing.append("worktree")
        try:
            found = self._original_git().run(
                "rev-parse",
                "--verify",
                "-q",
                f"refs/heads/{context.metadata['branch']}",
                ok=(0, 1),
            )
            if found.status != 0:
                missing.append("branch")
        except SandboxPermissionError as exc:
            logger.warning("sandbox %s reopened: %s", self.sandbox_id, exc)
        except GitFailure:
            missing.append("branch")
        self._missing = missing
        if missing:
            logger.warning("sandbox %s reopened without %s", self.sandbox_id, ", ".join(missing))
