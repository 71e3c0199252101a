"""Stress harness: N Sandboxes created at once, create->Active percentiles with a per-phase
breakdown from timestamps observed for real. Not a test.

Run (tier 2: etcd + kube-apiserver + the operator with the local executor, started here)::

    TMPDIR=/dev/shm .venv/bin/python benchmarks/stress.py [--sandboxes 100]
        [--strategy copy_on_write] [--max-workers 6] [--json FILE]

Against a cluster with a kubelet and the chart's operator (tier 3, pod executor), with a
Sandbox manifest whose ``metadata.name`` and ``spec.resourceId`` are replaced per copy::

    .venv/bin/python benchmarks/stress.py --kubeconfig FILE --namespace NS
        --template sandbox.yaml [--metrics-url http://.../metrics] [--sandboxes 100]

(``tests/operator/apiserver/test_stress.py`` runs a small one: 20 Sandboxes, tier 2.)

Method (also printed beside the figures). One ``kubectl apply`` of a multi-document YAML of N
Sandboxes; a watch on the namespace's Sandboxes (and, with the pod executor, its Pods) opened
before the apply records when each event arrives (this process's wall clock, milliseconds);
at the end one list reads the timestamps the API holds (one-second resolution). Per Sandbox:

- ``admission``: the apply began -> its ``ADDED`` event (the API server accepted it; kubectl
  creates the objects one after another, so this grows with N). API: ``creationTimestamp``.
- ``reconcile_start``: ``ADDED`` -> its first ``MODIFIED`` event, the operator's first write
  (kopf's finalizer patch, or the status patch when the admission policy set the finalizer).
  API: the earliest ``managedFields[].time`` of a manager other than kubectl.
- ``pod_scheduled``, ``pod_ready``, ``agent_ready`` (pod executor only): the workspace Pod's
  ``PodScheduled``, ``PodReadyToStartContainers`` (sandbox and volumes up) and ``Ready`` (the
  agent's ``/healthz`` readiness probe passed) conditions turning True; watch arrival and
  the conditions' ``lastTransitionTime``.
- ``active``: the previous mark -> the event showing ``status.phase: Active``. API: the Ready
  condition's ``lastTransitionTime``.

The workspace Pod of a Sandbox is the one its ``status.workspacePod`` names (seen on the
Sandbox's events, and in the list at the end), not a name derived from the Sandbox's: a Sandbox
served by a warm-pool Pod (``sbx-pool-...``, chart ``workspace.warmPool``) is *warm*. Its Pod was
scheduled and Ready before the apply, so its breakdown is ``admission``, ``reconcile_start`` and
``active`` (:data:`WARM_PHASES`), the last being the hand-over: reconcile start -> Active, which
holds claiming a Ready pool Pod (one merge patch) and handing its agent the Sandbox's token. Cold
(own Pod) and warm Sandboxes are reported in separate tables.

create->Active is ``ADDED`` -> Active per Sandbox (watch), and ``creationTimestamp`` -> Ready's
``lastTransitionTime`` (API). Percentiles are nearest-rank. The operator's own histograms
(``sandbox_operator_sandbox_create_to_active_seconds``, ``..._startup_phase_seconds``) are read
from its /metrics at the end and printed beside the harness's: their counts must equal N, and
their mean create->Active (``creationTimestamp`` -> its Active patch) must not exceed the
harness's (``creationTimestamp`` -> the Active event's arrival) by more than clock skew.

The API's marks are whole seconds written by three clocks: the API server's
(``creationTimestamp``, ``managedFields``), the kubelet's (the Pod's conditions) and the
operator's estimate of the API server's (Ready's ``lastTransitionTime``, good to half a second:
:mod:`sandbox_operator.kube.clock`). A mark that follows another by less than that error can
read one second earlier, so the order check allows :data:`API_ORDER_SLACK_SECONDS` on the API
clock and nothing on the watch's.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

GROUP, VERSION = "sandbox.cleveragents.io", "v1beta1"
PLAN = "stress"
SOURCE_FILES = 20
LOCAL_PHASES = ("admission", "reconcile_start", "active")
POD_PHASES = ("admission", "reconcile_start", "pod_scheduled", "pod_ready", "agent_ready", "active")
# A warm Sandbox's Pod phases happened before the apply: its last phase is the hand-over.
WARM_PHASES = LOCAL_PHASES
POOL_POD_PREFIX = "sbx-pool-"  # warm_pool.build_pool_pod's generateName
POD_CONDITIONS = {
    "pod_scheduled": "PodScheduled",
    "pod_ready": "PodReadyToStartContainers",
    "agent_ready": "Ready",
}
METHOD = (
    "method: one kubectl apply of N Sandboxes; a watch opened before it records each event's "
    "arrival (this process's clock, ms); one list at the end reads the API's timestamps (1 s "
    "resolution). admission = apply began -> ADDED (API: creationTimestamp); reconcile_start = "
    "ADDED -> first MODIFIED, the operator's first write (API: earliest managedFields time not "
    "kubectl's); pod_scheduled / pod_ready / agent_ready (pod executor) = the workspace Pod's "
    "PodScheduled / PodReadyToStartContainers / Ready turning True; active = -> status.phase "
    "Active (API: Ready's lastTransitionTime, the operator's estimate of the API's clock, good "
    "to 0.5 s; so API marks may read up to 1 s out of order). A Sandbox's Pod is the one its "
    "status.workspacePod names; warm (a warm-pool Pod, sbx-pool-*, Scheduled and Ready before "
    "the apply): admission, reconcile_start, then active = the hand-over, reconcile start -> "
    "Active (claiming a Ready pool Pod, one merge patch, and handing its agent the Sandbox's "
    "token). Percentiles nearest-rank over the Sandboxes of each table."
)
# Whole seconds from clocks up to half a second apart: a later mark may read one second earlier.
API_ORDER_SLACK_SECONDS = 1.0


def _stamp(value: Any) -> float | None:
    """An API timestamp (RFC 3339, ``Z``) as POSIX seconds; None when absent."""
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def is_pool_pod(name: str) -> bool:
    """``name`` is a warm-pool Pod's (:data:`POOL_POD_PREFIX`)."""
    return name.startswith(POOL_POD_PREFIX)


