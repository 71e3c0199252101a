"""A PostgreSQL connection the server closed is replaced and replayed transparently; a server that
is gone is a ``SandboxConnectionError``, never a refused statement (issue 7, §3).

Real server throughout: ``pg_terminate_backend`` from a second connection, a short
``idle_in_transaction_session_timeout``, and a TCP proxy (tests/support/tcpproxy.py) cut and
restored to play "the server died" and "the server restarted" without stopping the shared server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sandbox_core.errors import (
    SandboxConnectionError,
    SandboxError,
    SandboxRetryableError,
    SandboxStatementError,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.transaction import TransactionSandbox
from sandbox_core.strategies.transaction import db as _db
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.postgres


@pytest.fixture
def proxy(dsn: str) -> Iterator[TcpProxy]:
    fields = conninfo_to_dict(dsn)
    with TcpProxy(str(fields.get("host", "127.0.0.1")), int(fields.get("port", 5432))) as cut:
        yield cut


def new_sandbox(
    made: list[TransactionSandbox], dsn: str, tmp_path: Path, **options: object
) -> TransactionSandbox:
    sandbox = TransactionSandbox("db", dsn, sandbox_root=str(tmp_path), **options)
    made.append(sandbox)
    sandbox.create("plan")
    return sandbox


def names(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM items ORDER BY name")]


def terminate(dsn: str, sandbox: TransactionSandbox) -> int:
    pid = int(sandbox.execute("SELECT pg_backend_pid()")[0][0])
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return pid


def test_pg_terminate_backend_before_commit_is_replayed_transparently(
    made: list[TransactionSandbox], dsn: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, dsn, tmp_path)
    sandbox.execute("INSERT INTO items VALUES ('a'), ('b')")
    terminate(dsn, sandbox)
    result = sandbox.commit()
    assert result.metadata["statements"] == 1
    assert names(dsn) == ["a", "b"]


def test_pg_terminate_backend_before_a_read_is_replayed_transparently(
    made: list[TransactionSandbox], dsn: str, tmp_path: Path
) -> None:
    sandbox = new_sandbox(made, dsn, tmp_path)
    sandbox.execute("INSERT INTO items VALUES ('a')")
    old = terminate(dsn, sandbox)
    assert sandbox.execute("SELECT name, pg_backend_pid() <> %s FROM items", (old,)) == [
        ("a", True)
    ]
    sandbox.commit()
    assert names(dsn) == ["a"]


def test_idle_in_transaction_timeout_is_replayed_transparently(
    made: list[TransactionSandbox], dsn: str, tmp_path: Path
) -> None:
    fields = conninfo_to_dict(dsn)
    options = f"{fields.get('options', '')} -c idle_in_transaction_session_timeout=300".strip()
    short = make_conninfo(dsn, options=options)
    sandbox = new_sandbox(made, short, tmp_path)
    sandbox.execute("INSERT INTO items VALUES ('a')")
    time.sleep(0.8)  # the server ends the idle transaction and closes the connection
    sandbox.execute("INSERT INTO items VALUES ('b')")
    time.sleep(0.8)
    assert sandbox.execute("SELECT name FROM items ORDER BY name") == [("a",), ("b",)]
    time.sleep(0.8)
    sandbox.commit()
    assert names(dsn) == ["a", "b"]


def test_losing_the_server_is_a_connection_error_and_a_restart_is_transparent(
    made: list[TransactionSandbox], dsn: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    via_proxy = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
    sandbox = new_sandbox(made, via_proxy, tmp_path, timeout_seconds=1)
    sandbox.execute("INSERT INTO items VALUES ('a')")
    proxy.stop()  # the server is gone: connections cut, new ones refused
    started = time.monotonic()
    with pytest.raises(SandboxConnectionError, match="cannot reach database") as caught:
        sandbox.execute("INSERT INTO items VALUES ('b')")
    assert time.monotonic() - started < 10
    assert isinstance(caught.value, SandboxError)
    assert isinstance(caught.value, SandboxRetryableError)
    assert not isinstance(caught.value, SandboxStatementError)  # not a "refused statement"
    assert sandbox.status is SandboxStatus.ACTIVE
    with pytest.raises(SandboxConnectionError):
        sandbox.commit()
    assert sandbox.status is SandboxStatus.ACTIVE  # not ERRORED: commit later
    with pytest.raises(SandboxConnectionError):
        sandbox.commit_landed()
    proxy.start()  # the server is back (a restart): the log is replayed into a new transaction
    sandbox.execute("INSERT INTO items VALUES ('b')")
    assert [len(sandbox.statements()), names(dsn)] == [2, []]
    sandbox.commit()
    assert names(dsn) == ["a", "b"]


def test_a_server_restart_between_statements_is_transparent(
    made: list[TransactionSandbox], dsn: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    via_proxy = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
    sandbox = new_sandbox(made, via_proxy, tmp_path, timeout_seconds=3)
    sandbox.execute("INSERT INTO items VALUES ('a')")
    proxy.stop()
    proxy.start()
    sandbox.execute("INSERT INTO items VALUES ('b')")
    proxy.stop()
    proxy.start()
    sandbox.commit()
    assert names(dsn) == ["a", "b"]


def test_a_commit_whose_reply_is_lost_with_the_server_settles_on_the_next_commit(
    made: list[TransactionSandbox], dsn: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    via_proxy = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
    sandbox = new_sandbox(made, via_proxy, tmp_path, timeout_seconds=1)
    sandbox.execute("INSERT INTO items VALUES ('a')")
    # Commit lands, then the server "dies" before anyone can read the marker back.
    real_settle = TransactionSandbox._settle

    def cut_before_settle(self: TransactionSandbox, marker: object, exc: Exception) -> object:
        proxy.stop()
        return real_settle(self, marker, exc)  # type: ignore[arg-type]

    real_execute = _db.Connection.execute

    def commit_then_lose(self: _db.Connection, sql: str, params: object = None) -> object:
        result = real_execute(self, sql, params)  # type: ignore[arg-type]
        if sql == "COMMIT":
            raise _db.DatabaseError("server closed the connection", connection_lost=True)
        return result

    with (
        mock.patch.object(_db.Connection, "execute", commit_then_lose),
        mock.patch.object(TransactionSandbox, "_settle", cut_before_settle),
        pytest.raises(SandboxConnectionError),
    ):
        sandbox.commit()
    assert sandbox.status is SandboxStatus.ACTIVE  # outcome unknown: not ERRORED
    assert names(dsn) == ["a"]  # it did land
    proxy.start()
    result = sandbox.commit()  # finds the marker first: never applied twice
    assert result.metadata["already_committed"] is True
    assert sandbox.status is SandboxStatus.COMMITTED
    assert names(dsn) == ["a"]
