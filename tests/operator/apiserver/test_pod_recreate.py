"""Issue 8 leftover: a transaction_rollback (or none) workspace Pod keeps its state on a small
scratch claim, so a deleted Pod is made again and the sandbox continues with its logged
statements (tier 2: real API server, real operator with the pod executor, real agent process,
real SQLite; the test plays the kubelet, whose scratch volume is the claim's directory).

Before the claim, the agent's state lived in an emptyDir: the new Pod's agent created the
sandbox again under the same id with an empty statement log, and the PlanCommit committed
nothing while reporting success.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sandbox_core import SandboxFactory, SandboxStore
from tests.support.kubelet import POD, Kubelet
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    db_sandbox,
    plancommit_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


def log_statement(scratch: Path, sandbox_id: str, dsn: str, sql: str) -> None:
    """An actor's write through the sandbox, in the Pod (its scratch state directory)."""
    sandbox: Any = SandboxFactory().reopen(SandboxStore(str(scratch / "state")).load(sandbox_id))
    sandbox.use_credentials(dsn)
    sandbox.execute(sql)
    sandbox.close()


def test_a_recreated_pod_keeps_the_database_sandbox_and_its_statements(
    cluster: Cluster,
    pod_operator: tuple[OperatorProcess, Kubelet],
) -> None:
    _, kubelet = pod_operator
    cluster.create(db_sandbox("s-db", "plan-r", "db"))
    wait_for(lambda: cluster.get("pod", POD), 60, "the workspace Pod")
    pod = cluster.get("pod", POD)
    assert pod is not None
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    claim = volumes["scratch"]["persistentVolumeClaim"]["claimName"]
    pvc = cluster.get("persistentvolumeclaim", claim)
    assert pvc is not None
    assert pvc["spec"]["resources"]["requests"]["storage"] == "256Mi"
    assert pvc["metadata"]["ownerReferences"][0]["name"] == "s-db"
    kubelet.start_container()
    kubelet.report_ready()
    status = cluster.wait_phase("sandbox", "s-db", {"Active", "Errored"}, timeout=60)
    assert status["phase"] == "Active", status
    sandbox_id = status["sandboxId"]
    database = Path(kubelet.dsn.removeprefix("sqlite:///"))
    log_statement(
        kubelet.scratch_dir(pod), sandbox_id, kubelet.dsn, "INSERT INTO notes VALUES ('kept')"
    )

    # The Pod is deleted (evicted, node drained): its process ends, the operator makes a new
    # Pod on the same claim, the kubelet starts it with the claim's directory.
    old_uid = pod["metadata"]["uid"]
    cluster.kubectl("delete", "pod", POD, "--wait=true")
    kubelet.stop()
    new_pod = wait_for(
        lambda: (
            found
            if (found := cluster.get("pod", POD)) and found["metadata"]["uid"] != old_uid
            else None
        ),
        60,
        "a new workspace Pod",
    )
    assert kubelet.scratch_dir(new_pod) == kubelet.scratch_dir(pod)
    kubelet.start_container()
    kubelet.report_ready()
    wait_for(
        lambda: (cluster.condition("sandbox", "s-db", "Ready") or {}).get("status") == "True",
        60,
        "Ready=True again",
    )
    assert cluster.status("sandbox", "s-db")["sandboxId"] == sandbox_id

    # The statement logged before the Pod went is committed by the plan.
    cluster.create(plancommit_manifest("pc-r", "plan-r"))
    final = cluster.wait_phase("pcommit", "pc-r", {"Committed", "Failed"}, timeout=90)
    assert final["phase"] == "Committed", final
    with sqlite3.connect(database) as connection:
        assert [r[0] for r in connection.execute("SELECT body FROM notes")] == ["kept"]
    # Through the agent's two-phase routes (issue 9): reviewed, the SQLite sandbox the last
    # resource (held by the agent between prepare and apply), applied under the plan's txid.
    assert (cluster.condition("pcommit", "pc-r", "Reviewed") or {}).get("status") == "True"
    assert (cluster.condition("pcommit", "pc-r", "TwoPhase") or {}).get("status") != "False"
    record = cluster.status("sandbox", "s-db")["coreRecord"]
    assert record["status"] == "committed"
    assert record["last_commit"]["metadata"]["txid"], record["last_commit"]
