"""The two-phase side of a ``git_worktree`` sandbox: review, prepare, apply, abort.

The third layer of :class:`~sandbox_core.strategies.git_worktree.GitWorktreeSandbox`
(``docs/git-worktree.md``). ``review`` stages the worktree into a throw-away index (nothing
moves; digest = sha256 over base commit and tree). ``prepare`` commits the sandbox branch and
merges with the original untouched, recording ``refs/sandbox/prepared/<txid>/<sandbox_id>/
{new,old,tip}``; sandboxes of one repository prepared under one transaction id are chained.
``apply_prepared`` writes the changed paths and moves the target by compare-and-swap
(idempotent after a crash); ``abort_prepared`` deletes the prepared refs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from sandbox_core.errors import SandboxCommitError, SandboxError
from sandbox_core.protocol import ChangeSummary, CommitResult, PreparedCommit
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.git_worktree.git import GitCommand, GitFailure, repository_lock
from sandbox_core.strategies.git_worktree.merge import _NO_CHANGE, MergeBack, _Change, _Plan
from sandbox_core.strategies.git_worktree.worktree import (
    _PREPARED_ROOT,
    _is_safe_component,
    _translate,
)


def _change_digest(base: str, tree: str) -> str:
    """``sha256:<hex>`` naming a sandbox's exact change: its base commit and its tree (git's
    ids cover every path's content and mode, and the deletions)."""
    return "sha256:" + hashlib.sha256(f"git_worktree\0{base}\0{tree}".encode()).hexdigest()


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


class PreparedMergeBack(MergeBack):
    """The two-phase layer of :class:`GitWorktreeSandbox`: review, prepare, apply, abort."""

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
            # A branch rewritten since create gets the sandbox's own change replayed onto it.
            probe = worktree.run("commit-tree", tree, "-p", "HEAD", "-m", "sandbox-core review")
            rewritten = self._rewritten(original, base, sha)
            status, fields = self._merge_trees(original, base, sha, probe.out, rewritten=rewritten)
            if status == 1:
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
                    *self._replay_updates(plan),
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
                elif plan.new != plan.old and not self._apply_decided(
                    txid, original, ref, plan.old, plan.new, plan.change
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

    def _apply_decided(
        self, txid: str, original: GitCommand, ref: str, old: str, new: str, change: _Change
    ) -> bool:
        """``_apply`` of a decided two-phase commit: its marker names ``txid``, so a crash
        in the middle is rolled forward by ``finish_interrupted`` (never put back)."""
        self._moving_txid: str | None = txid
        try:
            return self._apply(original, ref, old, new, SandboxCommitError, change)
        finally:
            self._moving_txid = None

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
            "for-each-ref",
            "--format=%(refname)%00%(objectname)%00%(parent)%00%(contents)%00",
            prefix,
        ).stdout.split("\0")
        refs = {}
        parents = {}
        messages = {}
        for name, sha, parent, contents in zip(
            listed[0::4], listed[1::4], listed[2::4], listed[3::4], strict=False
        ):
            key = name.strip().removeprefix(prefix)
            refs[key] = sha
            parents[key] = parent.split()
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
        if how == "merge" and len(parents["new"]) == 1:
            how = "replay"  # onto a rewritten branch: the sandbox's change, one parent
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
