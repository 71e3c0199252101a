"""Step definitions for the copy_on_write area (features/copy_on_write/copy_on_write.feature).

The scenarios mirror the depth of seed 003 for the copy_on_write strategy, on real directories.
Faults are injected only by patching (``unittest.mock``) while the step under test runs, so the
fixture teardown always cleans up with the real functions.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from pytest_bdd import given, parsers, then, when
from ulid import ULID

from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxRollbackError,
    SandboxStateError,
)
from sandbox_core.protocol import Sandbox
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.tree.scan import scan_tree

State = dict[str, Any]


def tree_state(root: Path) -> dict[str, tuple[str, int, str | None]]:
    """Kind, mode and content (file text or link target) of every path below ``root``."""
    out: dict[str, tuple[str, int, str | None]] = {}
    for rel, entry in scan_tree(root).items():
        content = entry.target
        if entry.kind == "file":
            content = (root / rel).read_text()
        out[rel] = (entry.kind, entry.mode, content)
    return out


@pytest.fixture
def cow(tmp_path: Path) -> Iterator[State]:
    """Scenario state; cleans every sandbox made at teardown."""
    state: State = {"sandboxes": [], "faults": [], "tmp": tmp_path, "error": None}
    yield state
    for sandbox in state["sandboxes"]:
        with contextlib.suppress(Exception):
            sandbox.cleanup()


def _new(state: State, path: Path | str, root: Path | None = None) -> CopyOnWriteSandbox:
    sandbox_root = root if root is not None else state["tmp"] / "root"
    sandbox = CopyOnWriteSandbox("res-cow", str(path), sandbox_root=str(sandbox_root))
    state["sandboxes"].append(sandbox)
    state["sandbox"] = sandbox
    return sandbox


def _attempt(state: State, action: Callable[..., Any], *args: Any) -> Any:
    state["error"] = None
    try:
        with contextlib.ExitStack() as stack:
            for target in state["faults"]:
                stack.enter_context(mock.patch(target, side_effect=OSError(errno.EIO, "injected")))
            return action(*args)
    except Exception as exc:
        state["error"] = exc
        return None


def _sandbox(state: State) -> CopyOnWriteSandbox:
    sandbox: CopyOnWriteSandbox = state["sandbox"]
    return sandbox


def _split(names: str) -> list[str]:
    return [name for name in names.split(",") if name]


# -- Given ------------------------------------------------------------------------------------


@given("a cow test directory is initialised")
def cow_test_directory(cow: State) -> None:
    src = cow["tmp"] / "src"
    (src / "data").mkdir(parents=True)
    (src / "existing.txt").write_text("original content")
    (src / "data" / "file.txt").write_text("data")
    (src / "link").symlink_to("data/file.txt")
    (src / "outside").symlink_to(cow["tmp"])
    cow["src"] = src
    cow["initial"] = tree_state(src)


@given(parsers.parse('a cow sandbox is created and activated for plan "{plan_id}"'))
def cow_created_and_activated(cow: State, plan_id: str) -> None:
    sandbox = _new(cow, cow["src"])
    sandbox.create(plan_id)
    sandbox.activate()


@given(parsers.parse('cow "{target}" is patched to raise OSError'))
def cow_patch(cow: State, target: str) -> None:
    cow["faults"].append(target)


# -- When -------------------------------------------------------------------------------------


@when(parsers.parse('a cow sandbox is created for plan "{plan_id}"'))
def cow_create(cow: State, plan_id: str) -> None:
    _attempt(cow, _new(cow, cow["src"]).create, plan_id)


@when("a cow sandbox is created with empty plan_id")
def cow_create_empty_plan(cow: State) -> None:
    _attempt(cow, _new(cow, cow["src"]).create, "")


@when("a cow sandbox is prepared with empty resource_id")
def cow_empty_resource(cow: State) -> None:
    _attempt(cow, CopyOnWriteSandbox, "", str(cow["src"]))


@when("a cow sandbox is prepared with empty original_path")
def cow_empty_original(cow: State) -> None:
    _attempt(cow, CopyOnWriteSandbox, "res-cow", "")


@when(parsers.parse('a cow sandbox is created on "{name}" for plan "{plan_id}"'))
def cow_create_on(cow: State, name: str, plan_id: str) -> None:
    _attempt(cow, _new(cow, cow["src"] / name).create, plan_id)


@when(parsers.parse('a cow sandbox rooted inside the original is created for plan "{plan_id}"'))
def cow_create_inside(cow: State, plan_id: str) -> None:
    _attempt(cow, _new(cow, cow["src"], root=cow["src"] / ".sandboxes").create, plan_id)


@when("a cow sandbox is instantiated")
def cow_instantiate(cow: State) -> None:
    _new(cow, cow["src"])


@when(parsers.parse('the cow path "{path}" is resolved'))
def cow_resolve(cow: State, path: str) -> None:
    cow["resolved"] = _attempt(cow, _sandbox(cow).get_path, path)


@when(parsers.parse('a cow file "{path}" is created in the sandbox with content "{content}"'))
@given(parsers.parse('a cow file "{path}" is created in the sandbox with content "{content}"'))
def cow_write(cow: State, path: str, content: str) -> None:
    target = Path(_sandbox(cow).get_path(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)


@when(parsers.parse('the cow path "{path}" is deleted from the sandbox'))
@given(parsers.parse('the cow path "{path}" is deleted from the sandbox'))
def cow_delete(cow: State, path: str) -> None:
    target = Path(_sandbox(cow).get_path(path))
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    else:
        target.unlink()


@when(parsers.parse('the cow symlink "{path}" in the sandbox is pointed at "{target}"'))
def cow_retarget(cow: State, path: str, target: str) -> None:
    link = Path(_sandbox(cow).get_path(path))
    link.unlink()
    link.symlink_to(target)


@when(parsers.parse('the cow path "{path}" in the sandbox gets mode "{mode}"'))
def cow_chmod(cow: State, path: str, mode: str) -> None:
    Path(_sandbox(cow).get_path(path)).chmod(int(mode, 8))


@when(parsers.parse('the cow original file "{path}" is changed to "{content}"'))
def cow_change_original(cow: State, path: str, content: str) -> None:
    (cow["src"] / path).write_text(content)


@when("the cow sandbox is committed")
def cow_commit(cow: State) -> None:
    cow["result"] = _sandbox(cow).commit()


@when(parsers.parse('the cow sandbox is committed with message "{message}"'))
def cow_commit_message(cow: State, message: str) -> None:
    cow["result"] = _sandbox(cow).commit(message)


@when("the cow sandbox commit is attempted")
def cow_commit_attempt(cow: State) -> None:
    cow["result"] = _attempt(cow, _sandbox(cow).commit)


@when("the cow sandbox is rolled back")
def cow_rollback(cow: State) -> None:
    _sandbox(cow).rollback()


@when("the cow sandbox rollback is attempted")
def cow_rollback_attempt(cow: State) -> None:
    _attempt(cow, _sandbox(cow).rollback)


@when("the cow sandbox is cleaned up")
def cow_cleanup(cow: State) -> None:
    _sandbox(cow).cleanup()


# -- Then -------------------------------------------------------------------------------------


def _expect_error(cow: State, kind: type[Exception]) -> Exception:
    error = cow["error"]
    assert isinstance(error, kind), f"expected {kind.__name__}, got {error!r}"
    return error


@then(parsers.parse('a cow ValueError should be raised with message "{message}"'))
def cow_value_error(cow: State, message: str) -> None:
    assert str(_expect_error(cow, ValueError)) == message


@then(parsers.parse('a cow SandboxCreationError should be raised with message "{message}"'))
def cow_creation_error_message(cow: State, message: str) -> None:
    assert message in str(_expect_error(cow, SandboxCreationError))


@then("a cow SandboxStateError should be raised")
def cow_state_error(cow: State) -> None:
    _expect_error(cow, SandboxStateError)


@then("a cow SandboxCommitError should be raised")
def cow_commit_error(cow: State) -> None:
    error = _expect_error(cow, SandboxCommitError)
    assert isinstance(error.__cause__, OSError)


@then(parsers.parse('a cow SandboxCommitError should be raised with conflicts "{paths}"'))
def cow_commit_conflicts(cow: State, paths: str) -> None:
    error = _expect_error(cow, SandboxCommitError)
    assert isinstance(error, SandboxCommitError)
    assert error.conflicts == _split(paths)


@then("a cow SandboxRollbackError should be raised")
def cow_rollback_error(cow: State) -> None:
    error = _expect_error(cow, SandboxRollbackError)
    assert isinstance(error.__cause__, OSError)


@then(parsers.parse('the cow sandbox should be in the "{status}" state'))
def cow_status(cow: State, status: str) -> None:
    assert _sandbox(cow).status is SandboxStatus(status)


@then(parsers.parse('the cow sandbox status should be "{status}"'))
def cow_status_value(cow: State, status: str) -> None:
    assert _sandbox(cow).status.value == status


@then(parsers.parse('the cow sandbox context should reference plan "{plan_id}"'))
def cow_context_plan(cow: State, plan_id: str) -> None:
    context = _sandbox(cow).context
    assert context is not None
    assert context.plan_id == plan_id
    assert context.original_path == str(cow["src"])


@then(parsers.parse('the cow sandbox context should have strategy metadata "{strategy}"'))
def cow_context_strategy(cow: State, strategy: str) -> None:
    context = _sandbox(cow).context
    assert context is not None
    assert context.metadata["strategy"] == strategy


@then("the cow sandbox tree should equal the original directory")
def cow_tree_equals(cow: State) -> None:
    assert tree_state(_sandbox(cow).tree_dir) == tree_state(cow["src"])


@then(parsers.parse('the cow sandbox should have a tree and a manifest under "{layout}"'))
def cow_layout(cow: State, layout: str) -> None:
    sandbox = _sandbox(cow)
    base = cow["tmp"] / "root" / layout.replace("<sandbox_id>", sandbox.sandbox_id)
    assert sorted(p.name for p in base.iterdir()) == ["manifest.json", "tree"]
    assert sandbox.context is not None
    assert sandbox.context.sandbox_path == str(base / "tree")


@then("the cow resolved path should be inside the tree")
def cow_resolved_inside(cow: State) -> None:
    assert cow["error"] is None
    assert Path(cow["resolved"]).is_relative_to(_sandbox(cow).tree_dir)


@then("the cow commit result should indicate success")
def cow_result_success(cow: State) -> None:
    assert cow["result"].success is True
    assert cow["result"].sandbox_id == _sandbox(cow).sandbox_id


@then(
    parsers.re(
        r'the cow commit result should list changed "(?P<changed>[^"]*)", '
        r'added "(?P<added>[^"]*)", deleted "(?P<deleted>[^"]*)"'
    )
)
def cow_result_lists(cow: State, changed: str, added: str, deleted: str) -> None:
    result = cow["result"]
    assert result.changed_files == _split(changed)
    assert result.added_files == _split(added)
    assert result.deleted_files == _split(deleted)


@then(parsers.parse('the cow commit metadata should contain message "{message}"'))
def cow_result_message(cow: State, message: str) -> None:
    assert cow["result"].metadata["message"] == message


@then(parsers.parse('the cow original file "{path}" should contain "{content}"'))
def cow_original_content(cow: State, path: str, content: str) -> None:
    assert (cow["src"] / path).read_text() == content


@then(parsers.parse('the cow original path "{path}" should not exist'))
def cow_original_missing(cow: State, path: str) -> None:
    assert not os.path.lexists(cow["src"] / path)


@then(parsers.parse('the cow original symlink "{path}" should point at "{target}"'))
def cow_original_link(cow: State, path: str, target: str) -> None:
    assert (cow["src"] / path).is_symlink()
    assert os.readlink(cow["src"] / path) == target


@then(parsers.parse('the cow original path "{path}" should have mode "{mode}"'))
def cow_original_mode(cow: State, path: str, mode: str) -> None:
    assert stat.S_IMODE((cow["src"] / path).lstat().st_mode) == int(mode, 8)


@then("the cow original should be exactly as initialised")
def cow_original_initial(cow: State) -> None:
    assert tree_state(cow["src"]) == cow["initial"]
    leftovers = [p.name for p in cow["tmp"].iterdir() if ".sandbox-" in p.name]
    assert leftovers == []


@then(parsers.parse('the cow sandbox path "{path}" should not exist'))
def cow_sandbox_missing(cow: State, path: str) -> None:
    assert not os.path.lexists(_sandbox(cow).tree_dir / path)


@then("the cow sandbox base path should not exist")
def cow_base_missing(cow: State) -> None:
    assert not _sandbox(cow).base_dir.exists()


@then("the cow sandbox_id should be a valid ULID")
def cow_ulid(cow: State) -> None:
    sandbox_id = _sandbox(cow).sandbox_id
    assert len(sandbox_id) == 26
    assert str(ULID.from_str(sandbox_id)) == sandbox_id


@then("the cow sandbox context should be None")
def cow_context_none(cow: State) -> None:
    assert _sandbox(cow).context is None


@then("the cow sandbox should satisfy the Sandbox protocol and be rollbackable")
def cow_protocol(cow: State) -> None:
    sandbox = _sandbox(cow)
    assert isinstance(sandbox, Sandbox)
    assert sandbox.rollbackable is True
    assert sandbox.strategy == "copy_on_write"
