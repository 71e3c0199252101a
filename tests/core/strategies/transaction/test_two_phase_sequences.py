"""Two-phase commit of a PostgreSQL sandbox that used a sequence while another process consumed
values of the same sequence (issue 9, gap (c); docs/transaction-strategy.md, "Sequences and the
two-phase commit").

The decided behaviour: the prepared commit carries exactly the ids the sandbox saw, or nothing.

- The sandbox's transaction is still held: its statements are prepared as they ran (no replay),
  so a writer consuming sequence values meanwhile changes nothing; the commit lands with the
  sandbox's ids, the writer keeps its own.
- The statements must be replayed (``close()``, a lost connection, another process): the
  replay draws other values, so it diverges; the prepare refuses (``CommitFailed``, the
  statement named in ``conflicts``), every participant is aborted, nothing is touched and no
  prepared transaction is left. The ids are never re-read and re-mapped: rows and replies that
  used them (a child row, the actor's own reasoning) would silently point elsewhere, and an
  approval binds the reviewed outcomes (the generated ids are part of the digest).

The writer is a separate process (``psql``-like ``python -c`` with its own connection).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from sandbox_core.plan.journal import FileCommitJournal, JournalPhase
from sandbox_core.plan.two_phase import TwoPhasePlanCommit
from tests.support.pg import Pg

pytestmark = pytest.mark.postgres

WRITER = r"""
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    for _ in range(int(sys.argv[2])):
        conn.execute("INSERT INTO tickets (owner) VALUES ('writer')")
"""


@pytest.fixture
def seq_pg(postgres_schema_dsn: str, tmp_path: Path) -> Pg:
    with psycopg.connect(postgres_schema_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE tickets (id SERIAL PRIMARY KEY, owner TEXT NOT NULL)")
        conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")  # Pg.names() reads it
    return Pg(postgres_schema_dsn, tmp_path / "root")


def _writer(dsn: str, rows: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WRITER, dsn, str(rows)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _tickets(pg: Pg) -> list[tuple[int, str]]:
    return [(int(i), str(o)) for i, o in pg.run("SELECT id, owner FROM tickets ORDER BY id")]


def test_a_held_transaction_commits_the_ids_it_saw_whatever_another_process_drew(
    seq_pg: Pg, tmp_path: Path
) -> None:
    sandbox = seq_pg.sandbox()
    try:
        rows = sandbox.execute("INSERT INTO tickets (owner) VALUES ('sandbox') RETURNING id")
        seen = int(rows[0][0])
        _writer(seq_pg.dsn, 3)  # takes the next three values meanwhile

        results = TwoPhasePlanCommit(FileCommitJournal(tmp_path / "j.json")).run(
            "plan-seq-held", [sandbox]
        )

        assert results[0].success, results[0].error
        tickets = _tickets(seq_pg)
        assert (seen, "sandbox") in tickets
        assert sorted(o for _, o in tickets) == ["sandbox", "writer", "writer", "writer"]
    finally:
        seq_pg.finish()


def test_a_replay_that_draws_other_ids_is_refused_and_touches_nothing(
    seq_pg: Pg, tmp_path: Path
) -> None:
    sandbox = seq_pg.sandbox()
    try:
        sandbox.execute("INSERT INTO tickets (owner) VALUES ('sandbox') RETURNING id")
        sandbox.close()  # the held transaction is gone: the prepare has to replay
        _writer(seq_pg.dsn, 2)
        before = _tickets(seq_pg)
        journal = FileCommitJournal(tmp_path / "j.json")

        results = TwoPhasePlanCommit(journal).run("plan-seq-replay", [sandbox])

        failed = results[0]
        assert not failed.success
        assert failed.metadata["reason"] == "CommitFailed"
        assert failed.metadata["failed_sandbox_id"] == sandbox.sandbox_id
        assert failed.metadata["touched_originals"] == 0
        assert [c.split(":")[0] for c in failed.metadata["conflicts"]] == ["statement 1"]
        assert "diverged" in (failed.error or "")
        state = journal.load()
        assert state is not None and state.phase is JournalPhase.FAILED
        assert _tickets(seq_pg) == before  # only the writer's rows
        assert seq_pg.prepared() == []
    finally:
        seq_pg.finish()
