"""Attacks on an actor's jail, shared by the isolation tests of every /proc mode: what a
command tries in order to get out, and digests of what it must never change."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.support.actor import TOKEN, Layout
from tests.support.gitrepo import git

SECRETS = (TOKEN, "record-secret", "journal-secret", "other-sandbox-secret", "pw-secret-42")


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (following nothing) -> sha256 of its bytes or link target."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = "link:" + str(path.readlink())
        elif path.is_file():
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def agent_state(layout: Layout) -> dict[str, str]:
    """The agent's state files, without the actor's own (the audit log, the git copies)."""
    # actor/ is not walked at all: a finished command's git copy is removed in the background.
    found = {}
    for top in sorted(layout.state.iterdir()):
        if top.name == "actor":
            continue
        if top.is_symlink():
            found[top.name] = "link:" + str(top.readlink())
        elif top.is_dir():
            found.update({f"{top.name}/{p}": d for p, d in tree_digest(top).items()})
        elif top.is_file():
            found[top.name] = hashlib.sha256(top.read_bytes()).hexdigest()
    return found


def attack(layout: Layout, original: Path) -> str:
    """A shell line trying every way out of the jail it knows of."""
    return "; ".join(
        [
            f"cat {layout.token}",
            f"cat {layout.state}/sandboxes/x.json {layout.state}/requests/r.json",
            f"ls -R {layout.state}",
            f"cat {layout.other}/private.txt",
            f"ls {layout.root}",
            f"echo pwned > {original}/f.txt",
            f"echo pwned > {original}/new.txt",
            f"rm -f {original}/gone.txt",
            "cat /proc/*/environ",
            "env",
            "ls /proc",
            "cat /proc/1/root/etc/hostname",
            f"ln -s {layout.token} stolen && cat stolen",
            "mount -t tmpfs x /mnt",
            "unshare -r true",
            "echo done",
        ]
    )


def git_state(repo: Path) -> dict[str, object]:
    """What of the original repository a command must never move."""
    common = repo / ".git"
    return {
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "HEAD": (common / "HEAD").read_text(),
        "config": (common / "config").read_text(),
        "hooks": tree_digest(common / "hooks"),
        "index": hashlib.sha256((common / "index").read_bytes()).hexdigest(),
        "worktree-admin": tree_digest(common / "worktrees"),
        "status": git(repo, "status", "--porcelain"),
        "files": tree_digest(repo / "d"),
    }


GIT_ATTACKS = [
    "git checkout main && git commit --allow-empty -qm evil",
    "git checkout --ignore-other-worktrees main && echo evil > f.txt && git commit -qam evil",
    "git checkout -B main && git commit --allow-empty -qm evil",
    "git update-ref refs/heads/main HEAD~0 && git branch -f main HEAD && git tag evil",
    "git config user.name hacker && git config core.hooksPath /tmp",
    'echo "#!/bin/sh" > "$(git rev-parse --git-common-dir)/hooks/pre-commit"',
    'git --git-dir="$(git rev-parse --git-common-dir)" --work-tree=. add -A && git stash',
    "git reset --hard HEAD~0 && git gc -q && git reflog expire --expire=now --all",
    'c="$(git rev-parse --git-common-dir)" && echo evil > "$c/index" && rm -rf "$c/refs"',
    "git worktree add -q ../evil-worktree && git worktree prune",
]
