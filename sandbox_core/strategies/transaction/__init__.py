"""Strategy ``transaction_rollback``: database writes held in one transaction (seed 002).

:class:`TransactionSandbox` lives in :mod:`.sandbox`; :mod:`.db` is the only module of the core
that imports psycopg.
"""

from sandbox_core.errors import SandboxStatementError
from sandbox_core.strategies.transaction.replay import (
    DEFAULT_BOOKKEEPING_TABLE,
    DEFAULT_TIMEOUT_SECONDS,
    FIRST_BACKOFF_SECONDS,
    MAX_BACKOFF_SECONDS,
    STATEMENT_LOG,
)
from sandbox_core.strategies.transaction.sandbox import TransactionSandbox

__all__ = [
    "DEFAULT_BOOKKEEPING_TABLE",
    "DEFAULT_TIMEOUT_SECONDS",
    "FIRST_BACKOFF_SECONDS",
    "MAX_BACKOFF_SECONDS",
    "STATEMENT_LOG",
    "SandboxStatementError",
    "TransactionSandbox",
]
