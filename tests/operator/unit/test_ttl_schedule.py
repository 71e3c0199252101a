"""The TTL schedule of finished Sandboxes (sandbox_operator.resources.ttl): which watch events
schedule a deletion and which drop it, when a deletion is due (API server clock), a failed
deletion tried again, and no kopf timer on Sandboxes with the local executor (a timer makes kopf
keep every Sandbox's body in memory)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
from sandbox_operator.resources.sandbox import ttl_expired
from sandbox_operator.resources.ttl import TtlSchedule, ttl_deadline

from sandbox_api.models import SANDBOX_PLURAL

FINISHED = "2026-12-03T10:00:00Z"
AT = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def _sandbox(
    name: str, phase: str = "Committed", ttl: int | None = 30, **metadata: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"planId": "p"}
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", **metadata},
        "spec": spec,
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": FINISHED}],
        },
    }


def test_only_a_terminal_sandbox_with_a_ttl_is_due_at_its_finish_plus_the_ttl() -> None:
    assert ttl_deadline(_sandbox("a")) == AT + timedelta(seconds=30)
    assert ttl_deadline(_sandbox("b", phase="Active")) is None
    assert ttl_deadline(_sandbox("c", ttl=None)) is None
    no_ready = _sandbox("d")
    no_ready["status"]["conditions"] = []
    assert ttl_deadline(no_ready) is None
    assert not ttl_expired(_sandbox("a"), now=AT + timedelta(seconds=29))
    assert ttl_expired(_sandbox("a"), now=AT + timedelta(seconds=30))


def test_events_schedule_and_drop_and_a_sweep_deletes_what_is_due() -> None:
    schedule = TtlSchedule()
    for name in ("a", "b", "gone", "going"):
        schedule.event({"type": "MODIFIED", "object": _sandbox(name)})
    schedule.event({"type": "ADDED", "object": _sandbox("active", phase="Active")})
    schedule.event({"type": "DELETED", "object": _sandbox("gone")})
    going = _sandbox("going", deletionTimestamp="2026-12-03T10:00:05Z")
    schedule.event({"type": "MODIFIED", "object": going})
    schedule.event({"type": "MODIFIED", "object": _sandbox("b", ttl=3600)})  # TTL raised
    assert len(schedule) == 2
    assert schedule.due(AT + timedelta(seconds=29)) == []

    deleted: list[tuple[str, str]] = []
    assert schedule.sweep(lambda ns, n: deleted.append((ns, n)), AT + timedelta(seconds=31)) == 1
    assert deleted == [("ns", "a")]
    assert len(schedule) == 1  # b, due in an hour
    # A Sandbox that became Active again (rolled back and reused) is no longer due.
    schedule.event({"type": "MODIFIED", "object": _sandbox("b", phase="Active")})
    assert len(schedule) == 0


def test_a_failed_deletion_is_tried_again_at_the_next_sweep() -> None:
    schedule = TtlSchedule()
    schedule.event({"type": "MODIFIED", "object": _sandbox("a")})
    calls: list[str] = []

    def refuse_once(namespace: str, name: str) -> None:
        calls.append(name)
        if len(calls) == 1:
            raise RuntimeError("the API server is unavailable")

    later = AT + timedelta(minutes=1)
    assert schedule.sweep(refuse_once, later) == 0
    assert len(schedule) == 1
    assert schedule.sweep(refuse_once, later) == 1
    assert calls == ["a", "a"]
    assert len(schedule) == 0


def test_no_kopf_timer_on_sandboxes_with_the_local_executor() -> None:
    import sandbox_operator.main  # noqa: F401  (registers every handler)
    from sandbox_operator.runtime import SETTINGS

    assert SETTINGS.executor == "local"
    registry = kopf.get_default_registry()
    spawning = [
        handler.id
        for handler in registry._spawning.get_all_handlers()
        if handler.selector is not None and handler.selector.plural == SANDBOX_PLURAL
    ]
    assert spawning == []
    plancommit_timers = [h.id for h in registry._spawning.get_all_handlers()]
    assert plancommit_timers  # the check sees timers where they exist (a PlanCommit's)