def workspace_pod(sandbox: Mapping[str, Any]) -> str:
    """A Sandbox's ``status.workspacePod`` ("" when absent)."""
    return str((sandbox.get("status") or {}).get("workspacePod") or "")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100] of ``values``. Raises ValueError when empty."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100)
    return ordered[int(rank) - 1]


@dataclass
class Timeline:
    """The marks of one Sandbox: ``watch`` (event arrival, POSIX seconds on this process's clock)
    and ``api`` (the API's own timestamps, whole seconds), each by phase end name."""

    name: str
    watch: dict[str, float] = field(default_factory=dict)
    api: dict[str, float] = field(default_factory=dict)
    pod: str = ""  # its status.workspacePod ("" with the local executor, or none yet)

    @property
    def warm(self) -> bool:
        """Served by a warm-pool Pod (started before the apply)."""
        return is_pool_pod(self.pod)

    def durations(self, phases: Sequence[str], clock: str) -> dict[str, float]:
        """Seconds spent in each of ``phases`` present on ``clock`` (``watch`` or ``api``);
        a phase runs from the previous phase's mark (``applied`` before the first)."""
        marks = self.watch if clock == "watch" else self.api
        out: dict[str, float] = {}
        previous = marks.get("applied")
        for phase in phases:
            mark = marks.get(phase)
            if mark is not None and previous is not None:
                out[phase] = mark - previous
            previous = mark if mark is not None else previous
        return out

    def missing(self, phases: Sequence[str]) -> list[str]:
        """``clock:phase`` of every mark that is absent (the API has no mark of ``admission``'s
        start: ``applied`` is this process's)."""
        gone = [f"watch:{p}" for p in ("applied", *phases) if p not in self.watch]
        return gone + [f"api:{p}" for p in phases if p not in self.api]

    def out_of_order(self, phases: Sequence[str]) -> list[str]:
        """Pairs of consecutive marks whose later phase is earlier than the one before it (on
        the API clock, by more than :data:`API_ORDER_SLACK_SECONDS`)."""
        bad = []
        for clock, marks, slack in (
            ("watch", self.watch, 0.0),
            ("api", self.api, API_ORDER_SLACK_SECONDS),
        ):
            names = [p for p in ("applied", *phases) if p in marks]
            for before, after in itertools.pairwise(names):
                if marks[after] < marks[before] - slack:
                    bad.append(f"{clock}: {after} before {before}")
        return bad


