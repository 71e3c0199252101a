"""Step definitions for features/transaction/transaction.feature (seed 002, TransactionSandbox).

Scenarios run on a SQLite file in tmp_path or on a fresh schema of the real PostgreSQL server
(fixture ``postgres_schema_dsn``, requested only by PostgreSQL scenarios). "The original" is read
through a separate connection, so isolation is checked the way another client would see it.
Restart scenarios run ``txn_child.py`` in separate processes that die with their transaction open.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
import pytest
from pytest_bdd import given, parsers, then, when
from ulid import ULID

from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxReplayDivergedError,
    SandboxStateError,
)
from sandbox_core.host.store import SandboxStore
from sandbox_core.protocol import Sandbox
from sandbox_core.redaction import redact, secrets_of
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import (
    STATEMENT_LOG,
    SandboxStatementError,
    TransactionSandbox,
)
from sandbox_core.strategies.transaction import db as _db
from tests.support.postgres import postgres_dsn, postgres_schema_dsn  # noqa: F401 - fixtures

CHILD = Path(__file__).with_name("txn_child.py")


def _cleanup_all(world: dict[str, Any]) -> None:
    for patch in world["patches"]:
        patch.stop()
    world["patches"].clear()
    for sandbox in world["sandboxes"]:
        sandbox.cleanup()


@pytest.fixture
def txn(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Scenario state; every sandbox made here is cleaned up at teardown."""
    world: dict[str, Any] = {
        "tmp": tmp_path,
        "root": tmp_path / "sandboxes",
        "state_dir": tmp_path / "state",
        "sandboxes": [],
        "error": None,
        "patches": [],
    }
    yield world
    _cleanup_all(world)


def original_rows(world: dict[str, Any], table: str) -> list[str]:
    """Names in ``table`` as a separate client sees them."""
    sql = f"SELECT name FROM {table} ORDER BY name"  # noqa: S608 - test table name
    if world["backend"] == "sqlite":
        conn = sqlite3.connect(world["original"])
        try:
            return [row[0] for row in conn.execute(sql)]
        finally:
            conn.close()
    with psycopg.connect(world["original"]) as pg:
        return [row[0] for row in pg.execute(sql)]


def _track(world: dict[str, Any], sandbox: TransactionSandbox) -> TransactionSandbox:
    world["sandboxes"].append(sandbox)
    world["sandbox"] = sandbox
    return sandbox


def _attempt(world: dict[str, Any], action: Any) -> None:
    try:
        world["result"] = action()
    except (ValueError, SandboxError) as exc:
        world["error"] = exc


