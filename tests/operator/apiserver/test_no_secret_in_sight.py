"""No secret in sight (issue 8) on the real API server (tier 2, local executor).

The password grep covers every status, every Event and every operator log line of a plan with
every strategy (git_worktree, copy_on_write, overlay, none, transaction_rollback on a real
PostgreSQL), committed, plus a transaction_rollback Sandbox whose DSN carries a unique password
and cannot connect (the failure path: condition, Warning Event, log line). The terminal
``Finished`` condition and suspend / resume are in ``test_finished_and_suspend.py``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    db_sandbox,
    make_dir,
    make_repo,
    plancommit_manifest,
    ready,
    sandbox_manifest,
    secret_manifest,
    wait_for,
    write_in_sandbox,
)

pytestmark = pytest.mark.slow


TERMINAL = {"Committed", "Failed", "RolledBack"}


def everything_visible(namespace: Cluster, process: OperatorProcess) -> str:
    """Every status and Event of the namespace and every operator log line, as one text."""
    objects = namespace.kubectl("get", "sandboxes,plancommits,checkpoints", "-o", "json").stdout
    events = namespace.kubectl("get", "events", "-o", "json").stdout
    statuses = [item.get("status") for item in json.loads(objects)["items"]]
    messages = [e.get("message") for e in json.loads(events)["items"]]
    return json.dumps(statuses) + json.dumps(messages) + objects + process.logs()


def test_no_password_in_any_status_event_or_log_line_for_every_strategy(
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
    postgres_schema_dsn: str,
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


def test_a_private_key_under_any_key_of_a_secret_is_never_shown(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    """A ``secretRef`` naming ``tls.key`` (a PEM block, with its trailing newline): the Sandbox
    is Errored by the Secret's name and key, and no status, Event or log line holds the key
    or any line of it (docs/security.md, "Secrets")."""
    import base64

    body = "\n".join(uuid.uuid4().hex * 2 for _ in range(4))
    pem = f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "tls"},
            "data": {"tls.key": base64.b64encode(pem.encode()).decode()},
        }
    )
    operator.start({"SANDBOX_OPERATOR_LOG_FORMAT": "plain"})
    sandbox = db_sandbox("s-tls", "plan-tls", "tls")
    sandbox["spec"]["source"]["secretRef"]["key"] = "tls.key"
    cluster.create(sandbox)
    status = cluster.wait_phase("sandbox", "s-tls", {"Errored", "Active"})
    assert status["phase"] == "Errored"
    degraded = cluster.condition("sandbox", "s-tls", "Degraded")
    assert degraded is not None
    assert "the value of key 'tls.key' in Secret" in degraded["message"], degraded
    wait_for(lambda: cluster.events("s-tls"), 30, "the failure's Event")
    visible = everything_visible(cluster, operator)
    for line in [pem, pem.strip(), *body.splitlines()]:
        assert line not in visible
