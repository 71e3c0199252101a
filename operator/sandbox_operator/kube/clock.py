"""The API server's clock, for every time the operator writes and later compares.

A TTL (``ttlSecondsAfterFinished``, a PlanCommit's ``approvalTimeoutSeconds``) compares a time
one replica wrote (a condition's ``lastTransitionTime``, ``review.reviewedAt``) with the time
another replica reads it, maybe on another node whose clock is minutes off. Both therefore use
one clock, the API server's: :func:`now` is this process's wall clock plus its offset to the
``Date`` header of the API server's replies (:class:`ApiServerClock`, measured again every
``refresh_seconds``; the header has whole seconds, so the offset is good to about a second).
Without an installed clock (unit tests, tools) it is this process's own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

from kubernetes import client


class Clock(Protocol):
    """A source of the current UTC time."""

    def now(self) -> datetime:
        """The current time (aware, UTC)."""
        ...


class LocalClock:
    """This process's wall clock."""

    def now(self) -> datetime:
        """``datetime.now(UTC)``."""
        return datetime.now(UTC)


def server_date(api_client: Any) -> datetime:
    """The ``Date`` header of the API server's reply to ``GET /version`` (allowed to every
    authenticated user).

    Raises:
        ApiException: the API server refused; ValueError: the reply had no usable Date.
    """
    _, _, headers = client.VersionApi(api_client).get_code_with_http_info(_request_timeout=10)
    value = (headers or {}).get("Date") or (headers or {}).get("date")
    if not value:
        raise ValueError("the API server's reply has no Date header")
    return parsedate_to_datetime(str(value)).astimezone(UTC)


class ApiServerClock:
    """The API server's clock, estimated from this process's wall clock and a measured offset.

    Args:
        fetch: the API server's current time (:func:`server_date`).
        wall: this process's wall clock in seconds (``time.time``; a test skews it).
        monotonic: when to measure again (``time.monotonic``).
        refresh_seconds: age after which the offset is measured again.
    """

    def __init__(
        self,
        fetch: Callable[[], datetime],
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        refresh_seconds: float = 60.0,
    ) -> None:
        self._fetch = fetch
        self._wall = wall
        self._monotonic = monotonic
        self._refresh = refresh_seconds
        self._offset: float | None = None
        self._measured_at = 0.0
        self._lock = threading.Lock()

    def offset(self) -> float:
        """Seconds to add to this process's wall clock to get the API server's (the Date
        header's truncation to whole seconds is centred: +0.5 s). A failed measurement keeps
        the last offset (0 before the first)."""
        with self._lock:
            if self._offset is None or self._monotonic() - self._measured_at >= self._refresh:
                before = self._wall()
                try:
                    date = self._fetch().timestamp() + 0.5
                except Exception:  # the API unreachable: keep what was measured
                    return self._offset or 0.0
                after = self._wall()
                self._offset = date - (before + after) / 2
                self._measured_at = self._monotonic()
            return self._offset

    def now(self) -> datetime:
        """The API server's current time (aware, UTC)."""
        return datetime.fromtimestamp(self._wall() + self.offset(), UTC)


_CLOCK: list[Clock] = [LocalClock()]


def install(clock: Clock) -> None:
    """Use ``clock`` for :func:`now` from here on (the operator's startup installs an
    :class:`ApiServerClock`)."""
    _CLOCK[0] = clock


def now() -> datetime:
    """The current time on the installed clock (aware, UTC)."""
    return _CLOCK[0].now()
