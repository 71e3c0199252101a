"""pytest plugin: a real PostgreSQL server for tests marked ``postgres`` (DESIGN.md, test tier 1).

Fixtures:
    postgres_dsn (session): ``$SANDBOX_TEST_POSTGRES_DSN`` when set (``.ci/run`` exports it after
        ``hack/postgres.sh start``); otherwise this plugin runs ``hack/postgres.sh start`` itself,
        so the tests never skip on a machine where PostgreSQL can be installed.
    postgres_schema_dsn (function): a DSN whose ``search_path`` is a fresh schema, dropped after
        the test, so every test has its own tables (and its own ``sandbox_commits``).

Load it with ``pytest_plugins = ["tests.support.postgres"]`` in the top-level conftest, or import
the fixtures into an area's conftest.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

DSN_ENV = "SANDBOX_TEST_POSTGRES_DSN"
SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "postgres.sh"


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with ``options=-c search_path=<schema>`` added to its query string."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-c search_path={schema}"))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """DSN of the test PostgreSQL server (started by ``hack/postgres.sh`` when not given)."""
    dsn = os.environ.get(DSN_ENV, "").strip()
    if dsn:
        return dsn
    completed = subprocess.run(
        [str(SCRIPT), "start"], check=False, capture_output=True, text=True, timeout=900
    )
    if completed.returncode != 0:
        pytest.fail(f"hack/postgres.sh start failed:\n{completed.stderr}", pytrace=False)
    return completed.stdout.strip().splitlines()[-1]


@pytest.fixture
def postgres_schema_dsn(postgres_dsn: str) -> Iterator[str]:
    """DSN confined to a new schema ``t_<hex>``; the schema is dropped after the test.

    Close every connection to it first: request this fixture before the fixture that owns them,
    or register their cleanup with ``request.addfinalizer`` after requesting it.
    """
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(postgres_dsn, schema)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            # A transaction a test left open would block the drop forever: fail instead.
            conn.execute("SET lock_timeout = '20s'")
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
