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

Policies (each tested in ``tests/test_git_worktree_cases.py``):

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
- Rollback from COMMITTED restores the original branch to the pre-commit commit only while the
  branch still points at the sandbox's merge result, with the same two-tree method (uncommitted
  work elsewhere survives); otherwise :class:`SandboxRollbackError`.
- ``get_path`` refuses any ``.git`` component, and the product's own git commands address the
  worktree by ``--git-dir``/``--work-tree``, so a rewritten ``.git`` file cannot redirect them.
- Merge-backs and undos of one repository are serialised by a ``flock`` in its common dir. The
  original's files are written before its ref moves; a commit interrupted in between completes
  when retried, and :meth:`GitWorktreeSandbox.commit_landed` tells crash recovery whether the
  ref moved.

Extras beyond the protocol: ``create_checkpoint_ref`` / ``restore_checkpoint_ref`` /
``delete_checkpoint_ref`` / ``checkpoint_names`` (CheckpointManager), ``commit_landed`` (saga
recovery), ``diff`` (CLI) and ``missing_artifacts`` (after reopen).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from sandbox_core._git import (
    GitCommand,
    GitFailure,
    open_repo,
    read_gitdir_file,
    repository_lock,
)
from sandbox_core.base import BaseSandbox
from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxRollbackError,
    SandboxStateError,
)
from sandbox_core.paths import TRAVERSAL_MESSAGE
from sandbox_core.protocol import CommitResult, SandboxContext
from sandbox_core.status import SandboxStatus

logger = logging.getLogger("sandbox_core.git_worktree")

_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_BRANCH_SUFFIX = 100
_CAS_ATTEMPTS = 3


def _is_safe_component(value: str) -> bool:
    """True when ``value`` can be one path component of a git ref name and a directory name."""
    return bool(_SAFE_COMPONENT.match(value)) and ".." not in value and not value.endswith(".lock")


