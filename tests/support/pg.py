"""pytest plugin: the test's schema on the real PostgreSQL server as a :class:`Pg` (its
sandboxes, and a check that none of their prepared transactions is left behind), for the
two-phase tests of ``transaction_rollback``.

Fixtures: ``pg`` (a fresh schema holding ``items (name TEXT PRIMARY KEY)`` on the test server),
``noprep_server`` (session: a second cluster on port 55433 with ``max_prepared_transactions =
0``, started by ``hack/postgres.sh``) and ``noprep`` (a fresh schema on it).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sandbox_core.strategies.transaction import TransactionSandbox
from tests.support.postgres import SCRIPT, with_search_path

NOPREP_ENV = {
    "SANDBOX_PG_MAX_PREPARED": "0",
    "SANDBOX_PG_DIR": "/tmp/sandbox-pg-noprep",
    "SANDBOX_PG_PORT": "55433",
}


class Pg:
    """The test's schema on a PostgreSQL server, its sandboxes and the prepared-xact check."""

    def __init__(self, dsn: str, root: Path) -> None:
        self.dsn = dsn
        self.root = root
        self.sandbox_ids: list[str] = []
        self.sandboxes: list[TransactionSandbox] = []

    def run(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []

    def names(self) -> list[str]:
        return [row[0] for row in self.run("SELECT name FROM items ORDER BY name")]

    def sandbox(self, **options: Any) -> TransactionSandbox:
        options.setdefault("sandbox_root", str(self.root))
        sandbox = TransactionSandbox("db", self.dsn, **options)
        self.track(sandbox)
        sandbox.create("plan-2pc")
        return sandbox

    def track(self, sandbox: TransactionSandbox) -> None:
        self.sandboxes.append(sandbox)
        self.sandbox_ids.append(sandbox.sandbox_id)

    def prepared(self) -> list[str]:
        """Prepared transactions of this test's sandboxes."""
        rows = self.run("SELECT gid FROM pg_prepared_xacts ORDER BY gid")
        # In a SQL_ASCII database the driver hands text back as bytes.
        gids = [g.decode() if isinstance(g, bytes) else str(g) for (g,) in rows]
        return [g for g in gids if any(g.endswith("." + sid) for sid in self.sandbox_ids)]

    def finish(self) -> None:
        left = self.prepared()
        for gid in left:  # never leave one behind, even when the test failed
            self.run(f"ROLLBACK PREPARED '{gid}'")
        for sandbox in self.sandboxes:
            sandbox.close()
        assert left == [], f"prepared transactions left behind: {left}"


@pytest.fixture
def pg(postgres_schema_dsn: str, tmp_path: Path) -> Iterator[Pg]:
    with psycopg.connect(postgres_schema_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    helper = Pg(postgres_schema_dsn, tmp_path / "root")
    yield helper
    helper.finish()


@pytest.fixture(scope="session")
def noprep_server() -> Iterator[str]:
    """A second cluster with ``max_prepared_transactions = 0``, stopped after the session."""
    env = {**os.environ, **NOPREP_ENV}
    completed = subprocess.run(
        [str(SCRIPT), "start"], env=env, check=False, capture_output=True, text=True, timeout=900
    )
    if completed.returncode != 0:
        pytest.fail(f"hack/postgres.sh start (no prepare) failed:\n{completed.stderr}")
    try:
        yield completed.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(
            [str(SCRIPT), "stop"], env=env, check=False, capture_output=True, timeout=300
        )


@pytest.fixture
def noprep(noprep_server: str, tmp_path: Path) -> Iterator[Pg]:
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(noprep_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    dsn = with_search_path(noprep_server, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    helper = Pg(dsn, tmp_path / "root")
    yield helper
    helper.finish()
    with psycopg.connect(noprep_server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
