"""Placeholder until the copy_on_write strategy lands (being written now)."""

from __future__ import annotations

from sandbox_core.base import BaseSandbox


class CopyOnWriteSandbox(BaseSandbox):
    """copy_on_write strategy (in progress)."""

    strategy = "copy_on_write"
