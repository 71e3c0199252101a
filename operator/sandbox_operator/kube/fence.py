"""Fencing: no write reaches the API server once this replica may have lost the lead.

Leader election (:mod:`sandbox_operator.kube.leader`) says until when this replica surely
leads: the start of its last successful renewal plus ``renew_deadline_seconds``, on its own
monotonic clock. A standby can take the Lease only ``lease_duration_seconds`` after it saw that
renewal, which it cannot see before the renewal started, so the margin between the leader's
last moment and the earliest takeover is ``lease_duration - renew_deadline`` however slow the
API server is. Every write the operator sends checks :data:`FENCE` first and is refused without
being sent when the lead may be lost (a replica paused, then resumed, or starved of CPU):

- the operator's own calls (journal, children, Events) go through :class:`FencedApiClient`;
- kopf's (status and annotation patches, finalizers, Events) through :func:`install_kopf_fence`.

What it cannot stop: a write sent while leading that the API server then holds for longer than
the margin still lands (docs/security.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client

logger = logging.getLogger("sandbox_operator.fence")

READS = frozenset({"GET", "HEAD", "OPTIONS"})


class NotLeading(RuntimeError):  # noqa: N818 - named for the state it reports
    """A write was refused before it was sent: this replica may no longer lead."""


class Fence:
    """Until when this process may write (monotonic seconds); unbounded until bound."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: float | None = None

    def bind(self, until: float) -> None:
        """Writes are allowed until ``until`` (this process's monotonic clock)."""
        self._until = until

    def remaining(self) -> float:
        """Seconds of sure lead left (infinite when no leader election binds the fence)."""
        return float("inf") if self._until is None else self._until - self._clock()

    def check(self, method: str, what: str) -> None:
        """Raise :class:`NotLeading` for a write (``method`` not a read) past the bound."""
        if method.upper() in READS or self.remaining() > 0:
            return
        logger.error("fenced: %s %s refused, this replica may have lost the lead", method, what)
        raise NotLeading(f"{method} {what}: refused, this replica may have lost the lead")


FENCE = Fence()


class FencedApiClient(client.ApiClient):
    """The Kubernetes client whose writes check :attr:`fence` (:data:`FENCE`) before they are
    sent."""

    fence: Fence = FENCE

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        self.fence.check(method, url.split("?", 1)[0])
        return super().call_api(method, url, *args, **kwargs)


def install_kopf_fence() -> bool:
    """Make kopf's API requests check :data:`FENCE` (its patch, post and delete all go through
    ``kopf._cogs.clients.api.request``); False when kopf no longer has it (then only the
    operator's own writes are fenced)."""
    try:
        from kopf._cogs.clients import api as kopf_api
    except ImportError:  # pragma: no cover - a kopf without that module
        return False
    original: Callable[..., Awaitable[Any]] | None = getattr(kopf_api, "request", None)
    if original is None or getattr(original, "fenced", False):
        return original is not None

    async def request(method: str, url: str, **kwargs: Any) -> Any:
        FENCE.check(method, url.split("?", 1)[0])
        return await original(method, url, **kwargs)

    request.fenced = True  # type: ignore[attr-defined]
    kopf_api.request = request
    return True
