"""Two operator replicas, one active (issue 11, "High availability"), on the real API server.

Both processes run with leader election (a ``coordination.k8s.io`` Lease, sandbox_operator.leader)
and share the local executor's state and sandbox directories, as replicas share the cluster.
The leader is SIGKILLed by the core's fault hook in the middle of a PlanCommit (after the second
sandbox's commit landed, before the journal says so); the standby takes the Lease over within a
bound and resumes the saga from the journal in the PlanCommit's status: the plan ends all or
nothing, checked on the original repository and directories. Their JSON logs show that no handler
of the standby ran before the leader's last line (no handler runs in both at once).
"""

from __future__ import annotations

import datetime
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_operator.kube.leader import LEADING_MESSAGE

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    git,
    plancommit_manifest,
    three_sandbox_plan,
    wait_for,
)

pytestmark = pytest.mark.slow

LEASE = "ha-test-leader"
LEASE_DURATION = 6.0
RETRY_PERIOD = 0.5
# Measured takeover after a SIGKILL: the Lease's duration, one standby poll, kopf's start.
TAKEOVER_BOUND_SECONDS = LEASE_DURATION + RETRY_PERIOD + 4.0


def _replica(server: Any, cluster: Cluster, tmp_path: Path, name: str) -> OperatorProcess:
    work = tmp_path / name
    work.mkdir()
    shared = tmp_path / "shared"
    return OperatorProcess(
        server,
        cluster.namespace,
        work,
        {
            "SANDBOX_OPERATOR_STATE_DIR": str(shared / "state"),
            "SANDBOX_OPERATOR_SANDBOX_ROOT": str(shared / "sandboxes"),
            "SANDBOX_OPERATOR_LEADER_ELECTION": "true",
            "SANDBOX_OPERATOR_POD_NAMESPACE": cluster.namespace,
            "SANDBOX_OPERATOR_POD_NAME": name,
            "SANDBOX_OPERATOR_LEADER_ELECTION_LEASE_NAME": LEASE,
            "SANDBOX_OPERATOR_LEASE_DURATION_SECONDS": str(LEASE_DURATION),
            # Each Lease request may take (duration - deadline) / 2 = 1.5 s on a busy machine.
            "SANDBOX_OPERATOR_RENEW_DEADLINE_SECONDS": "3",
            "SANDBOX_OPERATOR_RETRY_PERIOD_SECONDS": str(RETRY_PERIOD),
        },
    )


@pytest.fixture
def replicas(
    local_apiserver: Any,
    tmp_path: Path,
) -> Iterator[tuple[Cluster, OperatorProcess, OperatorProcess]]:
    cluster = Cluster.fresh(local_apiserver, "ha")
    first = _replica(local_apiserver, cluster, tmp_path, "replica-a")
    second = _replica(local_apiserver, cluster, tmp_path, "replica-b")
    yield cluster, first, second
    for process in (first, second):
        if process.process is not None and process.process.poll() is None:
            cluster.kubectl("delete", "sandboxes", "--all", "--timeout=60s", check=False)
            break
    for process in (first, second):
        process.stop()
        print(process.logs()[-6000:])


def _records(process: OperatorProcess) -> list[dict[str, Any]]:
    out = []
    for line in process.logs().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            record["at"] = datetime.datetime.strptime(record["time"], "%Y-%m-%d %H:%M:%S,%f")
            out.append(record)
    return out


def _leading_at(process: OperatorProcess) -> datetime.datetime | None:
    for record in _records(process):
        if str(record["message"]).startswith(LEADING_MESSAGE):
            return record["at"]  # type: ignore[no-any-return]
    return None


def _holder(cluster: Cluster) -> str:
    lease = json.loads(cluster.kubectl("get", "lease", LEASE, "-o", "json").stdout)
    return str(lease["spec"].get("holderIdentity") or "")


def _handler_records(process: OperatorProcess) -> list[dict[str, Any]]:
    """Records written by kopf about objects (handlers, patches): the reconciling itself."""
    return [r for r in _records(process) if str(r.get("logger", "")).startswith("kopf.objects")]


