"""The lifecycle metrics (sandbox_operator.kube.lifecycle_metrics): what each histogram and the
per-phase gauge observe for real bodies and watch events, read back from the registry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY, generate_latest
from sandbox_operator import __version__
from sandbox_operator.kube.lifecycle_metrics import (
    PhaseIndex,
    SandboxStartup,
    observe_plan_phases,
    parse_time,
)

NOW = datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC)


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _sandbox(uid: str, phase: str | None = None, created: datetime = NOW) -> dict[str, object]:
    status = {"phase": phase} if phase else {}
    return {
        "metadata": {"uid": uid, "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "status": status,
    }


def test_a_new_sandbox_reports_each_startup_phase_once_and_create_to_active() -> None:
    startup = SandboxStartup()
    before = {
        phase: _sample("sandbox_operator_sandbox_startup_phase_seconds_count", phase=phase)
        for phase in ("reconcile_start", "workspace_pod", "active")
    }
    total_count = _sample("sandbox_operator_sandbox_create_to_active_seconds_count")
    total_sum = _sample("sandbox_operator_sandbox_create_to_active_seconds_sum")
    body = _sandbox("u-new", created=NOW - timedelta(seconds=3))
    startup.reconcile_started(body, now=NOW)
    startup.reconcile_started(body, now=NOW)  # a retry of the create handler: not again
    startup.pod_ready("u-new")
    assert len(startup) == 1
    startup.active(_sandbox("u-new", "Pending", NOW - timedelta(seconds=3)), now=NOW)
    assert len(startup) == 0
    after = {
        phase: _sample("sandbox_operator_sandbox_startup_phase_seconds_count", phase=phase)
        for phase in before
    }
    assert {phase: after[phase] - before[phase] for phase in before} == {
        "reconcile_start": 1.0,
        "workspace_pod": 1.0,
        "active": 1.0,
    }
    assert _sample("sandbox_operator_sandbox_create_to_active_seconds_count") == total_count + 1
    assert _sample("sandbox_operator_sandbox_create_to_active_seconds_sum") == total_sum + 3.0


def test_an_active_sandbox_mirrored_again_is_no_new_start() -> None:
    startup = SandboxStartup()
    count = _sample("sandbox_operator_sandbox_create_to_active_seconds_count")
    startup.reconcile_started(_sandbox("u-old", "Active"), now=NOW)  # a restart's re-provision
    startup.active(_sandbox("u-old", "Active"), now=NOW)
    startup.pod_ready("u-unknown")
    assert len(startup) == 0
    assert _sample("sandbox_operator_sandbox_create_to_active_seconds_count") == count


def test_a_sandbox_deleted_while_starting_is_forgotten() -> None:
    startup = SandboxStartup()
    startup.reconcile_started(_sandbox("u-gone"), now=NOW)
    startup.forget("u-gone")
    assert len(startup) == 0


def test_plan_commit_phases_come_from_the_recorded_times() -> None:
    labels = {"action": "Commit"}
    before = {
        phase: (
            _sample("sandbox_operator_plan_commit_phase_seconds_count", phase=phase, **labels),
            _sample("sandbox_operator_plan_commit_phase_seconds_sum", phase=phase, **labels),
        )
        for phase in ("review", "approval", "commit")
    }
    body = {"metadata": {"creationTimestamp": "2026-05-01T12:00:00Z"}}
    status = {
        "review": {"reviewedAt": "2026-05-01T12:00:02Z"},
        "conditions": [
            {"type": "Reviewed", "status": "True", "lastTransitionTime": "2026-05-01T12:00:02Z"},
            {"type": "Approved", "status": "True", "lastTransitionTime": "2026-05-01T12:00:20Z"},
        ],
    }
    observe_plan_phases("Commit", body, status, now=NOW)
    deltas = {
        phase: (
            _sample("sandbox_operator_plan_commit_phase_seconds_count", phase=phase, **labels)
            - before[phase][0],
            _sample("sandbox_operator_plan_commit_phase_seconds_sum", phase=phase, **labels)
            - before[phase][1],
        )
        for phase in before
    }
    assert deltas == {"review": (1.0, 2.0), "approval": (1.0, 18.0), "commit": (1.0, 10.0)}


def test_a_rollback_without_review_times_only_its_commit_from_creation() -> None:
    labels = {"action": "Rollback"}
    review = _sample("sandbox_operator_plan_commit_phase_seconds_count", phase="review", **labels)
    commit = _sample("sandbox_operator_plan_commit_phase_seconds_sum", phase="commit", **labels)
    body = {"metadata": {"creationTimestamp": "2026-05-01T12:00:25Z"}}
    observe_plan_phases("Rollback", body, {"conditions": []}, now=NOW)
    assert (
        _sample("sandbox_operator_plan_commit_phase_seconds_count", phase="review", **labels)
        == review
    )
    assert (
        _sample("sandbox_operator_plan_commit_phase_seconds_sum", phase="commit", **labels)
        == commit + 5.0
    )


def test_the_phase_gauge_counts_objects_by_their_last_event() -> None:
    index = PhaseIndex()
    index.event("Sandbox", {"type": "ADDED", "object": _sandbox("a")})
    index.event("Sandbox", {"type": "ADDED", "object": _sandbox("b", "Pending")})
    index.event("Sandbox", {"type": "MODIFIED", "object": _sandbox("a", "Active")})
    index.event("Sandbox", {"type": "MODIFIED", "object": _sandbox("b", "Active")})
    index.event("PlanCommit", {"type": "ADDED", "object": _sandbox("p", "AwaitingApproval")})
    index.event("Sandbox", {"type": "ADDED", "object": _sandbox("c", "Errored")})
    index.event("Sandbox", {"type": "DELETED", "object": _sandbox("c", "Errored")})
    index.event("Sandbox", {"type": "ADDED", "object": {"metadata": {}}})  # no uid: ignored
    assert index.counts() == {("Sandbox", "Active"): 2, ("PlanCommit", "AwaitingApproval"): 1}
    (family,) = index.collect()
    assert family.name == "sandbox_operator_objects"
    assert {(s.labels["kind"], s.labels["phase"], s.value) for s in family.samples} == {
        ("Sandbox", "Active", 2),
        ("PlanCommit", "AwaitingApproval", 1),
    }


def test_build_info_names_the_version() -> None:
    exposition = generate_latest(REGISTRY).decode()
    (line,) = [x for x in exposition.splitlines() if x.startswith("sandbox_operator_build_info{")]
    assert f'version="{__version__}"' in line
    assert line.endswith(" 1.0")


def test_timestamps_parse_or_are_none() -> None:
    assert parse_time("2026-05-01T12:00:30Z") == NOW
    assert parse_time("") is None
    assert parse_time("yesterday") is None
