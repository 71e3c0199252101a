"""Seed 000 (SandboxManager lifecycle) scenarios, run against the real ``none`` strategy.

Test doubles appear only where the seed asks for them ("committable mock", "non-rollbackable
mock") and as fault injection ("will fail on commit"): everything else is the real manager and
the real NoSandbox.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any
from unittest.mock import patch

import pytest
from pytest_bdd import given, parsers, scenarios, then, when
from ulid import ULID

from sandbox_core import (
    AtomicCommitError,
    CommitResult,
    SandboxCommitError,
    SandboxError,
    SandboxFactory,
    SandboxRollbackError,
    SandboxStatus,
)
from sandbox_core.host.manager import SandboxManager

scenarios("sandbox_manager.feature")


class RecordingSandbox:
    """The seed's "committable mock": an ACTIVE sandbox that logs commit and rollback calls."""

    strategy = "recording"

    def __init__(
        self,
        log: list[tuple[str, str]],
        *,
        rollbackable: bool = True,
        changes: bool = True,
        fail_rollback: bool = False,
    ) -> None:
        self.sandbox_id = str(ULID())
        self.status = SandboxStatus.ACTIVE
        self.context = None
        self.rollbackable = rollbackable
        self._log = log
        self._changes = changes
        self._fail_rollback = fail_rollback

    def commit(self, message: str | None = None) -> CommitResult:
        self._log.append(("commit", self.sandbox_id))
        self.status = SandboxStatus.COMMITTED
        files = ["changed.txt"] if self._changes else []
        return CommitResult(sandbox_id=self.sandbox_id, success=True, changed_files=files)

    def rollback(self) -> None:
        self._log.append(("rollback", self.sandbox_id))
        if self._fail_rollback:
            raise SandboxRollbackError(f"injected rollback failure of {self.sandbox_id}")
        self.status = SandboxStatus.ROLLED_BACK

    def cleanup(self) -> None:
        self.status = SandboxStatus.CLEANED_UP


@pytest.fixture
def ctx() -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"log": [], "patches": ExitStack(), "managers": []}
    with state["patches"]:
        yield state
    for manager in state["managers"]:
        manager.close()


def _manager(ctx: dict[str, Any], **kwargs: Any) -> SandboxManager:
    manager = SandboxManager(ctx["factory"], **kwargs)
    ctx["managers"].append(manager)
    ctx["manager"] = manager
    return manager


def _capture(ctx: dict[str, Any], action: Any) -> Any:
    ctx["error"] = None
    try:
        return action()
    except (ValueError, SandboxError) as exc:
        ctx["error"] = exc
        return None


def _tracked(ctx: dict[str, Any], plan_id: str, resource_id: str) -> Any:
    sandbox = ctx["manager"].get_sandbox(plan_id, resource_id)
    assert sandbox is not None
    return sandbox


def _replace(ctx: dict[str, Any], plan_id: str, resource_id: str, double: Any) -> None:
    _tracked(ctx, plan_id, resource_id)
    ctx["manager"]._sandboxes[plan_id][resource_id] = double


# -- Background and initialisation -------------------------------------------------------------


@given("a sandbox factory instance")
def given_factory(ctx: dict[str, Any]) -> None:
    ctx["factory"] = SandboxFactory()


@given("a sandbox manager with the factory")
def given_manager(ctx: dict[str, Any]) -> None:
    _manager(ctx)


@given("a sandbox manager with cleanup_on_exit disabled")
def given_manager_no_exit(ctx: dict[str, Any]) -> None:
    _manager(ctx, cleanup_on_exit=False)


@when("I create a sandbox manager with None factory")
def when_manager_none(ctx: dict[str, Any]) -> None:
    _capture(ctx, lambda: SandboxManager(None))


@then("the manager should have no active sandboxes")
def then_no_sandboxes(ctx: dict[str, Any]) -> None:
    assert ctx["manager"].plan_ids() == []


@then(parsers.parse("the manager cleanup_on_exit flag should be {flag}"))
def then_cleanup_flag(ctx: dict[str, Any], flag: str) -> None:
    assert ctx["manager"].cleanup_on_exit is (flag == "true")


@then(parsers.parse('a sandbox ValueError should be raised with message "{message}"'))
def then_value_error(ctx: dict[str, Any], message: str) -> None:
    assert isinstance(ctx["error"], ValueError)
    assert str(ctx["error"]) == message


# -- creation and lookup -----------------------------------------------------------------------


@given(
    parsers.parse(
        'a sandbox exists for plan "{plan_id}" resource "{resource_id}" path "{path}" '
        'strategy "{strategy}"'
    )
)
@when(
    parsers.parse(
        'I get or create a sandbox for plan "{plan_id}" resource "{resource_id}" path "{path}" '
        'strategy "{strategy}"'
    )
)
def get_or_create(
    ctx: dict[str, Any], plan_id: str, resource_id: str, path: str, strategy: str
) -> None:
    ctx["previous"] = ctx.get("sandbox")
    ctx["sandbox"] = ctx["manager"].get_or_create_sandbox(plan_id, resource_id, path, strategy)


