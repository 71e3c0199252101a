"""The actor's door from the engine's three surfaces against the real API server and the
operator (tier 2, local executor): the client's Sandbox methods (commands, edits, SQL, the
audit log), ``kubectl sandbox exec`` and ``sql``, and ``sandbox-mcp``'s tools through the MCP
library's in-memory session, with ``request_commit`` waiting for a person's approval and
committing nothing without it unless the administrator allowed it."""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mcp import Client

from sandbox_client import Plan, SandboxClient, aio
from sandbox_client.errors import RefusedError
from sandbox_client.kubectl_plugin import EXIT_NOT_FOUND, EXIT_REFUSED, cli
from sandbox_client.mcp_server import TOOLS, PlanTools, build_server
from sandbox_client.models import PlanCommitPhase
from tests.support.approvals import grant_plancommit_rights
from tests.support.client import ClientEnv, make_dir, make_repo

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(
        kubeconfig=env.kubeconfig, namespace=env.namespace, local_state_dir=env.state_dir
    ) as connected:
        yield connected


def database_secret(env: ClientEnv, tmp_path: Path, name: str) -> Path:
    """A SQLite database with a ``notes`` table, and the Secret ``name`` naming it."""
    path = tmp_path / f"{name}.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    connection.close()
    dsn = base64.b64encode(f"sqlite:///{path}".encode()).decode()
    env.cluster.create(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"dsn": dsn}}
    )
    return path


def count(database: Path) -> int:
    with sqlite3.connect(database) as connection:
        found = int(connection.execute("SELECT count(*) FROM notes").fetchone()[0])
    connection.close()
    return found


def test_sandbox_methods_run_commands_edits_and_sql(
    env: ClientEnv, client: SandboxClient, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"src/app.sh": "echo v0\n"})
    database = database_secret(env, tmp_path, "door-db")
    plan = Plan(client, "door-methods")
    code = plan.add_sandbox("code", "git_worktree", repo)
    db = plan.add_sandbox("db", "transaction_rollback", {"secretRef": {"name": "door-db"}})
    plan.wait_ready(timeout=90)

    assert code.exec(["sh", "src/app.sh"]).stdout == b"v0\n"
    assert code.edit("src/app.sh", "v0", "v1").occurrences == 1
    chunks = list(code.exec_stream("sh src/app.sh; exit 4"))
    assert chunks[0].kind == "started" and chunks[-1].result is not None
    assert chunks[-1].result.exit_code == 4
    assert b"".join(c.data for c in chunks) == b"v1\n"
    with pytest.raises(RefusedError) as refused:
        code.exec("true", cwd="../..")
    assert refused.value.reason == "PathTraversal"
    assert db.sql("INSERT INTO notes (body) VALUES (?)", ["x"]).rowcount == 1
    assert db.sql("SELECT body FROM notes").rows == [["x"]]
    assert [e["op"] for e in code.audit().entries] == ["exec", "edit", "exec"]
    assert count(database) == 0 and (repo / "src/app.sh").read_text() == "echo v0\n"

    result = plan.commit()
    assert result.committed, result.conditions
    assert count(database) == 1 and (repo / "src/app.sh").read_text() == "echo v1\n"
    plan.delete(cleanup=True)


def test_the_plugin_execs_with_the_commands_exit_code_and_prints_sql(
    env: ClientEnv, client: SandboxClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "g0\n"})
    database_secret(env, tmp_path, "plug-db")
    plan = Plan(client, "door-plugin")
    files = plan.add_sandbox("files", "copy_on_write", data)
    plan.add_sandbox("db", "transaction_rollback", {"secretRef": {"name": "plug-db"}})
    plan.wait_ready(timeout=90)
    common = ["-n", env.namespace, "--kubeconfig", env.kubeconfig]
    runner = CliRunner()
    elsewhere = runner.invoke(cli, ["exec", files.name, *common, "--", "true"])
    assert elsewhere.exit_code == EXIT_NOT_FOUND  # the default state directory has no record
    assert "SANDBOX_OPERATOR_STATE_DIR" in elsewhere.stderr
    monkeypatch.setenv("SANDBOX_OPERATOR_STATE_DIR", str(env.state_dir))
    run = runner.invoke(
        cli,
        ["exec", files.name, *common, "--cwd", ".", "--env", "WHO=plugin", "--",
         "sh", "-c", "cat g.txt; echo $WHO >&2; echo new > n.txt; exit 5"],
        catch_exceptions=False,
    )  # fmt: skip
    assert run.exit_code == 5, run.output
    assert run.stdout == "g0\n" and run.stderr == "plugin\n"
    assert files.read_file("n.txt") == "new\n" and not (data / "n.txt").exists()
    refused = runner.invoke(cli, ["exec", files.name, *common, "--cwd", "..", "--", "true"])
    assert refused.exit_code == EXIT_REFUSED and "PathTraversal" in refused.stderr

    db_name = f"{plan.plan_id}-db"
    insert = ["sql", db_name, "INSERT INTO notes (body) VALUES (?)", "--param", "hello", *common]
    assert runner.invoke(cli, insert).stdout.strip() == "INSERT 1"
    table = runner.invoke(cli, ["sql", db_name, "SELECT id, body FROM notes", *common])
    assert table.exit_code == 0 and table.stdout.split() == ["id", "body", "1", "hello"]
    as_json = runner.invoke(cli, ["sql", db_name, "SELECT body FROM notes", *common, "-o", "json"])
    assert json.loads(as_json.stdout)["rows"] == [["hello"]]
    plan.delete(cleanup=True)


async def call(session: Client, tool: str, **arguments: Any) -> Any:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, (tool, arguments, result.content)
    return result.structured_content


