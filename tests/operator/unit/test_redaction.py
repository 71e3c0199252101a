"""Issue 8, "No secret in sight": the operator's redaction boundary (tier 1)."""

from __future__ import annotations

import logging

import pytest
from sandbox_operator.executors.base import SandboxState
from sandbox_operator.kube import redaction
from sandbox_operator.kube.conditions import FINISHED, find_condition
from sandbox_operator.resources.sandbox import failure_status, status_of_state

from sandbox_core.redaction import same_database

PASSWORD = "s3cr3t-Pa55word"


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://app:{PASSWORD}@db:5432/app",
        f"postgresql://app@db:5432/app?password={PASSWORD}",
        f"host=db user=app password={PASSWORD} dbname=x",
        f"host=db password='{PASSWORD} x' dbname=x",
    ],
)
def test_redact_dsn_removes_the_password_in_both_libpq_forms(dsn: str) -> None:
    """The operator's redaction is the core's: the password is gone, the database is the same."""
    shown = redaction.redact_dsn(dsn)
    assert PASSWORD not in shown and "password=***" in shown
    assert same_database(shown, dsn)
    assert redaction.dsn_password(dsn) in (PASSWORD, f"{PASSWORD} x")


@pytest.mark.parametrize("dsn", ["postgresql://app@db/app", "sqlite:////tmp/app.db", "/a/b.db"])
def test_redact_dsn_keeps_a_dsn_without_password(dsn: str) -> None:
    assert redaction.redact_dsn(dsn) == dsn
    assert redaction.dsn_password(dsn) is None


def test_a_registered_dsn_is_scrubbed_from_records_conditions_logs_and_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = f"postgresql://app:{PASSWORD}@db:5432/app"
    redaction.register(dsn)
    record = {
        "strategy": "transaction_rollback",
        "sandbox_id": "01J",
        "status": "active",
        "original_path": dsn,
        "context": {"original_path": dsn, "sandbox_path": "/x", "metadata": {"m": [dsn]}},
    }
    state = SandboxState.from_record(record)
    status = status_of_state(state, "local", None, 1)
    assert PASSWORD not in repr(status)
    assert status["coreRecord"]["original_path"] == redaction.redact_dsn(dsn)
    assert "password=***" in status["coreRecord"]["original_path"]
    failed = failure_status(RuntimeError(f"cannot reach {dsn}"), None, 1)
    assert PASSWORD not in repr(failed)
    posted: list[str] = []
    sink = redaction.scrubbing_events(lambda body, type_, reason, message: posted.append(message))
    sink({}, "Warning", "X", f"failed on {dsn} ({PASSWORD})")
    assert posted and PASSWORD not in posted[0]
    handler = logging.StreamHandler()
    handler.addFilter(redaction.ScrubFilter())
    log = logging.LogRecord("t", logging.WARNING, __file__, 1, "bad %s", (dsn,), None)
    assert handler.filter(log)
    assert PASSWORD not in log.getMessage()


def test_the_finished_condition_is_true_only_in_terminal_phases() -> None:
    base = {"sandbox_id": "01J", "strategy": "git_worktree", "original_path": "/r"}
    active = status_of_state(
        SandboxState.from_record({**base, "status": "active"}), "local", None, 1
    )
    assert find_condition(active["conditions"], FINISHED)["status"] == "False"
    done = status_of_state(
        SandboxState.from_record({**base, "status": "committed"}), "local", None, 1
    )
    finished = find_condition(done["conditions"], FINISHED)
    assert finished["status"] == "True"
    assert finished["reason"] == "Committed"
