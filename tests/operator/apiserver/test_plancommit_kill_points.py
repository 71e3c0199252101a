"""An operator SIGKILLed at every point between a sandbox's commit and the PlanCommit's journal
write ends the plan all or nothing after a restart (issue 11, tier 2).

The small soak once saw a plan end ``Failed`` with edits left on its originals. These tests kill
the operator through the core's fault hook (``SANDBOX_CORE_FAULT=<point>:<index>``: before a
commit, after it returned, after the sandbox's record and Sandbox object were updated, after the
journal said so; around each compensation; around each two-phase prepare, the decision and each
apply), for the Saga and the TwoPhase modes, with and without an injected commit failure on the
last sandbox (the soak's "conflict"), and with the fault armed on the restarted operator too
(killed again in its recovery). After a clean restart the PlanCommit must be terminal with every
original holding the plan's edit (``Committed``) or none of them (``Failed``), no failed
compensation, a plan with an injected failure never ``Committed`` and a plan without one always
``Committed`` (resumed from its journal, issue 11 "Scale under faults").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    plancommit_manifest,
    run_operator,
)
from tests.support.plan_kills import AFTER, TERMINAL, edited_plan, killed_or_done

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, "kp")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path)


PREPARE = ("before_prepare", "after_prepare")
APPLY = ("before_apply", "after_apply")
# (mode, fault point, failure injected on r3, starts with the fault armed)
CASES = [
    *[("Saga", f"{p}:{i}", False, 1) for p in ("before_commit", "after_commit") for i in (1, 2, 3)],
    *[("Saga", f"{p}:{i}", False, 1) for p in ("after_persist", "after_record") for i in (1, 2)],
    ("Saga", "after_persist:3", False, 1),
    *[("Saga", f"{p}:2", True, 1) for p in ("after_commit", "after_persist", "after_record")],
    *[
        ("Saga", f"{p}:{i}", True, kills)
        for p in ("before_compensate", "after_compensate")
        for i in (1, 2)
        for kills in (1, 2)
    ],
    *[("TwoPhase", f"{p}:{i}", False, 1) for p in PREPARE for i in (1, 3)],
    ("TwoPhase", "after_decision:0", False, 1),
    ("TwoPhase", "after_decision:0", False, 2),
    *[("TwoPhase", f"{p}:{i}", False, 1) for p in APPLY for i in (1, 2, 3)],
    ("TwoPhase", "after_apply:2", False, 2),
    ("TwoPhase", "after_prepare:2", True, 1),
]


@pytest.mark.parametrize(("mode", "fault", "failing", "kills"), CASES)
def test_a_kill_between_a_commit_and_the_journal_ends_the_plan_all_or_nothing(
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
    mode: str,
    fault: str,
    failing: bool,
    kills: int,
) -> None:
    env = {"SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "r3" if failing else ""}
    armed = {**env, "SANDBOX_CORE_FAULT": fault}
    operator.start(armed)  # the fault points are only reached by a plan commit
    originals = edited_plan(cluster, tmp_path, "plan-kp")
    cluster.create(plancommit_manifest("pc-kp", "plan-kp", mode=mode))
    killed = 0
    for start in range(kills):
        if start:
            operator.start(armed)
        if not killed_or_done(cluster, operator):
            break  # this run's recovery never reached the point: the plan is terminal
        killed += 1
        assert "fault injection: SIGKILL" in operator.log_paths[-1].read_text(), operator.logs()
    assert killed >= 1, f"the fault point {fault} was never reached"
    operator.stop()
    operator.start(env)
    final = cluster.wait_phase("pcommit", "pc-kp", TERMINAL, timeout=120)
    landed = [(original / "f.txt").read_text() == AFTER for original in originals]
    assert all(landed) or not any(landed), (landed, final)
    assert final["failedRollbackIds"] == [], final
    if not failing:
        # Issue 11: a plan that nothing but a kill interrupted resumes from its journal and
        # commits (sandbox_operator.resume), whatever the point of the kill.
        assert final["phase"] == "Committed", final
    if final["phase"] == "Committed":
        assert all(landed), final
        assert not failing, final
    else:
        assert final["phase"] == "Failed", final
        assert not any(landed), final
    for original in originals:  # nothing else changed on the originals
        assert sorted(p.name for p in original.iterdir()) == ["f.txt"]