@dataclass
class StressReport:
    """What one run measured. Seconds; ``operator`` holds the samples of its histograms.
    ``phases`` are a cold Sandbox's (its own workspace Pod, or the local executor); a warm
    one's (:attr:`Timeline.warm`) are :data:`WARM_PHASES`."""

    sandboxes: int
    executor: str
    strategy: str
    phases: tuple[str, ...]
    timelines: list[Timeline]
    apply_seconds: float
    last_active_seconds: float
    load_average: tuple[float, float, float]
    operator: dict[str, float] = field(default_factory=dict)

    def phases_of(self, timeline: Timeline) -> tuple[str, ...]:
        """The phases of ``timeline``: :data:`WARM_PHASES` when warm, else :attr:`phases`."""
        return WARM_PHASES if timeline.warm else self.phases

    def groups(self) -> list[tuple[str, list[Timeline]]]:
        """``("cold", [...])`` then ``("warm", [...])``, each with its timelines in order; a
        group without any is left out."""
        cold = [t for t in self.timelines if not t.warm]
        warm = [t for t in self.timelines if t.warm]
        return [(label, group) for label, group in (("cold", cold), ("warm", warm)) if group]

    def create_to_active(
        self, clock: str, timelines: Sequence[Timeline] | None = None
    ) -> list[float]:
        """Per Sandbox (of ``timelines``, default all), seconds from its admission mark to
        Active on ``clock``."""
        out = []
        for timeline in self.timelines if timelines is None else timelines:
            marks = timeline.watch if clock == "watch" else timeline.api
            if "admission" in marks and "active" in marks:
                out.append(marks["active"] - marks["admission"])
        return out

    def harness_create_to_active_mean(self) -> float:
        """Mean of ``creationTimestamp`` -> the Active event's arrival (what the operator's
        ``create_to_active`` histogram measures, seen from here)."""
        values = [
            t.watch["active"] - t.api["admission"]
            for t in self.timelines
            if "active" in t.watch and "admission" in t.api
        ]
        return sum(values) / len(values) if values else 0.0

    def problems(self) -> list[str]:
        """Every missing mark and every out-of-order pair, by Sandbox, each against its own
        phases (:meth:`phases_of`; empty when complete and monotonic), and a Sandbox count
        that is not N."""
        found = [] if len(self.timelines) == self.sandboxes else [
            f"{len(self.timelines)} timelines for {self.sandboxes} Sandboxes"
        ]  # fmt: skip
        for timeline in self.timelines:
            phases = self.phases_of(timeline)
            found += [f"{timeline.name}: missing {m}" for m in timeline.missing(phases)]
            found += [f"{timeline.name}: {b}" for b in timeline.out_of_order(phases)]
        return found

    def table(self) -> str:
        """The figures as Markdown, one table per group (:meth:`groups`; headed with the pod
        executor), the method beside them."""
        lines = [
            f"{self.sandboxes} Sandboxes ({self.strategy}, {self.executor} executor) created at "
            f"once: apply {self.apply_seconds:.2f} s, last Active {self.last_active_seconds:.2f} s "
            f"after the apply began; load average {self.load_average[0]:.1f} / "
            f"{self.load_average[1]:.1f} / {self.load_average[2]:.1f}",
        ]

        def cells(values: list[float], unit: float, digits: int) -> str:
            if not values:
                return " - | - | - "
            figures = (percentile(values, q) * unit for q in (50, 90, 99))
            return " | ".join(f"{value:.{digits}f}" for value in figures)

        for label, group in self.groups():
            if self.executor == "pod":
                what = "a warm-pool Pod claimed" if label == "warm" else "its own workspace Pod"
                lines += ["", f"{label}: {len(group)} Sandboxes on {what}"]
            lines += [
                "",
                "| phase | watch p50 (ms) | p90 | p99 | API p50 (s) | p90 | p99 |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            phases = WARM_PHASES if label == "warm" else self.phases
            for phase in phases:
                watch = [t.durations(phases, "watch")[phase] for t in group
                         if phase in t.durations(phases, "watch")]  # fmt: skip
                api = [t.durations(phases, "api")[phase] for t in group
                       if phase in t.durations(phases, "api")]  # fmt: skip
                if phase == "admission":
                    api = []  # the API has no mark of the apply's start
                name = "active (hand-over)" if label == "warm" and phase == "active" else phase
                lines.append(f"| {name} | {cells(watch, 1000, 0)} | {cells(api, 1, 0)} |")
            lines.append(
                f"| **create->Active** | {cells(self.create_to_active('watch', group), 1000, 0)} "
                f"| {cells(self.create_to_active('api', group), 1, 0)} |"
            )
        count = self.operator.get("create_to_active_count", 0.0)
        mean = self.operator.get("create_to_active_sum", 0.0) / count if count else 0.0
        phase_counts = ", ".join(
            f"{p} {self.operator.get(f'phase_count:{p}', 0.0):.0f}"
            for p in ("reconcile_start", "workspace_pod", "active")
        )
        if self.operator:
            lines += [
                "",
                f"cross-check, the operator's histograms: create_to_active count {count:.0f} (of "
                f"{self.sandboxes}), mean {mean:.3f} s; the harness's creationTimestamp -> Active "
                f"event mean {self.harness_create_to_active_mean():.3f} s; startup_phase counts "
                f"{phase_counts}",
            ]
        lines += ["", METHOD]
        return "\n".join(lines) + "\n"


class _Watch:
    """One watch (its own thread) on a namespaced list; ``on_event(type, object, arrival)``
    for each event, arrival being ``time.time()``."""

    def __init__(
        self, list_call: Callable[..., Any], args: Sequence[Any],
        on_event: Callable[[str, dict[str, Any], float], None],
    ) -> None:  # fmt: skip
        from kubernetes import watch

        self._watch = watch.Watch()
        self._list_call = list_call
        self._args = args
        self._on_event = on_event
        self.error: BaseException | None = None
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            stream = self._watch.stream(self._list_call, *self._args, timeout_seconds=3600)
            self.started.set()
            for event in stream:
                raw = event["object"]
                item = raw if isinstance(raw, dict) else raw.to_dict()
                self._on_event(event["type"], item, time.time())
        except BaseException as exc:  # the watch ends when stop() closes it
            self.error = exc
            self.started.set()

    def stop(self) -> None:
        self._watch.stop()


class Recorder:
    """The watch marks of one run, by Sandbox name; thread-safe. A Pod's marks are kept by Pod
    name (its events may come before any Sandbox event names it) and join the timeline of the
    Sandbox whose ``status.workspacePod`` names it in :meth:`resolve`."""

    def __init__(self, executor: str) -> None:
        self.executor = executor
        self.timelines: dict[str, Timeline] = {}
        # Pod name -> the first arrival of each POD_CONDITIONS phase (True), any Pod.
        self.pods: dict[str, dict[str, float]] = {}
        self._changed = threading.Condition()

    def expect(self, names: Sequence[str], applied: float) -> None:
        with self._changed:
            for name in names:
                timeline = self.timelines.setdefault(name, Timeline(name))
                timeline.watch["applied"] = applied

    def sandbox_event(self, kind: str, item: dict[str, Any], arrival: float) -> None:
        name = item["metadata"]["name"]
        with self._changed:
            timeline = self.timelines.setdefault(name, Timeline(name))
            marks = timeline.watch
            if kind == "ADDED":
                marks.setdefault("admission", arrival)
            elif kind == "MODIFIED":
                marks.setdefault("reconcile_start", arrival)
            if (item.get("status") or {}).get("phase") == "Active":
                marks.setdefault("active", arrival)
            timeline.pod = workspace_pod(item) or timeline.pod
            self._changed.notify_all()

    def pod_event(self, kind: str, item: dict[str, Any], arrival: float) -> None:
        true = {
            c.get("type")
            for c in (item.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"
        }
        with self._changed:
            marks = self.pods.setdefault(item["metadata"]["name"], {})
            for phase, condition in POD_CONDITIONS.items():
                if condition in true:
                    marks.setdefault(phase, arrival)

    def resolve(self, listed: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Give each timeline its workspace Pod and that Pod's marks. The Pod is the one
        ``status.workspacePod`` names in ``listed`` (Sandbox name -> the Sandbox as listed at
        the end), else the last one its events named. A warm Sandbox (:attr:`Timeline.warm`)
        takes no Pod marks: its Pod was scheduled and Ready before the apply."""
        with self._changed:
            for name, timeline in self.timelines.items():
                listed_pod = workspace_pod((listed or {}).get(name) or {})
                timeline.pod = listed_pod or timeline.pod
                if timeline.pod and not timeline.warm:
                    for phase, arrival in self.pods.get(timeline.pod, {}).items():
                        timeline.watch.setdefault(phase, arrival)

    def wait_active(self, count: int, timeout: float, alive: Callable[[], None]) -> float:
        """The arrival of the last of ``count`` Active events. Raises RuntimeError after
        ``timeout`` seconds (with the count reached), or what ``alive`` raises."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                active = [t.watch["active"] for t in self.timelines.values() if "active" in t.watch]
                if len(active) >= count:
                    return max(active)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"only {len(active)} of {count} Sandboxes Active")
                alive()
                self._changed.wait(min(left, 1.0))


def api_marks(sandbox: Mapping[str, Any], pod: Mapping[str, Any] | None) -> dict[str, float]:
    """The API's own timestamps of one Sandbox (and its workspace Pod), by phase end name."""
    metadata = sandbox.get("metadata") or {}
    marks: dict[str, float] = {}
    created = _stamp(metadata.get("creationTimestamp"))
    if created is not None:
        marks["admission"] = created
    writes = [
        stamp
        for entry in metadata.get("managedFields") or []
        if not str(entry.get("manager", "")).startswith("kubectl")
        and (stamp := _stamp(entry.get("time"))) is not None
    ]
    if writes:
        marks["reconcile_start"] = min(writes)
    for condition in (sandbox.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            stamp = _stamp(condition.get("lastTransitionTime"))
            if stamp is not None:
                marks["active"] = stamp
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        for phase, kind in POD_CONDITIONS.items():
            if condition.get("type") == kind and condition.get("status") == "True":
                stamp = _stamp(condition.get("lastTransitionTime"))
                if stamp is not None:
                    marks[phase] = stamp
    return marks


def scrape_operator(url: str) -> dict[str, float]:
    """The operator's lifecycle histograms from its /metrics: ``create_to_active_count`` and
    ``_sum``, and ``phase_count:<phase>`` / ``phase_sum:<phase>`` of the startup phases."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url!r}")
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (checked above)
        text = response.read().decode()
    out: dict[str, float] = {}
    prefix = "sandbox_operator_sandbox_"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        key, _, value = line.rpartition(" ")
        if key.startswith(prefix + "create_to_active_seconds_"):
            out["create_to_active_" + key.rsplit("_", 1)[1]] = float(value)
        elif key.startswith(prefix + "startup_phase_seconds_") and "phase=" in key:
            kind = key.split("{")[0].rsplit("_", 1)[1]
            phase = key.split('phase="')[1].split('"')[0]
            if kind in ("count", "sum"):
                out[f"phase_{kind}:{phase}"] = float(value)
    return out


@dataclass
class StressConfig:
    """What to run: ``sandboxes`` at once of ``strategy``; seconds are wall-clock seconds."""

    sandboxes: int = 100
    strategy: str = "copy_on_write"
    max_workers: int = 6
    timeout_seconds: float = 600.0


class Target:
    """Where the Sandboxes go: a namespace, kubectl and the API client, the operator's metrics
    URL, the manifests, and a liveness check of the operator (tier 2 only)."""

    def __init__(
        self, kubeconfig: Path, namespace: str, executor: str, metrics_url: str | None,
        manifest: Callable[[str], dict[str, Any]], kubectl: Callable[..., Any],
        alive: Callable[[], None] = lambda: None,
    ) -> None:  # fmt: skip
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.executor = executor
        self.metrics_url = metrics_url
        self.manifest = manifest
        self.kubectl = kubectl
        self.alive = alive


def measure(target: Target, config: StressConfig) -> StressReport:
    """Create ``config.sandboxes`` Sandboxes at once in ``target`` and record their timelines
    (with the pod executor, each Sandbox's Pod is its ``status.workspacePod``: a warm-pool Pod
    makes it warm, :data:`WARM_PHASES`).

    Raises:
        RuntimeError: the apply failed, a watch could not start, or not all were Active within
            ``config.timeout_seconds``.
    """
    from kubernetes import client
    from kubernetes import config as kube_config

    api_client = kube_config.new_client_from_config(config_file=str(target.kubeconfig))
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    recorder = Recorder(target.executor)
    watches = [
        _Watch(custom.list_namespaced_custom_object,
               (GROUP, VERSION, target.namespace, "sandboxes"), recorder.sandbox_event),
    ]  # fmt: skip
    if target.executor == "pod":
        watches.append(_Watch(core.list_namespaced_pod, (target.namespace,), recorder.pod_event))
    try:
        for watch in watches:
            watch.started.wait(30)
            if watch.error is not None:
                raise RuntimeError(f"watch failed: {watch.error}")
        time.sleep(0.5)  # the watch request reaches the API server before the first create
        names = [f"{PLAN}-{i:04d}" for i in range(config.sandboxes)]
        manifests = [target.manifest(name) for name in names]
        applied = time.time()
        recorder.expect(names, applied)
        result = target.kubectl(
            "-n", target.namespace, "apply", "-f", "-",
            input=yaml.safe_dump_all(manifests), timeout=1200,
        )  # fmt: skip
        apply_seconds = time.time() - applied
        if result.returncode != 0:
            raise RuntimeError(f"kubectl apply failed: {result.stderr[-2000:]}")
        last = recorder.wait_active(config.sandboxes, config.timeout_seconds, target.alive)
        time.sleep(1.0)  # late events of the last patches
    finally:
        for watch in watches:
            watch.stop()
    load = os.getloadavg()
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, target.namespace, "sandboxes")
    pods: dict[str, dict[str, Any]] = {}
    if target.executor == "pod":
        pods = {p.metadata.name: api_client.sanitize_for_serialization(p)
                for p in core.list_namespaced_pod(target.namespace).items}  # fmt: skip
    by_name = {item["metadata"]["name"]: item for item in listed["items"]}
    recorder.resolve(by_name)
    timelines = []
    for name in names:
        timeline = recorder.timelines[name]
        if name in by_name:
            # A warm Sandbox's Pod conditions precede the apply: not its marks.
            pod = None if timeline.warm else pods.get(timeline.pod)
            timeline.api = api_marks(by_name[name], pod)
        timelines.append(timeline)
    operator: dict[str, float] = {}
    if target.metrics_url:
        try:
            operator = scrape_operator(target.metrics_url)
        except OSError as exc:  # the figures stand without the cross-check
            print(f"stress: the operator's /metrics did not answer: {exc}", file=sys.stderr)
    return StressReport(
        sandboxes=config.sandboxes,
        executor=target.executor,
        strategy=config.strategy,
        phases=POD_PHASES if target.executor == "pod" else LOCAL_PHASES,
        timelines=timelines,
        apply_seconds=apply_seconds,
        last_active_seconds=last - applied,
        load_average=load,
        operator=operator,
    )


def run_local(server: Any, work: Path, config: StressConfig) -> StressReport:
    """Tier 2: a fresh namespace on ``server`` (a running ``LocalApiServer``), the operator with
    the local executor watching it (its metrics on a free port), and :func:`measure`. The
    operator is stopped at the end; the Sandboxes and the namespace are left to the caller's
    server (tier 2 never finalizes namespaces). Raises what :func:`measure` raises."""
    from tests.support.apiserver.harness import free_port
    from tests.support.operator import Cluster, OperatorProcess, make_dir, sandbox_manifest

    cluster = Cluster.fresh(server, prefix="stress")
    source = work / "source"
    source.mkdir(parents=True)
    make_dir(source, {f"d{i % 4}/f{i:02d}.txt": f"line of file {i}\n" * 50
                      for i in range(SOURCE_FILES)})  # fmt: skip
    port = free_port()
    operator_dir = work / "operator"
    operator_dir.mkdir()
    operator = OperatorProcess(
        server, cluster.namespace, operator_dir,
        extra_env={
            "SANDBOX_OPERATOR_METRICS_PORT": str(port),
            "SANDBOX_OPERATOR_MAX_WORKERS": str(config.max_workers),
            "SANDBOX_OPERATOR_TTL_CHECK_INTERVAL_SECONDS": "10",
        },
    )  # fmt: skip
    cluster.operator = operator
    operator.start()
    try:
        _wait_metrics(f"http://127.0.0.1:{port}/metrics", operator.assert_alive)

        def manifest(name: str) -> dict[str, Any]:
            return sandbox_manifest(name, PLAN, config.strategy, source, resource_id=name)

        target = Target(
            server.kubeconfig_path, cluster.namespace, "local",
            f"http://127.0.0.1:{port}/metrics", manifest, server.kubectl, operator.assert_alive,
        )  # fmt: skip
        return measure(target, config)
    finally:
        server.kubectl(
            "-n", cluster.namespace, "delete", "sandboxes", "--all", "--timeout=120s",
            timeout=180.0,
        )  # fmt: skip
        operator.stop()


def _wait_metrics(url: str, alive: Callable[[], None], timeout: float = 60.0) -> None:
    """Until the operator's /metrics answers (its startup is not part of the figures)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive()
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 (ours: http://127.0.0.1)
                time.sleep(2.0)  # kopf's first (empty) list and watch
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the operator's metrics never answered at {url}")


TRACEMALLOC_HOOK = """\
import os, signal, tracemalloc

_out = os.environ.get("STRESS_TRACEMALLOC_DIR")
if _out:
    tracemalloc.start(int(os.environ.get("STRESS_TRACEMALLOC_FRAMES", "1")))
    _taken = []

    def _dump(signum, frame):
        import gc

        gc.collect()
        path = os.path.join(_out, "snapshot-%d.pickle" % len(_taken))
        tracemalloc.take_snapshot().dump(path)
        _taken.append(path)

    signal.signal(signal.SIGUSR2, _dump)
"""


@dataclass
class MemoryReport:
    """The operator's ``VmRSS`` (KiB, /proc/<pid>/status) with none of ``sandboxes`` Sandboxes
    and with all of them Active, in one process; ``top`` the tracemalloc lines that grew most
    (with ``--tracemalloc``)."""

    sandboxes: int
    cold_kib: int
    idle_kib: int
    loaded_kib: int
    peak_kib: int
    seconds_to_active: float
    load_average: tuple[float, float, float]
    top: list[str] = field(default_factory=list)

    @property
    def per_sandbox_kib(self) -> float:
        return (self.loaded_kib - self.idle_kib) / self.sandboxes

    def text(self) -> str:
        lines = [
            f"operator RSS: {self.cold_kib / 1024:.1f} MiB after its start, "
            f"{self.idle_kib / 1024:.1f} MiB with 0 Sandboxes (warm), "
            f"{self.loaded_kib / 1024:.1f} MiB with {self.sandboxes} Active (strategy none; peak "
            f"{self.peak_kib / 1024:.1f} MiB): {self.per_sandbox_kib:.1f} KiB per Sandbox; "
            f"cold ({self.loaded_kib - self.cold_kib} KiB / N): "
            f"{(self.loaded_kib - self.cold_kib) / self.sandboxes:.1f} KiB; "
            f"{self.sandboxes} to Active in {self.seconds_to_active:.1f} s; load average "
            f"{self.load_average[0]:.1f} / {self.load_average[1]:.1f} / {self.load_average[2]:.1f}",
            "method: one operator process (local executor, its own namespace) 10 s after its "
            "startup handler finished (cold), after one Sandbox was made Active and deleted "
            "(warm: the modules imported on first use loaded), and again 10 s after the last "
            "of N Sandboxes (strategy none: no files) is Active (with --tracemalloc: after a "
            "gc.collect()); VmRSS of /proc/<pid>/status; per Sandbox (loaded - warm) / N",
        ]
        if self.top:
            lines += ["tracemalloc, what grew (by line):", *[f"  {line}" for line in self.top]]
        return "\n".join(lines) + "\n"


def _rss(pid: int) -> dict[str, int]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values


def _warm_up(server: Any, namespace: str, source: Path, alive: Callable[[], None]) -> None:
    """One Sandbox made Active and deleted: the modules the operator imports on its first
    Sandbox and its first deletion are loaded before the idle figure."""
    from tests.support.operator import sandbox_manifest

    item = sandbox_manifest("warm-up", "stress-rss", "none", source, resource_id="warm-up")
    server.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(item), check=True)
    deadline = time.monotonic() + 120
    phase = ("-n", namespace, "get", "sandbox", "warm-up", "-o", "jsonpath={.status.phase}")
    while "Active" not in server.kubectl(*phase).stdout:
        alive()
        if time.monotonic() > deadline:
            shown = server.kubectl("-n", namespace, "get", "sandbox", "warm-up", "-o", "yaml")
            raise RuntimeError(f"the warm-up Sandbox never became Active:\n{shown.stdout}")
        time.sleep(0.5)
    server.kubectl(
        "-n", namespace, "delete", "sandbox", "warm-up", "--timeout=120s", check=True,
        timeout=150.0,
    )  # fmt: skip


def measure_memory(
    server: Any,
    work: Path,
    sandboxes: int,
    trace: bool = False,
    top: int = 25,
    warm: bool = True,
    operator_src: Path | None = None,
) -> MemoryReport:
    """RSS of a fresh operator with 0 and with ``sandboxes`` Active Sandboxes (strategy
    ``none``) on ``server`` (a running ``LocalApiServer``). With ``trace`` the operator runs
    under tracemalloc (a ``sitecustomize`` hook; SIGUSR2 dumps a snapshot) and the ``top``
    allocation sites that grew most are reported, by traceback (``STRESS_TRACEMALLOC_FRAMES``
    frames, default 8); tracemalloc's own memory inflates RSS then. With ``warm`` (default) the
    idle figure is taken after one Sandbox was made Active and deleted (:func:`_warm_up`), so
    the modules imported on first use are not counted per Sandbox; ``cold_kib`` is the figure
    before it. ``operator_src``: run the operator of another source tree (a directory holding
    ``operator/`` and ``sandbox_core/``, e.g. a ``git archive`` of an earlier commit).

    Raises:
        RuntimeError: the Sandboxes did not all become Active, or a snapshot never came.
    """
    import signal

    from tests.support.operator import Cluster, OperatorProcess, make_dir, sandbox_manifest

    cluster = Cluster.fresh(server, prefix="stress-rss")
    source = work / "rss-source"
    source.mkdir(parents=True)
    make_dir(source, {"f.txt": "x\n"})
    operator_dir = work / "operator-rss"
    operator_dir.mkdir()
    env = {"SANDBOX_OPERATOR_TTL_CHECK_INTERVAL_SECONDS": "10"}
    tree = operator_src or REPO_ROOT
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "operator"), str(tree)])
    if trace:
        hook = work / "tracemalloc-hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(TRACEMALLOC_HOOK)
        env["STRESS_TRACEMALLOC_DIR"] = str(hook)
        env["STRESS_TRACEMALLOC_FRAMES"] = os.environ.get("STRESS_TRACEMALLOC_FRAMES", "8")
        env["PYTHONPATH"] = os.pathsep.join([str(hook), env["PYTHONPATH"]])
    operator = OperatorProcess(server, cluster.namespace, operator_dir, extra_env=env)
    cluster.operator = operator
    operator.start()
    assert operator.process is not None
    pid = operator.process.pid
    snapshots: list[Path] = []

    def snapshot() -> None:
        if not trace:
            return
        path = work / "tracemalloc-hook" / f"snapshot-{len(snapshots)}.pickle"
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2.0)  # the dump finishes writing
        if not path.exists():
            raise RuntimeError("the operator wrote no tracemalloc snapshot")
        snapshots.append(path)

    try:
        # kopf's line after the startup handler; then its first (empty) list and watch.
        deadline = time.monotonic() + 300
        while "Activity 'configure' succeeded" not in operator.logs():
            operator.assert_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("the operator's startup handler never finished")
            time.sleep(0.5)
        time.sleep(10)
        cold = _rss(pid)
        if warm:
            _warm_up(server, cluster.namespace, source, operator.assert_alive)
            time.sleep(5)
        snapshot()
        idle = _rss(pid)
        names = [f"rss-{i:05d}" for i in range(sandboxes)]
        started = time.time()
        for chunk in range(0, sandboxes, 200):
            items = [sandbox_manifest(n, "stress-rss", "none", source, resource_id=n)
                     for n in names[chunk : chunk + 200]]  # fmt: skip
            result = server.kubectl(
                "-n", cluster.namespace, "create", "-f", "-",
                input=yaml.safe_dump_all(items), timeout=600,
            )  # fmt: skip
            if result.returncode != 0:
                raise RuntimeError(f"kubectl create failed: {result.stderr[-2000:]}")
        deadline = time.monotonic() + 120 + 2.0 * sandboxes
        while True:
            operator.assert_alive()
            listed = server.kubectl(
                "-n", cluster.namespace, "get", "sandboxes", "-o",
                "jsonpath={.items[*].status.phase}", check=True, timeout=120.0,
            ).stdout.split()  # fmt: skip
            if listed.count("Active") >= sandboxes:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{listed.count('Active')} of {sandboxes} Active")
            time.sleep(2.0)
        elapsed = time.time() - started
        time.sleep(10)  # the last patches and Events settle
        snapshot()
        loaded = _rss(pid)
    finally:
        server.kubectl(
            "-n", cluster.namespace, "delete", "sandboxes", "--all", "--wait=false",
            timeout=300.0,
        )  # fmt: skip
        operator.stop()
        if sys.exc_info()[0] is not None:
            print(operator.logs()[-3000:], file=sys.stderr)
    lines: list[str] = []
    if trace:
        import tracemalloc

        before, after = (tracemalloc.Snapshot.load(str(p)) for p in snapshots)
        stats = after.compare_to(before, "traceback")
        prefixes = (str(REPO_ROOT) + "/", sys.prefix + "/lib/", sys.base_prefix + "/lib/")

        def short(name: str) -> str:
            for prefix in prefixes:
                name = name.removeprefix(prefix)
            return name.removeprefix("site-packages/")

        for stat in stats[:top]:
            lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
            lines += [f"      {short(f.filename)}:{f.lineno}" for f in stat.traceback]
        total = sum(stat.size_diff for stat in stats)
        lines.append(f"total traced growth {total / 1024:.1f} KiB "
                     f"({total / 1024 / sandboxes:.1f} KiB per Sandbox)")  # fmt: skip
    return MemoryReport(
        sandboxes, cold["VmRSS"], idle["VmRSS"], loaded["VmRSS"], loaded["VmHWM"], elapsed,
        os.getloadavg(), lines,
    )  # fmt: skip


