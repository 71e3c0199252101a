"""The worktree of a ``git_worktree`` sandbox: making it, addressing it, and naming what it owns.

The first layer of :class:`~sandbox_core.strategies.git_worktree.GitWorktreeSandbox`:

- create: the sandbox's directory, its branch (never an existing one adopted), the linked
  worktree, the submodules checked out as linked worktrees of the original's module store, the
  undo of a create that failed part-way (only our own registrations are ever removed), and the
  cleanup by id of a create that was interrupted before its record was complete;
- the git commands of the original and of the worktree, with the owner policy applied (a
  repository owned by another user is refused unless trusted);
- the names the sandbox owns (branch, tags, prepared refs) and their deletion;
- the translation of a :class:`GitFailure` into the sandbox error of the phase it happened in.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCommitLockedError,
    SandboxCommitPermissionError,
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
from sandbox_core.protocol import SandboxContext
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.git_worktree.git import (
    GitCommand,
    GitFailure,
    RunAs,
    failure_kind,
    head_branch,
    open_repo,
    read_gitdir_file,
    registrations_below,
    registrations_of,
    repository_lock,
    repository_owner,
)

logger = logging.getLogger("sandbox_core.git_worktree")

_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_BRANCH_SUFFIX = 100


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
# Two-phase plan commit: what prepare recorded, per transaction id and sandbox.
_PREPARED_ROOT = "refs/sandbox/prepared/"


def _truthy(value: object) -> bool:
    """An option given as a bool or as a CLI string (``true``/``1``/``yes``/``on``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _error(phase: str, kind: str, message: str, *, untouched: bool = True) -> SandboxError:
    """The ``phase``'s error class for ``kind`` (``lock``, ``permission``, ``space``,
    ``other``). A ``space`` error (a full file system, nothing changed) is the phase's plain
    class marked ``retryable`` (True), as :class:`SandboxRetryableError` is: not now, later."""
    plain, locked, denied = _PHASE_ERRORS[phase]
    cls = {"lock": locked, "permission": denied}.get(kind, plain)
    if phase == "rollback":
        error = cls(message, refused=untouched and kind != "other")  # type: ignore[call-arg]
    else:
        error = cls(message)
    if kind == "space" and untouched:
        error.retryable = True  # type: ignore[attr-defined]
    return error


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
        what = "permission denied"
        if "read-only file system" in failure.stderr.lower():
            what = "the file system is read-only"
        message = (
            f"{doing}: {what} ({failure.stderr}). Give this process (uid "
            f"{os.geteuid()}) write access to {repo} (owner, group or mode), or trust the "
            f"repository's owner (option trust_repository_owner=true). {outcome}"
        )
        return _error(phase, "permission", message, untouched=untouched)
    if kind.kind == "space":
        message = (
            f"{doing}: the file system is full ({failure.stderr}). {outcome} Free space on "
            f"the volume of {repo} (or grow it) and retry."
        )
        return _error(phase, "space", message, untouched=untouched)
    return _error(phase, "other", f"{doing}: {failure}", untouched=False)


def _is_safe_component(value: str) -> bool:
    """True when ``value`` can be one path component of a git ref name and a directory name."""
    return bool(_SAFE_COMPONENT.match(value)) and ".." not in value and not value.endswith(".lock")


def _ref_component(value: str) -> str:
    """``value`` made usable as one ref component (unsafe characters become ``-``)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value).strip(".-") or "plan"
    cleaned = cleaned.replace("..", "-")
    cleaned = cleaned[:-5] + "-lock" if cleaned.endswith(".lock") else cleaned
    return re.sub(r"-{2,}", "-", cleaned)


def _gitdir_target(admin: Path) -> str:
    """The ``<work tree>/.git`` path an admin dir's ``gitdir`` file names."""
    return (admin / "gitdir").read_text(encoding="utf-8").strip()


class WorktreeBase(BaseSandbox):
    """The worktree layer of :class:`GitWorktreeSandbox`: create, the git commands of the
    original and of the worktree, and the refs the sandbox owns."""

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

    def _cleanup_interrupted_worktree(self) -> None:
        """Remove what an interrupted create of this id made, found by its id alone (no context).

        The worktree directory ``<sandbox_root>/git/<sandbox_id>`` with exactly its registration
        and those of the submodule worktrees inside it; the branch that registration was on when
        it is named after this id (``sandbox/<plan>/<id>[-N]``); any other branch named after
        this id that no worktree has checked out and whose commits the original's HEAD already
        holds (git creates the ``-b`` branch before the worktree, case 01: deleting it loses no
        work); this id's tags and prepared refs. Other worktrees, branches and the original's
        files are never touched (no repository-wide prune, case 02).

        Raises:
            GitFailure: git failed.
            SandboxPermissionError: the repository is another user's and not trusted.
        """
        if not _is_safe_component(self.sandbox_id):
            return  # create refused this id before making anything
        path = (self.sandbox_root / "git" / self.sandbox_id).absolute()
        try:
            repo = open_repo(self.original_path)
        except GitFailure:
            shutil.rmtree(path, ignore_errors=True)  # repository gone: only our directory is left
            return
        with repo:
            if repo.bare or repo.working_tree_dir is None:
                return  # create refuses a bare repository before making anything
            toplevel = str(Path(repo.working_tree_dir).resolve())
            common = str(Path(repo.common_dir).resolve())
            git_dir = str(Path(repo.git_dir).resolve())
        trusted, run_as = self._owner_policy(toplevel, common, "other")
        original = GitCommand(git_dir, common, toplevel, trusted=trusted, run_as=run_as)
        ours = re.compile(rf"^refs/heads/sandbox/[^/]+/{re.escape(self.sandbox_id)}(-\d+)?$")
        with repository_lock(common):
            admins = registrations_of(common, path)
            made = {b for b in (head_branch(a) for a in admins) if b and ours.match(b)}
            subs = [
                {"path": str(Path(_gitdir_target(a)).parent), "admin": str(a)}
                for a in registrations_below(common, path)
            ]
            self._remove_registrations(original, path, subs)
            checked_out = {head_branch(Path(common))} | {
                head_branch(a) for a in (Path(common) / "worktrees").glob("*")
            }
            listed = original.run("for-each-ref", "--format=%(refname)", "refs/heads/sandbox/")
            for branch in listed.out.splitlines():
                if not ours.match(branch) or branch in checked_out:
                    continue
                if branch in made or self._held_by_head(original, branch):
                    logger.warning("sandbox %s: deleting %s", self.sandbox_id, branch)
                    original.run("update-ref", "-d", branch)
            self._delete_refs(original)

    @staticmethod
    def _held_by_head(original: GitCommand, branch: str) -> bool:
        """Whether the original's HEAD contains every commit of ``branch``."""
        found = original.run("merge-base", "--is-ancestor", branch, "HEAD", ok=(0, 1, 128))
        return found.status == 0

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
        if path.is_symlink() or path.is_file():
            path.unlink()  # a file or link put in our directory's place: never followed
        if path.exists():
            shutil.rmtree(path)  # raise what is really in the way
        for admin in registrations_of(original.common_dir, path):
            shutil.rmtree(admin)

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
