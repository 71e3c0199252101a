"""Issue 8 on the real API server (tier 2, local executor): no secret in sight, the terminal
``Finished`` condition for one ``kubectl wait``, and suspend / resume.

The password grep covers every status, every Event and every operator log line of a plan with
every strategy (git_worktree, copy_on_write, overlay, none, transaction_rollback on a real
PostgreSQL), committed, plus a transaction_rollback Sandbox whose DSN carries a unique password
and cannot connect (the failure path: condition, Warning Event, log line).
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver.fixtures import local_apiserver  # noqa: F401 - pytest fixture
from tests.operator.support import (
    Cluster,
    OperatorProcess,
    make_dir,
    make_repo,
    plancommit_manifest,
    sandbox_manifest,
    wait_for,
)
from tests.postgres_fixture import postgres_dsn, postgres_schema_dsn  # noqa: F401 - fixtures
from tests.test_operator_apiserver import (  # fixtures and helpers of the tier-2 module
    cluster,  # noqa: F401 - pytest fixture
    operator,  # noqa: F401 - pytest fixture
    ready,
    write_in_sandbox,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


TERMINAL = {"Committed", "Failed", "RolledBack"}


def secret_manifest(name: str, dsn: str) -> dict[str, Any]:
    """A Secret holding ``dsn`` under key ``dsn``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {"dsn": base64.b64encode(dsn.encode()).decode()},
    }


def db_sandbox(name: str, plan: str, secret: str) -> dict[str, Any]:
    """A transaction_rollback Sandbox reading its DSN from Secret ``secret``."""
    return {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "planId": plan,
            "resourceId": name,
            "strategy": "transaction_rollback",
            "source": {"secretRef": {"name": secret}},
        },
    }


def everything_visible(namespace: Cluster, process: OperatorProcess) -> str:
    """Every status and Event of the namespace and every operator log line, as one text."""
    objects = namespace.kubectl("get", "sandboxes,plancommits,checkpoints", "-o", "json").stdout
    events = namespace.kubectl("get", "events", "-o", "json").stdout
    statuses = [item.get("status") for item in json.loads(objects)["items"]]
    messages = [e.get("message") for e in json.loads(events)["items"]]
    return json.dumps(statuses) + json.dumps(messages) + objects + process.logs()


def test_no_password_in_any_status_event_or_log_line_for_every_strategy(
    cluster: Cluster,  # noqa: F811 - the fixture
    operator: OperatorProcess,  # noqa: F811 - the fixture
    tmp_path: Path,
    postgres_schema_dsn: str,  # noqa: F811 - the fixture
) -> None:
    import psycopg

    with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    unique = f"pw-{uuid.uuid4().hex}"  # a password that can appear nowhere by chance
    unreachable = f"postgresql://app:{unique}@127.0.0.1:1/nothing?connect_timeout=2"
    cluster.create(secret_manifest("db", postgres_schema_dsn))
    cluster.create(secret_manifest("db-bad", unreachable))
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    layer = make_dir(tmp_path / "layer", {"h.txt": "o0\n"})
    scratch = make_dir(tmp_path / "plain", {"n.txt": "n0\n"})
    operator.start({"SANDBOX_OPERATOR_LOG_FORMAT": "plain"})
    plan = "plan-secret"
    cluster.create(sandbox_manifest("s-git", plan, "git_worktree", repo))
    cluster.create(sandbox_manifest("s-copy", plan, "copy_on_write", data))
    cluster.create(sandbox_manifest("s-overlay", plan, "overlay", layer))
    cluster.create(sandbox_manifest("s-none", plan, "none", scratch))
    cluster.create(db_sandbox("s-db", plan, "db"))
    cluster.create(db_sandbox("s-db-bad", "plan-bad-dsn", "db-bad"))
    for name, file in (("s-git", "f.txt"), ("s-copy", "g.txt"), ("s-overlay", "h.txt")):
        write_in_sandbox(ready(cluster, name), file, "changed\n")
    ready(cluster, "s-none")
    record = ready(cluster, "s-db")["coreRecord"]
    assert "password=***" in record["original_path"], record["original_path"]
    bad = cluster.wait_phase("sandbox", "s-db-bad", {"Errored", "Active"})
    assert bad["phase"] == "Errored"
    cluster.create(plancommit_manifest("pc-secret", plan))
    status = cluster.wait_phase("pcommit", "pc-secret", TERMINAL)
    assert status["phase"] == "Committed", status
    wait_for(lambda: cluster.events("s-db-bad"), 30, "the failure's Event")
    visible = everything_visible(cluster, operator)
    password = psycopg.conninfo.conninfo_to_dict(postgres_schema_dsn)["password"]
    user = psycopg.conninfo.conninfo_to_dict(postgres_schema_dsn)["user"]
    assert f"{user}:{password}@" not in visible
    assert f"password={password}" not in visible
    assert unique not in visible
    assert postgres_schema_dsn not in visible


