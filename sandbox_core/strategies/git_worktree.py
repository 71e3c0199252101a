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
- The repository is the user's (issue 7): the product's git commands run no hooks, no
  fsmonitor, no filter/diff/merge driver and no credential helper (``sandbox_core._git``); a
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

- Two-phase plan commit (issue 9, ``docs/git-worktree.md``): ``review`` stages the worktree into
  a throw-away index (nothing moves; digest = sha256 over base commit and tree), ``prepare``
  commits the sandbox branch and merges with the original untouched, recording
  ``refs/sandbox/prepared/<txid>/<sandbox_id>/{new,old,tip}``; ``apply_prepared`` writes the
  changed paths and moves the target by compare-and-swap (idempotent after a crash);
  ``abort_prepared`` and ``cleanup`` delete the prepared refs. The one-shot commit is the same
  plan + apply under one lock.

Extras beyond the protocol: ``create_checkpoint_ref`` / ``restore_checkpoint_ref`` /
``delete_checkpoint_ref`` / ``checkpoint_names`` (CheckpointManager), ``commit_landed`` (saga
recovery), ``diff`` (CLI) and ``missing_artifacts`` (after reopen).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_core._git import (
    GitCommand,
    GitFailure,
    GitResult,
    RunAs,
    failure_kind,
    head_branch,
    open_repo,
    read_gitdir_file,
    registrations_of,
    repository_lock,
    repository_owner,
    worktree_entry,
)
from sandbox_core._path_limits import refuse_what_git_skipped
from sandbox_core.base import BaseSandbox
from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCommitLockedError,
    SandboxCommitPermissionError,
    SandboxConflictError,
    SandboxCreationError,
    SandboxCreationLockedError,
    SandboxCreationPermissionError,
    SandboxError,
    SandboxLockedError,
    SandboxPermissionError,
    SandboxRollbackError,
    SandboxRollbackLockedError,
    SandboxRollbackPermissionError,
    SandboxStateError,
)
from sandbox_core.paths import TRAVERSAL_MESSAGE
from sandbox_core.protocol import ChangeSummary, CommitResult, PreparedCommit, SandboxContext
from sandbox_core.status import SandboxStatus

logger = logging.getLogger("sandbox_core.git_worktree")

_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_BRANCH_SUFFIX = 100
_CAS_ATTEMPTS = 3
# Above this many paths a full status scan is cheaper than matching every pathspec.
_MAX_PATHSPECS = 2000


_PHASE_ERRORS: dict[str, tuple[type[SandboxError], type[SandboxError], type[SandboxError]]] = {
    "create": (SandboxCreationError, SandboxCreationLockedError, SandboxCreationPermissionError),
    "commit": (SandboxCommitError, SandboxCommitLockedError, SandboxCommitPermissionError),
    "rollback": (
        SandboxRollbackError,
        SandboxRollbackLockedError,
        SandboxRollbackPermissionError,
    ),
    "other": (SandboxError, SandboxLockedError, SandboxPermissionError),
}
_NOT_UPTODATE = "not uptodate. Cannot merge."
# Two-phase plan commit: what prepare recorded, per transaction id and sandbox (issue 9).
_PREPARED_ROOT = "refs/sandbox/prepared/"


def _change_digest(base: str, tree: str) -> str:
    """``sha256:<hex>`` naming a sandbox's exact change: its base commit and its tree (git's
    ids cover every path's content and mode, and the deletions)."""
    return "sha256:" + hashlib.sha256(f"git_worktree\0{base}\0{tree}".encode()).hexdigest()


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
class _Summary:
    """Paths a change adds, changes and deletes (sorted), the regular files whose executable
    bit it flips, lines added and removed in text files, and bytes of new content."""

    added: list[str]
    changed: list[str]
    deleted: list[str]
    executable: set[str]
    lines_added: int
    lines_removed: int
    size: int

    @property
    def paths(self) -> list[str]:
        return sorted([*self.added, *self.changed, *self.deleted])

    @property
    def change(self) -> _Change:
        return _Change(self.added, self.changed, self.deleted, self.executable)

    def to_summary(self, sandbox: BaseSandbox, digest: str, conflicts: list[str]) -> ChangeSummary:
        return ChangeSummary(
            sandbox_id=sandbox.sandbox_id,
            resource_id=sandbox.resource_id,
            strategy=sandbox.strategy,
            digest=digest,
            added=self.added,
            changed=self.changed,
            deleted=self.deleted,
            lines_added=self.lines_added,
            lines_removed=self.lines_removed,
            bytes_changed=self.size,
            conflicts=conflicts,
        )


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


