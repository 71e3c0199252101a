"""Deleting a Sandbox never waits for another object (tier 2, real API server): whatever became
of the Secret its source names, its finalizer removes what the Sandbox made and lets it go.
A namespace's deletion removes its Secrets and Sandboxes in no set order, and ``kubectl delete
-f`` of one file deletes them in the file's order. A namespace holding a Sandbox of every
strategy, their Checkpoints and a PlanCommit awaiting approval, deleted while the operator is
down, is emptied by the next operator, with nothing left behind."""

from __future__ import annotations

import base64
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    db_sandbox,
    git,
    make_dir,
    make_repo,
    plancommit_manifest,
    run_operator,
    sandbox_manifest,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, prefix="gone")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path, cleanup_kinds="sandboxes")


def _remove_secret(cluster: Cluster) -> None:
    cluster.kubectl("delete", "secret", "db", "--wait=true")


def _drop_the_key(cluster: Cluster) -> None:
    other = base64.b64encode(b"unrelated").decode()
    cluster.kubectl(
        "patch", "secret", "db", "--type=json",
        "-p", f'[{{"op": "replace", "path": "/data", "value": {{"other": "{other}"}}}}]',
    )  # fmt: skip


def _no_longer_a_dsn(cluster: Cluster) -> None:
    value = base64.b64encode(b"not a connection string").decode()
    cluster.kubectl(
        "patch", "secret", "db", "--type=json",
        "-p", f'[{{"op": "replace", "path": "/data/dsn", "value": "{value}"}}]',
    )  # fmt: skip


def _names_another_database(cluster: Cluster) -> None:
    value = base64.b64encode(b"postgresql://app:secret@127.0.0.1:1/another").decode()
    cluster.kubectl(
        "patch", "secret", "db", "--type=json",
        "-p", f'[{{"op": "replace", "path": "/data/dsn", "value": "{value}"}}]',
    )  # fmt: skip


@pytest.mark.parametrize(
    "change_secret",
    [_remove_secret, _drop_the_key, _no_longer_a_dsn, _names_another_database],
    ids=["secret-deleted", "key-removed", "value-not-a-dsn", "names-another-database"],
)
def test_a_sandbox_is_deleted_and_cleaned_up_whatever_became_of_its_secret(
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
    change_secret: Callable[[Cluster], None],
) -> None:
    database = tmp_path / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    dsn = base64.b64encode(f"sqlite:///{database}".encode()).decode()
    cluster.create(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "data": {"dsn": dsn}}
    )
    operator.start()
    cluster.create(
        {
            "apiVersion": "sandbox.cleveragents.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": "s-db"},
            "spec": {
                "planId": "plan-db",
                "resourceId": "db",
                "strategy": "transaction_rollback",
                "source": {"secretRef": {"name": "db"}},
            },
        }
    )
    sandbox_id = cluster.wait_active("s-db")["sandboxId"]
    made = [p for p in (operator.work_dir / "sandboxes").rglob("*") if sandbox_id in p.name]
    assert made, "the sandbox made nothing to clean up"

    change_secret(cluster)
    cluster.kubectl("delete", "sandbox", "s-db", "--wait=false")

    wait_for(lambda: cluster.gone("sandbox", "s-db"), 30, "the Sandbox deleted")
    assert [p for p in made if p.exists()] == []
    assert "app:secret@" not in operator.logs() and "password=secret" not in operator.logs()
    with sqlite3.connect(database) as connection:
        assert connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)


def test_a_namespace_with_every_strategy_is_emptied_by_the_next_operator(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path, postgres_schema_dsn: str
) -> None:
    """Every strategy the local executor runs (PostgreSQL and SQLite behind Secrets), a
    Checkpoint of each that has files, and a PlanCommit awaiting approval; the namespace is
    deleted while the operator is down, its Secrets first (what the namespace controller does,
    in one of its orders). The next operator finalizes everything within 30 s."""
    import psycopg

    with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    database = tmp_path / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    cluster.create(secret_manifest("pg", postgres_schema_dsn))
    cluster.create(secret_manifest("db", f"sqlite:///{database}"))
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    directories = {
        "s-copy": make_dir(tmp_path / "data", {"g.txt": "d0\n"}),
        "s-overlay": make_dir(tmp_path / "layer", {"h.txt": "o0\n"}),
        "s-none": make_dir(tmp_path / "plain", {"n.txt": "n0\n"}),
    }
    operator.start()
    cluster.create(sandbox_manifest("s-git", "plan-ns", "git_worktree", repo))
    for name, strategy in (("s-copy", "copy_on_write"), ("s-overlay", "overlay")):
        cluster.create(sandbox_manifest(name, "plan-ns", strategy, directories[name]))
    cluster.create(sandbox_manifest("s-none", "plan-ns", "none", directories["s-none"]))
    cluster.create(db_sandbox("s-pg", "plan-ns", "pg"))
    cluster.create(db_sandbox("s-db", "plan-ns", "db"))
    names = ["s-git", "s-copy", "s-overlay", "s-none", "s-pg", "s-db"]
    statuses = {name: cluster.wait_active(name) for name in names}
    for name, file in (("s-git", "f.txt"), ("s-copy", "g.txt"), ("s-overlay", "h.txt")):
        (Path(statuses[name]["sandboxPath"]) / file).write_text("changed\n")
    for name in ("s-git", "s-copy", "s-overlay"):
        cluster.create(checkpoint_manifest(f"c-{name}", name))
    for name in ("s-git", "s-copy", "s-overlay"):
        assert cluster.wait_phase("checkpoint", f"c-{name}", {"Ready", "Failed"})["phase"] == (
            "Ready"
        )
    cluster.create(plancommit_manifest("pc", "plan-ns", approval="Required"))
    phase = cluster.wait_phase("pcommit", "pc", {"AwaitingApproval", "Failed", "Committed"})
    assert phase["phase"] == "AwaitingApproval", phase
    operator.stop()

    cluster.server.kubectl("delete", "namespace", cluster.namespace, "--wait=false", check=True)
    cluster.kubectl("delete", "secrets,plancommits,checkpoints,sandboxes", "--all", "--wait=false")
    operator.start()
    started = time.monotonic()

    wait_for(
        lambda: cluster.kubectl("get", "sandbox-all", "-o", "name").stdout.strip() == "",
        30,
        "every Sandbox, Checkpoint and PlanCommit finalized",
    )
    print(f"namespace emptied {time.monotonic() - started:.1f}s after the operator started")
    state, root = operator.work_dir / "state", operator.work_dir / "sandboxes"
    assert [p for p in state.rglob("*") if p.is_file()] == []
    assert [p for p in root.rglob("*") if not p.is_dir()] == []
    assert git(repo, "tag", "--list", "sandbox/*").strip() == ""
    assert git(repo, "branch", "--list", "sandbox/*").strip() == ""
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert (repo / "f.txt").read_text() == "r0\n"
    for name, file, text in (("s-copy", "g.txt", "d0\n"), ("s-overlay", "h.txt", "o0\n")):
        assert (directories[name] / file).read_text() == text
    with psycopg.connect(postgres_schema_dsn, autocommit=True) as connection:
        assert connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)
        assert connection.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
