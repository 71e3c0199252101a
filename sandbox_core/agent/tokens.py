"""Agent tokens that expire: their text, and how long the agent has held one.

A token the operator mints for a Sandbox reads ``v2.<serial>.<lifetime>.<mac>``: ``serial`` is
the renewal window it was minted for, ``lifetime`` the seconds the agent may accept it, ``mac``
hex HMAC-SHA256 of the operator's key over the Sandbox uid, serial and lifetime
(``sandbox_operator.executors.agent_client.derive_token``). A token of another shape (a bare
hex MAC, minted before tokens expired) carries no lifetime and never expires.

The lifetime is a duration the agent measures itself, on its monotonic clock, from the moment
it first read the token from its token file (:class:`TokenAges`): no wall clock written by
another process (the operator's, on another node) is compared with the agent's. The operator
writes a new token into the Sandbox's Secret every half lifetime; the kubelet brings it to the
Pod's token file within about a minute, so a token is refused only when the operator has not
renewed it for a whole lifetime.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

VERSION = "v2"
# Tokens remembered by TokenAges at most (the current and the few before it are enough).
REMEMBERED = 16


def format_token(serial: int, lifetime_seconds: int, mac: str) -> str:
    """The text of a token minted for window ``serial`` that lives ``lifetime_seconds``."""
    return f"{VERSION}.{serial}.{lifetime_seconds}.{mac}"


def signed_text(uid: str, serial: int, lifetime_seconds: int) -> bytes:
    """What the token's MAC signs: the Sandbox uid, the serial and the lifetime."""
    return f"{uid}|{serial}|{lifetime_seconds}".encode()


def lifetime_of(token: str) -> int | None:
    """The lifetime in seconds a token carries; None for a token without one (never expires)
    or of another shape."""
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != VERSION or not parts[2].isdigit():
        return None
    return int(parts[2])


class TokenAges:
    """How long this process has held each token (seconds since it first saw it).

    Args:
        clock: a monotonic clock in seconds (``time.monotonic``; a test injects another).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first_seen: dict[str, float] = {}

    def held(self, token: bytes) -> float:
        """Seconds since ``token`` was first passed here (0 the first time)."""
        digest = hashlib.sha256(token).hexdigest()
        now = self._clock()
        first = self._first_seen.setdefault(digest, now)
        if len(self._first_seen) > REMEMBERED:
            oldest = min(self._first_seen, key=self._first_seen.__getitem__)
            if oldest != digest:
                del self._first_seen[oldest]
        return now - first

    def expired(self, token: bytes) -> tuple[float, int] | None:
        """``(held seconds, lifetime seconds)`` when ``token`` has been held longer than its
        lifetime; None while it is valid or when it carries no lifetime."""
        lifetime = lifetime_of(token.decode(errors="replace"))
        if lifetime is None:
            return None
        held = self.held(token)
        return (held, lifetime) if held > lifetime else None
