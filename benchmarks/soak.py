"""Soak run of the operator under crashes, at scale. Not a test.

Run: ``.venv/bin/python benchmarks/soak.py [--sandboxes 2000] [--plans 200] [--kill-every 20]
[--max-kills N] [--conflict-every 5] [--modes TwoPhase,Saga] [--timeout 3600] [--json FILE]
[--keep]`` (tests/operator/apiserver/test_soak_small.py runs a small one: 100 Sandboxes, 2 kills).

On the real API server (tests/support/apiserver/harness.py) with the local executor, it:

1. creates N Sandboxes (``copy_on_write``, each over its own directory) spread over M plans, with
   bulk ``kubectl create`` of multi-object lists, and writes one edit into each sandbox once it is
   Active;
2. creates one PlanCommit per plan, modes TwoPhase and Saga in turn (``--modes``); every
   ``conflict-every``-th plan gets an injected commit failure on its last sandbox (the
   executor's fault hook), so it must be compensated (Saga) or aborted (TwoPhase);
3. deletes every PlanCommit and Sandbox and waits until the API holds none;

while a killer SIGKILLs the operator ``kill-every`` seconds after each (re)start finished its
startup handler, and restarts it at once. It then
checks every plan all or nothing on the originals (Committed: every original has the edit;
RolledBack/Failed: none has), and counts leftovers: objects in the API, files under the sandbox
root, core records in the state dir. It reports wall time, plans committed and failed, kills, and
the peak RSS (``VmHWM``) over every operator process, and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.support.apiserver.harness import LocalApiServer  # noqa: E402
from tests.support.operator import (  # noqa: E402
    Cluster,
    OperatorProcess,
    plancommit_manifest,
    sandbox_manifest,
)

BEFORE, AFTER = "v0\n", "v1\n"
TERMINAL = {"Committed", "RolledBack", "Failed"}
CHUNK = 200  # objects per kubectl call
READY_LINE = "Activity 'configure' succeeded"  # kopf's log line after the startup handler


@dataclass
class SoakConfig:
    """What to run. Seconds are wall-clock seconds."""

    sandboxes: int = 2000
    plans: int = 200
    kill_every_seconds: float = 20.0
    max_kills: int | None = None  # None: keep killing until the end
    conflict_every: int = 5
    timeout_seconds: float = 3600.0
    modes: tuple[str, ...] = ("TwoPhase", "Saga")  # PlanCommit spec.mode, in turn per plan


@dataclass
class SoakReport:
    """What happened; ``ok`` is the verdict the small test asserts."""

    sandboxes: int
    plans: int
    wall_seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    plans_committed: int = 0
    plans_rolled_back: int = 0
    plans_failed: int = 0
    conflicts_injected: int = 0
    injected_plans: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    # Per plan: final phase, mode, injected or not, the Ready condition's reason and message.
    plan_details: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "injected" / "not injected" -> reason -> count, over every plan not Committed.
    failure_reasons: dict[str, dict[str, int]] = field(default_factory=dict)
    all_or_nothing: bool = False
    broken_plans: list[str] = field(default_factory=list)
    kills: int = 0
    restarts: int = 0
    leftover_api_objects: int = -1
    leftover_files: int = -1
    leftover_core_records: int = -1
    peak_rss_kib: int = 0
    load_average_mean: float = 0.0  # 1-minute load average, sampled every 0.5 s
    load_average_max: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.all_or_nothing
            and self.plans_committed + self.plans_rolled_back + self.plans_failed == self.plans
            and self.leftover_api_objects == 0
            and self.leftover_files == 0
            and self.leftover_core_records == 0
            and self.failures_accounted_for
        )

    @property
    def failures_accounted_for(self) -> bool:
        """Every plan not Committed has its reason in ``failure_reasons``."""
        counted = sum(sum(group.values()) for group in self.failure_reasons.values())
        return counted == self.plans_rolled_back + self.plans_failed


def _rss_peak_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Killer:
    """SIGKILLs the operator every ``every`` seconds and restarts it at once."""

    def __init__(self, operator: OperatorProcess, every: float, max_kills: int | None) -> None:
        self.operator = operator
        self.every = every
        self.max_kills = max_kills
        self.kills = 0
        self.peak_rss_kib = 0
        self.loads: list[float] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> None:
        self.loads.append(os.getloadavg()[0])
        with self.lock:
            process = self.operator.process
            if process is not None and process.poll() is None:
                self.peak_rss_kib = max(self.peak_rss_kib, _rss_peak_kib(process.pid))

    def _ready(self) -> bool:
        """The current operator process has finished its startup handler."""
        log = self.operator.log_paths[-1] if self.operator.log_paths else None
        return log is not None and log.exists() and READY_LINE in log.read_text(errors="replace")

    def _run(self) -> None:
        next_kill: float | None = None
        while not self._stop.wait(0.5):
            self.sample()
            if self.max_kills is not None and self.kills >= self.max_kills:
                continue
            if next_kill is None:
                # Count from the end of the startup: on a busy machine a process can need more
                # than the whole interval just to import and start, and would never reconcile.
                if self._ready():
                    next_kill = time.monotonic() + self.every
                continue
            if time.monotonic() >= next_kill:
                with self.lock:
                    self.operator.kill()
                    self.kills += 1
                    self.operator.start()
                next_kill = None

    def done(self) -> bool:
        """True when ``max_kills`` kills happened (always, when unbounded)."""
        return self.max_kills is None or self.kills >= self.max_kills

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.sample()


def _chunks(items: list[dict[str, Any]]) -> Iterable[list[dict[str, Any]]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def _create_all(cluster: Cluster, manifests: list[dict[str, Any]]) -> None:
    for chunk in _chunks(manifests):
        body = {"apiVersion": "v1", "kind": "List", "items": chunk}
        result = cluster.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
        if result.returncode != 0:
            raise RuntimeError(f"kubectl create failed: {result.stderr[-2000:]}")


def _list(cluster: Cluster, plural: str) -> list[dict[str, Any]]:
    result = cluster.kubectl("get", plural, "-o", "json", check=False)
    if result.returncode != 0:
        return []
    return list(json.loads(result.stdout).get("items") or [])


def _condition(status: dict[str, Any]) -> tuple[str, str]:
    """The reason and message of a PlanCommit's ``Committed`` condition (why it did or did not
    commit), else of its last condition."""
    conditions = list(status.get("conditions") or [])
    chosen = [c for c in conditions if c.get("type") == "Committed"] or conditions
    if not chosen:
        return "NoCondition", ""
    last = chosen[-1]
    return str(last.get("reason") or "NoReason"), str(last.get("message") or "")[:300]


def failure_table(report: SoakReport) -> str:
    """A text table: every plan not Committed, grouped by injected or not and by reason."""
    lines = ["group         | count | reason", "--------------|------:|-------"]
    for group in ("injected", "not injected"):
        for reason, count in sorted((report.failure_reasons.get(group) or {}).items()):
            lines.append(f"{group:<13} | {count:>5} | {reason}")
    accounted = sum(sum(g.values()) for g in report.failure_reasons.values())
    lines.append(
        f"plans not Committed: {report.plans_rolled_back + report.plans_failed}, "
        f"accounted for: {accounted}"
    )
    for plan, detail in sorted(report.plan_details.items()):
        if detail["phase"] != "Committed" and not detail["injected"]:
            lines.append(f"  {plan} {detail['mode']} {detail['phase']}: {detail['message']}")
    return "\n".join(lines)


def _wait(
    what: str, probe: Any, deadline: float, operator: Killer, cluster: Cluster | None = None
) -> Any:
    while time.monotonic() < deadline:
        operator.sample()
        value = probe()
        if value:
            return value
        time.sleep(1.0)
    detail = ""
    if cluster is not None:
        # Say which objects are stuck and how, not only that the wait timed out.
        stuck = {}
        for plural in ("sandboxes", "plancommits"):
            for item in _list(cluster, plural):
                status = item.get("status") or {}
                if status.get("phase") not in ("Active", *TERMINAL):
                    stuck[item["metadata"]["name"]] = {
                        "phase": status.get("phase"),
                        "annotations": sorted(item["metadata"].get("annotations") or {}),
                        "finalizers": item["metadata"].get("finalizers"),
                        "conditions": status.get("conditions"),
                    }
        detail = f"; not there yet: {json.dumps(dict(list(stuck.items())[:5]))[:4000]}"
    raise TimeoutError(f"soak: timed out waiting for {what}{detail}")


def run(server: LocalApiServer, work: Path, config: SoakConfig) -> SoakReport:
    """One soak run against ``server``; ``work`` holds the sources, state and logs.

    Raises:
        TimeoutError: a phase did not finish within ``config.timeout_seconds`` overall.
    """
    report = SoakReport(sandboxes=config.sandboxes, plans=config.plans)
    deadline = time.monotonic() + config.timeout_seconds
    began = time.monotonic()
    cluster = Cluster.fresh(server, "soak")
    sources = work / "sources"
    plan_of: dict[str, str] = {}
    faulty: list[str] = []
    manifests = []
    for index in range(config.sandboxes):
        name = f"s{index:05d}"
        plan = f"plan-{index % config.plans:04d}"
        source = sources / name
        source.mkdir(parents=True)
        (source / "f.txt").write_text(BEFORE)
        plan_of[name] = plan
        manifests.append(sandbox_manifest(name, plan, "copy_on_write", source))
    plans = sorted(set(plan_of.values()))
    for number, plan in enumerate(plans):
        if config.conflict_every and number % config.conflict_every == config.conflict_every - 1:
            faulty.append(max(n for n, p in plan_of.items() if p == plan))
    report.conflicts_injected = len(faulty)
    report.injected_plans = sorted(plan_of[name] for name in faulty)
    operator_dir = work / "operator"
    operator_dir.mkdir()
    operator = OperatorProcess(
        server,
        cluster.namespace,
        operator_dir,
        {
            "SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": ",".join(faulty),
            "SANDBOX_OPERATOR_TTL_CHECK_INTERVAL_SECONDS": "30",
        },
    )
    cluster.operator = None  # the killer restarts it; waits must not fail on a dead pid
    operator.start()
    killer = Killer(operator, config.kill_every_seconds, config.max_kills)
    killer.start()
    try:
        mark = time.monotonic()
        _create_all(cluster, manifests)
        edited: set[str] = set()

        def all_active() -> bool:
            for item in _list(cluster, "sandboxes"):
                name, status = item["metadata"]["name"], item.get("status") or {}
                if status.get("phase") == "Active" and name not in edited:
                    (Path(status["sandboxPath"]) / "f.txt").write_text(AFTER)
                    edited.add(name)
            return len(edited) == config.sandboxes

        _wait("every Sandbox Active", all_active, deadline, killer, cluster)
        report.phase_seconds["sandboxes_to_active"] = time.monotonic() - mark

        mark = time.monotonic()
        mode_of = {plan: config.modes[n % len(config.modes)] for n, plan in enumerate(plans)}
        _create_all(
            cluster,
            [plancommit_manifest(f"pc-{plan}", plan, mode=mode_of[plan]) for plan in plans],
        )

        def all_terminal() -> list[dict[str, Any]] | None:
            items = _list(cluster, "plancommits")
            done = [i for i in items if (i.get("status") or {}).get("phase") in TERMINAL]
            return items if len(done) == len(plans) else None

        commits = _wait("every PlanCommit terminal", all_terminal, deadline, killer, cluster)
        report.phase_seconds["plancommits_terminal"] = time.monotonic() - mark
        members: dict[str, list[str]] = {}
        for name, plan in plan_of.items():
            members.setdefault(plan, []).append(name)
        all_or_nothing = True
        for item in commits:
            plan, phase = item["spec"]["planId"], item["status"]["phase"]
            report.outcomes[plan] = phase
            injected = plan in report.injected_plans
            reason, message = _condition(item["status"])
            report.plan_details[plan] = {
                "phase": phase,
                "mode": mode_of[plan],
                "injected": injected,
                "reason": reason,
                "message": message,
            }
            if phase != "Committed":
                group = report.failure_reasons.setdefault(
                    "injected" if injected else "not injected", {}
                )
                group[reason] = group.get(reason, 0) + 1
            edits = [(sources / n / "f.txt").read_text() == AFTER for n in members[plan]]
            if phase == "Committed":
                report.plans_committed += 1
                whole = all(edits)
            else:
                report.plans_rolled_back += phase == "RolledBack"
                report.plans_failed += phase == "Failed"
                whole = not any(edits)
            if not whole:
                all_or_nothing = False
                report.broken_plans.append(f"{plan}:{phase}:{mode_of[plan]}")
        report.all_or_nothing = all_or_nothing

        # A bounded kill count (the test's small soak) is reached before the deletion starts,
        # so a fast machine that finished the plans early still has its operator killed.
        _wait("the planned kills", killer.done, deadline, killer, cluster)
        mark = time.monotonic()
        cluster.kubectl("delete", "plancommits,sandboxes", "--all", "--wait=false", check=False)

        def api_empty() -> bool:
            return not _list(cluster, "sandboxes") and not _list(cluster, "plancommits")

        _wait("every object deleted", api_empty, deadline, killer, cluster)
        report.phase_seconds["delete_all"] = time.monotonic() - mark
    finally:
        killer.stop()
        report.kills = killer.kills
        report.restarts = len(operator.log_paths) - 1
        report.peak_rss_kib = killer.peak_rss_kib
        if killer.loads:
            report.load_average_mean = sum(killer.loads) / len(killer.loads)
            report.load_average_max = max(killer.loads)
        operator.stop()
    report.leftover_api_objects = sum(
        len(_list(cluster, plural)) for plural in ("sandboxes", "plancommits", "checkpoints")
    )
    sandbox_root = operator_dir / "sandboxes"
    report.leftover_files = (
        sum(1 for p in sandbox_root.rglob("*") if not p.is_dir()) if sandbox_root.exists() else 0
    )
    state = operator_dir / "state"
    report.leftover_core_records = len(list(state.glob("*.json"))) if state.exists() else 0
    report.wall_seconds = time.monotonic() - began
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxes", type=int, default=2000)
    parser.add_argument("--plans", type=int, default=200)
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds between kills")
    parser.add_argument("--max-kills", type=int, default=None)
    parser.add_argument("--conflict-every", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (operator logs) and say where"
    )
    parser.add_argument(
        "--modes", default="TwoPhase,Saga", help="PlanCommit modes, used in turn per plan"
    )
    args = parser.parse_args()
    config = SoakConfig(
        sandboxes=args.sandboxes,
        plans=args.plans,
        kill_every_seconds=args.kill_every,
        max_kills=args.max_kills,
        conflict_every=args.conflict_every,
        timeout_seconds=args.timeout,
        modes=tuple(args.modes.split(",")),
    )
    work = Path(tempfile.mkdtemp(prefix="sandbox-soak-"))
    try:
        with LocalApiServer() as server:
            report = run(server, work, config)
    finally:
        if args.keep:
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    data = {**asdict(report), "ok": report.ok, "config": asdict(config)}
    text = json.dumps(data, indent=2)
    print(text)
    print(failure_table(report))
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
