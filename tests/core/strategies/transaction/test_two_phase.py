"""Two-phase commit and review of ``transaction_rollback`` sandboxes (issue 9), on the real
PostgreSQL server and real SQLite files (WAL and rollback journal).

PostgreSQL: ``PREPARE TRANSACTION '<txid>.<sandbox_id>'`` survives the process (SIGKILL tests);
apply is ``COMMIT PREPARED``, abort ``ROLLBACK PREPARED``; a server with
``max_prepared_transactions = 0`` (a second cluster on port 55433) refuses up front. SQLite: the
prepared commit is a ``BEGIN IMMEDIATE`` transaction held in the preparing process (the last
resource). Every PostgreSQL test ends by asserting that no prepared transaction of its sandboxes
is left in ``pg_prepared_xacts``.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
import pytest

from sandbox_core.errors import (
    SandboxBusyError,
    SandboxCommitError,
    SandboxStateError,
    TwoPhaseUnavailableError,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import TransactionSandbox
from sandbox_core.strategies.transaction import db as _db
from tests.support.pg import Pg

REPO = Path(__file__).resolve().parents[4]
JOURNALS = [pytest.param("wal", id="wal"), pytest.param("delete", id="rollback-journal")]

# A process that prepares a sandbox's commit and then waits to be killed (SIGKILL after PREPARE).
CHILD = r"""
import json, sys, time
from sandbox_core.strategies.transaction import TransactionSandbox
original, root, txid, record_path, sql = sys.argv[1:6]
sandbox = TransactionSandbox("db", original, sandbox_root=root)
sandbox.create("plan-kill")
sandbox.execute(sql)
with open(record_path, "w") as handle:
    json.dump(sandbox.to_record(), handle)
