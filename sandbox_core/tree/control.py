"""The commit's guard of control paths: what a sandbox may never write into its original.

An actor's file operations refuse control paths (:mod:`sandbox_core.actor.beneath`), but a
command run in the sandbox may write anything into its tree. So every directory commit (one-shot
and two-phase prepare of ``copy_on_write`` and ``overlay``) checks its change set here first and
refuses, naming the paths, when it would:

- add, change or delete anything under a ``.git`` (or a name a filesystem could alias to it:
  :func:`sandbox_core.paths.is_control_name`) that is not the original's own repository: a
  non-git original never gains a ``.git`` through a commit;
- change or delete the original's own repository's configuration, hooks or ``info`` (a
  ``core.fsmonitor`` or a hook runs a command at the next ``git status`` there), or delete the
  repository itself; its history (objects, refs, index, logs) may move, as a ``git commit`` in a
  copy of a main worktree moves it;
- touch one of the core's own files (a lock ``.<name>.sandbox-lock``, a staging area, a backup,
  an overlay work dir, a checkpoint staging dir).

Nothing is written when refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sandbox_core.errors import SandboxCommitError
from sandbox_core.paths import CONTROL_DIRS, fold_name, is_control_name
from sandbox_core.tree.scan import TreeChanges

# What of the original's own repository a commit may never change: it runs commands.
REPOSITORY_CONFIG = frozenset({"config", "config.worktree", "hooks", "info", "commondir"})


def _is_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def refused_control_paths(changes: TreeChanges, original: Path) -> list[str]:
    """The paths of ``changes`` a commit into ``original`` must not write (sorted; see the
    module docstring)."""
    refused: list[str] = []
    deleted = set(changes.deleted)
    for rel in changes.paths:
        parts = rel.split("/")
        for index, part in enumerate(parts):
            if not is_control_name(part):
                continue
            own = (
                part in CONTROL_DIRS
                and fold_name(part) in CONTROL_DIRS
                and _is_directory(original.joinpath(*parts[: index + 1]))
            )
            rest = parts[index + 1 :]
            if not own:
                refused.append(rel)  # a new .git (or an alias of one), or the core's own file
            elif not rest and rel in deleted:
                refused.append(rel)  # the original's repository itself removed
            elif rest and rest[0] in REPOSITORY_CONFIG:
                refused.append(rel)  # configuration or hooks: they run commands
            break
    return sorted(refused)


def refuse_control_changes(changes: TreeChanges, original: Path, sandbox_id: str) -> None:
    """Refuse a commit of ``changes`` into ``original`` that would write a control path.

    Raises:
        SandboxCommitError: naming the refused paths (at most 10 shown; all in ``conflicts``).
    """
    refused = refused_control_paths(changes, original)
    if refused:
        shown = ", ".join(refused[:10])
        raise SandboxCommitError(
            f"commit of sandbox {sandbox_id} refused: it would write {len(refused)} control "
            f"path(s) into the original ({shown}): a .git that is not the original's own "
            "repository, that repository's configuration or hooks, or the sandbox's own files "
            "are never committed; remove them from the sandbox and commit again",
            conflicts=refused,
        )
