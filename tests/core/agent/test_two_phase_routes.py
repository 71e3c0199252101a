"""The workspace agent's two-phase routes and the pod executor's handle over them (issue 9),
on a real agent process on 127.0.0.1 with real git repositories, SQLite files and the real
PostgreSQL: review, prepare, apply-prepared and abort-prepared as the coordinator drives them
through :class:`RemoteSandbox`, idempotent by request id and by transaction id, across an agent
restart, and the agent's refusals raised as the core errors they stand for (conflicts carried).
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sandbox_operator.executors.agent_client import AgentRefused
from sandbox_operator.executors.base import SandboxHandle, SandboxTarget
from sandbox_operator.executors.remote import RemoteSandbox

from sandbox_core import SandboxFactory, SandboxStatus, SandboxStore
from sandbox_core.agent import wire
from sandbox_core.errors import SandboxCommitError, SandboxError, SandboxStateError
from tests.support.agent import SANDBOX_ID, UID, AgentProcess
from tests.support.gitrepo import git, make_repo

TXID = "plan-a.1"


class DirectExecutor:
    """The pod executor's ``call`` without the Pod lookup: straight to the agent process."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent

    def call(
        self,
        target: SandboxTarget,
        method: str,
        path: str,
        body: dict[str, Any] | bytes | None = None,
        *,
        query: dict[str, str] | None = None,
        request_id: str = "",
    ) -> dict[str, Any]:
        return self.agent.client().call(method, path, body, query=query, request_id=request_id)


def handle(agent: AgentProcess, strategy: str, sandbox_id: str = SANDBOX_ID) -> RemoteSandbox:
    """A fresh pod handle (status read now), as the coordinator opens one."""
    target = SandboxTarget(
        name="s", namespace="ns", uid=UID, sandbox_id=sandbox_id, plan_id="plan-a",
        resource_id="r", strategy=strategy, original="",
    )  # fmt: skip
    executor = DirectExecutor(agent)
    reply = executor.call(target, "GET", f"/v1/sandboxes/{sandbox_id}")
    return RemoteSandbox(executor, target, reply)  # type: ignore[arg-type]  # duck-typed executor


def create(agent: AgentProcess, strategy: str, original: str, sandbox_id: str = SANDBOX_ID) -> None:
    body = {
        "plan_id": "plan-a", "resource_id": "r", "strategy": strategy, "original": original,
        "sandbox_id": sandbox_id,
    }  # fmt: skip
    agent.client().call("POST", "/v1/sandboxes", body, request_id=f"create-{sandbox_id}")
    agent.client().call(
        "POST", f"/v1/sandboxes/{sandbox_id}/activate", request_id=f"act-{sandbox_id}"
    )


def write_statement(agent: AgentProcess, sql: str, dsn: str, sandbox_id: str = SANDBOX_ID) -> None:
    """An actor's write through the sandbox, in another process of the Pod (the agent's state
    directory; as ``e2e/test_two_phase.py`` does with ``kubectl exec``)."""
    record = SandboxStore(str(agent.work / "state")).load(sandbox_id)
    sandbox: Any = SandboxFactory().reopen(record)
    sandbox.use_credentials(dsn)
    sandbox.execute(sql)
    sandbox.close()


@pytest.fixture
def sqlite_agent(tmp_path: Path) -> Iterator[tuple[AgentProcess, Path]]:
    database = tmp_path / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": f"sqlite:///{database}"}).start()
    yield agent, database
    agent.stop()


def rows(database: Path) -> list[str]:
    with sqlite3.connect(database) as connection:
        return [r[0] for r in connection.execute("SELECT body FROM notes")]


def test_the_pod_handle_is_a_sandbox_handle_with_the_two_phase_members(
    sqlite_agent: tuple[AgentProcess, Path],
) -> None:
    agent, _ = sqlite_agent
    create(agent, "transaction_rollback", "env:SANDBOX_SOURCE_DSN")
    remote = handle(agent, "transaction_rollback")
    assert isinstance(remote, SandboxHandle)
    assert remote.prepares_durably is False  # SQLite: only the last resource