def test_finished_lets_one_kubectl_wait_return_on_success_and_on_failure(
    cluster: Cluster,  # noqa: F811 - the fixture
    operator: OperatorProcess,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    ok = make_dir(tmp_path / "ok", {"g.txt": "0\n"})
    bad = make_dir(tmp_path / "bad", {"g.txt": "0\n"})
    operator.start({"SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "r-bad"})
    cluster.create(sandbox_manifest("s-ok", "plan-ok", "copy_on_write", ok))
    cluster.create(sandbox_manifest("s-bad", "plan-bad", "copy_on_write", bad, resource_id="r-bad"))
    write_in_sandbox(ready(cluster, "s-ok"), "g.txt", "1\n")
    write_in_sandbox(ready(cluster, "s-bad"), "g.txt", "1\n")
    cluster.create(plancommit_manifest("pc-ok", "plan-ok"))
    cluster.create(plancommit_manifest("pc-bad", "plan-bad"))
    for name, outcome in (("pc-ok", "Committed"), ("pc-bad", "Failed")):
        waited = cluster.kubectl(
            "wait", "--for=condition=Finished", f"pcommit/{name}", "--timeout=90s", check=False
        )
        assert waited.returncode == 0, (waited.stderr, cluster.status("pcommit", name))
        finished = cluster.condition("pcommit", name, "Finished")
        assert finished is not None
        assert (finished["status"], finished["reason"]) == ("True", outcome)
    # The Sandbox that was committed is Finished too; the one compensated is usable again.
    sandbox_done = cluster.kubectl(
        "wait", "--for=condition=Finished", "sandbox/s-ok", "--timeout=30s", check=False
    )
    assert sandbox_done.returncode == 0, cluster.status("sandbox", "s-ok")
    assert cluster.condition("sandbox", "s-bad", "Finished")["status"] == "False"


def test_suspend_keeps_changes_and_a_plancommit_resumes_a_suspended_sandbox(
    cluster: Cluster,  # noqa: F811 - the fixture
    operator: OperatorProcess,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    operator.start()
    cluster.create(sandbox_manifest("s-git", "plan-s", "git_worktree", repo))
    write_in_sandbox(ready(cluster, "s-git"), "f.txt", "kept\n")
    cluster.kubectl("patch", "sandbox", "s-git", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    suspended = cluster.wait_phase("sandbox", "s-git", {"Suspended"}, timeout=60)
    assert cluster.condition("sandbox", "s-git", "Ready")["reason"] == "Suspended"
    cluster.kubectl("patch", "sandbox", "s-git", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    resumed = ready(cluster, "s-git")
    assert resumed["sandboxId"] == suspended["sandboxId"]
    assert (Path(resumed["sandboxPath"]) / "f.txt").read_text() == "kept\n"
    # Suspended again, then a PlanCommit of its plan: it is resumed first and committed.
    cluster.kubectl("patch", "sandbox", "s-git", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    cluster.wait_phase("sandbox", "s-git", {"Suspended"}, timeout=60)
    cluster.create(plancommit_manifest("pc-s", "plan-s"))
    status = cluster.wait_phase("pcommit", "pc-s", TERMINAL, timeout=120)
    assert status["phase"] == "Committed", status
    assert (repo / "f.txt").read_text() == "kept\n"
    assert cluster.get("sandbox", "s-git")["spec"]["suspend"] is False
    warnings = [e for e in cluster.events("s-git") if e["type"] == "Warning"]
    assert warnings == []
