"""Kubernetes Events, behind a small callable so that logic modules stay testable.

Handlers pass :func:`kopf_events`; unit tests pass a list-appending function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

EventSink = Callable[[Mapping[str, Any], str, str, str], None]
"""``(body, type, reason, message) -> None``; ``type`` is ``Normal`` or ``Warning``."""


def kopf_events(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Post an Event about ``body`` through kopf's poster (works from sync handlers)."""
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message[:1000])


def no_events(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """An EventSink that drops everything (tools and tests that do not care)."""
