"""The workspace agent as a real process on 127.0.0.1 (issue 8, tier 2 part of "A workspace
agent"): token refusal, idempotency by request id (also across an agent restart), the sandbox
operations on a real git repository, traversal refused, and a DSN given as ``env:NAME`` never
echoed."""

from __future__ import annotations

import base64
import sqlite3
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.agent_client import (
    AgentNotFound,
    AgentRefused,
    derive_token,
    request_id,
)

from tests.support.agent import KEY, SANDBOX_ID, UID, AgentProcess
from tests.support.gitrepo import git, make_repo


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path).start()
    yield process
    process.stop()


def create_git(agent: AgentProcess, repo: Path) -> dict:
    body = {
        "plan_id": "plan-a", "resource_id": "repo", "strategy": "git_worktree",
        "original": str(repo), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    return agent.client().call("POST", "/v1/sandboxes", body, request_id="create-1")


def test_a_call_without_or_with_a_wrong_token_is_refused(agent: AgentProcess) -> None:
    raw = urllib.request.Request(f"{agent.url}/v1/sandboxes/{SANDBOX_ID}")  # noqa: S310
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(raw, timeout=5)  # noqa: S310
    assert refused.value.code == 401
    refused.value.close()
    wrong = agent.client(token=derive_token(b"another key", UID))
    with pytest.raises(ExecutorError, match="refused"):
        wrong.call("GET", f"/v1/sandboxes/{SANDBOX_ID}")
    other_sandbox = agent.client(token=derive_token(KEY, "another-uid"))
    with pytest.raises(ExecutorError, match="refused"):
        other_sandbox.call("POST", "/v1/sandboxes", {}, request_id="x")
    with pytest.raises(AgentNotFound):  # the right token gets through
        agent.client().call("GET", f"/v1/sandboxes/{SANDBOX_ID}")


@pytest.mark.parametrize("missing", ["plan_id", "resource_id", "original", "strategy"])
def test_a_create_missing_a_field_is_refused_naming_it_and_makes_nothing(
    agent: AgentProcess, tmp_path: Path, missing: str
) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "one\n"})
    body = {
        "plan_id": "plan-a", "resource_id": "repo", "strategy": "git_worktree",
        "original": str(repo), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    del body[missing]
    with pytest.raises(AgentRefused) as refused:
        agent.client().call("POST", "/v1/sandboxes", body, request_id=f"create-{missing}")
    assert refused.value.error_type == "ValueError"
    assert missing in refused.value.detail
    with pytest.raises(AgentNotFound):
        agent.client().call("GET", f"/v1/sandboxes/{SANDBOX_ID}")
    assert len(git(repo, "worktree", "list").splitlines()) == 1  # only the original's own


def test_the_operations_on_a_real_git_repository(agent: AgentProcess, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n", "d/g.txt": "g\n"})
    created = create_git(agent, repo)
    assert created["status"] == "created"
    client = agent.client()
    sid = f"/v1/sandboxes/{SANDBOX_ID}"
    assert client.call("POST", f"{sid}/activate", request_id="act-1")["status"] == "active"
    client.call("PUT", f"{sid}/files", b"edited\n", query={"path": "f.txt"}, request_id="w-1")
    read = client.call("GET", f"{sid}/files", query={"path": "f.txt"})
    assert base64.b64decode(read["content_b64"]) == b"edited\n"
    names = [e["name"] for e in client.call("GET", f"{sid}/list", query={"path": "."})["entries"]]
    assert "f.txt" in names and "d" in names
    assert "+edited" in client.call("GET", f"{sid}/diff")["diff"]
    with pytest.raises(ExecutorError, match="Path traversal not allowed"):
        client.call("GET", f"{sid}/path", query={"path": "../../etc/passwd"})
    checkpoint = client.call(
        "POST", f"{sid}/checkpoints", {"phase": "p1", "metadata": {"k8s_checkpoint_uid": "c1"}},
        request_id="cp-1",
    )  # fmt: skip
    assert checkpoint["checkpoint_id"]
    result = client.call("POST", f"{sid}/commit", {"message": "m"}, request_id="commit-1")
    assert result["result"]["success"] is True
    assert (repo / "f.txt").read_text() == "edited\n"
    assert client.call("DELETE", sid, request_id="cleanup-1")["sandbox_id"] == SANDBOX_ID
    with pytest.raises(AgentNotFound):
        client.call("GET", sid)


def test_a_retried_commit_with_the_same_request_id_commits_once_even_after_a_restart(
    agent: AgentProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    create_git(agent, repo)
    client = agent.client()
    sid = f"/v1/sandboxes/{SANDBOX_ID}"
    client.call("PUT", f"{sid}/files", b"one\n", query={"path": "f.txt"}, request_id="w-1")
    before = client.call("GET", sid)["revision"]
    rid = request_id("commit", SANDBOX_ID, "m", before)
    first = client.call("POST", f"{sid}/commit", {"message": "m"}, request_id=rid)
    assert first["sandbox"]["revision"] > before  # a later call gets a new id from it
    commits = git(repo, "rev-list", "--count", "HEAD")
    agent.stop()  # the agent restarts too (the Pod's container restarted); the journal is on disk
    agent.start()
    again = agent.client().call("POST", f"{sid}/commit", {"message": "m"}, request_id=rid)
    assert again == first
    assert git(repo, "rev-list", "--count", "HEAD") == commits
    # The same id is a replay, never a new operation: a repeated create returns the same too.
    assert create_git(agent, repo)["sandbox_id"] == SANDBOX_ID
    with pytest.raises(ExecutorError, match="X-Request-Id"):
        agent.client().call("POST", f"{sid}/commit", {"message": "m"})


def test_reads_leave_the_record_and_revision_alone_and_a_write_moves_the_revision(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """A read is not a change: it neither rewrites the stored record nor moves the revision
    callers put into request ids; new content does move it (a later commit is a new request)."""
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    create_git(agent, repo)
    client = agent.client()
    sid = f"/v1/sandboxes/{SANDBOX_ID}"
    client.call("PUT", f"{sid}/files", b"one\n", query={"path": "f.txt"}, request_id="w-1")
    revision = client.call("GET", sid)["revision"]
    records = [
        p for p in (agent.work / "state").rglob("*") if p.is_file() and "revisions" not in p.parts
    ]
    assert records
    stamps = {path: path.stat().st_mtime_ns for path in records}
    for n in range(3):
        client.call("GET", f"{sid}/files", query={"path": "f.txt"}, request_id=f"r-{n}")
        client.call("GET", f"{sid}/list", query={"path": ""}, request_id=f"l-{n}")
    assert client.call("GET", sid)["revision"] == revision
    assert {path: path.stat().st_mtime_ns for path in records} == stamps
    client.call("PUT", f"{sid}/files", b"two\n", query={"path": "f.txt"}, request_id="w-2")
    assert client.call("GET", sid)["revision"] > revision


def test_a_dsn_given_as_an_env_reference_is_never_echoed(tmp_path: Path) -> None:
    database = tmp_path / "app-secret-name.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    dsn = f"sqlite:///{database}"
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": dsn}).start()
    try:
        body = {
            "plan_id": "p", "resource_id": "db", "strategy": "transaction_rollback",
            "original": "env:SANDBOX_SOURCE_DSN", "sandbox_id": SANDBOX_ID,
        }  # fmt: skip
        created = agent.client().call("POST", "/v1/sandboxes", body, request_id="c")
        status = agent.client().call("GET", f"/v1/sandboxes/{SANDBOX_ID}")
        for reply in (created, status):
            assert dsn not in repr(reply)
            assert reply["record"]["original_path"] == "env:SANDBOX_SOURCE_DSN"
        (tmp_path / "no-env").mkdir()
        missing = AgentProcess(tmp_path / "no-env").start()
        try:
            with pytest.raises(ExecutorError, match="SANDBOX_SOURCE_DSN is not set"):
                missing.client().call("POST", "/v1/sandboxes", body, request_id="c2")
        finally:
            missing.stop()
    finally:
        agent.stop()


@pytest.mark.postgres
def test_a_database_sandbox_reopened_by_the_agent_commits_with_the_pods_secret(
    tmp_path: Path,
    postgres_schema_dsn: str,
) -> None:
    """Records keep DSNs redacted (issue 7), so every request that re-opens a PostgreSQL sandbox
    takes the password from the Pod's secret environment again; the commit then reaches the
    server and the password is in no reply."""
    from sandbox_core import dsn_secrets

    assert dsn_secrets(postgres_schema_dsn), "the test server's DSN carries a password"
    agent = AgentProcess(tmp_path, env={"SANDBOX_SOURCE_DSN": postgres_schema_dsn}).start()
    try:
        client = agent.client()
        body = {
            "plan_id": "p", "resource_id": "db", "strategy": "transaction_rollback",
            "original": "env:SANDBOX_SOURCE_DSN", "sandbox_id": SANDBOX_ID,
        }  # fmt: skip
        client.call("POST", "/v1/sandboxes", body, request_id="c")
        sid = f"/v1/sandboxes/{SANDBOX_ID}"
        assert client.call("POST", f"{sid}/activate", request_id="a")["status"] == "active"
        result = client.call("POST", f"{sid}/commit", {"message": "m"}, request_id="commit")
        assert result["result"]["success"] is True, result
        for secret in dsn_secrets(postgres_schema_dsn):  # the test password is a plain word
            assert f"password={secret}" not in repr(result)
            assert f":{secret}@" not in repr(result)
    finally:
        agent.stop()
