"""TTLs compare times on one clock, the API server's, whatever the replicas' clocks say (tier 2).

Two "replicas" whose wall clocks are skewed by +1 h and -1 h (the fault, injected) each measure
their offset to the real API server's ``Date`` header (``kube.clock.ApiServerClock``). A
Sandbox's finish is stamped by the first (its Ready condition's ``lastTransitionTime``, through
``kube.conditions``) and its ``ttlSecondsAfterFinished`` judged by the second: not expired
before the TTL, expired after it; with the replicas' own clocks it would be wrong by two hours.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import config as k8s_config
from sandbox_operator.kube import clock
from sandbox_operator.kube.conditions import now_rfc3339
from sandbox_operator.resources.sandbox import ttl_expired

SKEW = 3600.0
TTL = 3


@pytest.fixture
def api_client(local_apiserver: Any) -> Iterator[Any]:
    yield k8s_config.new_client_from_config(config_file=str(local_apiserver.kubeconfig_path))
    clock.install(clock.LocalClock())


def _replica(api_client: Any, skew: float) -> clock.ApiServerClock:
    return clock.ApiServerClock(
        lambda: clock.server_date(api_client), wall=lambda: time.time() + skew
    )


def _finished(ready_at: str) -> dict[str, Any]:
    return {
        "spec": {"ttlSecondsAfterFinished": TTL},
        "status": {
            "phase": "Committed",
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": ready_at}],
        },
    }


def test_replicas_with_skewed_clocks_agree_on_a_ttl(api_client: Any) -> None:
    ahead, behind = _replica(api_client, SKEW), _replica(api_client, -SKEW)
    real = datetime.now(UTC)
    # Each measured the API server's clock: both within about a second of it (and of each other).
    assert abs((ahead.now() - real).total_seconds()) < 2.5
    assert abs((behind.now() - real).total_seconds()) < 2.5
    assert abs(ahead.offset() + SKEW) < 2.5 and abs(behind.offset() - SKEW) < 2.5

    clock.install(ahead)  # the replica that stamps the finish
    body = _finished(now_rfc3339())
    clock.install(behind)  # the replica whose timer judges it
    assert not ttl_expired(body)
    time.sleep(TTL + 1.5)
    assert ttl_expired(body)
    # The replicas' own clocks would have disagreed by two hours.
    stamped_locally = datetime.fromtimestamp(time.time() + SKEW, UTC)
    local_body = _finished(stamped_locally.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert not ttl_expired(local_body, now=datetime.fromtimestamp(time.time() - SKEW, UTC))


def test_an_unreachable_api_server_keeps_the_last_offset() -> None:
    calls: list[int] = []

    def fetch() -> datetime:
        calls.append(1)
        if len(calls) > 1:
            raise OSError("unreachable")
        return datetime.fromtimestamp(1_000_000.0, UTC)

    ticks = iter([0.0, 100.0, 200.0, 300.0])
    replica = clock.ApiServerClock(fetch, wall=lambda: 999_000.0, monotonic=lambda: next(ticks),
                                   refresh_seconds=50)  # fmt: skip
    assert replica.offset() == pytest.approx(1000.5)
    assert replica.offset() == pytest.approx(1000.5)  # measured again, failed: kept
    assert len(calls) == 2
