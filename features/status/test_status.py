"""Status transition scenarios (seed 002, "Lifecycle" and "Status Transition Validation")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from sandbox_core import SandboxFactory, SandboxStateError, SandboxStatus

scenarios("status_transitions.feature")


@pytest.fixture
def ctx() -> dict[str, Any]:
    return {}


@given(parsers.parse('a sandbox status "{current}"'))
def given_status(ctx: dict[str, Any], current: str) -> None:
    ctx["current"] = SandboxStatus(current)


@when(parsers.parse('the transition to "{target}" is checked'))
def when_checked(ctx: dict[str, Any], target: str) -> None:
    ctx["target"] = SandboxStatus(target)
    ctx["allowed"] = SandboxStatus.can_transition(ctx["current"], ctx["target"])


@then("the transition should be allowed")
def then_allowed(ctx: dict[str, Any]) -> None:
    assert ctx["allowed"] is True


@then("the transition should be refused")
def then_refused(ctx: dict[str, Any]) -> None:
    assert ctx["allowed"] is False


@then("asserting the transition should not raise")
def then_assert_ok(ctx: dict[str, Any]) -> None:
    assert SandboxStatus.assert_transition(ctx["current"], ctx["target"]) is None


@then(
    parsers.parse(
        'asserting the transition should raise SandboxStateError naming "{current}" and "{target}"'
    )
)
def then_assert_raises(ctx: dict[str, Any], current: str, target: str) -> None:
    with pytest.raises(SandboxStateError) as raised:
        SandboxStatus.assert_transition(ctx["current"], ctx["target"])
    assert str(raised.value) == f"Invalid status transition: {current} -> {target}"


@then(parsers.parse('only "{status}" should have no outgoing transitions'))
def then_only_dead_end(status: str) -> None:
    dead_ends = [
        current
        for current in SandboxStatus
        if not any(SandboxStatus.can_transition(current, target) for target in SandboxStatus)
    ]
    assert dead_ends == [SandboxStatus(status)]


@then(parsers.parse('the terminal statuses should be "{names}"'))
def then_terminal(names: str) -> None:
    expected = {SandboxStatus(name.strip()) for name in names.split(",")}
    assert {status for status in SandboxStatus if status.is_terminal} == expected


@then(parsers.parse('every status other than "{final}" should be able to reach "{target}"'))
def then_all_reach(final: str, target: str) -> None:
    for status in SandboxStatus:
        reachable = SandboxStatus.can_transition(status, SandboxStatus(target))
        assert reachable is (status is not SandboxStatus(final)), status


@given(parsers.parse('a created "{strategy}" sandbox for plan "{plan_id}"'))
def given_real_sandbox(ctx: dict[str, Any], tmp_path: Path, strategy: str, plan_id: str) -> None:
    sandbox = SandboxFactory().create(strategy, "res-1", str(tmp_path))
    sandbox.create(plan_id)
    ctx["sandbox"] = sandbox


@when("the sandbox is committed")
def when_commit(ctx: dict[str, Any]) -> None:
    assert ctx["sandbox"].commit().success


@when("the sandbox is committed again")
def when_commit_again(ctx: dict[str, Any]) -> None:
    with pytest.raises(SandboxStateError) as raised:
        ctx["sandbox"].commit()
    ctx["error"] = raised.value


@then(parsers.parse('a SandboxStateError should be raised naming status "{status}"'))
def then_state_error(ctx: dict[str, Any], status: str) -> None:
    assert f"in status {status}" in str(ctx["error"])


@then(parsers.parse('the sandbox status should be "{status}"'))
def then_sandbox_status(ctx: dict[str, Any], status: str) -> None:
    assert ctx["sandbox"].status is SandboxStatus(status)
