"""Step definitions for features/none/none.feature (strategy "none", seed 002 NoSandbox)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, then, when
from ulid import ULID

from sandbox_core.errors import SandboxStateError
from sandbox_core.protocol import Sandbox
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.none import NoSandbox


@pytest.fixture
def none_world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Scenario state; every sandbox made is cleaned up at teardown."""
    world: dict[str, Any] = {"error": None, "sandboxes": []}
    yield world
    for sandbox in world["sandboxes"]:
        sandbox.cleanup()


def _attempt(world: dict[str, Any], action: Any) -> None:
    try:
        world["result"] = action()
    except (ValueError, SandboxStateError) as exc:
        world["error"] = exc


def _new(world: dict[str, Any], resource_id: str = "res-001", original: str | None = None) -> Any:
    sandbox = NoSandbox(resource_id, world["original"] if original is None else original)
    world["sandboxes"].append(sandbox)
    world["sandbox"] = sandbox
    return sandbox


@given(parsers.parse('a none original directory with file "{name}" containing "{content}"'))
def _original(none_world: dict[str, Any], tmp_path: Path, name: str, content: str) -> None:
    original = tmp_path / "original"
    original.mkdir()
    (original / name).write_text(content)
    none_world["original"] = str(original)


@when(parsers.parse('a none sandbox is created for plan "{plan_id}"'))
def _create(none_world: dict[str, Any], caplog: pytest.LogCaptureFixture, plan_id: str) -> None:
    caplog.set_level(logging.WARNING, logger="sandbox_core")
    _new(none_world).create(plan_id)


@when("a none sandbox is created with empty plan_id")
def _create_empty_plan(none_world: dict[str, Any]) -> None:
    _attempt(none_world, lambda: _new(none_world).create(""))


@when("a none sandbox is prepared with empty resource_id")
def _prepare_empty_resource(none_world: dict[str, Any]) -> None:
    _attempt(none_world, lambda: _new(none_world, resource_id=""))


@when("a none sandbox is prepared with empty original_path")
def _prepare_empty_original(none_world: dict[str, Any]) -> None:
    _attempt(none_world, lambda: _new(none_world, original=""))


@when("a none sandbox is instantiated")
def _instantiate(none_world: dict[str, Any]) -> None:
    _new(none_world)


@when(parsers.parse('the none path "{path}" is resolved'))
def _resolve(none_world: dict[str, Any], path: str) -> None:
    _attempt(none_world, lambda: none_world["sandbox"].get_path(path))


@when(parsers.parse('the none file "{name}" is written through the sandbox with content "{text}"'))
def _write(none_world: dict[str, Any], name: str, text: str) -> None:
    Path(none_world["sandbox"].get_path(name)).write_text(text)


@when(parsers.parse('the none sandbox is committed with message "{message}"'))
def _commit(none_world: dict[str, Any], message: str) -> None:
    none_world["commit"] = none_world["sandbox"].commit(message)


@when("the none sandbox commit is attempted")
def _commit_attempt(none_world: dict[str, Any]) -> None:
    _attempt(none_world, lambda: none_world["sandbox"].commit())


@when("the none sandbox rollback is attempted")
def _rollback_attempt(none_world: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sandbox_core")
    _attempt(none_world, lambda: none_world["sandbox"].rollback())


@when("the none sandbox is cleaned up")
def _cleanup(none_world: dict[str, Any]) -> None:
    none_world["sandbox"].cleanup()


@then(parsers.parse('the none sandbox should be in the "{state}" state'))
def _state(none_world: dict[str, Any], state: str) -> None:
    assert none_world["sandbox"].status is SandboxStatus(state)


@then(parsers.parse('the none sandbox context should reference plan "{plan_id}"'))
def _context_plan(none_world: dict[str, Any], plan_id: str) -> None:
    assert none_world["sandbox"].context.plan_id == plan_id


@then(parsers.parse('the none sandbox context should have strategy metadata "{strategy}"'))
def _context_strategy(none_world: dict[str, Any], strategy: str) -> None:
    assert none_world["sandbox"].context.metadata["strategy"] == strategy


@then("the none sandbox path should be the original directory")
def _path_is_original(none_world: dict[str, Any]) -> None:
    assert none_world["sandbox"].context.sandbox_path == none_world["original"]


@then(parsers.parse('a none warning should have been logged saying "{text}"'))
def _warning(caplog: pytest.LogCaptureFixture, text: str) -> None:
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(text in r.getMessage() for r in warnings), [r.getMessage() for r in warnings]


@then(parsers.parse('a none ValueError should be raised with message "{message}"'))
def _value_error(none_world: dict[str, Any], message: str) -> None:
    assert isinstance(none_world["error"], ValueError)
    assert str(none_world["error"]) == message


@then("a none SandboxStateError should be raised")
def _state_error(none_world: dict[str, Any]) -> None:
    assert isinstance(none_world["error"], SandboxStateError)


@then("no none error should have been raised")
def _no_error(none_world: dict[str, Any]) -> None:
    assert none_world["error"] is None


@then(parsers.parse('the none resolved path should be "{path}" inside the original directory'))
def _resolved_inside(none_world: dict[str, Any], path: str) -> None:
    assert none_world["result"] == str(Path(none_world["original"]) / path)


@then(parsers.parse('the none original file "{name}" should contain "{content}"'))
def _original_content(none_world: dict[str, Any], name: str, content: str) -> None:
    assert (Path(none_world["original"]) / name).read_text() == content


@then("the none commit result should indicate success")
def _commit_success(none_world: dict[str, Any]) -> None:
    assert none_world["commit"].success is True
    assert none_world["commit"].sandbox_id == none_world["sandbox"].sandbox_id


@then("the none sandbox_id should be a valid ULID")
def _ulid(none_world: dict[str, Any]) -> None:
    sandbox_id = none_world["sandbox"].sandbox_id
    assert len(sandbox_id) == 26
    assert str(ULID.from_str(sandbox_id)) == sandbox_id


@then(parsers.parse('the none sandbox status should be "{state}"'))
def _status(none_world: dict[str, Any], state: str) -> None:
    assert none_world["sandbox"].status is SandboxStatus(state)


@then("the none sandbox context should be None")
def _context_none(none_world: dict[str, Any]) -> None:
    assert none_world["sandbox"].context is None


@then("the none sandbox should not be rollbackable")
def _not_rollbackable(none_world: dict[str, Any]) -> None:
    assert none_world["sandbox"].rollbackable is False
    assert isinstance(none_world["sandbox"], Sandbox)