def _truthy(value: object) -> bool:
    """An option given as a bool or as a CLI string (``true``/``1``/``yes``/``on``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _error(phase: str, kind: str, message: str, *, untouched: bool = True) -> SandboxError:
    """The ``phase``'s error class for ``kind`` (``lock``, ``permission``, ``other``)."""
    plain, locked, denied = _PHASE_ERRORS[phase]
    cls = {"lock": locked, "permission": denied}.get(kind, plain)
    if phase == "rollback":
        return cls(message, refused=untouched and kind != "other")  # type: ignore[call-arg]
    return cls(message)


def _translate(
    failure: GitFailure, phase: str, doing: str, repo: str, *, untouched: bool = True
) -> SandboxError:
    """A classified sandbox error for a git failure, with what to do in its message."""
    kind = failure_kind(failure)
    outcome = "Nothing was changed." if untouched else "The operation stopped part-way."
    if kind.kind == "lock":
        message = (
            f"{doing}: the git lock file {kind.lock_path} exists: another git command is "
            f"running in {repo}, or one crashed and left it. Retry when it has finished; if no "
            f"git process is running, remove {kind.lock_path} and retry. {outcome}"
        )
        error = _error(phase, "lock", message, untouched=untouched)
        error.lock_path = kind.lock_path  # type: ignore[attr-defined]
        return error
    if kind.kind == "permission":
        message = (
            f"{doing}: permission denied ({failure.stderr}). Give this process (uid "
            f"{os.geteuid()}) write access to {repo} (owner, group or mode), or trust the "
            f"repository's owner (option trust_repository_owner=true). {outcome}"
        )
        return _error(phase, "permission", message, untouched=untouched)
    return _error(phase, "other", f"{doing}: {failure}", untouched=False)


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
    the umask's mode. Policy (issue 7): a file written back keeps the owner, group and
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
        **options: ``sandbox_root`` (str), ``sandbox_id`` (str, letters, digits, ``._-``),
            ``trust_repository_owner`` (bool, or ``"true"`` from the CLI; default false):
            accept a repository owned by another user.
    """

    strategy = "git_worktree"
    layout_folder = "git"
    rollbackable = True

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
        trusted, run_as = self._owner_policy(str(toplevel), str(common), "create")
        original = GitCommand(
            str(git_dir), str(common), str(toplevel), trusted=trusted, run_as=run_as
        )
        head = original.run("rev-parse", "HEAD", "--symbolic-full-name", "HEAD", ok=(0, 128))
        if head.status != 0:
            if failure_kind(GitFailure(["rev-parse"], 128, head.stderr)).kind == "permission":
                raise GitFailure(["rev-parse", "HEAD"], head.status, head.stderr)
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
        if run_as is not None:
            os.chown(path, run_as.uid, run_as.gid)
        branch = ""
        submodules: list[dict[str, str]] = []
        # Concurrent `git worktree add` on one repository races inside git (".git/worktrees/<id>/
        # commondir" read before it is written), so adds, like merges, are serialised per repo.
        with repository_lock(str(common)):
            try:
                wanted = f"sandbox/{_ref_component(plan_id)}/{self.sandbox_id}"
                # Only our own registration of this very path may be stale (the directory was
                # deleted behind our back); other worktrees are never pruned (case 02).
                self._forget_stale_registration(original, path)
                branch = self._free_branch(original, wanted)
                original.run("worktree", "add", "--quiet", "-b", branch, str(path), base)
                admin = self._linked_admin_dir(path)
                if (path / ".gitmodules").is_file():
                    worktree = original.with_work_tree(admin, str(path))
                    self._populate_submodules(worktree, path, common / "modules", submodules, 0)
            except BaseException:
                # Whatever failed (git, I/O, interrupt), leave no worktree, directory or branch.
                self._undo_failed_create(original, path, branch, base, submodules)
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
                "submodules": submodules,
            },
        )

    def _owner_policy(self, toplevel: str, common: str, phase: str) -> tuple[bool, RunAs | None]:
        """(trusted, run git as) for a repository; refuses another user's unless trusted.

        Raises:
            SandboxPermissionError: (the ``phase``'s subclass) owned by another user, not trusted.
        """
        try:
            owner = repository_owner(common, toplevel)
        except OSError as exc:
            raise _error(phase, "permission", f"cannot inspect {toplevel}: {exc}") from exc
        if owner is None:
            return False, None
        if not _truthy(self._options.get("trust_repository_owner")):
            raise _error(
                phase,
                "permission",
                f"the repository {toplevel} is owned by uid {owner[0]}, not by this process "
                f"(uid {os.geteuid()}); its configuration and hooks are that user's. Nothing "
                "was changed. If you trust that user, create the sandbox with the option "
                "trust_repository_owner=true (CLI: --option trust_repository_owner=true).",
            )
        # As root, git runs as the owner so that everything it writes (objects, refs, index,
        # files) stays the owner's; otherwise only git's ownership check is lifted.
        run_as = RunAs(*owner) if os.geteuid() == 0 else None
        return True, run_as

    def _forget_stale_registration(self, original: GitCommand, path: Path) -> None:
        """Drop a registration of ``path`` left by an earlier sandbox with this id (case 02).

        ``path`` was just created empty, so a registration for it is stale: its admin dir is
        removed, and so are the branch it was on when that is one of ours
        (``sandbox/<plan>/<this id>[-N]``) and this id's tags, so nothing stale stays behind.
        """
        ours = re.compile(rf"^refs/heads/sandbox/[^/]+/{re.escape(self.sandbox_id)}(-\d+)?$")
        for admin in registrations_of(original.common_dir, path):
            branch = head_branch(admin)
            logger.warning("sandbox %s: removing stale registration %s", self.sandbox_id, admin)
            shutil.rmtree(admin)
            if branch and ours.match(branch):
                original.run("update-ref", "-d", branch)
            self._delete_refs(original)

    def _populate_submodules(
        self,
        worktree: GitCommand,
        top: Path,
        store: Path,
        made: list[dict[str, str]],
        depth: int,
    ) -> None:
        """Check out each submodule at its pinned commit as a linked worktree of its module
        store (``<common>/modules/<name>``): offline, sharing objects with the original.

        A submodule the original never initialised (no module store, or the pinned commit is
        not in it) stays an empty directory, as in a fresh clone; its gitlink is kept.
        """
        listed = worktree.run(
            "config",
            "--file",
            str(top / ".gitmodules"),
            "-z",
            "--get-regexp",
            r"^submodule\..*\.path$",
            ok=(0, 1),
        )
        names: dict[str, str] = {}
        for entry in listed.nul_fields():
            key, _, rel = entry.partition("\n")
            names[rel] = key[len("submodule.") : -len(".path")]
        if not names or depth > 8:
            return
        stage = worktree.run("--literal-pathspecs", "ls-files", "-s", "-z", "--", *names)
        for entry in stage.nul_fields():
            info, _, rel = entry.partition("\t")
            mode, sha = info.split()[:2]
            name = names.get(rel, rel)
            if name.startswith("/") or ".." in name.split("/"):
                logger.warning("submodule name %r refused (as git does): left empty", name)
                continue
            module = store / name
            target = top / rel
            if mode != "160000" or not (module / "HEAD").is_file():
                continue
            if target.is_symlink() or not target.is_dir():
                continue
            module_git = GitCommand(
                str(module), str(module), trusted=worktree.trusted, run_as=worktree.run_as
            )
            found = module_git.run("cat-file", "-e", f"{sha}^{{commit}}", ok=(0, 1, 128))
            if found.status != 0:
                logger.warning("submodule %s: commit %s not in %s; left empty", rel, sha, module)
                continue
            module_git.run("worktree", "add", "--quiet", "--detach", str(target), sha)
            admin = read_gitdir_file(target)
            if admin is None:
                raise SandboxCreationError(f"git did not link the submodule worktree at {target}")
            made.append({"path": str(target), "admin": str(Path(admin).resolve())})
            if (target / ".gitmodules").is_file():
                nested = module_git.with_work_tree(admin, str(target))
                self._populate_submodules(nested, target, module / "modules", made, depth + 1)

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

    def _undo_failed_create(
        self,
        original: GitCommand,
        path: Path,
        branch: str,
        base: str,
        submodules: list[dict[str, str]],
    ) -> None:
        """Remove what a failed create may have left: worktrees, directory, branch.

        git 2.39 creates the ``-b`` branch before checking the path (case 01), so the branch is
        deleted too, but only while it still points at ``base`` (compare-and-delete). Only the
        registrations of our own paths are removed (never a repository-wide prune, case 02).
        """
        try:
            self._remove_registrations(original, path, submodules)
        except OSError as exc:  # best effort: report, keep undoing the rest
            logger.warning("undo of failed create %s: %s", self.sandbox_id, exc)
        if branch:
            try:
                original.run("update-ref", "-d", f"refs/heads/{branch}", base, ok=(0, 1, 128))
            except GitFailure as exc:
                logger.warning("undo of failed create %s: %s", self.sandbox_id, exc)

    @staticmethod
    def _remove_registrations(
        original: GitCommand, path: Path, submodules: list[dict[str, str]]
    ) -> None:
        """Delete our worktree directory and exactly our admin dirs (submodules first).

        What ``git worktree remove --force`` does, for our paths only, and also for a
        superproject (which git refuses to remove) and for a directory already gone.
        """
        for sub in reversed(submodules):
            admin = Path(sub["admin"])
            linked = admin / "gitdir"
            try:
                points_here = os.path.realpath(
                    linked.read_text(encoding="utf-8").strip()
                ) == os.path.realpath(Path(sub["path"]) / ".git")
            except OSError:
                points_here = False
            if points_here:
                shutil.rmtree(admin, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            shutil.rmtree(path)  # raise what is really in the way
        for admin in registrations_of(original.common_dir, path):
            shutil.rmtree(admin)

    # -- commit -----------------------------------------------------------------------------

    def commit(self, message: str | None = None) -> CommitResult:
        """As :meth:`BaseSandbox.commit`; see the module docstring for the merge-back.

        Raises:
            SandboxConflictError: the changes overlap changes in the original (``conflicts``).
            SandboxCommitLockedError: a leftover git lock file (``lock_path``) blocks it.
            SandboxCommitPermissionError: the original cannot be written, or its owner is
                another user who is not trusted.
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
        # Refuse before writing files that a failed ref move would revert.
        self._refuse_ref_locks(original, [*(line.split()[1] for line in updates or []), ref])

        def merge(half: list[str]) -> tuple[_Owners, Any]:
            """Put back a half-written earlier attempt's paths, then merge into the original."""
            if half:
                self._touched = True
                self._restore_from_index(original, half)
            owners = _Owners(top, paths, change.executable)
            self._touched = True
            return owners, original.run("read-tree", "-m", "-u", old, new, ok=(0, 128))

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
            self._touched = False
            original.run("update-index", "-q", "--refresh", ok=(0, 1))
            self._touched = True
            updated = original.run("read-tree", "-m", "-u", old, new, ok=(0, 128))
        if updated.status != 0:
            failure = GitFailure(["read-tree", "-m", "-u", old, new], 128, updated.stderr)
            kind = failure_kind(failure).kind
            if kind == "lock" or _NOT_UPTODATE in updated.stderr:
                self._touched = False  # read-tree checks everything before writing
            elif kind == "permission":
                self._put_back_partial_update(original, paths, owners)
                self._touched = False
            if kind != "other":
                raise failure
            raise self._overlap_error(error, paths, updated.stderr)  # a change appeared since
        owners.restore()
        target = [*(updates or []), *(["option no-deref\n"] if ref == "HEAD" else [])]
        target.append(f"update {ref} {new} {old}\n")
        moved = self._update_refs(original, target, ok=(0, 1, 128))
        if moved.status == 0:
            self._move_submodules(original, top, old, new, paths)
            return True
        original.run("read-tree", "-m", "-u", new, old)
        owners.restore()
        failure = GitFailure(["update-ref", ref], moved.status, moved.stderr)
        if failure_kind(failure).kind != "other":
            self._touched = False  # the files were put back
            raise failure
        return False  # a ref moved concurrently: the caller retries

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
        """(commit the target should point at, how): no-op, fast-forward or merge commit.

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
        if common == old:
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
            raise SandboxConflictError(
                f"sandbox {self.sandbox_id} conflicts with the original in: "
                f"{', '.join(conflicts)}; resolve them in {self.original_path} (or discard the "
                "sandbox's version) and retry",
                conflicts=conflicts,
            )
        commit = original.run("commit-tree", fields[0], "-p", old, "-p", tip, "-m", message)
        return commit.out, "merge"

    def _put_back_partial_update(
        self, original: GitCommand, paths: list[str], owners: _Owners
    ) -> None:
        """Undo the files a failed ``read-tree -m -u`` wrote before it stopped (an immutable or
        unwritable file part-way): it writes the index last, so the index still holds the
        original's state; tracked paths are checked out from it, new files are removed."""
        written = sorted(self._local_changes(original, paths) & set(paths))
        if not written:
            return
        self._restore_from_index(original, written)
        for folder in owners.created_folders():
            with contextlib.suppress(OSError):
                folder.rmdir()  # only the empty folders read-tree made
        owners.restore()
        owners.put_back_times(written)

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

    def _restore_from_index(self, original: GitCommand, paths: list[str]) -> None:
        """Put ``paths`` back as the original's index has them: tracked paths are checked out
        from it, files it does not track are removed (they hold what a merge wrote)."""
        listed = original.run("--literal-pathspecs", "ls-files", "-z", "--", *paths)
        tracked = set(listed.nul_fields())
        restore = "\0".join(rel for rel in paths if rel in tracked)
        if restore:
            original.run(
                "checkout-index", "-f", "-q", "-z", "--stdin", stdin=restore, ok=(0, 1, 128)
            )
        top = Path(str(self._meta()["original_toplevel"]))
        for rel in paths:
            if rel not in tracked and os.path.lexists(top / rel) and not (top / rel).is_dir():
                (top / rel).unlink()

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
        listed = set(paths)
        folders = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
        for folder in folders - listed:
            where = top / folder
            if where.is_symlink() or (os.path.lexists(where) and not where.is_dir()):
                dirty.add(folder)
        return dirty

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

    # -- two-phase plan commit (issue 9) ----------------------------------------------------

    def _do_review(self) -> ChangeSummary:
        """What a commit would change now, read with no lock and nothing moved.

        The worktree is staged into a throw-away copy of its index (``GIT_INDEX_FILE``), so
        neither the sandbox branch nor its index changes; the tree written there names the
        exact content and git modes. ``digest`` = sha256 over the base commit and that tree
        (:func:`_change_digest`): ``prepare`` commits the same tree, so it reports the same
        digest while nothing changed. Conflicts are the paths the merge with the original's
        current tip conflicts on and the paths with uncommitted work in the original's working
        tree; ``"HEAD"`` when the original's HEAD is no longer on the ref it was on at create.
        """
        worktree = self._worktree_git_or(SandboxError, "review")
        meta = self._meta()
        base = str(meta["base_commit"])
        try:
            tree = self._staged_tree(worktree)
            original = self._original_git()
            summary = self._summarise(original, base, tree)
            conflicts = self._review_conflicts(original, worktree, base, tree, summary)
        except GitFailure as exc:
            raise _translate(
                exc, "other", f"review of sandbox {self.sandbox_id}", self._sandbox_dir()
            ) from exc
        return summary.to_summary(self, _change_digest(base, tree), conflicts)

    def _staged_tree(self, worktree: GitCommand) -> str:
        """Tree id of the worktree as ``add -A`` would stage it, via a throw-away index."""
        admin = Path(worktree.git_dir)
        scratch = admin / f"sandbox-core-review-{os.getpid()}-{threading.get_ident()}.index"
        try:
            with contextlib.suppress(FileNotFoundError):
                # Its stat cache keeps add -A cheap; copy2 keeps the index's mtime, which git's
                # racy-entry check needs (a same-size edit in the second of the checkout).
                shutil.copy2(admin / "index", scratch)
            staged = worktree.with_index_file(str(scratch))
            staged.run("add", "-A")
            return staged.run("write-tree").out
        finally:
            with contextlib.suppress(FileNotFoundError):
                scratch.unlink()

    @staticmethod
    def _summarise(original: GitCommand, base: str, tree: str) -> _Summary:
        """What ``base`` -> ``tree`` adds, changes and deletes, with line and byte counts."""
        fields = original.run(
            "diff-tree", "-r", "--no-renames", "-z", "--raw", "--numstat", base, tree
        ).nul_fields()
        added: list[str] = []
        changed: list[str] = []
        deleted: list[str] = []
        executable: set[str] = set()
        blobs: list[str] = []
        lines_added = lines_removed = 0
        index = 0
        while index < len(fields):
            entry = fields[index]
            if entry.startswith(":"):
                old_mode, new_mode, _old_id, new_id, status = entry[1:].split()[:5]
                path = fields[index + 1]
                index += 2
                {"A": added, "D": deleted}.get(status[0], changed).append(path)
                if {old_mode, new_mode} == {"100644", "100755"}:
                    executable.add(path)
                if status[0] != "D" and new_mode != "160000":
                    blobs.append(new_id)
                continue
            plus, minus, _path = entry.split("\t", 2)
            lines_added += int(plus) if plus.isdigit() else 0  # "-" for a binary file
            lines_removed += int(minus) if minus.isdigit() else 0
            index += 1
        size = 0
        if blobs:
            sizes = original.run(
                "cat-file", "--batch-check=%(objectsize)", stdin="".join(f"{b}\n" for b in blobs)
            )
            size = sum(int(line) for line in sizes.out.split() if line.isdigit())
        return _Summary(
            sorted(added),
            sorted(changed),
            sorted(deleted),
            executable,
            lines_added,
            lines_removed,
            size,
        )

    def _review_conflicts(
        self,
        original: GitCommand,
        worktree: GitCommand,
        base: str,
        tree: str,
        summary: _Summary,
    ) -> list[str]:
        """What would refuse a commit now (read-only; the merge writes objects only)."""
        sha, symbolic = original.run(
            "rev-parse", "HEAD", "--symbolic-full-name", "HEAD"
        ).out.splitlines()[:2]
        if symbolic != (self._meta()["target_ref"] or "HEAD"):
            return ["HEAD"]
        paths = summary.paths
        if not paths:
            return []
        new = tree
        if sha != base:
            # The original moved since create: merge as the commit would, on a commit object
            # of the staged tree (written, never referenced: left to git's gc).
            probe = worktree.run("commit-tree", tree, "-p", "HEAD", "-m", "sandbox-core review")
            merged = original.run(
                "merge-tree",
                "--write-tree",
                "--name-only",
                "--no-messages",
                "-z",
                sha,
                probe.out,
                ok=(0, 1),
            )
            fields = merged.nul_fields()
            if merged.status == 1:
                return sorted(set(fields[1:]))
            new = fields[0]
            paths = self._classify(original, sha, new).paths
            if not paths:
                return []
        conflicts, _half = self._overlap(original, sha, new, paths)
        return conflicts

    def _do_prepare(self, txid: str, message: str | None) -> PreparedCommit:
        """Commit the sandbox branch, merge, check, and record it all under refs named after
        ``txid``: ``refs/sandbox/prepared/<txid>/<sandbox_id>/{new,old,tip}`` (the commit the
        target moves to, the target's expected old value, the sandbox commit), written in one
        ref transaction with the ``pre-commit`` tag. The original's files, index and refs are
        untouched. Another sandbox of the same repository prepared under the same ``txid`` is
        chained: this merge is computed on top of the commit that one moves the target to.

        Raises:
            SandboxConflictError: merge conflict or overlapping local work (``conflicts``).
            SandboxCommitLockedError / SandboxCommitPermissionError / SandboxCommitError.
        """
        self._check_txid(txid)
        context = self._require_context()
        text = message or f"Apply sandbox {self.sandbox_id} of plan {context.plan_id}"
        original = self._original_git("commit")
        try:
            worktree = self._worktree_git_or(SandboxCommitError, "prepare")
            self._check_worktree_head(worktree)
            tree = self._stage(worktree)
            base = str(context.metadata["base_commit"])
            summary = self._summarise(original, base, tree)
            prefix = self._prepared_prefix(txid)
            with repository_lock(str(context.metadata["git_common_dir"])):
                heads = self._read_heads(original, SandboxCommitError)
                after = self._chained_after(original, txid, heads.target)
                snap = self._snapshot(original, tree, heads, text)
                plan = self._plan(original, snap, heads, text, summary.change, after)
                # The sandbox branch, its tags and the prepared refs move together or not at
                # all: a refused prepare leaves nothing behind.
                updates = [
                    *self._snapshot_updates(snap, heads),
                    f"update {prefix}new {plan.new}\n",
                    f"update {prefix}old {plan.old}\n",
                    f"update {prefix}tip {snap.tip}\n",
                    f"update {self._tag('pre-commit')} {plan.old}\n",
                ]
                self._update_refs(original, updates, f"sandbox-core: prepare {txid}")
        except GitFailure as exc:
            raise _translate(
                exc, "commit", f"prepare of sandbox {self.sandbox_id} failed", self.original_path
            ) from exc
        digest = _change_digest(base, snap.tree)
        return PreparedCommit(
            sandbox_id=self.sandbox_id,
            txid=txid,
            digest=digest,
            summary=summary.to_summary(self, digest, []),
            details={
                "prepared_ref": prefix.rstrip("/"),
                "target_ref": plan.ref,
                "expected_old": plan.old,
                "merge_commit": plan.new,
                "sandbox_commit": snap.tip,
                "landed_as": plan.how,
            },
        )

    def _do_apply_prepared(self, txid: str) -> CommitResult:
        """Move the original to the prepared merge: files and index for the changed paths, then
        the target ref by compare-and-swap against the prepared old value.

        Idempotent: a crash at any point inside leaves either nothing done, half-written paths
        (put back and rewritten), files and index done (kept), or the ref moved (then this only
        returns the result). If the target moved since prepare (someone else wrote the
        repository between prepare and apply), nothing is touched and
        :class:`SandboxCommitError` is raised: the coordinator decides.
        """
        self._check_txid(txid)
        meta = self._meta()
        original = self._original_git("commit")
        self._touched = False
        try:
            with repository_lock(str(meta["git_common_dir"])):
                plan, tip, text, lists = self._read_prepared(original, txid)
                ref, current = self._current_target(original, SandboxCommitError)
                if current != plan.old and plan.new != plan.old:
                    landed = (
                        current == plan.new
                        or original.run(
                            "merge-base", "--is-ancestor", plan.new, current, ok=(0, 1)
                        ).status
                        == 0
                    )
                    if not landed:
                        raise SandboxCommitError(
                            f"{ref} moved from {plan.old} to {current} after sandbox "
                            f"{self.sandbox_id} was prepared under {txid}: something else wrote "
                            f"{self.original_path} between prepare and apply. Nothing was "
                            f"changed. Move {ref} back to {plan.old} and apply again, or abort "
                            "the plan commit (before its decision) and commit it again."
                        )
                    top = Path(str(meta["original_toplevel"]))
                    self._move_submodules(original, top, plan.old, plan.new, plan.paths)
                elif plan.new != plan.old and not self._apply(
                    original,
                    ref,
                    plan.old,
                    plan.new,
                    SandboxCommitError,
                    plan.change,
                ):
                    raise SandboxCommitError(
                        f"{ref} moved during the apply of sandbox {self.sandbox_id}; "
                        "nothing was changed"
                    )
        except GitFailure as exc:
            raise _translate(
                exc,
                "commit",
                f"apply of the prepared commit of sandbox {self.sandbox_id} failed",
                self.original_path,
                untouched=not self._touched,
            ) from exc
        return self._result(plan, tip, lists, text, txid=txid)

    def _do_abort_prepared(self, txid: str) -> None:
        """Delete the prepared refs of ``txid``; merge objects are left to git's gc."""
        self._check_txid(txid)
        if self._context is None:
            return
        git_cmd = self._common_git()
        if git_cmd is None:
            return
        try:
            self._delete_matching(git_cmd, self._prepared_prefix(txid))
        except GitFailure as exc:
            raise _translate(
                exc,
                "other",
                f"abort of the prepared commit of sandbox {self.sandbox_id}",
                self.original_path,
            ) from exc

    @staticmethod
    def _check_txid(txid: str) -> None:
        if len(txid) > 64 or not _is_safe_component(txid):
            raise ValueError(f"invalid transaction id {txid!r}: [A-Za-z0-9._-], at most 64")

    def _prepared_prefix(self, txid: str) -> str:
        return f"{_PREPARED_ROOT}{txid}/{self.sandbox_id}/"

    def _read_prepared(
        self, original: GitCommand, txid: str
    ) -> tuple[_Plan, str, str, tuple[list[str], list[str], list[str]]]:
        """(plan, sandbox commit, message, (added, changed, deleted) of the sandbox's change)
        recorded by ``prepare`` under ``txid``."""
        prefix = self._prepared_prefix(txid)
        listed = original.run(
            "for-each-ref", "--format=%(refname)%00%(objectname)%00%(contents)%00", prefix
        ).stdout.split("\0")
        refs = {}
        messages = {}
        for name, sha, contents in zip(listed[0::3], listed[1::3], listed[2::3], strict=False):
            key = name.strip().removeprefix(prefix)
            refs[key] = sha
            messages[key] = contents.strip()
        if not {"new", "old", "tip"} <= refs.keys():
            raise SandboxCommitError(
                f"sandbox {self.sandbox_id} has no commit prepared under {txid} "
                f"(no {prefix}new/old/tip): prepare it first"
            )
        old, new, tip = refs["old"], refs["new"], refs["tip"]
        base = str(self._meta()["base_commit"])
        from_base = self._classify(original, base, tip)
        if new == old:
            change = _NO_CHANGE
        elif (old, new) == (base, tip):  # a fast-forward from the base: the sandbox's paths
            change = from_base
        else:
            change = self._classify(original, old, new)
        how = "no-op" if new == old else "fast-forward" if new == tip else "merge"
        ref = str(self._meta()["target_ref"] or "HEAD")
        plan = _Plan(ref, old, new, how, change, None)
        lists = (from_base.added, from_base.changed, from_base.deleted)
        return plan, tip, messages["tip"], lists

    def _chained_after(self, original: GitCommand, txid: str, head: str) -> str | None:
        """The commit the target will be at once the sandboxes of this repository prepared
        before this one under ``txid`` are applied (in prepare order), starting from the
        target's tip ``head``; None when there is none.

        Chained by value: a prepared sandbox whose expected old value is the target's current
        tip goes first, then the one expecting its result, and so on.
        """
        listed = original.run(
            "for-each-ref", "--format=%(refname) %(objectname)", f"{_PREPARED_ROOT}{txid}/"
        )
        moves: dict[str, dict[str, str]] = {}
        for line in listed.out.splitlines():
            name, _, sha = line.partition(" ")
            sid, _, kind = name.removeprefix(f"{_PREPARED_ROOT}{txid}/").partition("/")
            if sid != self.sandbox_id:
                moves.setdefault(sid, {})[kind] = sha
        if not moves:
            return None
        start = head
        for _ in range(len(moves)):
            step = next(
                (m["new"] for m in moves.values() if m.get("old") == head and m.get("new") != head),
                None,
            )
            if step is None:
                break
            head = step
        return head if head != start else None

    def _common_git(self) -> GitCommand | None:
        """Ref-only commands addressed by the common dir (the original checkout may be gone);
        None when the repository itself is gone."""
        common = str(self._meta()["git_common_dir"])
        if not Path(common).is_dir():
            return None
        trusted, run_as = self._trust("other")
        return GitCommand(common, common, trusted=trusted, run_as=run_as)

    def _delete_matching(self, git_cmd: GitCommand, prefix: str) -> None:
        """Delete every ref under ``prefix`` in one ref transaction."""
        listed = git_cmd.run("for-each-ref", "--format=%(refname)", prefix)
        found = [line for line in listed.out.splitlines() if line]
        if found:
            git_cmd.run("update-ref", "--stdin", stdin="".join(f"delete {r}\n" for r in found))

    # -- rollback ---------------------------------------------------------------------------

    def _do_rollback(self) -> None:
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

    def _do_rollback_committed(self) -> None:
        last = self._last_commit
        if last is None or last.commit_ref is None:
            raise SandboxRollbackError(f"sandbox {self.sandbox_id} has no recorded commit")
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
            self._do_rollback()  # the sandbox itself is clean again, as after an ACTIVE rollback

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

    def _delete_refs(self, original: GitCommand, *refs: str) -> None:
        """Delete ``refs``, every ``sandbox/<id>/*`` tag and every ref prepared for this sandbox
        under any transaction id, in one ref transaction."""
        listed = original.run(
            "for-each-ref",
            "--format=%(refname)",
            f"refs/tags/sandbox/{self.sandbox_id}/",
            _PREPARED_ROOT,
            *refs,
        )
        found = [
            line
            for line in listed.out.splitlines()
            if line
            and (not line.startswith(_PREPARED_ROOT) or line.split("/")[-2] == self.sandbox_id)
        ]
        if found:
            original.run("update-ref", "--stdin", stdin="".join(f"delete {r}\n" for r in found))

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

    # -- helpers ----------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return self._require_context().metadata

    def _sandbox_dir(self) -> str:
        return self._require_context().sandbox_path

    def _tag(self, name: str) -> str:
        return f"refs/tags/sandbox/{self.sandbox_id}/{name}"

    def _checkpoint_ref(self, name: str) -> str:
        if not isinstance(name, str) or not _is_safe_component(name):
            raise ValueError(f"invalid checkpoint name: {name!r}")
        return self._tag(f"ckpt/{name}")

    def _trust(self, phase: str) -> tuple[bool, RunAs | None]:
        meta = self._meta()
        return self._owner_policy(
            str(meta["original_toplevel"]), str(meta["git_common_dir"]), phase
        )

    def _original_git(self, phase: str = "other") -> GitCommand:
        """Commands for the original checkout (owner policy applied for ``phase``)."""
        meta = self._meta()
        trusted, run_as = self._trust(phase)
        return GitCommand(
            str(meta["original_git_dir"]),
            str(meta["git_common_dir"]),
            str(meta["original_toplevel"]),
            trusted=trusted,
            run_as=run_as,
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
        phase = {SandboxCommitError: "commit", SandboxRollbackError: "rollback"}.get(error, "other")
        trusted, run_as = self._trust(phase)
        return GitCommand(
            admin,
            str(context.metadata["git_common_dir"]),
            context.sandbox_path,
            trusted=trusted,
            run_as=run_as,
        )

    def _adopt_worktree(self, worktree: GitCommand) -> None:
        """Hand files an actor made in the sandbox to the user git runs as (trusted foreign
        repository, as root only), so that git can remove them on rollback and restore."""
        run_as = worktree.run_as
        if run_as is None:
            return
        top = Path(self._sandbox_dir())
        for folder, dirs, files in os.walk(top):
            for name in dirs + files:
                path = Path(folder) / name
                try:
                    info = path.lstat()
                    if info.st_uid != run_as.uid:
                        os.lchown(path, run_as.uid, run_as.gid)
                except OSError as exc:
                    logger.warning("cannot hand %s to uid %s: %s", path, run_as.uid, exc)

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