def test_sqlite_last_resource_is_held_by_the_agent_between_prepare_and_apply(
    sqlite_agent: tuple[AgentProcess, Path],
) -> None:
    agent, database = sqlite_agent
    dsn = f"sqlite:///{database}"
    create(agent, "transaction_rollback", "env:SANDBOX_SOURCE_DSN")
    write_statement(agent, "INSERT INTO notes (body) VALUES ('one')", dsn)
    remote = handle(agent, "transaction_rollback")
    summary = remote.review()
    assert summary.statements == 1 and summary.changed == ["notes"]
    assert summary.digest.startswith("sha256:") and summary.conflicts == []
    prepared = remote.prepare(TXID, "m")
    assert prepared.txid == TXID and prepared.digest == summary.digest
    assert remote.status is SandboxStatus.ACTIVE  # prepare never changes the status
    assert rows(database) == []  # nothing applied yet
    # A retried prepare (lost reply) with the same state seen is a replay, not a second prepare.
    again = RemoteSandbox(remote._executor, remote._target, dict(reply_before_prepare(remote)))
    assert again.prepare(TXID, "m") == prepared
    assert handle(agent, "transaction_rollback").commit_landed() is False
    result = handle(agent, "transaction_rollback").apply_prepared(TXID)
    assert result.success and result.metadata["txid"] == TXID
    assert rows(database) == ["one"]
    assert handle(agent, "transaction_rollback").commit_landed() is True  # the marker row
    # apply is idempotent per txid: a repeat (a fresh handle, a retry) returns the same result.
    repeat = handle(agent, "transaction_rollback")
    assert repeat.status is SandboxStatus.COMMITTED
    assert repeat.apply_prepared(TXID).metadata["txid"] == TXID
    assert rows(database) == ["one"]


def reply_before_prepare(remote: RemoteSandbox) -> dict[str, Any]:
    """The status reply the handle had before its prepare (revision one lower, same status)."""
    reply = dict(remote.reply)
    reply["revision"] = int(reply["revision"]) - 1
    return reply


def test_sqlite_abort_releases_the_held_write_lock_and_changes_nothing(
    sqlite_agent: tuple[AgentProcess, Path],
) -> None:
    agent, database = sqlite_agent
    create(agent, "transaction_rollback", "env:SANDBOX_SOURCE_DSN")
    write_statement(agent, "INSERT INTO notes (body) VALUES ('one')", f"sqlite:///{database}")
    remote = handle(agent, "transaction_rollback")
    remote.prepare(TXID)
    with sqlite3.connect(database, timeout=0.2) as blocked, pytest.raises(sqlite3.OperationalError):
        blocked.execute("INSERT INTO notes (body) VALUES ('app')")  # the agent holds the lock
    remote.abort_prepared(TXID)
    remote.abort_prepared(TXID)  # idempotent
    with sqlite3.connect(database, timeout=2) as free:
        free.execute("INSERT INTO notes (body) VALUES ('app')")
    assert rows(database) == ["app"]
    assert handle(agent, "transaction_rollback").status is SandboxStatus.ACTIVE


@pytest.mark.postgres
def test_postgres_prepare_survives_an_agent_kill_and_applies_from_the_txid_alone(
    tmp_path: Path,
    postgres_schema_dsn: str,
) -> None:
    dsn = postgres_schema_dsn
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
        # The bookkeeping table exists (a database that saw a commit): two sandboxes of one
        # database prepared together would otherwise both create it, and the second prepare
        # waits for the first's prepared CREATE TABLE until its lock timeout.
        connection.execute(
            "CREATE TABLE sandbox_commits (sandbox_id TEXT PRIMARY KEY, resource_id TEXT NOT "
            "NULL, plan_id TEXT NOT NULL, committed_at TEXT NOT NULL, statement_count INTEGER "
            "NOT NULL, message TEXT)"
        )
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": dsn}).start()
    applied, aborted = SANDBOX_ID, "01HZX0A7Q3J0F8K2M4N6P8R0T3"
    gids: list[str] = []
    try:
        for sid, name in ((applied, "kept"), (aborted, "dropped")):
            create(agent, "transaction_rollback", "env:SANDBOX_SOURCE_DSN", sid)
            write_statement(agent, f"INSERT INTO items (name) VALUES ('{name}')", dsn, sid)  # noqa: S608
            remote = handle(agent, "transaction_rollback", sid)
            assert remote.prepares_durably is True
            gids.append(remote.prepare(TXID, "m").details["gid"])
        assert set(gids) <= set(prepared_gids(dsn))
        # The Pod's process dies after the decision; a new one applies and aborts from the txid.
        assert agent.process is not None
        os.kill(agent.process.pid, signal.SIGKILL)
        agent.process.wait(timeout=10)
        agent.start()
        result = handle(agent, "transaction_rollback", applied).apply_prepared(TXID)
        assert result.success and result.metadata["gid"] == gids[0]
        handle(agent, "transaction_rollback", aborted).abort_prepared(TXID)
        handle(agent, "transaction_rollback", aborted).abort_prepared(TXID)  # again: no-op
        with psycopg.connect(dsn) as connection:
            names = [r[0] for r in connection.execute("SELECT name FROM items")]
        assert names == ["kept"]
        assert not set(gids) & set(prepared_gids(dsn))
        assert handle(agent, "transaction_rollback", applied).status is SandboxStatus.COMMITTED
        assert handle(agent, "transaction_rollback", aborted).status is SandboxStatus.ACTIVE
    finally:
        agent.stop()
        with psycopg.connect(dsn, autocommit=True) as connection:  # never leave one behind
            for gid in set(gids) & set(prepared_gids(dsn)):
                connection.execute(f"ROLLBACK PREPARED '{gid}'")


