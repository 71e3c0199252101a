"""Deleting a Sandbox never waits for another object (tier 2, real API server): whatever became
of the Secret its source names, its finalizer removes what the Sandbox made and lets it go.
A namespace's deletion removes its Secrets and Sandboxes in no set order, and ``kubectl delete
-f`` of one file deletes them in the file's order."""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import Cluster, OperatorProcess, run_operator, wait_for

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
