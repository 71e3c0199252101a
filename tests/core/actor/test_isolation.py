"""The jail of an actor's command, attacked (issue "The actor's door", item 1): a command tries
to read the agent's token, its state directory (records, request journal, audit log), another
sandbox and the agent's environment (a DSN), to write the original, and - in a git worktree,
whose ``.git`` points into the original repository - to move the original's refs, config,
hooks and index with ``git checkout main && git commit`` and friends. Every attempt fails and
leaves everything as it was, for every strategy with a working tree."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sandbox_core.actor.exec import ExecRequest
from tests.support.actor import DSN_SECRET, KINDS, TOKEN, Layout, MakeSandbox
from tests.support.gitrepo import GIT_ENV, git, make_repo

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


@pytest.mark.parametrize("kind", [*KINDS, pytest.param("none", id="none")])
def test_a_command_reads_nothing_of_the_agent_nor_of_another_sandbox(
    layout: Layout, make_sandbox: MakeSandbox, kind: str
) -> None:
    sandbox = make_sandbox(kind)
    original = Path(sandbox.original_path)
    before = tree_digest(original) if kind != "none" else None
    state_before = agent_state(layout)
    out, err, result = layout.runner().run(
        sandbox, ExecRequest(shell_line=attack(layout, original))
    )
    text = (out + err).decode(errors="replace")
    assert "done" in text, text  # the line ran to its end
    for secret in SECRETS:
        assert secret not in text, f"{secret} leaked: {text}"
    assert DSN_SECRET not in text
    assert "mount: " in text or "permission denied" in text.lower()
    assert agent_state(layout) == state_before  # the audit log (actor/) may grow, nothing else
    if before is not None:  # a sandbox's command never reaches its original
        assert tree_digest(original) == before
    assert result.exit_code == 0


def test_a_command_cannot_see_the_agents_processes(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("copy_on_write")
    out, _, _ = layout.runner().run(
        sandbox, ExecRequest(shell_line="ls /proc | grep -E '^[0-9]+$'")
    )
    assert sorted(int(pid) for pid in out.split()) == sorted(
        int(pid) for pid in out.split() if int(pid) < 20
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


@pytest.mark.parametrize("line", GIT_ATTACKS)
def test_git_in_a_worktree_sandbox_never_moves_the_originals_refs_config_hooks_or_index(
    layout: Layout, make_sandbox: MakeSandbox, line: str
) -> None:
    sandbox = make_sandbox("git_worktree")
    original = Path(sandbox.original_path)
    before = git_state(original)
    sandbox_admin = tree_digest(Path(git(Path(sandbox.get_path(".")), "rev-parse", "--git-dir")))
    _, err, _ = layout.runner().run(sandbox, ExecRequest(shell_line=line, env=GIT_ENV))
    assert git_state(original) == before, err
    # The worktree's own admin directory (its HEAD and index) is not moved either.
    assert (
        tree_digest(Path(git(Path(sandbox.get_path(".")), "rev-parse", "--git-dir")))
        == sandbox_admin
    )


def test_git_works_inside_the_sandbox_on_a_private_copy_of_the_metadata(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("git_worktree")
    original = Path(sandbox.original_path)
    line = (
        "git status --short && sed -i s/base/edited/ f.txt && git diff --stat && git add -A "
        "&& git commit -qm in-jail && git log --format=%s -1 && git cat-file -t HEAD~1"
    )
    out, err, result = layout.runner().run(sandbox, ExecRequest(shell_line=line, env=GIT_ENV))
    assert result.exit_code == 0, err
    assert out.decode().splitlines()[-2:] == [
        "in-jail",
        "commit",
    ]  # the original's objects are readable
    assert git(original, "log", "--format=%s", "--all") == "base"  # its commit stayed in the jail
    assert "f.txt" in sandbox.review().changed  # the file change did land in the sandbox


def test_a_repository_inside_a_copy_is_the_sandboxs_own(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    """copy_on_write of a tree holding a whole repository: the copy's ``.git`` is part of the
    sandbox, so git in it changes the sandbox (shown in the review), never the original."""
    sandbox = make_sandbox("copy_on_write")
    original = Path(sandbox.original_path)
    make_repo(original / "repo", {"a.txt": "a\n"})
    sandbox.rollback()  # pick up the repository made after create
    sandbox.activate()
    refs_before = git(original / "repo", "for-each-ref")
    line = "cd repo && git checkout -q -b other && git commit -q --allow-empty -m x"
    _, err, result = layout.runner().run(sandbox, ExecRequest(shell_line=line, env=GIT_ENV))
    assert result.exit_code == 0, err
    assert git(original / "repo", "for-each-ref") == refs_before
