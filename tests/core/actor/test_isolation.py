"""The jail of an actor's command, attacked (issue "The actor's door", item 1): a command tries
to read the agent's token, its state directory (records, request journal, audit log), another
sandbox and the agent's environment (a DSN), to write the original, and - in a git worktree,
whose ``.git`` points into the original repository - to move the original's refs, config,
hooks and index with ``git checkout main && git commit`` and friends. Every attempt fails and
leaves everything as it was, for every strategy with a working tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_core.actor.exec import ExecRequest
from tests.support.actor import DSN_SECRET, KINDS, Layout, MakeSandbox
from tests.support.gitrepo import GIT_ENV, git, make_repo
from tests.support.jail_attacks import (
    GIT_ATTACKS,
    SECRETS,
    agent_state,
    attack,
    git_state,
    tree_digest,
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
