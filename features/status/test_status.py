"""Status transition scenarios (seed 002, "Lifecycle" and "Status Transition Validation")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from sandbox_core import (
    SandboxFactory,
    SandboxRollbackError,
    SandboxStateError,
    SandboxStatus,
    SandboxStrategy,
)
from sandbox_core.strategies.factory import is_rollbackable, rollbackable_strategies

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


def _yes(word: str) -> bool:
    assert word in ("yes", "no"), word
    return word == "yes"


@then(
    parsers.parse(
        'the guards should say commit "{commit}", open "{open_}", activate "{activate}", '
        'blocks plan "{blocks}"'
    )
)
def then_guards(ctx: dict[str, Any], commit: str, open_: str, activate: str, blocks: str) -> None:
    status: SandboxStatus = ctx["current"]
    assert status.can_commit is _yes(commit)
    assert status.is_open is _yes(open_)
    assert status.can_activate is _yes(activate)
    assert status.blocks_plan_commit is _yes(blocks)


@then(parsers.parse('the rollbackable strategies should be "{names}"'))
def then_rollbackable(names: str) -> None:
    expected = {name.strip() for name in names.split(",")}
    assert rollbackable_strategies() == expected
    assert all(is_rollbackable(name) is (name in expected) for name in SandboxStrategy)


@then("every strategy class should agree with the factory on being rollbackable")
def then_classes_agree() -> None:
    factory = SandboxFactory()
    for name in factory.strategies:
        assert factory.strategy_class(name).rollbackable is is_rollbackable(name)


@given(parsers.parse('a committed "{strategy}" sandbox whose undo fails once'))
def given_committed_failing_undo(ctx: dict[str, Any], tmp_path: Path, strategy: str) -> None:
    original = tmp_path / "orig"
    original.mkdir()
    (original / "v").write_text("before\n")
    sandbox = SandboxFactory().create(
        strategy, "res-1", str(original), sandbox_root=str(tmp_path / "sbx")
    )
    sandbox.create("plan-s2")
    Path(sandbox.get_path("v")).write_text("after\n")
    sandbox.commit()
    assert (original / "v").read_text() == "after\n"
    real = sandbox._do_rollback_committed
    calls: list[int] = []

    def fail_once() -> None:  # fault injection: the first undo hits an I/O error
        calls.append(1)
        if len(calls) == 1:
            raise OSError("injected I/O error")
        real()

    sandbox._do_rollback_committed = fail_once  # type: ignore[method-assign]
    ctx.update(sandbox=sandbox, original=original)


@when("the sandbox is rolled back expecting a failure")
def when_rollback_fails(ctx: dict[str, Any]) -> None:
    with pytest.raises(SandboxRollbackError):
        ctx["sandbox"].rollback()


@when("the sandbox is rolled back")
def when_rollback(ctx: dict[str, Any]) -> None:
    ctx["sandbox"].rollback()


@then("the original should hold its content from before the commit")
def then_original_before(ctx: dict[str, Any]) -> None:
    assert (ctx["original"] / "v").read_text() == "before\n"
    ctx["sandbox"].cleanup()
