"""Prometheus metrics of object lifecycles: how long a Sandbox takes from creation to Active
and a PlanCommit from creation through review and approval to its end, per phase; how many
objects are in each phase; which build runs.

- ``sandbox_operator_sandbox_create_to_active_seconds``: histogram, ``metadata.creationTimestamp``
  (the API server's clock, one-second resolution) to the status patch that makes a new
  Sandbox Active (this process's clock).
- ``sandbox_operator_sandbox_startup_phase_seconds{phase}``: histogram of each startup phase of a
  new Sandbox: ``reconcile_start`` (creation to the first provision handler run, wall clocks),
  ``workspace_pod`` (that run to the workspace Pod's Ready event, monotonic; Pod executor only),
  ``active`` (the last mark to the Active status patch, monotonic: the agent's provision call).
  Phases after the first one are measured by this replica only: a Sandbox whose start spans an
  operator restart reports ``create_to_active`` but not the phases the new replica did not see.
- ``sandbox_operator_plan_commit_phase_seconds{action,phase}``: histogram, from the status's
  recorded times (one-second resolution, so they survive restarts): ``review`` (creation to
  ``status.review.reviewedAt``), ``approval`` (review to the Approved condition), ``commit``
  (approval, else review, else creation, to the terminal phase).
- ``sandbox_operator_objects{kind,phase}``: gauge, the Sandboxes and PlanCommits this replica
  sees in each ``status.phase`` (``None`` before the first status), from their watch events.
- ``sandbox_operator_build_info{version,python}``: always 1.
"""

from __future__ import annotations

import platform
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import REGISTRY, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Apply to Active is sub-second from a warm pool and seconds to minutes with image pulls.
_STARTUP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# Review and commit take seconds; an approval waits for a person (minutes to hours).
_PLAN_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)

CREATE_TO_ACTIVE = Histogram(
    "sandbox_operator_sandbox_create_to_active_seconds",
    "Seconds from a Sandbox's creationTimestamp to the status patch making it Active (new "
    "Sandboxes only; one-second resolution of the creation time).",
    buckets=_STARTUP_BUCKETS,
)
STARTUP_PHASE = Histogram(
    "sandbox_operator_sandbox_startup_phase_seconds",
    "Seconds a new Sandbox spent in each startup phase: reconcile_start (creation to the first "
    "provision run), workspace_pod (to the workspace Pod's Ready event), active (to Active).",
    ["phase"],
    buckets=_STARTUP_BUCKETS,
)
PLAN_COMMIT_PHASE = Histogram(
    "sandbox_operator_plan_commit_phase_seconds",
    "Seconds a PlanCommit spent in each phase: review (creation to reviewed), approval "
    "(reviewed to approved), commit (approved, else reviewed, else created, to its end).",
    ["action", "phase"],
    buckets=_PLAN_BUCKETS,
)
BUILD_INFO = Gauge(
    "sandbox_operator_build_info",
    "Always 1; the labels name the operator's version and the Python it runs on.",
    ["version", "python"],
)


def _version() -> str:
    try:
        return version("sandbox-operator")
    except PackageNotFoundError:
        return "0+unknown"


BUILD_INFO.labels(_version(), platform.python_version()).set(1)


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of the API (``2026-01-02T03:04:05Z``) as an aware datetime;
    None when absent or unparseable."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _since(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else max(0.0, (now - moment).total_seconds())