def _ref_component(value: str) -> str:
    """``value`` made usable as one ref component (unsafe characters become ``-``)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value).strip(".-") or "plan"
    cleaned = cleaned.replace("..", "-")
    cleaned = cleaned[:-5] + "-lock" if cleaned.endswith(".lock") else cleaned
    return re.sub(r"-{2,}", "-", cleaned)


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


class GitWorktreeSandbox(BaseSandbox):
    """Strategy ``git_worktree``. See the module docstring for naming and policies.

    Args:
        resource_id: id of the sandboxed resource.
        original_path: top level of a git working tree (main checkout or linked worktree) whose
            HEAD has at least one commit.
        **options: ``sandbox_root`` (str), ``sandbox_id`` (str, letters, digits, ``._-``).
    """

    strategy = "git_worktree"
    rollbackable = True

    def __init__(self, resource_id: str, original_path: str, **options: Any) -> None:
        super().__init__(resource_id, original_path, **options)
        self._missing: list[str] = []

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
        recorded at create (or the original's HEAD when it was detached). False when no commit was
        ever attempted.

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
            added, changed, deleted = self._classify(original, str(meta["base_commit"]), tip)
        except GitFailure as exc:
            message = f"cannot rebuild commit of sandbox {self.sandbox_id}: {exc}"
            raise SandboxError(message) from exc
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            commit_ref=merged,
            changed_files=changed,
            added_files=added,
            deleted_files=deleted,
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
                return worktree.run("diff", "--cached", "--no-color", "--no-ext-diff", base).stdout
            except GitFailure as exc:
                raise SandboxError(f"diff of sandbox {self.sandbox_id}: {exc}") from exc

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
                worktree.run("add", "-A")
                tree = worktree.run("write-tree").out
                head = worktree.run("rev-parse", "HEAD").out
                sha = worktree.run(
                    "commit-tree", tree, "-p", head, "-m", f"sandbox-core checkpoint {name}"
                ).out
                worktree.run("update-ref", ref, sha)
            except GitFailure as exc:
                raise SandboxError(
                    f"checkpoint {name!r} of sandbox {self.sandbox_id}: {exc}"
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
            try:
                found = worktree.run("rev-parse", "--verify", "-q", f"{ref}^{{commit}}", ok=(0, 1))
                if found.status != 0:
                    raise SandboxError(
                        f"checkpoint {name!r} of sandbox {self.sandbox_id} not found"
                    )
                # Track every current file first so that read-tree -u removes those the
                # checkpoint does not have; clean then drops what is left (ignored files).
                worktree.run("add", "-A")
                worktree.run("read-tree", "-u", "--reset", found.out)
                worktree.run("clean", "-fdqx")
            except GitFailure as exc:
                raise SandboxError(f"restore of checkpoint {name!r}: {exc}") from exc

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
            raise SandboxError(f"delete of checkpoint {name!r}: {exc}") from exc

    def checkpoint_names(self) -> list[str]:
        """Names of this sandbox's checkpoints, sorted."""
        prefix = f"refs/tags/sandbox/{self.sandbox_id}/ckpt/"
        try:
            refs = self._original_git().run("for-each-ref", "--format=%(refname)", prefix)
        except GitFailure as exc:
            raise SandboxError(f"cannot list checkpoints: {exc}") from exc
        return sorted(line[len(prefix) :] for line in refs.out.splitlines() if line)

    # -- create -----------------------------------------------------------------------------

    def _do_create(self, plan_id: str) -> SandboxContext:
        try:
            return self._create_worktree(plan_id)
        except GitFailure as exc:
            raise SandboxCreationError(
                f"cannot create git_worktree sandbox for {self.original_path}: {exc.stderr}"
            ) from exc

    def _create_worktree(self, plan_id: str) -> SandboxContext:
        if not _is_safe_component(self.sandbox_id):
            raise SandboxCreationError(
                f"sandbox_id {self.sandbox_id!r} cannot name a git branch or directory"
            )
        source = Path(self.original_path)
        if not source.is_dir():
            raise SandboxCreationError(f"original_path {self.original_path} is not a directory")
        repo = open_repo(source)
        with repo:
            if repo.bare or repo.working_tree_dir is None:
                raise SandboxCreationError(f"{self.original_path} is a bare repository")
            toplevel = Path(repo.working_tree_dir).resolve()
            common = Path(repo.common_dir).resolve()
            git_dir = Path(repo.git_dir).resolve()
        if toplevel != source.resolve():
            raise SandboxCreationError(
                f"{self.original_path} is not the top level of a git working tree ({toplevel})"
            )
        original = GitCommand(str(git_dir), str(common), str(toplevel))
        head = original.run("rev-parse", "HEAD", "--symbolic-full-name", "HEAD", ok=(0, 128))
        if head.status != 0:
            raise SandboxCreationError(f"{self.original_path} has no commit to start from")
        base, symbolic = head.out.splitlines()[:2]
        path = (self.sandbox_root / "git" / self.sandbox_id).absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Claiming the directory atomically makes a duplicate create fail here, before any
            # branch exists, and makes everything below ours to undo.
            path.mkdir()
        except FileExistsError:
            raise SandboxCreationError(
                f"sandbox {self.sandbox_id} already exists at {path}"
            ) from None
        branch = ""
        # Concurrent `git worktree add` on one repository races inside git (".git/worktrees/<id>/
        # commondir" read before it is written), so adds, like merges, are serialised per repo.
        with repository_lock(str(common)):
            try:
                # Forget registrations of worktrees whose directory is gone (a crashed create,
                # a workspace volume deleted with its Pod) before adding ours.
                original.run("worktree", "prune")
                branch = self._free_branch(
                    original, f"sandbox/{_ref_component(plan_id)}/{self.sandbox_id}"
                )
                original.run("worktree", "add", "--quiet", "-b", branch, str(path), base)
                admin = self._linked_admin_dir(path)
            except BaseException:
                # Whatever failed (git, I/O, interrupt), leave no worktree, directory or branch.
                self._undo_failed_create(original, path, branch, base)
                raise
        return SandboxContext(
            sandbox_id=self.sandbox_id,
            sandbox_path=str(path),
            original_path=self.original_path,
            resource_id=self.resource_id,
            plan_id=plan_id,
            metadata={
                "strategy": self.strategy,
                "branch": branch,
                "base_commit": base,
                "target_ref": symbolic if symbolic != "HEAD" else None,
                "detached": symbolic == "HEAD",
                "original_toplevel": str(toplevel),
                "git_common_dir": str(common),
                "original_git_dir": str(git_dir),
                "worktree_admin_dir": str(Path(admin).resolve()),
            },
        )

    @staticmethod
    def _linked_admin_dir(path: Path) -> str:
        admin = read_gitdir_file(path)
        if admin is None:
            raise SandboxCreationError(f"git did not link the worktree at {path}")
        return admin

    @staticmethod
    def _free_branch(original: GitCommand, wanted: str) -> str:
        """``wanted`` or ``wanted-N``: the first name no ref uses (never adopt a branch)."""
        listed = original.run("for-each-ref", "--format=%(refname)", f"refs/heads/{wanted}*")
        taken = {line.removeprefix("refs/heads/") for line in listed.out.splitlines()}
        if wanted not in taken:
            return wanted
        for suffix in range(2, _MAX_BRANCH_SUFFIX):
            candidate = f"{wanted}-{suffix}"
            if candidate not in taken:
                logger.warning("branch %s exists and is not adopted; using %s", wanted, candidate)
                return candidate
        raise SandboxCreationError(f"no free branch name for {wanted}")

    def _undo_failed_create(self, original: GitCommand, path: Path, branch: str, base: str) -> None:
        """Remove what a failed ``worktree add`` may have left: worktree, directory, branch.

        git 2.39 creates the ``-b`` branch before checking the path (case 01), so the branch is
        deleted too, but only while it still points at ``base`` (compare-and-delete).
        """
        steps: list[tuple[str, ...]] = [
            ("worktree", "remove", "--force", str(path)),
            ("worktree", "prune"),
        ]
        if branch:
            steps.append(("update-ref", "-d", f"refs/heads/{branch}", base))
        for index, args in enumerate(steps):
            if index == 1:
                shutil.rmtree(path, ignore_errors=True)
            try:
                original.run(*args, ok=(0, 1, 128))
            except GitFailure as exc:  # best effort: report, keep undoing the rest
                logger.warning("undo of failed create %s: %s", self.sandbox_id, exc)

    # -- commit -----------------------------------------------------------------------------

    def _do_commit(self, message: str | None) -> CommitResult:
        try:
            return self._merge_back(message)
        except GitFailure as exc:
            raise SandboxCommitError(f"commit of sandbox {self.sandbox_id} failed: {exc}") from exc

    def _merge_back(self, message: str | None) -> CommitResult:
        context = self._require_context()
        meta = context.metadata
        text = message or f"Apply sandbox {self.sandbox_id} of plan {context.plan_id}"
        tip = self._snapshot(self._worktree_git_or(SandboxCommitError, "commit"), text)
        original = self._original_git()
        # Written before the merge so that crash recovery can find the commit (commit_landed).
        original.run("update-ref", self._tag("committed"), tip)
        base = str(meta["base_commit"])
        added, changed, deleted = self._classify(original, base, tip)
        with repository_lock(str(meta["git_common_dir"])):
            for _attempt in range(_CAS_ATTEMPTS):
                ref, old = self._current_target(original, SandboxCommitError)
                new, how = self._merge_result(original, base, tip, old, text)
                original.run("update-ref", self._tag("pre-commit"), old)
                if new == old or self._apply(original, ref, old, new, SandboxCommitError):
                    break
            else:
                raise SandboxCommitError(f"{ref} kept moving during the commit; retry later")
        return CommitResult(
            sandbox_id=self.sandbox_id,
            success=True,
            commit_ref=new,
            changed_files=changed,
            added_files=added,
            deleted_files=deleted,
            metadata={
                "strategy": self.strategy,
                "branch": meta["target_ref"] or "HEAD",
                "sandbox_branch": meta["branch"],
                "sandbox_commit": tip,
                "pre_commit_sha": old,
                "pre_commit_tag": self._tag("pre-commit"),
                "landed_as": how,
                "message": text,
            },
        )

    def _snapshot(self, worktree: GitCommand, message: str) -> str:
        """Stage everything and commit it on the sandbox branch; returns the branch tip."""
        worktree.run("add", "-A")
        tree = worktree.run("write-tree").out
        head, head_tree, symbolic = worktree.run(
            "rev-parse", "HEAD", "HEAD^{tree}", "--symbolic-full-name", "HEAD"
        ).out.splitlines()[:3]
        branch = f"refs/heads/{self._meta()['branch']}"
        if symbolic != branch:  # an actor switched branches inside the worktree
            raise SandboxCommitError(
                f"sandbox {self.sandbox_id} worktree is on {symbolic!r}, not {branch!r}"
            )
        if tree == head_tree:
            return head
        new = worktree.run("commit-tree", tree, "-p", head, "-m", message).out
        worktree.run("update-ref", "-m", "sandbox-core: snapshot", "HEAD", new, head)
        return new

    def _merge_result(
        self, original: GitCommand, base: str, tip: str, old: str, message: str
    ) -> tuple[str, str]:
        """(commit the target should point at, how): no-op, fast-forward or merge commit.

        Raises:
            SandboxCommitError: with ``conflicts`` when the merge conflicts (nothing touched).
        """
        if tip == base or self._is_ancestor(original, tip, old):
            return old, "no-op"  # nothing to land, or it already landed (never commit twice)
        if self._is_ancestor(original, old, tip):
            return tip, "fast-forward"
        merged = original.run(
            "merge-tree",
            "--write-tree",
            "--name-only",
            "--no-messages",
            "-z",
            old,
            tip,
            ok=(0, 1),
        )
        fields = merged.nul_fields()
        if merged.status == 1:
            conflicts = sorted(set(fields[1:]))
            raise SandboxCommitError(
                f"sandbox {self.sandbox_id} conflicts with the original in: {', '.join(conflicts)}",
                conflicts=conflicts,
            )
        commit = original.run("commit-tree", fields[0], "-p", old, "-p", tip, "-m", message)
        return commit.out, "merge"

    def _apply(
        self,
        original: GitCommand,
        ref: str,
        old: str,
        new: str,
        error: type[SandboxCommitError] | type[SandboxRollbackError],
    ) -> bool:
        """Move the original from ``old`` to ``new``: files, index, then ref (compare-and-swap).

        Only the paths that differ between the two commits are written; uncommitted work on any
        of them refuses the move with the original untouched. Returns False when the ref moved
        concurrently (the files are put back first).
        """
        paths = original.run("diff-tree", "-r", "--no-renames", "--name-only", "-z", old, new)
        overlap = _collisions(paths.nul_fields(), self._local_changes(original, paths.nul_fields()))
        if overlap:
            overlap = self._not_yet_at(original, new, overlap)
        if overlap:
            raise self._overlap_error(error, overlap)
        updated = original.run("read-tree", "-m", "-u", old, new, ok=(0, 128))
        if updated.status != 0:  # a local change appeared since the check
            raise self._overlap_error(error, paths.nul_fields(), updated.stderr)
        deref = ["--no-deref"] if ref == "HEAD" else []
        moved = original.run(
            "update-ref",
            *deref,
            "-m",
            f"sandbox-core: sandbox {self.sandbox_id}",
            ref,
            new,
            old,
            ok=(0, 1, 128),
        )
        if moved.status == 0:
            return True
        original.run("read-tree", "-m", "-u", new, old)
        return False

    @staticmethod
    def _not_yet_at(original: GitCommand, commit: str, paths: list[str]) -> list[str]:
        """Those of ``paths`` whose index entry or file differs from ``commit``.

        A path already equal to ``commit`` in both is the trace of an interrupted earlier
        attempt (files written, ref not yet moved), not the user's work; the two-tree
        ``read-tree`` keeps it as it is, so the retried commit completes (crash recovery).
        """
        differing: set[str] = set()
        for cached in ((), ("--cached",)):
            listed = original.run(
                "--literal-pathspecs",
                "diff-index",
                *cached,
                "--name-only",
                "-z",
                commit,
                "--",
                *paths,
            )
            differing.update(listed.nul_fields())
        return [path for path in paths if path in differing]

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
            return SandboxCommitError(text, conflicts=paths)
        return SandboxRollbackError(text, refused=True)

    def _local_changes(self, original: GitCommand, paths: list[str]) -> set[str]:
        """Paths with uncommitted changes in the original: modified, staged, untracked, ignored.

        An ignored directory (listed as ``dir/``) counts only through the files of ``paths``
        that already exist inside it, so a new file in, say, ``build/`` is not a collision.
        """
        status = original.run(
            "--no-optional-locks",
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignored=matching",
            "--no-renames",
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
            top = Path(str(self._meta()["original_toplevel"]))
            dirty.update(
                path
                for path in paths
                if any(_blocked_by_ignored_dir(path, folder, top) for folder in ignored_dirs)
            )
        return dirty

    @staticmethod
    def _classify(original: GitCommand, base: str, tip: str) -> tuple[list[str], ...]:
        """(added, changed, deleted) paths between two commits, sorted."""
        diff = original.run("diff-tree", "-r", "--no-renames", "--name-status", "-z", base, tip)
        fields = diff.nul_fields()
        added: list[str] = []
        changed: list[str] = []
        deleted: list[str] = []
        for status, path in zip(fields[0::2], fields[1::2], strict=True):
            {"A": added, "D": deleted}.get(status[0], changed).append(path)
        return sorted(added), sorted(changed), sorted(deleted)

    @staticmethod
    def _is_ancestor(original: GitCommand, ancestor: str, descendant: str) -> bool:
        result = original.run("merge-base", "--is-ancestor", ancestor, descendant, ok=(0, 1))
        return result.status == 0

    def _current_target(
        self,
        original: GitCommand,
        error: type[SandboxCommitError] | type[SandboxRollbackError],
    ) -> tuple[str, str]:
        """(ref to update, its commit); the original's HEAD must be where it was at create."""
        meta = self._require_context().metadata
        sha, symbolic = original.run(
            "rev-parse", "HEAD", "--symbolic-full-name", "HEAD"
        ).out.splitlines()[:2]
        expected = meta["target_ref"] or "HEAD"
        if symbolic != expected:
            raise error(
                f"the original's HEAD is now {symbolic!r}, not {expected!r} as when sandbox "
                f"{self.sandbox_id} was created; check out {expected!r} again and retry"
            )
        return expected, sha

    # -- rollback ---------------------------------------------------------------------------

    def _do_rollback(self) -> None:
        worktree = self._worktree_git_or(SandboxRollbackError, "roll back")
        base = str(self._require_context().metadata["base_commit"])
        try:
            worktree.run("reset", "-q", "--hard", base)
            worktree.run("clean", "-fdqx")
        except GitFailure as exc:
            raise SandboxRollbackError(f"rollback of sandbox {self.sandbox_id}: {exc}") from exc

    def _do_rollback_committed(self) -> None:
        last = self._last_commit
        if last is None or last.commit_ref is None:
            raise SandboxRollbackError(f"sandbox {self.sandbox_id} has no recorded commit")
        original = self._original_git()
        try:
            with repository_lock(str(self._meta()["git_common_dir"])):
                self._undo_commit(original, last.commit_ref)
        except GitFailure as exc:
            raise SandboxRollbackError(f"rollback of sandbox {self.sandbox_id}: {exc}") from exc
        if Path(self._require_context().sandbox_path).is_dir():
            self._do_rollback()  # the sandbox itself is clean again, as after an ACTIVE rollback

    def _undo_commit(self, original: GitCommand, merged: str) -> None:
        """Move the original back from ``merged`` to the pre-commit tag, if it is still there."""
        pre = original.run("rev-parse", "--verify", f"{self._tag('pre-commit')}^{{commit}}").out
        if merged == pre:
            return  # the commit changed nothing in the original
        ref, current = self._current_target(original, SandboxRollbackError)
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

    # -- cleanup and reopen -----------------------------------------------------------------

    def _do_cleanup(self) -> None:
        context = self._context
        if context is None:
            return  # never created, or the failed create already undid itself
        path = Path(context.sandbox_path)
        meta = context.metadata
        if not Path(str(meta["git_common_dir"])).is_dir():
            shutil.rmtree(path, ignore_errors=True)  # repository gone: only our directory is left
            return
        # Addressed by the common dir: works even when the original checkout (for example a
        # linked worktree, case 05) has been removed since.
        common = str(meta["git_common_dir"])
        original = GitCommand(common, common)
        try:
            with repository_lock(common):
                self._remove_worktree(original, path, str(meta["branch"]))
        except GitFailure as exc:
            raise SandboxError(f"cleanup of sandbox {self.sandbox_id} failed: {exc}") from exc

    def _remove_worktree(self, original: GitCommand, path: Path, branch: str) -> None:
        """Remove the worktree, its branch and every ``sandbox/<id>/*`` tag (caller holds lock)."""
        if path.exists():
            original.run("worktree", "remove", "--force", str(path), ok=(0, 128))
        if path.exists():
            shutil.rmtree(path)
        original.run("worktree", "prune")
        original.run("update-ref", "-d", f"refs/heads/{branch}")
        tags = original.run(
            "for-each-ref", "--format=%(refname)", f"refs/tags/sandbox/{self.sandbox_id}/"
        )
        for tag in tags.out.splitlines():
            original.run("update-ref", "-d", tag)

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
        except GitFailure:
            missing.append("branch")
        self._missing = missing
        if missing:
            logger.warning("sandbox %s reopened without %s", self.sandbox_id, ", ".join(missing))

    # -- helpers ----------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return self._require_context().metadata

    def _tag(self, name: str) -> str:
        return f"refs/tags/sandbox/{self.sandbox_id}/{name}"

    def _checkpoint_ref(self, name: str) -> str:
        if not isinstance(name, str) or not _is_safe_component(name):
            raise ValueError(f"invalid checkpoint name: {name!r}")
        return self._tag(f"ckpt/{name}")

    def _original_git(self) -> GitCommand:
        meta = self._meta()
        return GitCommand(
            str(meta["original_git_dir"]),
            str(meta["git_common_dir"]),
            str(meta["original_toplevel"]),
        )

    def _worktree_git_or(
        self,
        error: type[SandboxCommitError] | type[SandboxRollbackError] | type[SandboxError],
        action: str,
    ) -> GitCommand:
        """Commands for the sandbox worktree after checking it is still linked to its admin dir."""
        context = self._require_context()
        admin = str(context.metadata["worktree_admin_dir"])
        linked = read_gitdir_file(context.sandbox_path)
        if linked is None or Path(linked).resolve() != Path(admin) or not Path(admin).is_dir():
            raise error(
                f"cannot {action} sandbox {self.sandbox_id}: its worktree at "
                f"{context.sandbox_path} is missing or no longer linked to the repository"
            )
        return GitCommand(admin, str(context.metadata["git_common_dir"]), context.sandbox_path)

    def _live_worktree_git(self, action: str) -> GitCommand:
        if self.status not in (
            SandboxStatus.CREATED,
            SandboxStatus.ACTIVE,
            SandboxStatus.ROLLED_BACK,
        ):
            raise SandboxStateError(
                f"cannot {action} sandbox {self.sandbox_id} in status {self.status.value}"
            )
        return self._worktree_git_or(SandboxError, action)