def test_standby_takes_over_a_plancommit_killed_mid_saga(
    replicas: tuple[Cluster, OperatorProcess, OperatorProcess], tmp_path: Path
) -> None:
    cluster, first, second = replicas
    # The leader kills itself after the 2nd sandbox's commit landed, before the journal said so.
    first.start({"SANDBOX_CORE_FAULT": "after_commit:2"})
    wait_for(lambda: _leading_at(first), 60, "replica-a leading")
    second.start()
    wait_for(lambda: "standby" in second.logs(), 60, "replica-b waiting as a standby")
    assert _holder(cluster).startswith("replica-a_")
    cluster.operator = first
    plan = three_sandbox_plan(cluster, tmp_path, "plan-ha")
    head_before = git(plan["repo"], "rev-parse", "HEAD")
    assert _handler_records(first), "the leader reconciled the Sandboxes"
    assert not _handler_records(second), "the standby must not reconcile anything"
    cluster.operator = None
    cluster.create(plancommit_manifest("pc-ha", "plan-ha", mode="Saga"))  # saga fault points
    assert first.wait_exit(90) != 0  # SIGKILLed by the fault hook, mid-saga
    killed_at = _records(first)[-1]["at"]
    mid = cluster.status("pcommit", "pc-ha")
    assert mid["phase"] == "Committing"
    assert [step["state"] for step in mid["sandboxes"]] == ["Committed", "Committing", "Pending"]

    cluster.operator = second
    leading = wait_for(lambda: _leading_at(second), 60, "replica-b leading")
    takeover = (leading - killed_at).total_seconds()
    print(f"takeover after SIGKILL: {takeover:.2f}s (bound {TAKEOVER_BOUND_SECONDS}s)")
    assert 0 < takeover <= TAKEOVER_BOUND_SECONDS
    assert _holder(cluster).startswith("replica-b_")
    final = cluster.wait_phase("pcommit", "pc-ha", {"Committed", "RolledBack", "Failed"})
    changed = [
        (plan["repo"] / "f.txt").read_text() == "r1\n",
        (plan["data"] / "g.txt").read_text() == "d1\n",
        (plan["layer"] / "h.txt").read_text() == "o1\n",
    ]
    assert all(changed) or not any(changed), (changed, final)
    assert final["failedRollbackIds"] == []
    if final["phase"] == "Committed":
        assert all(changed)
    else:  # an interrupted, compensated commit ends Failed with RolledBack=True (issue 11 §6)
        assert final["phase"] == "Failed" and not any(changed)
        assert git(plan["repo"], "rev-parse", "HEAD") == head_before
    assert git(plan["repo"], "log", "--format=%s", "--all").count("plan-ha") <= 1

    # No handler ran in both at once: every kopf record of the standby comes after its lead
    # began, which came after the leader's last record.
    assert killed_at < leading
    assert all(r["at"] >= leading for r in _handler_records(second))
    assert _handler_records(second), "the new leader finished the PlanCommit"


def test_graceful_stop_hands_the_lease_over_at_once(
    replicas: tuple[Cluster, OperatorProcess, OperatorProcess],
) -> None:
    """SIGTERM: the leader releases the Lease at exit, the standby leads well before the Lease
    would have expired (a rolling update's handover)."""
    cluster, first, second = replicas
    first.start()
    wait_for(lambda: _leading_at(first), 60, "replica-a leading")
    second.start()
    wait_for(lambda: "standby" in second.logs(), 60, "replica-b waiting as a standby")
    began = time.monotonic()
    assert first.process is not None
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=60) == 0, first.logs()[-3000:]
    stopped = time.monotonic() - began
    assert "released Lease" in first.logs()
    wait_for(lambda: _leading_at(second), 30, "replica-b leading")
    handover = time.monotonic() - began - stopped
    print(f"graceful handover: stop {stopped:.2f}s, then lead after {handover:.2f}s")
    assert handover < LEASE_DURATION
    assert _holder(cluster).startswith("replica-b_")


def test_a_leader_that_loses_the_lease_stops_at_once(
    replicas: tuple[Cluster, OperatorProcess, OperatorProcess],
) -> None:
    """Fencing: when the Lease names another holder (or cannot be renewed), the leader exits
    within one renewal period instead of reconciling beside the new holder."""
    cluster, first, _ = replicas
    first.start()
    wait_for(lambda: _leading_at(first), 60, "replica-a leading")
    cluster.kubectl(
        "patch", "lease", LEASE, "--type=merge", "-p", '{"spec":{"holderIdentity":"intruder"}}'
    )
    began = time.monotonic()
    assert first.wait_exit(30) == 70
    assert time.monotonic() - began < RETRY_PERIOD + 5
    assert "lost the lead" in first.logs()
    assert _holder(cluster) == "intruder"  # it did not fight for the Lease on its way out