def _child(world: dict[str, Any], **spec: Any) -> dict[str, Any]:
    # The password goes through libpq's environment, never through process arguments; the
    # child sees the redacted DSN, as a process reopening a stored record does.
    env = dict(os.environ)
    secrets = secrets_of(world["original"])
    if secrets:
        env["PGPASSWORD"] = secrets[0]
    spec.update(
        original=redact(world["original"]),
        sandbox_root=str(world["root"]),
        state_dir=str(world["state_dir"]),
        placeholder=world["placeholder"],
    )
    done = subprocess.run(
        [sys.executable, str(CHILD), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    reply: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reply


# -- given ---------------------------------------------------------------------------------------


@given(parsers.parse('a txn {backend} database with an empty "{table}" table'))
def _database(
    txn: dict[str, Any], request: pytest.FixtureRequest, backend: str, table: str
) -> None:
    ddl = f"CREATE TABLE {table} (name TEXT NOT NULL)"
    if backend == "SQLite":
        path = txn["tmp"] / "original.db"
        conn = sqlite3.connect(path)
        conn.execute(ddl)
        conn.commit()
        conn.close()
        txn.update(backend="sqlite", original=str(path), placeholder="?")
    else:
        assert backend == "PostgreSQL", backend
        dsn = request.getfixturevalue("postgres_schema_dsn")
        # Runs before the schema is dropped: open sandbox transactions would block the drop.
        request.addfinalizer(lambda: _cleanup_all(txn))
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute(ddl)
        txn.update(backend="postgresql", original=dsn, placeholder="%s")


@given(parsers.parse('a txn plain file "{name}" containing "{content}"'))
def _plain_file(txn: dict[str, Any], name: str, content: str) -> None:
    (txn["tmp"] / name).write_text(content)


# -- when: creation ------------------------------------------------------------------------------


@when(parsers.parse('a txn sandbox is created for plan "{plan_id}"'))
def _create(txn: dict[str, Any], plan_id: str) -> None:
    _track(txn, TransactionSandbox("res-001", txn["original"], sandbox_root=str(txn["root"])))
    txn["sandbox"].create(plan_id)


@when(parsers.parse('a txn sandbox is created on "{original}" for plan "{plan_id}"'))
def _create_on(txn: dict[str, Any], original: str, plan_id: str) -> None:
    if "://" not in original and original != ":memory:":
        original = str(txn["tmp"] / original)
    sandbox = _track(txn, TransactionSandbox("res-001", original, sandbox_root=str(txn["root"])))
    _attempt(txn, lambda: sandbox.create(plan_id))


@when(parsers.parse('a txn sandbox is created through a sqlite URL for plan "{plan_id}"'))
def _create_url(txn: dict[str, Any], plan_id: str) -> None:
    url = f"sqlite:///{txn['original']}"
    _track(txn, TransactionSandbox("res-001", url, sandbox_root=str(txn["root"])))
    txn["sandbox"].create(plan_id)


@when("a txn sandbox is created with empty plan_id")
def _create_empty_plan(txn: dict[str, Any]) -> None:
    sandbox = _track(txn, TransactionSandbox("res-001", txn["original"]))
    _attempt(txn, lambda: sandbox.create(""))


@when("a txn sandbox is prepared with empty resource_id")
def _prepare_empty_resource(txn: dict[str, Any]) -> None:
    _attempt(txn, lambda: TransactionSandbox("", txn["original"]))


@when("a txn sandbox is prepared with empty original_path")
def _prepare_empty_original(txn: dict[str, Any]) -> None:
    _attempt(txn, lambda: TransactionSandbox("res-001", ""))


@when("a txn sandbox is instantiated")
def _instantiate(txn: dict[str, Any]) -> None:
    _track(txn, TransactionSandbox("res-001", txn["original"], sandbox_root=str(txn["root"])))


# -- when: statements, paths, lifecycle ----------------------------------------------------------


@when(parsers.parse('txn row "{name}" is inserted through the sandbox'))
def _insert(txn: dict[str, Any], name: str) -> None:
    sql = f"INSERT INTO items (name) VALUES ({txn['placeholder']})"  # noqa: S608
    txn["sandbox"].execute(sql, (name,))


@when("a txn NULL row is inserted through the sandbox")
def _insert_null(txn: dict[str, Any]) -> None:
    sql = f"INSERT INTO items (name) VALUES ({txn['placeholder']})"  # noqa: S608
    _attempt(txn, lambda: txn["sandbox"].execute(sql, (None,)))


@when(parsers.parse('the txn statement "{sql}" is attempted through the sandbox'))
def _statement_attempt(txn: dict[str, Any], sql: str) -> None:
    _attempt(txn, lambda: txn["sandbox"].execute(sql))


@when(parsers.parse('the txn path "{path}" is resolved'))
def _resolve(txn: dict[str, Any], path: str) -> None:
    _attempt(txn, lambda: txn["sandbox"].get_path(path))


@when("the txn sandbox is committed")
def _commit(txn: dict[str, Any]) -> None:
    txn["commit"] = txn["sandbox"].commit()


@when(parsers.parse('the txn sandbox is committed with message "{message}"'))
def _commit_message(txn: dict[str, Any], message: str) -> None:
    txn["commit"] = txn["sandbox"].commit(message)


@when("the txn sandbox commit is attempted")
def _commit_attempt(txn: dict[str, Any]) -> None:
    _attempt(txn, lambda: txn["sandbox"].commit())


@when("the txn COMMIT statement is made to fail")
def _fail_commit(txn: dict[str, Any]) -> None:
    real = _db.Connection.execute

    def failing(self: _db.Connection, sql: str, params: Any = None) -> Any:
        if sql == "COMMIT":
            raise _db.DatabaseError("injected: COMMIT failed")
        return real(self, sql, params)

    patch = mock.patch.object(_db.Connection, "execute", failing)
    patch.start()
    txn["patches"].append(patch)


@when("the txn sandbox is rolled back")
def _rollback(txn: dict[str, Any]) -> None:
    txn["sandbox"].rollback()


@when("the txn sandbox rollback is attempted")
def _rollback_attempt(txn: dict[str, Any]) -> None:
    _attempt(txn, lambda: txn["sandbox"].rollback())


@when("the txn sandbox is cleaned up")
def _cleanup(txn: dict[str, Any]) -> None:
    txn["scratch"] = Path(txn["sandbox"].context.sandbox_path)
    txn["sandbox"].cleanup()


# -- when: other processes -----------------------------------------------------------------------


@when(
    parsers.parse(
        'a txn child process creates a sandbox for plan "{plan_id}" inserting "{name}" and dies'
    )
)
def _child_create(txn: dict[str, Any], plan_id: str, name: str) -> None:
    reply = _child(txn, action="create", plan_id=plan_id, rows=[name])
    txn["sandbox_id"] = reply["sandbox_id"]


@when(parsers.parse('a txn child process reopens the sandbox, inserts "{name}" and commits'))
def _child_commit(txn: dict[str, Any], name: str) -> None:
    txn["child"] = _child(txn, action="commit", sandbox_id=txn["sandbox_id"], rows=[name])


@when("a txn child process reopens the sandbox, commits and dies before saving its status")
def _child_commit_dies(txn: dict[str, Any]) -> None:
    txn["child"] = _child(
        txn, action="commit", sandbox_id=txn["sandbox_id"], rows=[], die_after_commit=True
    )


@when("the txn stored sandbox is reopened here")
def _reopen_here(txn: dict[str, Any]) -> None:
    record = SandboxStore(txn["state_dir"]).load(txn["sandbox_id"])
    assert secrets_of(record["original_path"]) == ()  # stored redacted
    sandbox = _track(txn, TransactionSandbox.reopen(record))
    if txn["backend"] == "postgresql":
        sandbox.use_credentials(txn["original"])  # the record keeps no password


# -- then ----------------------------------------------------------------------------------------


@then(parsers.parse('the txn sandbox should be in the "{state}" state'))
def _state(txn: dict[str, Any], state: str) -> None:
    assert txn["sandbox"].status is SandboxStatus(state)


@then(parsers.parse('the txn sandbox context should reference plan "{plan_id}"'))
def _context_plan(txn: dict[str, Any], plan_id: str) -> None:
    assert txn["sandbox"].context.plan_id == plan_id


@then(parsers.parse('the txn sandbox context should have strategy metadata "{strategy}"'))
def _context_strategy(txn: dict[str, Any], strategy: str) -> None:
    assert txn["sandbox"].context.metadata["strategy"] == strategy


@then(parsers.parse('the txn sandbox context should have backend metadata "{backend}"'))
def _context_backend(txn: dict[str, Any], backend: str) -> None:
    metadata = txn["sandbox"].context.metadata
    assert metadata["backend"] == backend
    assert "sandbox:sandbox@" not in metadata["database"]  # the DSN password is redacted


@then("the txn statement log should exist and be empty")
def _log_empty(txn: dict[str, Any]) -> None:
    log = Path(txn["sandbox"].context.sandbox_path) / STATEMENT_LOG
    assert log.is_file()
    assert log.read_text() == ""
    assert log.parent == txn["root"] / "txn" / txn["sandbox"].sandbox_id


@then(parsers.parse("the txn statement log should hold {count:d} statements"))
def _log_count(txn: dict[str, Any], count: int) -> None:
    assert len(txn["sandbox"].statements()) == count


@then(parsers.parse('a txn ValueError should be raised with message "{message}"'))
def _value_error(txn: dict[str, Any], message: str) -> None:
    assert type(txn["error"]) is ValueError
    assert str(txn["error"]) == message


@then(parsers.parse('a txn SandboxCreationError should be raised mentioning "{text}"'))
def _creation_error(txn: dict[str, Any], text: str) -> None:
    assert isinstance(txn["error"], SandboxCreationError), txn["error"]
    assert text in str(txn["error"])


@then(parsers.parse('the txn error should not mention "{text}"'))
def _error_hides(txn: dict[str, Any], text: str) -> None:
    assert text not in str(txn["error"])


@then(parsers.parse('the txn file "{name}" should not exist'))
def _file_absent(txn: dict[str, Any], name: str) -> None:
    assert not (txn["tmp"] / name).exists()


@then("a txn SandboxStateError should be raised")
def _state_error(txn: dict[str, Any]) -> None:
    assert isinstance(txn["error"], SandboxStateError), txn["error"]


@then(parsers.parse('a txn SandboxStateError should be raised mentioning "{text}"'))
def _state_error_text(txn: dict[str, Any], text: str) -> None:
    assert isinstance(txn["error"], SandboxStateError), txn["error"]
    assert text in str(txn["error"])


@then("a txn SandboxCommitError should be raised")
def _commit_error(txn: dict[str, Any]) -> None:
    assert isinstance(txn["error"], SandboxCommitError), txn["error"]


@then("a txn SandboxStatementError should be raised for a constraint")
def _statement_error_constraint(txn: dict[str, Any]) -> None:
    assert isinstance(txn["error"], SandboxStatementError), txn["error"]
    assert txn["error"].integrity is True
    assert "null" in str(txn["error"]).lower()


@then(parsers.parse('a txn SandboxStatementError should be raised mentioning "{text}"'))
def _statement_error_text(txn: dict[str, Any], text: str) -> None:
    assert isinstance(txn["error"], SandboxStatementError), txn["error"]
    assert text in str(txn["error"])


@then("the txn resolved path should be inside the scratch directory")
def _resolved_inside(txn: dict[str, Any]) -> None:
    scratch = Path(txn["sandbox"].context.sandbox_path)
    assert txn["result"] == str(scratch / "exports" / "report.csv")
    assert scratch.parent == txn["root"] / "txn"


@then(parsers.parse('the txn sandbox should read "{names}" from "{table}"'))
def _sandbox_reads(txn: dict[str, Any], names: str, table: str) -> None:
    rows = txn["sandbox"].execute(f"SELECT name FROM {table} ORDER BY name")  # noqa: S608
    assert [row[0] for row in rows] == [n for n in names.split(",") if n]


@then(parsers.parse('the txn sandbox should read nothing from "{table}"'))
def _sandbox_reads_nothing(txn: dict[str, Any], table: str) -> None:
    assert txn["sandbox"].execute(f"SELECT name FROM {table}") == []  # noqa: S608


@then(parsers.parse('the txn original "{table}" table should be empty'))
def _original_empty(txn: dict[str, Any], table: str) -> None:
    assert original_rows(txn, table) == []


@then(parsers.parse('the txn original "{table}" table should hold "{names}"'))
def _original_holds(txn: dict[str, Any], table: str, names: str) -> None:
    assert original_rows(txn, table) == names.split(",")


@then("the txn commit result should indicate success")
def _commit_success(txn: dict[str, Any]) -> None:
    assert txn["commit"].success is True
    assert txn["commit"].sandbox_id == txn["sandbox"].sandbox_id
    assert txn["commit"].metadata["strategy"] == "transaction_rollback"


@then(parsers.parse("the txn commit result should count {count:d} statements"))
def _commit_count(txn: dict[str, Any], count: int) -> None:
    assert txn["commit"].metadata["statements"] == count


@then(parsers.parse('the txn commit metadata should contain message "{message}"'))
def _commit_message_meta(txn: dict[str, Any], message: str) -> None:
    assert txn["commit"].metadata["message"] == message


@then("the txn commit result should say it was already committed")
def _already(txn: dict[str, Any]) -> None:
    assert txn["commit"].metadata["already_committed"] is True


@then("the txn commit should have landed")
def _landed(txn: dict[str, Any]) -> None:
    assert txn["sandbox"].commit_landed() is True


@then("the txn commit should not have landed")
def _not_landed(txn: dict[str, Any]) -> None:
    for patch in txn["patches"]:
        patch.stop()
    txn["patches"].clear()
    assert txn["sandbox"].commit_landed() is False


@then("the txn scratch directory should not exist")
def _scratch_gone(txn: dict[str, Any]) -> None:
    assert not txn["scratch"].exists()


@then(parsers.parse('the txn child process should have read "{names}" before its insert'))
def _child_read(txn: dict[str, Any], names: str) -> None:
    assert txn["child"]["seen"] == names.split(",")


@then(parsers.parse('the txn stored sandbox should be in the "{state}" state'))
def _stored_state(txn: dict[str, Any], state: str) -> None:
    record = SandboxStore(txn["state_dir"]).load(txn["sandbox_id"])
    assert record["status"] == state


@then("the txn sandbox_id should be a valid ULID")
def _ulid(txn: dict[str, Any]) -> None:
    sandbox_id = txn["sandbox"].sandbox_id
    assert str(ULID.from_str(sandbox_id)) == sandbox_id
    assert len(sandbox_id) == 26


@then(parsers.parse('the txn sandbox status should be "{state}"'))
def _status(txn: dict[str, Any], state: str) -> None:
    assert txn["sandbox"].status is SandboxStatus(state)


@then("the txn sandbox context should be None")
def _context_none(txn: dict[str, Any]) -> None:
    assert txn["sandbox"].context is None


@then("the txn sandbox should satisfy the Sandbox protocol without being rollbackable")
def _protocol(txn: dict[str, Any]) -> None:
    assert isinstance(txn["sandbox"], Sandbox)
    assert txn["sandbox"].rollbackable is False


# -- living next to the application (cases 31 and 32) --------------------------------------------

APP_TIMEOUT_SECONDS = 0.5


def _app_run(world: dict[str, Any], sql: str, params: tuple[Any, ...] = ()) -> None:
    """One autocommit statement as the application, giving up after APP_TIMEOUT_SECONDS."""
    if world["backend"] == "sqlite":
        conn = sqlite3.connect(world["original"], isolation_level=None, timeout=APP_TIMEOUT_SECONDS)
        try:
            conn.execute(sql, params)
        finally:
            conn.close()
        return
    with psycopg.connect(world["original"], autocommit=True) as pg:
        pg.execute(f"SET lock_timeout = {int(APP_TIMEOUT_SECONDS * 1000)}")
        pg.execute(sql.replace("?", "%s"), params)


@given(parsers.parse('the txn database journal mode is "{mode}"'))
def _journal_mode(txn: dict[str, Any], mode: str) -> None:
    if txn["backend"] != "sqlite":
        return
    conn = sqlite3.connect(txn["original"], isolation_level=None)
    try:
        assert conn.execute(f"PRAGMA journal_mode={mode}").fetchone()[0] == mode
    finally:
        conn.close()


@given(parsers.parse('a txn {backend} database with a "parent" table with generated ids'))
def _parent_database(txn: dict[str, Any], request: pytest.FixtureRequest, backend: str) -> None:
    _database(txn, request, backend, "seed")
    column = "id INTEGER PRIMARY KEY" if txn["backend"] == "sqlite" else "id serial PRIMARY KEY"
    _app_run(txn, f"CREATE TABLE parent ({column}, name TEXT NOT NULL)")


@when(parsers.parse('the txn sandbox reads "{table}"'))
def _sandbox_reads_table(txn: dict[str, Any], table: str) -> None:
    txn["sandbox"].execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - test table name


@when(parsers.parse('the txn application inserts "{name}" without waiting'))
def _app_inserts(txn: dict[str, Any], name: str) -> None:
    _app_run(txn, "INSERT INTO items (name) VALUES (?)", (name,))


@when(parsers.parse('the txn sandbox inserts parent "{name}" and sees id {expected:d}'))
def _sandbox_inserts_parent(txn: dict[str, Any], name: str, expected: int) -> None:
    p = txn["placeholder"]
    rows = txn["sandbox"].execute(
        f"INSERT INTO parent (name) VALUES ({p}) RETURNING id",  # noqa: S608 - placeholder
        (name,),
    )
    assert rows == [(expected,)]


@when("the txn sandbox is closed")
def _close(txn: dict[str, Any]) -> None:
    txn["sandbox"].close()


@when(parsers.parse('the txn application inserts parent "{name}"'))
def _app_inserts_parent(txn: dict[str, Any], name: str) -> None:
    _app_run(txn, "INSERT INTO parent (name) VALUES (?)", (name,))


@then(parsers.parse("a txn SandboxReplayDivergedError should be raised naming statement {n:d}"))
def _diverged(txn: dict[str, Any], n: int) -> None:
    assert isinstance(txn["error"], SandboxReplayDivergedError), txn["error"]
    assert txn["error"].statement == n
    assert "database is unchanged" in str(txn["error"])