sandbox.prepare(txid, "two-phase")
print("PREPARED", flush=True)
time.sleep(600)
"""


def prepare_in_killed_process(original: str, root: Path, txid: str, sql: str) -> dict[str, Any]:
    """Run ``CHILD``: create, execute ``sql``, prepare under ``txid``; SIGKILL it after PREPARE.

    Returns the sandbox's record (saved before prepare, as a process's state store would)."""
    record_path = root / f"record-{txid}.json"
    root.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, original, str(root), txid, str(record_path), sql],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "PREPARED", child.stderr.read() if child.stderr else line
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    record: dict[str, Any] = json.loads(record_path.read_text())
    return record


# -- PostgreSQL -----------------------------------------------------------------------------------

pg_mark = pytest.mark.postgres


@pg_mark
def test_pg_prepare_then_apply_commits_exactly_once(pg: Pg) -> None:
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES (%s), (%s)", ("a", "b"))

    prepared = sandbox.prepare("plan-1.1", "ship it")

    gid = f"plan-1.1.{sandbox.sandbox_id}"
    assert prepared.details["gid"] == gid == sandbox.prepared_gid("plan-1.1")
    assert prepared.txid == "plan-1.1"
    assert prepared.details["statements"] == 1
    assert prepared.digest == sandbox.review().digest
    assert pg.prepared() == [gid]
    assert pg.names() == []  # prepared is not committed
    assert sandbox.status is SandboxStatus.ACTIVE

    result = sandbox.apply_prepared("plan-1.1")

    assert result.success and result.metadata["txid"] == "plan-1.1"
    assert result.metadata["gid"] == gid and result.metadata["already_committed"] is False
    assert result.metadata["message"] == "ship it"
    assert sandbox.status is SandboxStatus.COMMITTED
    assert pg.names() == ["a", "b"]
    assert pg.prepared() == []
    assert sandbox.commit_landed()
    # Idempotent: again here, and in a fresh process from the record saved before apply.
    assert sandbox.apply_prepared("plan-1.1") == result
    assert pg.run("SELECT count(*) FROM sandbox_commits") == [(1,)]


@pg_mark
def test_pg_apply_after_the_commit_landed_unrecorded_returns_the_recorded_result(pg: Pg) -> None:
    """A process died after COMMIT PREPARED, before saving COMMITTED: apply settles by marker."""
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    record = sandbox.to_record()
    sandbox.prepare("tx-landed")
    pg.run(f"COMMIT PREPARED '{sandbox.prepared_gid('tx-landed')}'")

    fresh = TransactionSandbox.reopen(record)
    fresh.use_credentials(pg.dsn)
    pg.track(fresh)
    result = fresh.apply_prepared("tx-landed")

    assert result.metadata["already_committed"] is True
    assert fresh.status is SandboxStatus.COMMITTED
    assert pg.names() == ["a"]


@pg_mark
def test_pg_prepare_then_abort_leaves_the_database_unchanged(pg: Pg) -> None:
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    sandbox.prepare("tx-abort")
    assert pg.prepared() == [sandbox.prepared_gid("tx-abort")]

    sandbox.abort_prepared("tx-abort")
    sandbox.abort_prepared("tx-abort")  # idempotent

    assert pg.prepared() == []
    assert pg.names() == []
    # The bookkeeping table is made (empty) before PREPARE, in its own transaction: no marker.
    assert pg.run("SELECT count(*) FROM sandbox_commits") == [(0,)]
    assert sandbox.status is SandboxStatus.ACTIVE
    assert [s["sql"] for s in sandbox.statements()] == ["INSERT INTO items VALUES ('a')"]
    # The plan can be retried: the log replays into a new transaction.
    sandbox.prepare("tx-again")
    sandbox.apply_prepared("tx-again")
    assert pg.names() == ["a"]


@pg_mark
def test_pg_abort_when_nothing_was_prepared_is_a_no_op(pg: Pg) -> None:
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    sandbox.abort_prepared("tx-never")
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.commit()
    assert pg.names() == ["a"]


@pg_mark
def test_pg_apply_with_nothing_prepared_and_no_marker_is_refused(pg: Pg) -> None:
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    with pytest.raises(SandboxCommitError, match="nothing landed"):
        sandbox.apply_prepared("tx-never")
    assert sandbox.status is SandboxStatus.ACTIVE
    assert pg.names() == []


@pg_mark
def test_pg_statements_and_commit_wait_for_the_prepared_commit(pg: Pg) -> None:
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    sandbox.prepare("tx-pending")

    with pytest.raises(SandboxStateError, match="prepared under tx-pending"):
        sandbox.execute("INSERT INTO items VALUES ('b')")
    with pytest.raises(SandboxStateError, match="prepared under tx-pending"):
        sandbox.commit()
    with pytest.raises(SandboxStateError, match="prepared under tx-pending"):
        sandbox.prepare("tx-other")

    assert sandbox.status is SandboxStatus.ACTIVE
    assert sandbox.prepare("tx-pending").details["gid"] == sandbox.prepared_gid("tx-pending")
    sandbox.apply_prepared("tx-pending")
    assert pg.names() == ["a"]


@pg_mark
def test_pg_rollback_and_cleanup_release_a_prepared_commit(pg: Pg) -> None:
    first = pg.sandbox()
    first.execute("INSERT INTO items VALUES ('a')")
    first.prepare("tx-r")
    first.rollback()
    second = pg.sandbox()
    second.execute("INSERT INTO items VALUES ('b')")
    second.prepare("tx-c")
    second.cleanup()
    assert pg.prepared() == []
    assert pg.names() == []


def lose_reply_after(statement_prefix: str) -> Any:
    """Fault: the statement runs on the server, then its reply is lost (connection dropped)."""
    real_execute = _db.Connection.execute
    fired: list[str] = []

    def execute(self: _db.Connection, sql: str, params: Any = None) -> Any:
        result = real_execute(self, sql, params)
        if sql.startswith(statement_prefix) and not fired:
            fired.append(sql)
            self.close()
            raise _db.DatabaseError("server closed the connection", connection_lost=True)
        return result

    return mock.patch.object(_db.Connection, "execute", execute)


@pg_mark
def test_pg_prepare_whose_reply_is_lost_is_found_prepared(pg: Pg) -> None:
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    with lose_reply_after("PREPARE TRANSACTION"):
        prepared = sandbox.prepare("tx-lost")
    assert pg.prepared() == [prepared.details["gid"]]
    sandbox.apply_prepared("tx-lost")
    assert pg.names() == ["a"]


@pg_mark
def test_pg_apply_whose_reply_is_lost_settles_by_the_marker(pg: Pg) -> None:
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    sandbox.prepare("tx-lost")
    with lose_reply_after("COMMIT PREPARED"):
        result = sandbox.apply_prepared("tx-lost")
    assert result.metadata["already_committed"] is True  # found landed on the retry
    assert sandbox.status is SandboxStatus.COMMITTED
    assert pg.names() == ["a"]
    assert pg.run("SELECT count(*) FROM sandbox_commits") == [(1,)]


@pg_mark
def test_pg_invalid_txid_is_refused_before_anything(pg: Pg) -> None:
    sandbox = pg.sandbox()
    sandbox.execute("INSERT INTO items VALUES ('a')")
    with pytest.raises(SandboxCommitError, match="invalid transaction id"):
        sandbox.prepare("bad id'; DROP TABLE items; --")
    with pytest.raises(SandboxCommitError, match="invalid transaction id"):
        sandbox.prepare("x" * 65)
    assert pg.prepared() == []
    assert sandbox.status is SandboxStatus.ACTIVE


@pg_mark
def test_pg_killed_after_prepare_then_apply_in_a_fresh_process_commits(pg: Pg) -> None:
    record = prepare_in_killed_process(
        pg.dsn, pg.root, "tx-kill-apply", "INSERT INTO items VALUES ('k')"
    )
    pg.sandbox_ids.append(record["sandbox_id"])
    gid = f"tx-kill-apply.{record['sandbox_id']}"
    assert pg.prepared() == [gid]  # the prepared transaction outlived its process
    assert pg.names() == []

    fresh = TransactionSandbox.reopen(record)
    fresh.use_credentials(pg.dsn)
    pg.track(fresh)
    result = fresh.apply_prepared("tx-kill-apply")

    assert result.metadata["gid"] == gid
    assert fresh.status is SandboxStatus.COMMITTED
    assert pg.names() == ["k"]
    assert pg.prepared() == []


@pg_mark
def test_pg_killed_after_prepare_then_abort_in_a_fresh_process_rolls_back(pg: Pg) -> None:
    record = prepare_in_killed_process(
        pg.dsn, pg.root, "tx-kill-abort", "INSERT INTO items VALUES ('k')"
    )
    pg.sandbox_ids.append(record["sandbox_id"])
    assert pg.prepared() == [f"tx-kill-abort.{record['sandbox_id']}"]

    fresh = TransactionSandbox.reopen(record)
    fresh.use_credentials(pg.dsn)
    pg.track(fresh)
    fresh.abort_prepared("tx-kill-abort")

    assert pg.prepared() == []
    assert pg.names() == []
    assert fresh.status is SandboxStatus.ACTIVE
    assert not fresh.commit_landed()


@pg_mark
def test_pg_server_without_prepared_transactions_refuses_before_replaying(noprep: Pg) -> None:
    sandbox = noprep.sandbox(timeout_seconds=1)
    sandbox.execute("INSERT INTO items VALUES ('a')")
    sandbox.close()  # the next use would replay the log
    # The application holds the table: a replay would wait for it (SandboxBusyError).
    with psycopg.connect(noprep.dsn) as app:
        app.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(TwoPhaseUnavailableError, match="max_prepared_transactions = 0") as err:
            sandbox.prepare("tx-noprep")
        app.rollback()
    assert "password=sandbox" not in str(err.value) and ":sandbox@" not in str(err.value)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert noprep.names() == []
    assert noprep.run("SELECT to_regclass('sandbox_commits') IS NULL") == [(True,)]
    # The sandbox is intact: the saga's one-shot commit still works.
    sandbox.commit()
    assert noprep.names() == ["a"]


@pg_mark
def test_pg_review_digest_is_stable_and_follows_the_statements(pg: Pg) -> None:
    pg.run("CREATE TABLE notes (txt TEXT)")
    made = []
    for value in ("b", "b", "c"):
        sandbox = pg.sandbox()
        sandbox.execute("INSERT INTO notes VALUES (%s)", ("a",))
        sandbox.execute("UPDATE notes SET txt = %s WHERE txt = %s", (value, "a"))
        made.append(sandbox)
    first, twin, other = made

    review = first.review()

    assert review.statements == 2 and review.changed == ["notes"]
    assert review.conflicts == []
    assert review.digest.startswith("sha256:") and len(review.digest) == 7 + 64
    assert first.review().digest == review.digest == twin.review().digest
    assert other.review().digest != review.digest
    fresh = TransactionSandbox.reopen(first.to_record())  # another process, same digest
    fresh.use_credentials(pg.dsn)
    first.close()
    assert fresh.review().digest == review.digest
    first.execute("INSERT INTO notes VALUES ('z')")
    assert first.review().digest != review.digest
    assert pg.run("SELECT count(*) FROM notes") == [(0,)]


@pg_mark
def test_pg_review_reports_a_conflict_from_a_dry_replay_and_keeps_no_lock(pg: Pg) -> None:
    sandbox = pg.sandbox(timeout_seconds=2)
    sandbox.execute("INSERT INTO items VALUES ('a')")
    sandbox.close()  # no live transaction: review replays the log
    pg.run("INSERT INTO items VALUES ('a')")  # the application takes the key

    review = sandbox.review()

    assert len(review.conflicts) == 1
    assert review.conflicts[0].startswith("statement 1: INSERT INTO items VALUES ('a')")
    assert "failed on replay" in review.conflicts[0]
    with psycopg.connect(pg.dsn, autocommit=True) as app, app.transaction():
        app.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE NOWAIT")  # nothing held
    assert pg.names() == ["a"]
    assert sandbox.status is SandboxStatus.ACTIVE


# -- SQLite ---------------------------------------------------------------------------------------


def sqlite_db(path: Path, journal: str) -> Path:
    connection = sqlite3.connect(path)
    connection.execute(f"PRAGMA journal_mode={journal}")
    connection.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    connection.commit()
    connection.close()
    return path


def names(path: Path) -> list[str]:
    connection = sqlite3.connect(path, timeout=5)
    try:
        return [row[0] for row in connection.execute("SELECT name FROM items ORDER BY name")]
    finally:
        connection.close()


def app_insert(path: Path, name: str, timeout: float = 0.2) -> None:
    connection = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        connection.execute("INSERT INTO items VALUES (?)", (name,))
    finally:
        connection.close()


@pytest.fixture
def made() -> Iterator[list[TransactionSandbox]]:
    sandboxes: list[TransactionSandbox] = []
    yield sandboxes
    for sandbox in sandboxes:
        sandbox.cleanup()


def sqlite_sandbox(
    made: list[TransactionSandbox], path: Path, root: Path, **options: Any
) -> TransactionSandbox:
    sandbox = TransactionSandbox("db", str(path), sandbox_root=str(root), **options)
    made.append(sandbox)
    sandbox.create("plan-2pc")
    return sandbox


@pytest.mark.parametrize("journal", JOURNALS)
def test_sqlite_prepare_holds_the_write_lock_and_apply_commits(
    made: list[TransactionSandbox], tmp_path: Path, journal: str
) -> None:
    path = sqlite_db(tmp_path / "app.db", journal)
    sandbox = sqlite_sandbox(made, path, tmp_path / "root")
    sandbox.execute("INSERT INTO items VALUES ('a')")
    assert sandbox.prepares_durably is False

    prepared = sandbox.prepare("tx-lite", "lite")

    assert prepared.details == {"backend": "sqlite", "held_in_process": True, "statements": 1}
    assert prepared.digest == sandbox.review().digest
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        app_insert(path, "app")  # another writer waits for the prepared commit
    assert names(path) == []  # readers are not blocked and see the old state
    assert not sandbox.commit_landed()

    result = sandbox.apply_prepared("tx-lite")

    assert result.metadata["txid"] == "tx-lite" and result.metadata["already_committed"] is False
    assert sandbox.status is SandboxStatus.COMMITTED
    assert names(path) == ["a"]
    app_insert(path, "app")  # the lock is gone
    assert names(path) == ["a", "app"]
    assert sandbox.commit_landed()


@pytest.mark.parametrize("journal", JOURNALS)
def test_sqlite_abort_releases_the_lock_and_changes_nothing(
    made: list[TransactionSandbox], tmp_path: Path, journal: str
) -> None:
    path = sqlite_db(tmp_path / "app.db", journal)
    sandbox = sqlite_sandbox(made, path, tmp_path / "root")
    sandbox.execute("INSERT INTO items VALUES ('a')")
    sandbox.prepare("tx-lite")
    with pytest.raises(SandboxStateError, match="prepared under tx-lite"):
        sandbox.execute("INSERT INTO items VALUES ('b')")

    sandbox.abort_prepared("tx-lite")
    sandbox.abort_prepared("tx-lite")

    app_insert(path, "app")
    assert names(path) == ["app"]
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.execute("INSERT INTO items VALUES ('b')")  # usable again, log kept
    sandbox.commit()
    assert names(path) == ["a", "app", "b"]


@pytest.mark.parametrize("journal", JOURNALS)
def test_sqlite_apply_in_a_fresh_process_after_a_crash_is_refused(
    made: list[TransactionSandbox], tmp_path: Path, journal: str
) -> None:
    """Nothing is held after the preparing process died: apply must not re-replay the log."""
    path = sqlite_db(tmp_path / "app.db", journal)
    record = prepare_in_killed_process(
        str(path), tmp_path / "root", "tx-lite-kill", "INSERT INTO items VALUES ('k')"
    )
    fresh = TransactionSandbox.reopen(record)
    made.append(fresh)

    assert not fresh.commit_landed()
    with pytest.raises(SandboxCommitError, match="only in the memory of the process"):
        fresh.apply_prepared("tx-lite-kill")

    assert fresh.status is SandboxStatus.ACTIVE
    assert names(path) == []
    app_insert(path, "app")  # the dead process's lock went with it
    fresh.abort_prepared("tx-lite-kill")  # safe when nothing is held
    assert names(path) == ["app"]


def test_sqlite_apply_in_a_fresh_process_after_the_commit_landed_returns_it(
    made: list[TransactionSandbox], tmp_path: Path
) -> None:
    path = sqlite_db(tmp_path / "app.db", "wal")
    sandbox = sqlite_sandbox(made, path, tmp_path / "root")
    sandbox.execute("INSERT INTO items VALUES ('a')")
    record = sandbox.to_record()  # saved before apply: the process died before saving again
    sandbox.prepare("tx-landed")
    sandbox.apply_prepared("tx-landed")

    fresh = TransactionSandbox.reopen(record)
    result = fresh.apply_prepared("tx-landed")

    assert result.metadata["already_committed"] is True
    assert fresh.status is SandboxStatus.COMMITTED
    assert names(path) == ["a"]


def test_sqlite_one_shot_commit_waits_for_the_prepared_commit(
    made: list[TransactionSandbox], tmp_path: Path
) -> None:
    path = sqlite_db(tmp_path / "app.db", "wal")
    sandbox = sqlite_sandbox(made, path, tmp_path / "root")
    sandbox.execute("INSERT INTO items VALUES ('a')")
    sandbox.prepare("tx-1")
    with pytest.raises(SandboxStateError, match="prepared under tx-1"):
        sandbox.commit()
    with pytest.raises(SandboxStateError, match="prepared under tx-1"):
        sandbox.prepare("tx-2")
    assert sandbox.status is SandboxStatus.ACTIVE
    assert sandbox.prepare("tx-1").txid == "tx-1"  # same txid: same answer
    sandbox.close()  # a SQLite prepared commit lives in this process only
    app_insert(path, "app")
    assert names(path) == ["app"]


@pytest.mark.parametrize("journal", JOURNALS)
def test_sqlite_review_digest_and_dry_replay_conflict(
    made: list[TransactionSandbox], tmp_path: Path, journal: str
) -> None:
    path = sqlite_db(tmp_path / "app.db", journal)
    root = tmp_path / "root"
    first = sqlite_sandbox(made, path, root)
    twin = sqlite_sandbox(made, path, root)
    other = sqlite_sandbox(made, path, root)
    for sandbox, value in ((first, "a"), (twin, "a"), (other, "b")):
        sandbox.execute("INSERT INTO items VALUES (?)", (value,))

    review = first.review()

    assert review.statements == 1 and review.changed == ["items"] and review.conflicts == []
    assert review.digest == first.review().digest == twin.review().digest
    assert other.review().digest != review.digest

    app_insert(path, "a")
    conflicted = first.review()

    assert conflicted.digest == review.digest  # the changes are the same; they now conflict
    assert conflicted.conflicts[0].startswith("statement 1: INSERT INTO items VALUES (?)")
    app_insert(path, "c", timeout=0)  # the dry replay kept no lock
    assert names(path) == ["a", "c"]
    with pytest.raises(SandboxCommitError):
        first.prepare("tx-conflict")  # the same divergence refuses prepare; nothing held
    app_insert(path, "d", timeout=0)


def test_sqlite_prepare_waits_for_another_writer_then_reports_busy(
    made: list[TransactionSandbox], tmp_path: Path
) -> None:
    path = sqlite_db(tmp_path / "app.db", "delete")
    sandbox = sqlite_sandbox(made, path, tmp_path / "root", timeout_seconds=0.5)
    sandbox.execute("INSERT INTO items VALUES ('a')")
    app = sqlite3.connect(path, isolation_level=None)
    try:
        app.execute("BEGIN IMMEDIATE")
        with pytest.raises(SandboxBusyError):
            sandbox.prepare("tx-busy")
    finally:
        app.execute("ROLLBACK")
        app.close()
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.prepare("tx-busy")
    sandbox.apply_prepared("tx-busy")
    assert names(path) == ["a"]


@pg_mark
def test_pg_two_sandboxes_of_one_database_prepare_in_one_plan_without_a_bookkeeping_table(
    pg: Pg,
) -> None:
    """The bookkeeping table is created before PREPARE, so a second sandbox of the same
    database does not wait on the first one's prepared CREATE TABLE (found in tier 2)."""
    from sandbox_core.plan.journal import MemoryCommitJournal
    from sandbox_core.plan.two_phase import TwoPhasePlanCommit

    assert pg.run("SELECT to_regclass('sandbox_commits') IS NULL") == [(True,)]
    first, second = pg.sandbox(timeout_seconds=3), pg.sandbox(timeout_seconds=3)
    first.execute("INSERT INTO items VALUES ('a')")
    second.execute("INSERT INTO items VALUES ('b')")

    results = TwoPhasePlanCommit(MemoryCommitJournal()).run("plan-2pc", [first, second])

    assert [r.success for r in results] == [True, True]
    assert pg.names() == ["a", "b"]
    assert pg.prepared() == []
