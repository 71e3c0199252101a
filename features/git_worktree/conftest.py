"""Step definitions for features/git_worktree, all on real repositories made with ``git init``."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, then, when
from ulid import ULID

from sandbox_core import (
    GitWorktreeSandbox,
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxRollbackError,
    SandboxStateError,
    SandboxStatus,
)
from sandbox_core.errors import SandboxCommitLockedError
from sandbox_core.strategies.git_worktree import GitCommand, GitFailure
from tests.support.gitrepo import GIT_ENV as IDENTITY
from tests.support.gitrepo import git


@pytest.fixture
def gctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for key, value in IDENTITY.items():
        monkeypatch.setenv(key, value)
    return {"tmp": tmp_path, "monkeypatch": monkeypatch, "error": None}


def _sandbox(gctx: dict[str, Any]) -> GitWorktreeSandbox:
    sandbox: GitWorktreeSandbox = gctx["sandbox"]
    return sandbox


def _new(gctx: dict[str, Any], path: str | None = None, **options: Any) -> GitWorktreeSandbox:
    return GitWorktreeSandbox(
        "res-git",
        str(gctx["repo"]) if path is None else path,
        sandbox_root=str(gctx["tmp"] / "sandboxes"),
        **options,
    )


def _attempt(gctx: dict[str, Any], action: Any) -> None:
    try:
        gctx["result"] = action()
        gctx["error"] = None
    except (ValueError, SandboxError) as exc:
        gctx["error"] = exc


# -- given ------------------------------------------------------------------------------------


@given("a git test repository is initialised")
def repository(gctx: dict[str, Any]) -> None:
    repo = gctx["tmp"] / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "existing.txt").write_text("original content")
    (repo / "other.txt").write_text("other")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    gctx["repo"] = repo


@given(parsers.parse('a git sandbox is created and activated for plan "{plan}"'))
def created_and_activated(gctx: dict[str, Any], plan: str) -> None:
    gctx["sandbox"] = _new(gctx)
    gctx["sandbox"].create(plan)
    gctx["sandbox"].activate()


@given("git worktree add is made to fail after it ran")
def worktree_add_fails(gctx: dict[str, Any]) -> None:
    real_run = GitCommand.run

    def run_then_fail(self: GitCommand, *args: str, **kwargs: Any) -> Any:
        result = real_run(self, *args, **kwargs)
        if args[:2] == ("worktree", "add"):  # injected fault
            raise GitFailure(args, 1, "injected failure")
        return result

    gctx["monkeypatch"].setattr(GitCommand, "run", run_then_fail)


@given("git add is made to fail")
def git_add_fails(gctx: dict[str, Any]) -> None:
    real_run = GitCommand.run

    def fail_add(self: GitCommand, *args: str, **kwargs: Any) -> Any:
        if args[:1] == ("add",):  # injected fault
            raise GitFailure(args, 128, "injected: index.lock exists")
        return real_run(self, *args, **kwargs)

    gctx["monkeypatch"].setattr(GitCommand, "run", fail_add)


# -- when: creation ---------------------------------------------------------------------------


@when(parsers.parse('a git sandbox is created for plan "{plan}"'))
def create(gctx: dict[str, Any], plan: str) -> None:
    gctx["sandbox"] = _new(gctx)
    gctx["sandbox"].create(plan)
    gctx["head_at_create"] = git(gctx["repo"], "rev-parse", "HEAD")


@when(parsers.parse('a git sandbox create is attempted for plan "{plan}"'))
def create_attempt(gctx: dict[str, Any], plan: str) -> None:
    gctx["sandbox"] = _new(gctx)
    _attempt(gctx, lambda: gctx["sandbox"].create(plan))


@when("a git sandbox is created with empty plan_id")
def create_empty_plan(gctx: dict[str, Any]) -> None:
    gctx["sandbox"] = _new(gctx)
    _attempt(gctx, lambda: gctx["sandbox"].create(""))


@when("a git sandbox is prepared with empty resource_id")
def prepare_empty_resource(gctx: dict[str, Any]) -> None:
    _attempt(gctx, lambda: GitWorktreeSandbox("", str(gctx["repo"])))


@when("a git sandbox is prepared with empty original_path")
def prepare_empty_path(gctx: dict[str, Any]) -> None:
    _attempt(gctx, lambda: GitWorktreeSandbox("res-git", ""))


@when(parsers.parse('a git sandbox is created on a non-existent directory for plan "{plan}"'))
def create_missing(gctx: dict[str, Any], plan: str) -> None:
    gctx["sandbox"] = _new(gctx, str(gctx["tmp"] / "does-not-exist"))
    _attempt(gctx, lambda: gctx["sandbox"].create(plan))


@when(parsers.parse('a git sandbox is created on a plain directory for plan "{plan}"'))
def create_plain(gctx: dict[str, Any], plan: str) -> None:
    plain = gctx["tmp"] / "plain"
    plain.mkdir()
    gctx["sandbox"] = _new(gctx, str(plain))
    _attempt(gctx, lambda: gctx["sandbox"].create(plan))


@when(parsers.parse('a second git sandbox with the same id is created for plan "{plan}"'))
def create_duplicate(gctx: dict[str, Any], plan: str) -> None:
    duplicate = _new(gctx, sandbox_id=_sandbox(gctx).sandbox_id)
    _attempt(gctx, lambda: duplicate.create(plan))


@when("a git sandbox is instantiated")
def instantiate(gctx: dict[str, Any]) -> None:
    gctx["sandbox"] = _new(gctx)


# -- when: paths and files --------------------------------------------------------------------


@when(parsers.parse('the git path "{path}" is resolved'))
def resolve(gctx: dict[str, Any], path: str) -> None:
    _attempt(gctx, lambda: _sandbox(gctx).get_path(path))
    gctx["resolved"] = gctx.get("result")


@when(parsers.parse('the git path "{path}" is resolved on a cleaned-up sandbox'))
def resolve_cleaned(gctx: dict[str, Any], path: str) -> None:
    _attempt(gctx, lambda: _sandbox(gctx).get_path(path))


@when(parsers.parse('a git file "{name}" is created in the sandbox with content "{content}"'))
def write_file(gctx: dict[str, Any], name: str, content: str) -> None:
    Path(_sandbox(gctx).get_path(name)).write_text(content)


@when(
    parsers.parse(
        'the git existing file "{name}" is modified in the sandbox with content "{content}"'
    )
)
def modify_file(gctx: dict[str, Any], name: str, content: str) -> None:
    target = Path(_sandbox(gctx).get_path(name))
    assert target.exists()
    target.write_text(content)


@when(parsers.parse('the git existing file "{name}" is deleted from the sandbox'))
def delete_file(gctx: dict[str, Any], name: str) -> None:
    Path(_sandbox(gctx).get_path(name)).unlink()


@when(
    parsers.parse(
        'the git user has an untracked file "{untracked}" and an unstaged edit of "{edited}"'
    )
)
def user_work(gctx: dict[str, Any], untracked: str, edited: str) -> None:
    (gctx["repo"] / untracked).write_text("mine")
    (gctx["repo"] / edited).write_text("user edit")


@when(parsers.parse('the git original commits "{name}" with content "{content}"'))
def original_commits(gctx: dict[str, Any], name: str, content: str) -> None:
    (gctx["repo"] / name).write_text(content)
    git(gctx["repo"], "add", name)
    git(gctx["repo"], "commit", "-qm", f"user changes {name}")
    gctx["head_before_commit"] = git(gctx["repo"], "rev-parse", "HEAD")


# -- when: lifecycle --------------------------------------------------------------------------


@when("the git sandbox is committed")
def commit(gctx: dict[str, Any]) -> None:
    gctx["commit"] = _sandbox(gctx).commit()


@when(parsers.parse('the git sandbox is committed with message "{message}"'))
def commit_with_message(gctx: dict[str, Any], message: str) -> None:
    gctx["commit"] = _sandbox(gctx).commit(message)


@when("the git sandbox commit is attempted")
@when("the git sandbox commit is attempted on cleaned-up sandbox")
def commit_attempt(gctx: dict[str, Any]) -> None:
    _attempt(gctx, lambda: _sandbox(gctx).commit())


@when("the git sandbox is rolled back")
def rollback(gctx: dict[str, Any]) -> None:
    _sandbox(gctx).rollback()


@when("the git sandbox rollback is attempted")
@when("the git sandbox rollback is attempted on created sandbox")
def rollback_attempt(gctx: dict[str, Any]) -> None:
    _attempt(gctx, lambda: _sandbox(gctx).rollback())


@when("the git sandbox is cleaned up")
@when("the git sandbox is cleaned up again")
def cleanup(gctx: dict[str, Any]) -> None:
    _sandbox(gctx).cleanup()


@when(parsers.parse('a git checkpoint "{name}" is created'))
def checkpoint(gctx: dict[str, Any], name: str) -> None:
    gctx.setdefault("checkpoints", {})[name] = _sandbox(gctx).create_checkpoint_ref(name)


@when(parsers.parse('the git checkpoint "{name}" is restored'))
def restore(gctx: dict[str, Any], name: str) -> None:
    _sandbox(gctx).restore_checkpoint_ref(name)


# -- then -------------------------------------------------------------------------------------


@then(parsers.parse('the git sandbox should be in the "{state}" state'))
def in_state(gctx: dict[str, Any], state: str) -> None:
    assert _sandbox(gctx).status is SandboxStatus(state)


@then(parsers.parse('the git sandbox context should reference plan "{plan}"'))
def context_plan(gctx: dict[str, Any], plan: str) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    assert context.plan_id == plan


@then(parsers.parse('the git sandbox context should have strategy metadata "{strategy}"'))
def context_strategy(gctx: dict[str, Any], strategy: str) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    assert context.metadata["strategy"] == strategy


@then("the git sandbox worktree should exist")
def worktree_exists(gctx: dict[str, Any]) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    assert (Path(context.sandbox_path) / "existing.txt").read_text() == "original content"
    assert (Path(context.sandbox_path) / ".git").is_file()


@then("the git sandbox worktree should not exist")
def worktree_gone(gctx: dict[str, Any]) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    assert not Path(context.sandbox_path).exists()


@then(parsers.parse('the git sandbox branch should start with "{prefix}"'))
def branch_prefix(gctx: dict[str, Any], prefix: str) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    assert context.metadata["branch"] == prefix + _sandbox(gctx).sandbox_id


@then("the git sandbox worktree should be on the sandbox branch")
def on_sandbox_branch(gctx: dict[str, Any]) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    head = git(Path(context.sandbox_path), "symbolic-ref", "HEAD")
    assert head == f"refs/heads/{context.metadata['branch']}"


@then(parsers.parse('the git original should still be on branch "{branch}"'))
def original_branch(gctx: dict[str, Any], branch: str) -> None:
    assert git(gctx["repo"], "symbolic-ref", "--short", "HEAD") == branch


@then(parsers.parse("the git repository should list {count:d} worktrees"))
def worktrees(gctx: dict[str, Any], count: int) -> None:
    listing = git(gctx["repo"], "worktree", "list", "--porcelain")
    assert listing.count("worktree ") == count


@then(parsers.parse('the git repository should have only the branch "{branch}"'))
def only_branch(gctx: dict[str, Any], branch: str) -> None:
    assert git(gctx["repo"], "for-each-ref", "--format=%(refname:short)", "refs/heads") == branch


@then("the git repository should have no sandbox tags")
def no_tags(gctx: dict[str, Any]) -> None:
    assert git(gctx["repo"], "tag", "--list", "sandbox/*") == ""


@then(parsers.parse('a git ValueError should be raised with message "{message}"'))
def value_error(gctx: dict[str, Any], message: str) -> None:
    assert isinstance(gctx["error"], ValueError)
    assert str(gctx["error"]) == message


@then("a git SandboxCreationError should be raised")
def creation_error(gctx: dict[str, Any]) -> None:
    assert isinstance(gctx["error"], SandboxCreationError)


@then(parsers.parse('a git SandboxCreationError should be raised with message "{message}"'))
def creation_error_message(gctx: dict[str, Any], message: str) -> None:
    assert isinstance(gctx["error"], SandboxCreationError)
    assert message in str(gctx["error"])


@then("a git SandboxStateError should be raised")
def state_error(gctx: dict[str, Any]) -> None:
    assert isinstance(gctx["error"], SandboxStateError)


@then("a git SandboxCommitError should be raised")
def commit_error(gctx: dict[str, Any]) -> None:
    assert isinstance(gctx["error"], SandboxCommitError)


@then(parsers.parse('a git SandboxCommitError should be raised naming conflict "{path}"'))
def conflict_error(gctx: dict[str, Any], path: str) -> None:
    error = gctx["error"]
    assert isinstance(error, SandboxCommitError)
    assert error.conflicts == [path]
    assert path in str(error)


@then(parsers.parse('a git SandboxRollbackError should be raised with message "{message}"'))
def rollback_error(gctx: dict[str, Any], message: str) -> None:
    assert isinstance(gctx["error"], SandboxRollbackError)
    assert message in str(gctx["error"])


@then("the git resolved path should be inside the worktree")
def inside_worktree(gctx: dict[str, Any]) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    assert gctx["resolved"] == str(Path(context.sandbox_path) / "data" / "file.txt")


@then("the git commit result should indicate success")
def commit_success(gctx: dict[str, Any]) -> None:
    assert gctx["commit"].success is True


@then(parsers.parse("the git commit result should have {count:d} {kind} files"))
def commit_count(gctx: dict[str, Any], count: int, kind: str) -> None:
    assert len(getattr(gctx["commit"], f"{kind}_files")) == count


@then(parsers.parse('the git commit metadata should contain message "{message}"'))
def commit_message(gctx: dict[str, Any], message: str) -> None:
    assert gctx["commit"].metadata["message"] == message


@then(parsers.parse('the git original HEAD commit message should be "{message}"'))
def head_message(gctx: dict[str, Any], message: str) -> None:
    assert git(gctx["repo"], "log", "-1", "--format=%s") == message


@then(parsers.parse('the git file "{name}" should exist in the original with content "{content}"'))
@then(parsers.parse('the git file "{name}" in the original should have content "{content}"'))
@then(parsers.parse('the git original file "{name}" should contain "{content}"'))
def original_content(gctx: dict[str, Any], name: str, content: str) -> None:
    assert (gctx["repo"] / name).read_text() == content


@then(parsers.parse('the git file "{name}" should not exist in the original'))
def original_missing(gctx: dict[str, Any], name: str) -> None:
    assert not (gctx["repo"] / name).exists()


@then(parsers.parse('the git file "{name}" should not exist in the sandbox'))
def sandbox_missing(gctx: dict[str, Any], name: str) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    assert Path(context.sandbox_path).is_dir()
    assert not (Path(context.sandbox_path) / name).exists()


@then(parsers.parse('the git file "{name}" in the sandbox should have content "{content}"'))
def sandbox_content(gctx: dict[str, Any], name: str, content: str) -> None:
    context = _sandbox(gctx).context
    assert context is not None
    assert (Path(context.sandbox_path) / name).read_text() == content


@then("the git original branch should point at the commit result")
def branch_at_result(gctx: dict[str, Any]) -> None:
    assert git(gctx["repo"], "rev-parse", "main") == gctx["commit"].commit_ref


@then("the git original branch should point at the pre-commit tag")
def branch_at_pre_commit(gctx: dict[str, Any]) -> None:
    tag = f"sandbox/{_sandbox(gctx).sandbox_id}/pre-commit"
    assert git(gctx["repo"], "rev-parse", "main") == git(gctx["repo"], "rev-parse", tag)
    assert git(gctx["repo"], "rev-parse", "main") == gctx["head_at_create"]


@then("the git original working tree should be clean")
def original_clean(gctx: dict[str, Any]) -> None:
    assert git(gctx["repo"], "status", "--porcelain") == ""


@then("the git original status should list only the user's work")
def only_user_work(gctx: dict[str, Any]) -> None:
    lines = git(gctx["repo"], "status", "--porcelain").splitlines()
    assert lines == [" M other.txt", "?? note.txt"]


@then("the git original HEAD should be unchanged since the conflict")
def head_unchanged(gctx: dict[str, Any]) -> None:
    assert git(gctx["repo"], "rev-parse", "HEAD") == gctx["head_before_commit"]


@then("the git original should have no merge in progress")
def no_merge(gctx: dict[str, Any]) -> None:
    assert not (gctx["repo"] / ".git" / "MERGE_HEAD").exists()
    assert "<<<<<<<" not in (gctx["repo"] / "existing.txt").read_text()


@then(parsers.parse('the git tag for checkpoint "{name}" should exist'))
def checkpoint_tag(gctx: dict[str, Any], name: str) -> None:
    tag = f"sandbox/{_sandbox(gctx).sandbox_id}/ckpt/{name}"
    assert git(gctx["repo"], "rev-parse", tag) == gctx["checkpoints"][name]


@then("the git sandbox_id should be a valid ULID")
def valid_ulid(gctx: dict[str, Any]) -> None:
    sandbox_id = _sandbox(gctx).sandbox_id
    assert len(sandbox_id) == 26
    assert str(ULID.from_str(sandbox_id)) == sandbox_id


@then(parsers.parse('the git sandbox status should be "{state}"'))
def status_is(gctx: dict[str, Any], state: str) -> None:
    assert _sandbox(gctx).status.value == state


@then("the git sandbox context should be None")
def context_none(gctx: dict[str, Any]) -> None:
    assert _sandbox(gctx).context is None


@then("the git sandbox should be rollbackable")
def is_rollbackable(gctx: dict[str, Any]) -> None:
    assert _sandbox(gctx).rollbackable is True


# -- the repository is the user's (issue 7) ---------------------------------------------------


@given(parsers.parse('the git repository has a "{hook}" hook that leaves a marker'))
def hook_with_marker(gctx: dict[str, Any], hook: str) -> None:
    marker = gctx["tmp"] / "hook-marker"
    path = gctx["repo"] / ".git" / "hooks" / hook
    path.write_text(f"#!/bin/sh\necho {hook} >> {marker}\necho x > generated.txt\nexit 1\n")
    path.chmod(0o755)
    gctx["marker"] = marker


@when(parsers.parse('the git original file "{name}" is touched a second later'))
def touch_original(gctx: dict[str, Any], name: str) -> None:
    time.sleep(1.05)
    (gctx["repo"] / name).touch()


@when(parsers.parse('a git lock file "{name}" is left in the original'))
def leave_lock(gctx: dict[str, Any], name: str) -> None:
    (gctx["repo"] / ".git" / name).write_text("")


@then("the git hook marker should not exist")
def no_marker(gctx: dict[str, Any]) -> None:
    assert not gctx["marker"].exists()


@then("a git SandboxCommitLockedError should be raised")
def locked_error(gctx: dict[str, Any]) -> None:
    assert isinstance(gctx["error"], SandboxCommitLockedError), gctx["error"]