class SandboxStartup:
    """Marks of the Sandboxes this replica is starting, by uid (dropped at Active or deletion,
    so it holds only Sandboxes in their first start)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[str, float] = {}  # uid -> monotonic time of the last phase mark

    def reconcile_started(self, body: Mapping[str, Any], now: datetime | None = None) -> None:
        """The provision handler runs for a Sandbox with no phase yet: observe
        ``reconcile_start`` once and start the clock of the next phase."""
        metadata = body.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid or (body.get("status") or {}).get("phase"):
            return
        with self._lock:
            if uid in self._marks:
                return
            self._marks[uid] = time.monotonic()
        waited = _since(parse_time(metadata.get("creationTimestamp")), now or datetime.now(UTC))
        if waited is not None:
            STARTUP_PHASE.labels("reconcile_start").observe(waited)

    def pod_ready(self, uid: str) -> None:
        """The workspace Pod of a starting Sandbox became Ready: observe ``workspace_pod``."""
        with self._lock:
            mark = self._marks.get(uid)
            if mark is None:
                return
            now = time.monotonic()
            self._marks[uid] = now
        STARTUP_PHASE.labels("workspace_pod").observe(now - mark)

    def active(self, body: Mapping[str, Any], now: datetime | None = None) -> None:
        """A new Sandbox (no phase or Pending) is made Active: observe ``active`` (when this
        replica saw it start) and ``create_to_active``, and forget it."""
        metadata = body.get("metadata") or {}
        if (body.get("status") or {}).get("phase") not in (None, "Pending"):
            return
        uid = str(metadata.get("uid") or "")
        with self._lock:
            mark = self._marks.pop(uid, None)
        if mark is not None:
            STARTUP_PHASE.labels("active").observe(time.monotonic() - mark)
        total = _since(parse_time(metadata.get("creationTimestamp")), now or datetime.now(UTC))
        if total is not None:
            CREATE_TO_ACTIVE.observe(total)

    def forget(self, uid: str) -> None:
        """The Sandbox is being deleted or ended before Active."""
        with self._lock:
            self._marks.pop(uid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._marks)


def _condition_time(conditions: Iterable[Mapping[str, Any]] | None, kind: str) -> datetime | None:
    for condition in conditions or ():
        if condition.get("type") == kind and condition.get("status") == "True":
            return parse_time(condition.get("lastTransitionTime"))
    return None


def observe_plan_phases(
    action: str, body: Mapping[str, Any], status: Mapping[str, Any], now: datetime | None = None
) -> None:
    """A PlanCommit reached its terminal phase with ``status`` (the merged status it ends with):
    observe its ``review``, ``approval`` and ``commit`` phases from the recorded times (a phase
    with no recorded start or end is skipped)."""
    end = now or datetime.now(UTC)
    created = parse_time((body.get("metadata") or {}).get("creationTimestamp"))
    reviewed = parse_time((status.get("review") or {}).get("reviewedAt"))
    approved = _condition_time(status.get("conditions"), "Approved")
    if created is not None and reviewed is not None:
        PLAN_COMMIT_PHASE.labels(action, "review").observe(_since(created, reviewed) or 0.0)
    if reviewed is not None and approved is not None:
        PLAN_COMMIT_PHASE.labels(action, "approval").observe(_since(reviewed, approved) or 0.0)
    start = approved or reviewed or created
    if start is not None:
        PLAN_COMMIT_PHASE.labels(action, "commit").observe(_since(start, end) or 0.0)


class PhaseIndex(Collector):
    """``sandbox_operator_objects{kind,phase}``: the phase of every object this replica saw in
    a watch event, counted at scrape time (no label outlives its last object)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}  # (kind, uid) -> phase

    def event(self, kind: str, event: Mapping[str, Any]) -> None:
        """Record one watch event (``type`` and ``object``) of ``kind``."""
        obj = event.get("object") or {}
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        with self._lock:
            if event.get("type") == "DELETED":
                self._phases.pop((kind, uid), None)
            else:
                self._phases[(kind, uid)] = str((obj.get("status") or {}).get("phase") or "None")

    def counts(self) -> dict[tuple[str, str], int]:
        """``(kind, phase) -> objects``."""
        with self._lock:
            return dict(Tally((kind, phase) for (kind, _), phase in self._phases.items()))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "sandbox_operator_objects",
            "Sandboxes and PlanCommits this replica sees, by kind and status.phase.",
            labels=["kind", "phase"],
        )
        for (kind, phase), count in sorted(self.counts().items()):
            family.add_metric([kind, phase], count)
        yield family


SANDBOX_STARTUP = SandboxStartup()
PHASES = PhaseIndex()
REGISTRY.register(PHASES)
