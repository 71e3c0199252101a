"""A finalizer that waits for a saga backs off and is logged at INFO, not ERROR (issue 11).

The operator logged ``Handler 'cleanup' failed temporarily: cleanup waits: ...`` at ERROR once a
second while a PlanCommit held the Sandbox (and kopf turned every such line into a Warning
Event). Now the retry backs off and kopf's line is INFO with the reason.
"""

from __future__ import annotations

import logging
from pathlib import Path

import kopf
import pytest
from sandbox_operator.errors import (
    WAIT_BACKOFF_MAX_SECONDS,
    QuietWaits,
    install_quiet_waits,
    waiting,
)
from sandbox_operator.executors.local import LocalExecutor
from sandbox_operator.kube.claims import Claims
from sandbox_operator.kube.events import no_events
from sandbox_operator.resources.sandbox import SandboxLogic
from sandbox_operator.settings import Settings

UID = "6f1c2a52-1a0b-4c55-9a53-8e2b51a0c001"


def body(uid: str = UID) -> dict[str, object]:
    return {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "s1", "namespace": "ns", "uid": uid},
        "spec": {"planId": "p", "resourceId": "r", "strategy": "none"}
        | {"source": {"nodePath": "/x"}},
    }


def test_a_cleanup_held_by_a_saga_backs_off_and_names_the_holder(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", sandbox_root=tmp_path / "sb")
    logic = SandboxLogic(settings, LocalExecutor(settings), None, no_events)
    logic.claims = Claims()
    assert logic.claims.acquire(UID, "PlanCommit ns/pc")
    delays = []
    for retry in range(6):
        with pytest.raises(kopf.TemporaryError) as caught:
            logic.finalize(body(), retry)
        assert str(caught.value).startswith(
            "cleanup waits: the sandbox is in use by PlanCommit ns/pc"
        )
        delays.append(caught.value.delay)
    base = settings.retry_delay_seconds
    assert delays == [min(base * 2**n, WAIT_BACKOFF_MAX_SECONDS) for n in range(6)]
    assert delays[-1] == WAIT_BACKOFF_MAX_SECONDS  # the back-off is capped
    logic.claims.release(UID, "PlanCommit ns/pc")
    logic.finalize(body(), 6)  # let go: the cleanup runs (nothing was made: fine)


def test_an_unknown_wait_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown wait prefix"):
        waiting("sleeping: ", "x", 1.0, 0)


class Collect(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize(
    ("message", "level"),
    [
        ("cleanup waits: the sandbox is in use by PlanCommit ns/pc; next check in 2s", "INFO"),
        ("snapshot deletion waits: in use by Sandbox ns/s1; next check in 1s", "INFO"),
        ("InternalError: disk full", "ERROR"),  # a real failure stays an error
    ],
)
def test_kopf_lines_about_waits_are_info_and_post_no_event(message: str, level: str) -> None:
    """Through kopf's own per-object logger, as kopf logs a TemporaryError."""
    logger = logging.getLogger("kopf.objects")
    install_quiet_waits()
    install_quiet_waits()  # idempotent
    assert sum(isinstance(f, QuietWaits) for f in logger.filters) == 1
    everything, poster = Collect(logging.DEBUG), Collect(logging.WARNING)  # poster: kopf's Events
    logger.addHandler(everything)
    logger.addHandler(poster)
    try:
        adapter = logging.LoggerAdapter(logger, {})
        adapter.error(f"Handler 'cleanup' failed temporarily: {message}")
    finally:
        logger.removeHandler(everything)
        logger.removeHandler(poster)
    assert [r.levelname for r in everything.records] == [level]
    assert len(poster.records) == (level == "ERROR")