def _kubectl_for(kubeconfig: Path) -> Callable[..., Any]:
    def kubectl(*args: str, input: str | None = None, timeout: float = 120.0) -> Any:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), *args],
            input=input, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    return kubectl


def _template(path: Path) -> Callable[[str], dict[str, Any]]:
    base = yaml.safe_load(path.read_text())

    def manifest(name: str) -> dict[str, Any]:
        item = copy.deepcopy(base)
        item.setdefault("metadata", {})["name"] = name
        item["metadata"].pop("namespace", None)
        item.setdefault("spec", {})["resourceId"] = name
        item["spec"]["planId"] = PLAN
        return item

    return manifest


def _iter_args(argv: Sequence[str] | None) -> Iterator[argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=100)
    parser.add_argument("--strategy", default="copy_on_write")
    parser.add_argument("--max-workers", type=int, default=6, help="kopf's thread pools (tier 2)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="also write every timeline to this file")
    parser.add_argument("--kubeconfig", type=Path, help="an existing cluster (tier 3)")
    parser.add_argument("--namespace", help="with --kubeconfig: where the Sandboxes go")
    parser.add_argument("--template", type=Path, help="with --kubeconfig: a Sandbox manifest")
    parser.add_argument("--executor", default="pod", help="with --kubeconfig: the operator's")
    parser.add_argument("--metrics-url", help="with --kubeconfig: the operator's /metrics")
    parser.add_argument(
        "--memory", type=int, metavar="K",
        help="instead: the operator's RSS per Sandbox with K Sandboxes Active (tier 2)",
    )  # fmt: skip
    parser.add_argument("--tracemalloc", action="store_true", help="with --memory: what grew")
    parser.add_argument(
        "--operator-src", type=Path, metavar="DIR",
        help="with --memory: the operator of another source tree (holds operator/, sandbox_core/)",
    )  # fmt: skip
    yield parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = next(_iter_args(argv))
    config = StressConfig(args.sandboxes, args.strategy, args.max_workers, args.timeout)
    if args.memory:
        from tests.support.apiserver.harness import LocalApiServer

        work = Path(tempfile.mkdtemp(prefix="sandbox-stress-rss-"))
        try:
            with LocalApiServer() as server:
                memory = measure_memory(
                    server, work, args.memory, trace=args.tracemalloc,
                    operator_src=args.operator_src,
                )  # fmt: skip
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(memory.text())
        return 0
    if args.kubeconfig:
        if not (args.namespace and args.template):
            print("--kubeconfig needs --namespace and --template", file=sys.stderr)
            return 2
        target = Target(
            args.kubeconfig, args.namespace, args.executor, args.metrics_url,
            _template(args.template), _kubectl_for(args.kubeconfig),
        )  # fmt: skip
        report = measure(target, config)
    else:
        from tests.support.apiserver.harness import LocalApiServer

        work = Path(tempfile.mkdtemp(prefix="sandbox-stress-"))
        try:
            with LocalApiServer() as server:
                report = run_local(server, work, config)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(report.table())
    problems = report.problems()
    for problem in problems[:20]:
        print(f"  incomplete: {problem}")
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
