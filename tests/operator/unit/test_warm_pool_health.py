"""When a free pool Pod counts as bad (``pool_pod_is_bad``, replaced by the refill loop).

The property: a Pod still starting is never replaced before its start grace, whatever seconds
the kubelet's clock gave its ``startTime`` and its first ``Ready=False`` (one status update, two
readings of the clock: they can fall in consecutive seconds); a Pod that ended, or lost a
readiness it had, is replaced at once; a Ready Pod never is.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sandbox_operator.executors.warm_pool import READY_LOST_SLACK_SECONDS, pool_pod_is_bad

CREATED = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
GRACE = 300.0


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(phase: str, ready: bool, started: float, transition: float) -> dict[str, Any]:
    """A pool Pod created at :data:`CREATED`, started ``started`` s later, its Ready condition
    last changed ``transition`` s after the start (whole seconds, as the API stores them)."""
    start = CREATED + timedelta(seconds=started)
    return {
        "metadata": {"name": "sbx-pool-x", "creationTimestamp": _stamp(CREATED)},
        "status": {
            "phase": phase,
            "startTime": _stamp(start),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastTransitionTime": _stamp(start + timedelta(seconds=transition)),
                }
            ],
        },
    }


@given(
    started=st.floats(0, 30),
    skew=st.floats(0, 1.999),
    elapsed=st.floats(0, GRACE - 31),
    phase=st.sampled_from(["Pending", "Running"]),
)
def test_a_starting_pod_is_kept_until_its_grace_whatever_its_stamps(
    started: float, skew: float, elapsed: float, phase: str
) -> None:
    pod = _pod(phase, ready=False, started=started, transition=skew)
    now = CREATED + timedelta(seconds=started + elapsed)
    assert not pool_pod_is_bad(pod, GRACE, now)


@given(started=st.floats(0, 30), skew=st.floats(0, 1.999))
def test_a_pod_never_ready_past_its_grace_is_bad(started: float, skew: float) -> None:
    pod = _pod("Running", ready=False, started=started, transition=skew)
    assert pool_pod_is_bad(pod, GRACE, CREATED + timedelta(seconds=GRACE + 1))


@given(ready_after=st.floats(READY_LOST_SLACK_SECONDS + 1, 200))
def test_a_pod_whose_readiness_went_false_after_it_was_ready_is_bad(ready_after: float) -> None:
    pod = _pod("Running", ready=False, started=1, transition=ready_after)
    assert pool_pod_is_bad(pod, GRACE, CREATED + timedelta(seconds=ready_after + 2))


@given(skew=st.floats(0, 1.999))
def test_a_pod_this_operator_saw_ready_is_bad_once_not_ready_whatever_its_stamps(
    skew: float,
) -> None:
    """After a restart the stamps are all there is; before it, what the refill loop saw."""
    pod = _pod("Running", ready=False, started=1, transition=skew)
    now = CREATED + timedelta(seconds=10)
    assert not pool_pod_is_bad(pod, GRACE, now)
    assert pool_pod_is_bad(pod, GRACE, now, seen_ready=True)


@given(
    phase=st.sampled_from(["Failed", "Succeeded"]),
    ready=st.booleans(),
    transition=st.floats(0, 100),
)
def test_a_pod_that_ended_is_bad(phase: str, ready: bool, transition: float) -> None:
    pod = _pod(phase, ready=ready, started=1, transition=transition)
    assert pool_pod_is_bad(pod, GRACE, CREATED + timedelta(seconds=5))


@given(transition=st.floats(0, 100), elapsed=st.floats(0, 10 * GRACE), seen=st.booleans())
def test_a_ready_pod_is_never_bad(transition: float, elapsed: float, seen: bool) -> None:
    pod = _pod("Running", ready=True, started=1, transition=transition)
    assert not pool_pod_is_bad(pod, GRACE, CREATED + timedelta(seconds=elapsed), seen_ready=seen)