def prepared_gids(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as connection:
        return [r[0] for r in connection.execute("SELECT gid FROM pg_prepared_xacts")]


@pytest.mark.postgres
def test_a_failed_apply_is_not_remembered_so_its_retry_applies(
    tmp_path: Path,
    postgres_schema_dsn: str,
) -> None:
    """apply-prepared before anything is prepared is refused (nothing landed); the same call
    with the same request id after the prepare really applies (a replayed refusal would block
    the coordinator's roll-forward for ever)."""
    dsn = postgres_schema_dsn
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": dsn}).start()
    try:
        create(agent, "transaction_rollback", "env:SANDBOX_SOURCE_DSN")
        write_statement(agent, "INSERT INTO items (name) VALUES ('x')", dsn)
        with pytest.raises(SandboxCommitError, match="nothing landed"):
            handle(agent, "transaction_rollback").apply_prepared(TXID)
        handle(agent, "transaction_rollback").prepare(TXID)
        assert handle(agent, "transaction_rollback").apply_prepared(TXID).success
        with psycopg.connect(dsn) as connection:
            assert connection.execute("SELECT count(*) FROM items").fetchone() == (1,)
    finally:
        agent.stop()
        with psycopg.connect(dsn, autocommit=True) as connection:
            for gid in prepared_gids(dsn):
                if gid.startswith(TXID + "."):
                    connection.execute(f"ROLLBACK PREPARED '{gid}'")


def test_refusals_are_the_core_errors_they_stand_for(agent: AgentProcess, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    create(agent, "git_worktree", str(repo))
    remote = handle(agent, "git_worktree")
    with pytest.raises(SandboxError, match="txid"):  # refused before anything (422)
        remote.prepare("no spaces allowed")
    # A commit conflict: the agent's refusal carries the conflicting paths.
    client = agent.client()
    sid = f"/v1/sandboxes/{SANDBOX_ID}"
    client.call("PUT", f"{sid}/files", b"sandbox\n", query={"path": "f.txt"}, request_id="w")
    (repo / "f.txt").write_text("original moved on\n")
    git(repo, "commit", "-qam", "moved")
    with pytest.raises(AgentRefused) as refused:
        client.call("POST", f"{sid}/commit", {"message": "m"}, request_id="c")
    assert refused.value.conflicts == ["f.txt"]
    translated = wire.core_error(refused.value.error, refused.value.detail)
    assert isinstance(translated, SandboxCommitError) and translated.conflicts == ["f.txt"]
    # A committed sandbox cannot prepare: SandboxStateError, as the core raises.
    (repo / "f.txt").write_text("base\n")
    git(repo, "commit", "-qam", "back")
    client.call("POST", f"{sid}/commit", {"message": "m"}, request_id="c2")
    with pytest.raises(SandboxStateError):
        handle(agent, "git_worktree").prepare(TXID)
    with pytest.raises(SandboxStateError):
        handle(agent, "git_worktree").review()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path).start()
    yield process
    process.stop()
