"""The compensation loop appears once in the code (issue 9, §1).

The operator's ``action: Rollback`` used to carry a second copy of the saga's loop; both now call
:func:`sandbox_core.plan.saga.run_compensations`.
"""

from __future__ import annotations

from pathlib import Path

from sandbox_core.plan.journal import JournalState, JournalStep, StepState
from sandbox_core.plan.saga import run_compensations

ROOT = Path(__file__).resolve().parents[3]


def test_only_one_place_marks_a_step_compensating() -> None:
    sources = [
        *ROOT.joinpath("sandbox_core").rglob("*.py"),
        *ROOT.joinpath("operator").rglob("*.py"),
    ]
    marking = [
        str(path.relative_to(ROOT))
        for path in sources
        for line in path.read_text(encoding="utf-8").splitlines()
        if "state = StepState.COMPENSATING" in line
    ]
    assert marking == ["sandbox_core/plan/saga.py"]
    handlers = ROOT / "operator/sandbox_operator/resources/plancommit.py"
    assert "run_compensations(" in handlers.read_text(encoding="utf-8")


def test_run_compensations_attempts_every_step_and_names_failures() -> None:
    state = JournalState(
        plan_id="p",
        steps=[JournalStep(sandbox_id=s, state=StepState.COMMITTED) for s in "abc"],
        failed_rollback_ids=["c"],
    )
    saved: list[list[str]] = []
    done: list[tuple[str, bool]] = []

    def undo(step: JournalStep, target: str) -> None:
        if target == "broken":
            raise OSError("disk full")

    failures = run_compensations(
        state,
        [(state.steps[2], "ok"), (state.steps[1], "broken"), (state.steps[0], "ok")],
        undo,
        lambda st: saved.append([s.state.value for s in st.steps]),
        on_done=lambda step, _t, exc: done.append((step.sandbox_id, exc is None)),
    )
    assert [(s.sandbox_id, str(e)) for s, _, e in failures] == [("b", "disk full")]
    assert [s.state for s in state.steps] == [
        StepState.COMPENSATED,
        StepState.COMPENSATION_FAILED,
        StepState.COMPENSATED,
    ]
    assert state.rolled_back_ids == ["c", "a"]
    assert state.failed_rollback_ids == ["b"]
    assert state.steps[1].error == "OSError: disk full"
    assert done == [("c", True), ("b", False), ("a", True)]
    assert len(saved) == 6  # before and after each step
