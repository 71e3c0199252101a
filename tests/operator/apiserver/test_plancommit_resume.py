"""A PlanCommit that only operator kills interrupt resumes from its journal and commits all of
its plan (issue 11, "Scale under faults"; tier 2, real API server).

The 600-Sandbox soak with a kill every 4 s ended 41 of 48 plans without an injected conflict
``Failed`` / ``Interrupted`` (docs/benchmarks.md). The root causes, one test each:

1. Saga, killed between two steps: recovery compensated the committed steps (roll back, not
   forward) instead of committing the pending ones.
2. Saga, killed inside a ``copy_on_write`` commit: the strategy could not say whether the commit
   landed, so the step counted as committed and the plan was compensated.
3. TwoPhase, killed before the decision: recovery aborted every participant (nothing changed)
   and ended the PlanCommit ``Failed`` instead of starting a new attempt.
4. TwoPhase, killed again during that abort: the same, with the message lost
   ("commit of plan ... did not complete").

Each kill is the core's fault hook (``SANDBOX_CORE_FAULT``, SIGKILL at a named point), armed on
the first ``kills`` operator processes; the last one starts clean. The plan must end
``Committed`` with every original holding its edit and nothing else on the originals.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import Cluster, OperatorProcess, plancommit_manifest, run_operator
from tests.support.plan_kills import (
    AFTER,
    TERMINAL,
    edited_plan,
    killed_or_done,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, "kp")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path)


def run_killed(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path, mode: str, fault: str, kills: int
) -> tuple[dict[str, Any], list[Path]]:
    """Commit a three-Sandbox plan with the operator killed ``kills`` times at ``fault``."""
    armed = {"SANDBOX_CORE_FAULT": fault}
    operator.start(armed)
    originals = edited_plan(cluster, tmp_path, "plan-kp")
    cluster.create(plancommit_manifest("pc-kp", "plan-kp", mode=mode))
    for start in range(kills):
        if start:
            operator.start(armed)
        assert killed_or_done(cluster, operator), f"kill {start + 1} at {fault} never happened"
        assert "fault injection: SIGKILL" in operator.log_paths[-1].read_text(), operator.logs()
    operator.start({})
    final = cluster.wait_phase("pcommit", "pc-kp", TERMINAL, timeout=120)
    return final, originals


def assert_committed(final: dict[str, Any], originals: list[Path]) -> None:
    assert final["phase"] == "Committed", final
    assert final["failedRollbackIds"] == [] and final["rolledBackIds"] == [], final
    for original in originals:
        assert (original / "f.txt").read_text() == AFTER, final
        assert sorted(p.name for p in original.iterdir()) == ["f.txt"]


@pytest.mark.parametrize(
    ("fault", "kills"), [("after_record:1", 1), ("after_record:1,after_record:2", 2)]
)
def test_saga_killed_between_steps_commits_the_pending_steps(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path, fault: str, kills: int
) -> None:
    """Root cause 1: the restarted operator commits the rest, also when killed again."""
    final, originals = run_killed(cluster, operator, tmp_path, "Saga", fault, kills)
    assert_committed(final, originals)


@pytest.mark.parametrize("fault", ["after_commit:2", "before_commit:2"])
def test_saga_killed_inside_a_copy_on_write_commit_commits(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path, fault: str
) -> None:
    """Root cause 2: ``commit_landed()`` of copy_on_write tells a landed commit from one that
    did not land, so the step is adopted or committed again, never compensated."""
    final, originals = run_killed(cluster, operator, tmp_path, "Saga", fault, 1)
    assert_committed(final, originals)
    steps = {s["name"]: s for s in final["sandboxes"]}
    assert steps["sb-r2"]["state"] == "Committed", final


def test_two_phase_killed_before_the_decision_runs_a_new_attempt(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Root cause 3: the aborted attempt (nothing touched) is followed by attempt 2."""
    final, originals = run_killed(cluster, operator, tmp_path, "TwoPhase", "after_prepare:3", 1)
    assert_committed(final, originals)
    assert final["twoPhase"]["attempt"] == 2, final


def test_two_phase_killed_again_during_the_abort_runs_a_new_attempt(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Root cause 4: killed before the decision, then in the recovery's abort; the next
    operator aborts again (idempotent) and commits in a new attempt."""
    final, originals = run_killed(
        cluster, operator, tmp_path, "TwoPhase", "after_prepare:3,before_abort:2", 2
    )
    assert_committed(final, originals)
    assert final["twoPhase"]["attempt"] == 2, final