@when(parsers.parse("I get or create a sandbox with empty {field}"))
def when_empty_argument(ctx: dict[str, Any], field: str) -> None:
    arguments = {"plan_id": "plan-001", "resource_id": "res-001", "original_path": "/tmp/repo"}
    arguments[field] = ""
    _capture(
        ctx,
        lambda: ctx["manager"].get_or_create_sandbox(sandbox_strategy="none", **arguments),
    )


@when(parsers.parse('I get sandbox for plan "{plan_id}" resource "{resource_id}"'))
def when_get_sandbox(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    ctx["sandbox"] = ctx["manager"].get_sandbox(plan_id, resource_id)


@when(parsers.parse('I list sandboxes for plan "{plan_id}"'))
def when_list(ctx: dict[str, Any], plan_id: str) -> None:
    ctx["listed"] = ctx["manager"].list_sandboxes(plan_id)


@then("a sandbox should be returned")
def then_sandbox_returned(ctx: dict[str, Any]) -> None:
    assert ctx["sandbox"] is not None
    assert ctx["sandbox"].sandbox_id


@then("the sandbox result should be None")
def then_sandbox_none(ctx: dict[str, Any]) -> None:
    assert ctx["sandbox"] is None


@then(parsers.parse('the sandbox should have status "{status}"'))
def then_status(ctx: dict[str, Any], status: str) -> None:
    assert ctx["sandbox"].status == SandboxStatus(status)


@then(parsers.parse('the sandbox should be tracked for plan "{plan_id}"'))
def then_tracked(ctx: dict[str, Any], plan_id: str) -> None:
    assert ctx["sandbox"] in ctx["manager"].list_sandboxes(plan_id)


@then("the same sandbox instance should be returned")
def then_same(ctx: dict[str, Any]) -> None:
    assert ctx["sandbox"] is ctx["previous"]


@then("a different sandbox instance should be returned")
def then_different(ctx: dict[str, Any]) -> None:
    assert ctx["sandbox"] is not ctx["previous"]
    assert ctx["sandbox"].sandbox_id != ctx["previous"].sandbox_id
    assert ctx["sandbox"].status is SandboxStatus.CREATED


@then(parsers.parse('{count:d} sandboxes should be tracked for plan "{plan_id}"'))
def then_tracked_count(ctx: dict[str, Any], count: int, plan_id: str) -> None:
    assert len(ctx["manager"].list_sandboxes(plan_id)) == count


@then(parsers.parse("the sandbox list should contain {count:d} sandboxes"))
def then_list_count(ctx: dict[str, Any], count: int) -> None:
    assert len(ctx["listed"]) == count


# -- putting a tracked sandbox into a state ----------------------------------------------------


@given(parsers.parse('the sandbox for plan "{plan_id}" resource "{resource_id}" is activated'))
def given_activated(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    _tracked(ctx, plan_id, resource_id).activate()
    assert _tracked(ctx, plan_id, resource_id).status is SandboxStatus.ACTIVE


@given(parsers.parse('the sandbox for plan "{plan_id}" resource "{resource_id}" is committed'))
def given_committed(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    assert _tracked(ctx, plan_id, resource_id).commit().success


@given(parsers.parse('the sandbox for plan "{plan_id}" resource "{resource_id}" is cleaned up'))
def given_cleaned(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    _tracked(ctx, plan_id, resource_id).cleanup()


@given(parsers.parse('the sandbox for plan "{plan_id}" resource "{resource_id}" is rolled back'))
def given_rolled_back(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    sandbox = _tracked(ctx, plan_id, resource_id)
    sandbox.activate()
    sandbox.rollback()
    assert sandbox.status is SandboxStatus.ROLLED_BACK


@given(
    parsers.parse('the sandbox for plan "{plan_id}" resource "{resource_id}" is in errored state')
)
def given_errored(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    # A real I/O failure inside the strategy's commit marks the sandbox errored.
    sandbox = _tracked(ctx, plan_id, resource_id)
    with (
        patch.object(sandbox, "_do_commit", side_effect=OSError("injected disk failure")),
        pytest.raises(SandboxCommitError),
    ):
        sandbox.commit()
    assert sandbox.status is SandboxStatus.ERRORED


@given(
    parsers.parse('the sandbox for plan "{plan_id}" resource "{resource_id}" will fail on commit')
)
def given_fail_commit(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    sandbox = _tracked(ctx, plan_id, resource_id)
    error = SandboxCommitError(f"injected commit failure of {sandbox.sandbox_id}")
    ctx["patches"].enter_context(patch.object(sandbox, "commit", side_effect=error))
    # The seed's failing sandbox stands for a rollbackable one (a git merge conflict), so that
    # it is committed before any non-rollbackable sandbox.
    ctx["patches"].enter_context(patch.object(sandbox, "rollbackable", True))


@given(
    parsers.parse(
        'the sandbox for plan "{plan_id}" resource "{resource_id}" will raise RuntimeError on '
        "commit"
    )
)
def given_runtime_error(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    sandbox = _tracked(ctx, plan_id, resource_id)
    error = RuntimeError("injected unexpected failure")
    ctx["patches"].enter_context(patch.object(sandbox, "commit", side_effect=error))


@given(
    parsers.parse('the sandbox for plan "{plan_id}" resource "{resource_id}" will fail on rollback')
)
def given_fail_rollback(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    sandbox = _tracked(ctx, plan_id, resource_id)
    error = SandboxRollbackError("injected rollback failure")
    ctx["patches"].enter_context(patch.object(sandbox, "rollback", side_effect=error))


@given(
    parsers.parse('the sandbox for plan "{plan_id}" resource "{resource_id}" will fail on cleanup')
)
def given_fail_cleanup(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    sandbox = _tracked(ctx, plan_id, resource_id)
    error = SandboxError("injected cleanup failure")
    ctx["patches"].enter_context(patch.object(sandbox, "cleanup", side_effect=error))


@given(
    parsers.parse(
        'the sandbox for plan "{plan_id}" resource "{resource_id}" is replaced with a committable '
        "mock"
    )
)
def given_committable_mock(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    _replace(ctx, plan_id, resource_id, RecordingSandbox(ctx["log"]))


@given(
    parsers.parse(
        'the sandbox for plan "{plan_id}" resource "{resource_id}" is replaced with a no-change '
        "committable mock"
    )
)
def given_no_change_mock(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    _replace(ctx, plan_id, resource_id, RecordingSandbox(ctx["log"], changes=False))


@given(
    parsers.parse(
        'the sandbox for plan "{plan_id}" resource "{resource_id}" is replaced with a '
        "non-rollbackable mock"
    )
)
def given_non_rollbackable_mock(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    _replace(ctx, plan_id, resource_id, RecordingSandbox(ctx["log"], rollbackable=False))


@given(
    parsers.parse(
        'the sandbox for plan "{plan_id}" resource "{resource_id}" will succeed commit then fail '
        "rollback"
    )
)
def given_commit_then_fail_rollback(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    _replace(ctx, plan_id, resource_id, RecordingSandbox(ctx["log"], fail_rollback=True))


@given("cleanup_all is patched to raise a RuntimeError")
def given_cleanup_all_raises(ctx: dict[str, Any]) -> None:
    error = RuntimeError("injected cleanup_all failure")
    ctx["patches"].enter_context(patch.object(ctx["manager"], "cleanup_all", side_effect=error))


# -- batch operations --------------------------------------------------------------------------


@when(parsers.parse('I commit all sandboxes for plan "{plan_id}"'))
def when_commit_all(ctx: dict[str, Any], plan_id: str) -> None:
    ctx["results"] = ctx["manager"].commit_all(plan_id)


@when(parsers.parse('I commit all sandboxes for plan "{plan_id}" expecting a non-sandbox error'))
def when_commit_all_atomic_error(ctx: dict[str, Any], plan_id: str) -> None:
    with pytest.raises(AtomicCommitError) as raised:
        ctx["manager"].commit_all(plan_id)
    ctx["error"] = raised.value


@when(parsers.parse("I {operation} all sandboxes with empty plan_id"))
def when_batch_empty(ctx: dict[str, Any], operation: str) -> None:
    method = {"commit": "commit_all", "rollback": "rollback_all", "cleanup": "cleanup_all"}
    _capture(ctx, lambda: getattr(ctx["manager"], method[operation])(""))


@when(parsers.parse('I rollback all sandboxes for plan "{plan_id}"'))
def when_rollback_all(ctx: dict[str, Any], plan_id: str) -> None:
    _capture(ctx, lambda: ctx["manager"].rollback_all(plan_id))


@when(parsers.parse('I cleanup all sandboxes for plan "{plan_id}"'))
def when_cleanup_all(ctx: dict[str, Any], plan_id: str) -> None:
    _capture(ctx, lambda: ctx["manager"].cleanup_all(plan_id))


@when("I cleanup abandoned sandboxes")
def when_cleanup_abandoned(ctx: dict[str, Any]) -> None:
    ctx["cleaned"] = ctx["manager"].cleanup_abandoned()


@when("the atexit cleanup handler runs")
def when_atexit(ctx: dict[str, Any]) -> None:
    _capture(ctx, ctx["manager"]._atexit_cleanup)


@then(parsers.parse("{count:d} commit results should be returned"))
def then_result_count(ctx: dict[str, Any], count: int) -> None:
    assert len(ctx["results"]) == count


@then("all commit results should be successful")
def then_all_success(ctx: dict[str, Any]) -> None:
    assert ctx["results"]
    assert all(result.success for result in ctx["results"])


@then("the first commit result should have success false")
def then_first_failed(ctx: dict[str, Any]) -> None:
    assert ctx["results"][0].success is False


@then("the first commit result error should mention the failed sandbox")
def then_error_names_sandbox(ctx: dict[str, Any]) -> None:
    result = ctx["results"][0]
    assert result.metadata["failed_sandbox_id"] == result.sandbox_id
    assert result.sandbox_id in (result.error or "")


@then(parsers.parse('the first commit result error should contain "{text}"'))
def then_error_contains(ctx: dict[str, Any], text: str) -> None:
    assert text in (ctx["results"][0].error or "")


def _committed_ids(ctx: dict[str, Any]) -> list[str]:
    return [sandbox_id for action, sandbox_id in ctx["log"] if action == "commit"]


def _rolled_back_ids(ctx: dict[str, Any]) -> list[str]:
    return [sandbox_id for action, sandbox_id in ctx["log"] if action == "rollback"]


@then("the first commit result metadata should list rolled back sandboxes")
def then_metadata_rolled_back(ctx: dict[str, Any]) -> None:
    metadata = ctx["results"][0].metadata
    assert metadata["rolled_back_ids"] == _committed_ids(ctx)[::-1]
    assert metadata["rolled_back_ids"]
    assert metadata["failed_rollback_ids"] == []


@then("the first commit result metadata should list failed rollback sandboxes")
def then_metadata_failed_rollbacks(ctx: dict[str, Any]) -> None:
    metadata = ctx["results"][0].metadata
    assert metadata["failed_rollback_ids"] == _rolled_back_ids(ctx)
    assert metadata["failed_rollback_ids"]
    assert metadata["rolled_back_ids"] == []


@then(
    parsers.parse(
        'the no-change sandbox rollback should have succeeded for plan "{plan_id}" resource '
        '"{resource_id}"'
    )
)
def then_no_change_rolled_back(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    double = _tracked(ctx, plan_id, resource_id)
    assert double.status is SandboxStatus.ROLLED_BACK
    assert ctx["results"][0].metadata["rolled_back_ids"] == [double.sandbox_id]


@then("an AtomicCommitError should have been raised with RuntimeError as cause")
def then_atomic_error(ctx: dict[str, Any]) -> None:
    assert isinstance(ctx["error"], AtomicCommitError)
    assert isinstance(ctx["error"].__cause__, RuntimeError)


@then("the AtomicCommitError should carry rollback metadata")
def then_atomic_metadata(ctx: dict[str, Any]) -> None:
    assert ctx["error"].rolled_back_ids == _committed_ids(ctx)[::-1]
    assert ctx["error"].rolled_back_ids
    assert ctx["error"].failed_rollback_ids == []


@then(
    parsers.parse(
        'the committable mock for plan "{plan_id}" resource "{resource_id}" should have been '
        "rolled back"
    )
)
def then_mock_rolled_back(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    double = _tracked(ctx, plan_id, resource_id)
    assert ("rollback", double.sandbox_id) in ctx["log"]
    assert double.status is SandboxStatus.ROLLED_BACK


@then(parsers.parse('the rollback order should be reverse of commit order for plan "{plan_id}"'))
def then_lifo(ctx: dict[str, Any], plan_id: str) -> None:
    committed = _committed_ids(ctx)
    assert len(committed) == 2
    assert _rolled_back_ids(ctx) == committed[::-1]
    assert ctx["results"][0].metadata["rolled_back_ids"] == committed[::-1]


@then(
    parsers.parse(
        'the non-rollbackable mock for plan "{plan_id}" resource "{resource_id}" should not have '
        "been committed"
    )
)
def then_not_committed(ctx: dict[str, Any], plan_id: str, resource_id: str) -> None:
    double = _tracked(ctx, plan_id, resource_id)
    assert double.sandbox_id not in _committed_ids(ctx)
    assert double.status is SandboxStatus.ACTIVE


@then("no sandbox error should be raised")
def then_no_error(ctx: dict[str, Any]) -> None:
    assert ctx["error"] is None


@then(parsers.parse('plan "{plan_id}" should no longer be tracked'))
def then_untracked(ctx: dict[str, Any], plan_id: str) -> None:
    assert plan_id not in ctx["manager"].plan_ids()
    assert ctx["manager"].list_sandboxes(plan_id) == []


@then(parsers.parse("{count:d} abandoned sandboxes should be cleaned up"))
def then_abandoned_count(ctx: dict[str, Any], count: int) -> None:
    assert ctx["cleaned"] == count