def test_the_mcp_tools_and_an_approval_that_a_person_gives(env: ClientEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "r0\n", "src/a.py": "x = 1\nx = 1\n"})
    database = database_secret(env, tmp_path, "mcp-db")

    async def agent() -> tuple[dict[str, Any], dict[str, Any]]:
        client = aio.SandboxClient(
            kubeconfig=env.kubeconfig, namespace=env.namespace, local_state_dir=env.state_dir
        )
        plan = aio.Plan(client, "door-mcp", env.namespace, keep=True)
        await plan.add_sandbox("repo", "git_worktree", repo)
        await plan.add_sandbox("db", "transaction_rollback", {"secretRef": {"name": "mcp-db"}})
        await plan.wait_ready(timeout=90)
        tools = PlanTools(client, "door-mcp", env.namespace, approval_wait_seconds=3)
        async with Client(build_server(tools)) as session:
            names = {t.name for t in (await session.list_tools()).tools}
            assert names == set(TOOLS)
            line = {"shell": "cat README.md; exit 2"}
            ran = await call(session, "exec", sandbox="repo", **line)
            assert (ran["exit_code"], ran["stdout"]) == (2, "r0\n")
            assert (await call(session, "read", sandbox="repo", path="README.md"))[
                "content"
            ] == "r0\n"
            await call(session, "write", sandbox="repo", path="new.txt", content="n\n")
            twice = await session.call_tool(
                "edit", {"sandbox": "repo", "path": "src/a.py", "old": "x = 1", "new": "x = 2"}
            )
            assert twice.is_error and "InvalidOperation" in twice.content[0].text  # type: ignore[union-attr]
            edited = await call(
                session,
                "edit",
                sandbox="repo",
                path="src/a.py",
                old="x = 1",
                new="x = 2",
                replace_all=True,
            )
            assert edited["occurrences"] == 2
            await call(session, "write", sandbox="repo", path="tmp/t.txt", content="t")
            await call(session, "move", sandbox="repo", path="tmp/t.txt", to="tmp/u.txt")
            await call(session, "delete", sandbox="repo", path="tmp", recursive=True)
            assert (await call(session, "stat", sandbox="repo", path="src"))["type"] == "dir"
            page = await call(session, "glob", sandbox="repo", pattern="**/*", max_results=1)
            assert page["truncated"] and page["next_cursor"]
            found = await call(session, "grep", sandbox="repo", pattern="x = 2")
            assert len(found["matches"]) == 2
            await call(
                session,
                "sql",
                sandbox="db",
                statement="INSERT INTO notes (body) VALUES (?)",
                params=["m"],
            )
            diff = await call(session, "diff", sandbox="repo", max_chars=20)
            assert diff["next_offset"] == 20 and len(diff["diff"]) == 20
            made = await call(session, "checkpoint", sandbox="repo")
            await call(session, "restore", sandbox="repo", checkpoint=made["checkpoint"])
            reviewed = await call(session, "review")
            assert reviewed["digest"].startswith("sha256:")

            waited = await call(session, "request_commit", message="by the agent")
            assert waited["status"] == "awaiting_approval"  # nothing committed without a person
            assert waited["digest"] == reviewed["digest"]
            review_page = f"kubectl sandbox review --web door-mcp -n {env.namespace}"
            assert waited["review_command"] == review_page and review_page in waited["message"]
            asked = await call(session, "pending_approvals")
            assert asked["review_command"] == review_page
            assert [p["digest"] for p in asked["pending"]] == [waited["digest"]]
            assert (repo / "README.md").read_text() == "r0\n" and count(database) == 0

            grant_plancommit_rights(env.cluster)

            async def person() -> None:  # alice, not the engine that asked
                await asyncio.sleep(1)
                async with aio.SandboxClient(
                    kubeconfig=env.kubeconfig, namespace=env.namespace, impersonate="alice"
                ) as alice:
                    await aio.Plan(alice, "door-mcp", env.namespace).approve(
                        waited["digest"], wait=False
                    )

            tools.approval_wait_seconds = 60
            approval = asyncio.create_task(person())
            done = await call(session, "request_commit", message="by the agent")
            await approval
            commits = await plan.commits()
        return done, {c.name: c.phase for c in commits}

    done, phases = asyncio.run(agent())
    assert done["status"] == "committed" and done["result"]["committed"] is True
    assert list(phases.values()) == [PlanCommitPhase.COMMITTED]  # one PlanCommit, reused
    assert (repo / "new.txt").read_text() == "n\n" and count(database) == 1
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as cleanup:
        Plan(cleanup, "door-mcp").delete()


def test_request_commit_commits_unattended_only_with_the_server_option(
    env: ClientEnv, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "g0\n"})

    async def agent() -> dict[str, Any]:
        async with aio.SandboxClient(
            kubeconfig=env.kubeconfig, namespace=env.namespace, local_state_dir=env.state_dir
        ) as client:
            plan = aio.Plan(client, "door-allow", env.namespace, keep=True)
            await plan.add_sandbox("data", "copy_on_write", data)
            await plan.wait_ready(timeout=90)
            tools = PlanTools(
                client, "door-allow", env.namespace, allow_commit_without_approval=True
            )
            async with Client(build_server(tools)) as session:
                await call(session, "write", sandbox="data", path="g.txt", content="g1\n")
                return dict(await call(session, "request_commit"))

    done = asyncio.run(agent())
    assert done["status"] == "committed" and "server option" in done["approved_by"]
    assert (data / "g.txt").read_text() == "g1\n"
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as cleanup:
        Plan(cleanup, "door-allow").delete()
