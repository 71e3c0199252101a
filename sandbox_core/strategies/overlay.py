"""Placeholder until the overlay strategy lands (being written now)."""

from __future__ import annotations

from sandbox_core.base import BaseSandbox


class OverlaySandbox(BaseSandbox):
    """overlay strategy (in progress)."""

    strategy = "overlay"
