"""``kubectl-sandbox`` against the real API server and the operator (tier 2, local executor).

Issue 10, section 2: the plan flow through the plugin's commands (list, diff, checkpoint,
restore, rollback, commit --wait with its progress line, log), a failing commit with its exit
code and the rolled-back ids, the documented exit codes, and ``kubectl sandbox`` finding the
plugin on PATH; ``kubectl sandbox review`` and ``approve`` (issue 9).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from sandbox_client import Plan, SandboxClient
from sandbox_client.kubectl_plugin import (
    EXIT_COMPENSATED,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    cli,
)
from tests.support.approvals import grant_plancommit_rights
from tests.support.client import ClientEnv, make_dir, make_repo, three_sources
from tests.support.operator import git, sandbox_manifest

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as connected:
        yield connected


def run(env: ClientEnv, *args: str) -> Result:
    """``kubectl sandbox ARGS -n NS --kubeconfig K`` in-process (stdout and stderr apart)."""
    return CliRunner().invoke(
        cli, [*args, "-n", env.namespace, "--kubeconfig", env.kubeconfig], catch_exceptions=False
    )


def test_plan_flow_through_the_plugin(
    env: ClientEnv, client: SandboxClient, tmp_path: Path
) -> None:
    sources = three_sources(tmp_path)
    for name, strategy, source in (
        ("pg-repo", "git_worktree", sources["repo"]),
        ("pg-data", "copy_on_write", sources["data"]),
        ("pg-layer", "overlay", sources["layer"]),
    ):
        env.cluster.create(sandbox_manifest(name, "plug-ok", strategy, source))
    plan = Plan(client, "plug-ok")
    plan.wait_ready(timeout=90)

    listed = run(env, "list", "--plan", "plug-ok")
    assert listed.exit_code == EXIT_OK, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "PLAN", "RESOURCE", "STRATEGY", "PHASE", "READY", "AGE"]
    assert [line.split()[0] for line in lines[1:]] == ["pg-data", "pg-layer", "pg-repo"]
    assert all(line.split()[4:6] == ["Active", "True"] for line in lines[1:])
    wide = run(env, "list", "-o", "wide", "--plan", "plug-ok").stdout.splitlines()
    assert wide[0].split()[-3:] == ["EXECUTOR", "SANDBOX-ID", "PATH"]
    assert all(" local " in line for line in wide[1:])
    as_json = json.loads(run(env, "list", "-o", "json", "--plan", "plug-ok").stdout)
    assert as_json["kind"] == "List" and len(as_json["items"]) == 3
    as_yaml = yaml.safe_load(run(env, "list", "-o", "yaml", "--plan", "plug-ok").stdout)
    assert {i["spec"]["strategy"] for i in as_yaml["items"]} == {
        "git_worktree",
        "copy_on_write",
        "overlay",
    }
    assert run(env, "list", "-o", "name", "--plan", "plug-ok").stdout.split() == [
        "sandbox/pg-data",
        "sandbox/pg-layer",
        "sandbox/pg-repo",
    ]
    assert run(env, "list", "--plan", "nobody").stdout.strip() == "No resources found."

    client.sandbox("pg-repo").write_file("src/app.py", "print('v1')\n")
    client.sandbox("pg-data").write_file("g.txt", "d1\n")
    client.sandbox("pg-layer").write_file("o.txt", "o1\n")
    diff = run(env, "diff", "pg-repo")
    assert diff.exit_code == EXIT_OK and "+print('v1')" in diff.stdout
    assert "+d1" in json.loads(run(env, "diff", "pg-data", "-o", "json").stdout)["diff"]

    made = run(env, "checkpoint", "pg-data", "--phase", "before_bad", "--meta", "by=test")
    assert made.exit_code == EXIT_OK, made.stderr
    assert "(directory-snapshot)" in made.stdout
    checkpoint = made.stdout.split()[0].split("/", 1)[1].removesuffix(" created")
    client.sandbox("pg-data").write_file("g.txt", "bad\n")
    restored = run(env, "restore", "pg-data", checkpoint)
    assert restored.exit_code == EXIT_OK, restored.stderr
    assert client.sandbox("pg-data").read_file("g.txt") == "d1\n"
    named = run(env, "checkpoint", "pg-repo", "-o", "name")
    assert named.stdout.startswith("checkpoint/pg-repo-")

    rolled = run(env, "rollback", "sandbox/pg-layer")
    assert rolled.exit_code == EXIT_OK and "rolled back" in rolled.stdout
    assert client.sandbox("pg-layer").read_file("o.txt") == "o0\n"
    client.sandbox("pg-layer").write_file("o.txt", "o2\n")

    committed = run(env, "commit", "plug-ok", "--wait", "-m", "via plugin")
    assert committed.exit_code == EXIT_OK, (committed.stdout, committed.stderr)
    assert "Committed (3/3 committed)" in committed.stderr  # the progress line
    assert "Committed=True" in committed.stdout
    assert (sources["repo"] / "src/app.py").read_text() == "print('v1')\n"
    assert (sources["data"] / "g.txt").read_text() == "d1\n"
    assert (sources["layer"] / "o.txt").read_text() == "o2\n"

    history = run(env, "log", "pg-data")
    assert history.exit_code == EXIT_OK
    kinds = [line.split()[1] for line in history.stdout.splitlines()[1:]]
    assert kinds[0] == "commit" and "restore" in kinds and "checkpoint" in kinds
    entries = json.loads(run(env, "log", "pg-data", "-o", "json").stdout)
    assert entries[0]["kind"] == "commit" and entries[0]["outcome"] == "Committed"
    plan.delete(cleanup=True)


def test_failed_commit_exit_code_and_rolled_back_ids(
    env: ClientEnv, client: SandboxClient, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    repo = make_repo(tmp_path / "repo", {"f.txt": "line1\n"})
    plan = Plan(client, "plug-bad")
    copy = plan.add_sandbox("data", "copy_on_write", data)
    worktree = plan.add_sandbox("repo", "git_worktree", repo)
    plan.wait_ready(timeout=90)
    copy.write_file("g.txt", "d1\n")
    worktree.write_file("f.txt", "sandbox\n")
    (repo / "f.txt").write_text("main\n")
    git(repo, "commit", "-qam", "main moved")

    failed = run(env, "commit", "plug-bad", "--wait", "--mode", "Saga", "-o", "json")

    assert failed.exit_code == EXIT_COMPENSATED, failed.stderr
    status = json.loads(failed.stdout)["status"]
    assert status["phase"] == "Failed"
    assert status["rolledBackIds"] == [copy.info().sandbox_id]
    assert status["failedRollbackIds"] == []
    assert (data / "g.txt").read_text() == "d0\n"
    back = run(env, "rollback", "plug-bad")  # a bare name that is no Sandbox: the plan
    assert back.exit_code == EXIT_OK, back.stderr
    assert "RolledBack" in back.stdout
    plan.delete(cleanup=True)


def test_exit_codes(env: ClientEnv, client: SandboxClient, tmp_path: Path) -> None:
    missing = run(env, "diff", "no-such-sandbox")
    assert missing.exit_code == EXIT_NOT_FOUND
    assert missing.stderr.startswith("error: NotFound:")
    assert run(env, "commit", "no-such-plan", "--wait").exit_code == EXIT_NOT_FOUND
    assert run(env, "rollback", "nothing-named-so").exit_code == EXIT_NOT_FOUND
    assert run(env, "log", "no-such-sandbox").exit_code == EXIT_NOT_FOUND
    assert run(env, "commit", "p", "--timeout", "soon").exit_code == EXIT_USAGE
    assert run(env, "list", "-o", "xml").exit_code == EXIT_USAGE
    assert run(env, "rollback", "deployment/x").exit_code == EXIT_REFUSED

    plan = Plan(client, "plug-codes")
    data = plan.add_sandbox("data", "copy_on_write", make_dir(tmp_path / "d", {"a": "1\n"}))
    plan.wait_ready(timeout=90)
    unknown = run(env, "restore", data.name, "no-such-checkpoint")
    assert unknown.exit_code == EXIT_NOT_FOUND, unknown.stderr
    bad_phase = run(env, "checkpoint", data.name, "--phase", "Not-Snake")
    assert bad_phase.exit_code == EXIT_REFUSED and "Invalid" in bad_phase.stderr
    plan.delete(cleanup=True)

    context = CliRunner().invoke(
        cli, ["list", "--kubeconfig", env.kubeconfig, "--context", "no-such-context"]
    )
    assert context.exit_code == EXIT_FAILED and "ConfigError" in context.stderr


def test_kubectl_finds_the_plugin_on_path(env: ClientEnv) -> None:
    process_env = env.env()
    process_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), process_env["PATH"]])
    done = subprocess.run(
        ["kubectl", "sandbox", "list", "-n", env.namespace, "-o", "json"],
        capture_output=True,
        text=True,
        env=process_env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["kind"] == "List"
    helped = subprocess.run(
        ["kubectl", "sandbox", "--help"], capture_output=True, text=True, env=process_env
    )
    assert "Exit codes:" in helped.stdout


def test_kubectl_sandbox_review_and_approve(
    client: SandboxClient, env: ClientEnv, tmp_path: Path
) -> None:
    sources = three_sources(tmp_path)
    with Plan(client, "rev-cli", client.namespace) as plan:
        data = plan.add_sandbox("data", "copy_on_write", str(sources["data"]))
        plan.wait_ready(timeout=90)
        data.write_file("c.txt", "c\n")
        shown = run(env, "review", "rev-cli", "-o", "json")
        assert shown.exit_code == 0, shown.output
        review = json.loads(shown.stdout)
        assert review["phase"] == "AwaitingApproval" and review["sandboxes"][0]["added"] == 1
        table = run(env, "review", "rev-cli", "-o", "wide")
        assert f"digest: {review['digest']}" in table.stdout and "+1 ~0 -0" in table.stdout
        assert "A c.txt" in table.stdout
        wrong = run(env, "approve", "rev-cli", "--digest", "sha256:bad", "--as", "alice")
        assert wrong.exit_code == EXIT_REFUSED, wrong.output  # not sha256 + 64 hex: Invalid
        waiting = run(env, "pending", "--plan", "rev-cli", "-o", "json")
        assert waiting.exit_code == EXIT_OK, waiting.output
        [row] = json.loads(waiting.stdout)
        assert (row["plancommit"], row["digest"]) == (review["plancommit"], review["digest"])
        assert row["createdBy"] == "sandbox-test-admin" and row["approvals"] == []
        grant_plancommit_rights(env.cluster)  # alice may read and patch PlanCommits
        done = run(env, "approve", "rev-cli", "--digest", review["digest"], "--as", "alice")
        assert done.exit_code == EXIT_OK, done.output
        assert "Committed" in done.stdout
        assert json.loads(run(env, "pending", "-o", "json").stdout) == []
        assert (sources["data"] / "c.txt").read_text() == "c\n"
