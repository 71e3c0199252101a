"""Fixtures of the transaction_rollback tests on the real PostgreSQL server (``postgres_dsn``
and ``postgres_schema_dsn`` come from the ``tests.support.postgres`` plugin)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest


@pytest.fixture(name="dsn")
def items_table_dsn(postgres_schema_dsn: str) -> str:
    """``dsn``: a schema DSN holding ``items (name TEXT PRIMARY KEY)`` (transaction tests)."""
    with psycopg.connect(postgres_schema_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    return postgres_schema_dsn


@pytest.fixture(name="made")
def transaction_sandboxes(dsn: str) -> Iterator[list[Any]]:
    """``made``: append the sandboxes a test makes; each is cleaned up after it. Depends on
    ``dsn``, so sandboxes are cleaned up before the schema is dropped."""
    sandboxes: list[Any] = []
    yield sandboxes
    for sandbox in sandboxes:
        sandbox.cleanup()
