"""Two-phase commit on a PostgreSQL database whose encoding is ``SQL_ASCII`` (issue 9, gap (a)).

In a ``SQL_ASCII`` database psycopg cannot know how text is encoded and hands text columns back
as ``bytes``. The commit marker (``sandbox_commits``) is read back by ``COMMIT PREPARED``'s
result, by a repeated apply and by recovery; each must work there as in a UTF-8 database. Each
test creates its own ``SQL_ASCII`` database (unique name, ``TEMPLATE template0``) through the
test server's superuser socket (``hack/postgres.sh``) and drops it afterwards; no prepared
transaction is left behind (``Pg.finish``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from sandbox_core.plan.journal import FileCommitJournal, JournalPhase
from sandbox_core.plan.two_phase import TwoPhasePlanCommit
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import TransactionSandbox
from tests.support.pg import Pg

pytestmark = pytest.mark.postgres

MESSAGE = "déployé ✓"  # not ASCII: the marker's message must come back as written


def _admin_conninfo(dsn: str) -> str:
    """The test cluster's superuser over its unix socket (trusted; ``hack/postgres.sh``)."""
    port = urlsplit(dsn).port or 55432
    socket_dir = os.environ.get("SANDBOX_PG_DIR", "/tmp/sandbox-operator-pg")
    user = os.environ.get("SANDBOX_PG_USER", "postgres")
    return f"host={socket_dir} port={port} user={user} dbname=postgres"


@pytest.fixture
def ascii_pg(postgres_dsn: str, tmp_path: Path) -> Iterator[Pg]:
    """A fresh ``SQL_ASCII`` database owned by the test role, with ``items (name TEXT)``."""
    name = f"tpc9_ascii_{uuid.uuid4().hex[:12]}"
    role = urlsplit(postgres_dsn).username
    admin = _admin_conninfo(postgres_dsn)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' TEMPLATE template0 "
            f"LC_COLLATE 'C' LC_CTYPE 'C' OWNER {role}"
        )
    dsn = urlunsplit(urlsplit(postgres_dsn)._replace(path=f"/{name}"))
    helper = Pg(dsn, tmp_path / "root")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # psycopg hands text back as bytes here: the very condition under test.
            assert conn.execute("SHOW server_encoding").fetchone() == (b"SQL_ASCII",)
            conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
        yield helper
        helper.finish()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)
            ).fetchall():  # never leave one behind, even when the test failed
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_sql_ascii_prepare_apply_and_repeat_read_the_marker_as_text(ascii_pg: Pg) -> None:
    sandbox = ascii_pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")

    sandbox.prepare("tx-ascii", MESSAGE)
    result = sandbox.apply_prepared("tx-ascii")

    assert result.success and result.metadata["message"] == MESSAGE
    assert result.metadata["already_committed"] is False
    assert sandbox.status is SandboxStatus.COMMITTED
    assert ascii_pg.names() == [b"a"]
    assert sandbox.commit_landed()
    assert sandbox.apply_prepared("tx-ascii") == result  # idempotent


def test_sql_ascii_apply_after_an_unrecorded_commit_settles_by_the_marker(ascii_pg: Pg) -> None:
    """The reply of COMMIT PREPARED was lost (a crash): a fresh sandbox reads the marker."""
    sandbox = ascii_pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('b')")
    record = sandbox.to_record()
    sandbox.prepare("tx-ascii-landed", MESSAGE)
    ascii_pg.run(f"COMMIT PREPARED '{sandbox.prepared_gid('tx-ascii-landed')}'")

    fresh = TransactionSandbox.reopen(record)
    fresh.use_credentials(ascii_pg.dsn)
    ascii_pg.track(fresh)
    result = fresh.apply_prepared("tx-ascii-landed")

    assert result.metadata["already_committed"] is True
    assert result.metadata["message"] == MESSAGE
    assert result.timestamp.year >= 2000  # the marker's committed_at parsed as a time
    assert fresh.status is SandboxStatus.COMMITTED
    assert ascii_pg.names() == [b"b"]


class _Crash(BaseException):
    """Stands for a process killed at a fault point (nothing catches it)."""


def test_sql_ascii_plan_interrupted_after_the_decision_is_recovered(
    ascii_pg: Pg, tmp_path: Path
) -> None:
    """Crash right after COMMIT PREPARED (``after_apply``): recovery re-applies from the
    marker and the plan ends committed, with the database changed once."""
    sandbox = ascii_pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('c')")
    record = sandbox.to_record()  # what the store holds: COMMITTED is never saved here
    journal = FileCommitJournal(tmp_path / "journal.json")

    def crash_after_apply(point: str, index: int, sandbox_id: str) -> None:
        if point == "after_apply":
            raise _Crash

    with pytest.raises(_Crash):
        TwoPhasePlanCommit(journal, fault_hook=crash_after_apply).run(
            "plan-ascii", [sandbox], message=MESSAGE
        )
    sandbox.close()
    fresh = TransactionSandbox.reopen(record)
    fresh.use_credentials(ascii_pg.dsn)
    ascii_pg.track(fresh)

    state = TwoPhasePlanCommit(journal).recover(lambda step: fresh)

    assert state is not None and state.phase is JournalPhase.COMMITTED
    assert state.steps[0].result is not None
    assert state.steps[0].result["metadata"]["message"] == MESSAGE
    assert ascii_pg.names() == [b"c"]
    assert ascii_pg.prepared() == []
