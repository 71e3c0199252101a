"""Placeholder until the transaction_rollback strategy lands (being written now)."""

from __future__ import annotations

from sandbox_core.base import BaseSandbox


class TransactionSandbox(BaseSandbox):
    """transaction_rollback strategy (in progress)."""

    strategy = "transaction_rollback"
