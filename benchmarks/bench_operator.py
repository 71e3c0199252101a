"""Operator benchmark on the real API server, beside the same core operations called directly.

Run: ``.venv/bin/python benchmarks/bench_operator.py [--sandboxes 100] [--plan-size 10]
[--rss-sandboxes 1000] [--strategies copy_on_write,git_worktree] [--markdown FILE]``; the
throughput alone: ``TMPDIR=/dev/shm .venv/bin/python benchmarks/bench_operator.py --throughput
[--sandboxes 100] [--rounds N] [--admission-policy off,on] [--max-workers 6]
[--operator-src LABEL=DIR] [--profile DIR]``. Method and figures: docs/benchmarks.md.

One run starts etcd + kube-apiserver (``tests/support/apiserver/harness.py``),
installs ``crds/`` and runs the operator as a subprocess with the local executor
(``tests/support/operator.py``), then measures:

(a) N Sandboxes to Active: one ``kubectl apply`` of a multi-document YAML, then one
    ``kubectl get sbx -o json`` per second until every phase is Active. Anchor: N x
    ``SandboxFactory.create`` + ``create(plan)`` + ``activate()`` in this process, same strategy
    on the same kind of source.
(b) A PlanCommit of a plan with M Active Sandboxes (each over its own source, same edits in
    each): ``kubectl apply`` of the PlanCommit, then ``kubectl wait --for=condition=Committed``.
    Anchor: ``SandboxManager.commit_all`` of an M-sandbox plan with the same edits, with a
    ``SandboxStore`` (file journal), as the operator persists its state too.
(d) Throughput, ``--throughput``: N Sandboxes to Active through the operator beside
    the same ``kubectl apply`` into a namespace no operator watches (median of three) plus the
    core's own time, with the parts apart: apply (kubectl), per Sandbox the time from its ADDED
    event to Active (a watch: the operator's watch, finalizer, handler and patches), handler
    (the provision handler's mean from the operator's own histogram), core (in-process), the
    operator's CPU seconds and its writes per object (the API server's
    ``apiserver_request_total``). Once per ``--max-workers`` value and per ``--operator-src``
    tree (another operator source tree, e.g. main's, for a before/after in one run), and
    per ``--admission-policy`` mode (``on``: the chart's MutatingAdmissionPolicy sets the
    finalizer, the label and kopf's marker at admission, in the operator's namespace only).
    Also printed: the operator's CPU split into kopf's loop (main thread), its other threads
    and its child processes; the API server's and etcd's CPU during the run and during the bare
    apply; every request of the run by verb and resource; one Sandbox's size in bytes; with
    ``--profile DIR`` a py-spy profile of the operator (speedscope) and its log.
(c) The operator's RSS (``VmRSS`` of /proc/<pid>/status) idle with 0 Sandboxes and after K
    Sandboxes of strategy ``none`` are Active (``none`` keeps the disk out of the measurement),
    in a fresh operator process on its own namespace.

Every process it starts (API server, etcd, operators) is stopped at the end, and every
sandbox goes with the work dir then, never between figures: an ext4 without a journal skips
inodes freed in the last minute when it allocates new ones (``recently_deleted``, seen with
``perf``), so a cleanup before a timed part made its ``cp`` children cost 2-3x. Other writers
(kubectl's cache, store records) still free inodes now and then: ``TMPDIR=/dev/shm`` puts the
work dir on tmpfs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from sandbox_core import SandboxFactory, SandboxManager, SandboxStore  # noqa: E402
from tests.support.apiserver.harness import LocalApiServer, free_port  # noqa: E402
from tests.support.operator import (  # noqa: E402
    GIT_ENV,
    Cluster,
    OperatorProcess,
    install_admission_policy,
    install_crds,
    make_dir,
    make_repo,
    plancommit_manifest,
    sandbox_manifest,
)

SOURCE_FILES = 50
POLL_SECONDS = 1.0
# Not the tests' 1 s: the TTL timer is off anyway (no ttlSecondsAfterFinished), keep defaults.
OPERATOR_ENV = {"SANDBOX_OPERATOR_TTL_CHECK_INTERVAL_SECONDS": "10"}


def source_files() -> dict[str, str]:
    """50 small text files in 5 folders (about 2 KiB each)."""
    return {
        f"pkg{i % 5}/file_{i:02d}.txt": "".join(f"line {n} of file {i}\n" for n in range(150))
        for i in range(SOURCE_FILES)
    }


def make_source(path: Path, strategy: str) -> Path:
    """A git repository (git_worktree) or a plain directory (other strategies) of 50 files."""
    if strategy == "git_worktree":
        return make_repo(path, source_files())
    path.mkdir(parents=True)
    return make_dir(path, source_files())


def apply_edits(root: Path) -> None:
    """The plan's edits in one sandbox: 2 files changed, 1 added, 1 deleted."""
    for rel in ("pkg0/file_00.txt", "pkg1/file_01.txt"):
        with open(root / rel, "a", encoding="utf-8") as handle:
            handle.write("edited by the plan\n")
    (root / "pkg2" / "added.txt").write_text("added by the plan\n")
    (root / "pkg3" / "file_03.txt").unlink()


def edits_landed(original: Path) -> bool:
    """True when ``apply_edits`` reached the original."""
    return (
        (original / "pkg2" / "added.txt").exists()
        and not (original / "pkg3" / "file_03.txt").exists()
        and (original / "pkg0" / "file_00.txt").read_text().endswith("edited by the plan\n")
    )


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its waited-for children (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the waited-for children of ``pid`` (the core's ``cp``,
    ``git`` and the like)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[13:15]) / os.sysconf("SC_CLK_TCK")


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the main thread of ``pid`` (kopf's event loop; the handler
    threads, the Event poster and the metrics server are the rest)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak) of ``pid`` in KiB, from /proc/<pid>/status."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values


class SandboxWatch:
    """A watch on the Sandboxes of one namespace (its own thread): when each was first seen
    (``ADDED``) and first seen ``Active``, on this process's clock (``time.perf_counter``).

    The throughput figure (d) ends at the event that shows the last Sandbox Active, not at a
    once-a-second poll (up to 1 s late, a quarter of a 4 s figure).
    """

    def __init__(self, server: LocalApiServer, namespace: str) -> None:
        from kubernetes import client, config, watch

        api_client = config.new_client_from_config(config_file=str(server.kubeconfig_path))
        self._api = client.CustomObjectsApi(api_client)
        self._watch = watch.Watch()
        self.namespace = namespace
        self.added: dict[str, float] = {}
        self.active: dict[str, float] = {}
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stream = self._watch.stream(
            self._api.list_namespaced_custom_object,
            "sandbox.cleveragents.io",
            "v1beta1",
            self.namespace,
            "sandboxes",
            timeout_seconds=3600,
        )
        try:
            for event in stream:
                self._seen(event)
        except Exception:  # the watch ends when stop() closes it
            return

    def _seen(self, event: dict[str, Any]) -> None:
        now = time.perf_counter()
        item = event["object"]
        name = item["metadata"]["name"]
        with self._changed:
            self.added.setdefault(name, now)
            if (item.get("status") or {}).get("phase") == "Active":
                self.active.setdefault(name, now)
            self._changed.notify_all()

    def wait_active(self, count: int, timeout: float) -> float:
        """perf_counter time at which ``count`` Sandboxes had been seen Active.

        Raises:
            RuntimeError: not all Active within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.active) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"only {len(self.active)} of {count} Active")
                self._changed.wait(min(left, 1.0))
            return max(self.active.values())

    def latencies(self) -> list[float]:
        """Per Sandbox, seconds from its ADDED event to its first Active event."""
        with self._changed:
            return [self.active[n] - self.added[n] for n in self.active if n in self.added]

    def stop(self) -> None:
        self._watch.stop()


class Bench:
    """The work dir, the API server and the rows of the result table."""

    def __init__(self, server: LocalApiServer, work: Path) -> None:
        self.server = server
        self.work = work
        self.rows: list[tuple[str, str, str, str, str]] = []
        self.notes: list[str] = []
        self.profile_dir: Path | None = None

    def row(self, label: str, ours: float, anchor_label: str, anchor: float) -> None:
        ratio = ours / anchor if anchor > 0 else float("inf")
        self.rows.append((label, f"{ours:.2f} s", anchor_label, f"{anchor:.3f} s", f"{ratio:.1f}x"))
        print(
            f"{label:<46} {ours:8.2f} s   {anchor_label:<52} {anchor:8.3f} s   ratio {ratio:6.1f}x",
            flush=True,
        )

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)

    # -- helpers --------------------------------------------------------------------------------

    def namespace(self, name: str) -> Cluster:
        self.server.kubectl("create", "namespace", name, check=True)
        return Cluster(self.server, name)

    def operator(self, cluster: Cluster, name: str) -> OperatorProcess:
        work = self.work / name
        work.mkdir()
        operator = OperatorProcess(self.server, cluster.namespace, work, extra_env=OPERATOR_ENV)
        cluster.operator = operator
        return operator.start()

    @staticmethod
    def apply_all(cluster: Cluster, manifests: list[dict[str, Any]]) -> None:
        """One ``kubectl apply`` of a multi-document YAML."""
        result = cluster.server.kubectl(
            "-n",
            cluster.namespace,
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump_all(manifests),
            timeout=1200,  # kubectl's client-side rate limit: 1,000 objects take minutes
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl apply failed: {result.stderr[-2000:]}")

    @staticmethod
    def wait_all_active(cluster: Cluster, plan_id: str, count: int, timeout: float) -> None:
        """One ``kubectl get sbx -o json`` per second until ``count`` of the plan are Active."""
        deadline = time.monotonic() + timeout
        phases: dict[str, int] = {}
        while time.monotonic() < deadline:
            if cluster.operator is not None:
                cluster.operator.assert_alive()
            items = json.loads(cluster.kubectl("get", "sbx", "-o", "json").stdout)["items"]
            mine = [i for i in items if i["spec"]["planId"] == plan_id]
            phases = {}
            for item in mine:
                phase = (item.get("status") or {}).get("phase") or "-"
                phases[phase] = phases.get(phase, 0) + 1
            if phases.get("Active", 0) == count:
                return
            if phases.get("Errored") or phases.get("Failed"):
                reasons = [
                    f"{item['metadata']['name']}: {condition.get('reason')}: "
                    f"{condition.get('message')}"
                    for item in mine
                    for condition in (item.get("status") or {}).get("conditions") or []
                    if condition.get("type") == "Ready"
                    and condition.get("status") != "True"
                    and (item.get("status") or {}).get("phase") in ("Errored", "Failed")
                ]
                raise RuntimeError(f"plan {plan_id}: sandboxes failed: {phases}: {reasons}")
            time.sleep(POLL_SECONDS)
        raise RuntimeError(f"plan {plan_id}: not all {count} Active after {timeout}s: {phases}")

    def core_factory_kwargs(self, tag: str) -> dict[str, str]:
        root = self.work / f"core-sandboxes-{tag}"
        root.mkdir()
        return {"sandbox_root": str(root)}

    # -- (a) N sandboxes to Active --------------------------------------------------------------

    def sources_to_active(self, name: str, strategy: str, count: int) -> list[Path]:
        """One shared directory; for git_worktree one repository per sandbox.

        The core serialises ``git worktree add`` on one repository with its per-repository lock
        (concurrent adds race inside git: ``failed to read .git/worktrees/<id>/commondir``); one
        repository each keeps that lock's waiting out of the timing.
        """
        if strategy != "git_worktree":
            return [make_source(self.work / name, strategy)] * count
        return [make_source(self.work / f"{name}-{i:03d}", strategy) for i in range(count)]

    def bench_to_active(self, cluster: Cluster, strategy: str, count: int) -> None:
        plan = f"bench-a-{strategy.replace('_', '-')}"
        sources = self.sources_to_active(f"a-source-{strategy}", strategy, count)
        manifests = [
            sandbox_manifest(f"{plan}-{i:03d}", plan, strategy, src, resource_id=f"res-{i:03d}")
            for i, src in enumerate(sources)
        ]

        def through_operator() -> None:
            self.apply_all(cluster, manifests)
            self.wait_all_active(cluster, plan, count, timeout=60 + 3.0 * count)

        ours = timed(through_operator)

        core_sources = self.sources_to_active(f"a-core-source-{strategy}", strategy, count)
        factory = SandboxFactory()
        options = self.core_factory_kwargs(f"a-{strategy}")

        def in_process() -> None:
            for i in range(count):
                source = str(core_sources[i])
                sandbox = factory.create(strategy, f"res-{i:03d}", source, **options)
                sandbox.create(plan)
                sandbox.activate()

        anchor = timed(in_process)  # its sandboxes stay (module docstring: no cleanup between)
        self.row(
            f"{count} Sandboxes to Active ({strategy})",
            ours,
            f"{count} x factory.create+create+activate ({strategy})",
            anchor,
        )

    # -- (b) M-sandbox PlanCommit ---------------------------------------------------------------

    def bench_plancommit(self, cluster: Cluster, strategy: str, size: int) -> None:
        plan = f"bench-b-{strategy.replace('_', '-')}"
        sources = [
            make_source(self.work / f"b-source-{strategy}-{i}", strategy) for i in range(size)
        ]
        self.apply_all(
            cluster,
            [
                sandbox_manifest(f"{plan}-{i:02d}", plan, strategy, src, resource_id=f"res-{i:02d}")
                for i, src in enumerate(sources)
            ],
        )
        self.wait_all_active(cluster, plan, size, timeout=60 + 3.0 * size)
        for i in range(size):
            apply_edits(Path(cluster.status("sbx", f"{plan}-{i:02d}")["sandboxPath"]))
        commit = plancommit_manifest(f"{plan}-commit", plan, message="bench")

        def through_operator() -> None:
            cluster.create(commit)
            cluster.kubectl(
                "wait", "--for=condition=Committed", f"pcommit/{plan}-commit", "--timeout=300s"
            )

        ours = timed(through_operator)
        status = cluster.status("pcommit", f"{plan}-commit")
        if status.get("phase") != "Committed" or not all(edits_landed(s) for s in sources):
            raise RuntimeError(f"operator PlanCommit did not commit everything: {status}")

        core_sources = [
            make_source(self.work / f"b-core-source-{strategy}-{i}", strategy) for i in range(size)
        ]
        state = self.work / f"b-core-state-{strategy}"
        manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(state))
        options = self.core_factory_kwargs(f"b-{strategy}")
        for i, src in enumerate(core_sources):
            sandbox = manager.get_or_create_sandbox(
                plan, f"res-{i:02d}", str(src), strategy, **options
            )
            sandbox.activate()
            apply_edits(Path(sandbox.context.sandbox_path))
        results: list[Any] = []
        anchor = timed(lambda: results.extend(manager.commit_all(plan, message="bench")))
        if len(results) != size or not all(r.success for r in results):
            raise RuntimeError(f"core commit_all failed: {results}")
        if not all(edits_landed(s) for s in core_sources):
            raise RuntimeError("core commit_all did not reach every original")
        self.row(
            f"PlanCommit of {size} Sandboxes ({strategy})",
            ours,
            f"SandboxManager.commit_all, {size} sandboxes ({strategy})",
            anchor,
        )

    # -- (c) RSS --------------------------------------------------------------------------------

    def bench_rss(self, count: int) -> None:
        cluster = self.namespace("bench-rss")
        operator = self.operator(cluster, "operator-rss")
        try:
            time.sleep(8)  # startup: imports, CRD discovery, first (empty) list + watch
            operator.assert_alive()
            assert operator.process is not None
            pid = operator.process.pid
            idle = rss_kib(pid)
            source = self.work / "rss-source"
            source.mkdir()
            make_dir(source, source_files())
            manifests = [
                sandbox_manifest(f"rss-{i:04d}", "bench-rss", "none", source, resource_id=f"r{i}")
                for i in range(count)
            ]
            started = time.perf_counter()
            self.apply_all(cluster, manifests)
            self.note(
                f"kubectl apply of {count} Sandboxes took {time.perf_counter() - started:.1f} s"
            )
            self.wait_all_active(cluster, "bench-rss", count, timeout=60 + 1.0 * count)
            elapsed = time.perf_counter() - started
            time.sleep(5)  # let the last patches and events settle
            loaded = rss_kib(pid)
        finally:
            operator.stop()
        mib = 1024.0
        print(
            f"operator RSS, 0 Sandboxes: {idle['VmRSS'] / mib:.1f} MiB; "
            f"{count} Sandboxes (none): {loaded['VmRSS'] / mib:.1f} MiB "
            f"(peak VmHWM {loaded['VmHWM'] / mib:.1f} MiB; ratio "
            f"{loaded['VmRSS'] / idle['VmRSS']:.2f}x); {count} to Active in {elapsed:.1f} s",
            flush=True,
        )
        self.rows.append(
            (
                f"Operator RSS with {count} Sandboxes (none), VmRSS",
                f"{loaded['VmRSS'] / mib:.1f} MiB (peak {loaded['VmHWM'] / mib:.1f})",
                "Operator RSS with 0 Sandboxes (same process, before)",
                f"{idle['VmRSS'] / mib:.1f} MiB",
                f"{loaded['VmRSS'] / idle['VmRSS']:.2f}x",
            )
        )
        self.note(f"{count} Sandboxes (none) reached Active {elapsed:.1f} s after the apply began")

    # -- (d) throughput, parts apart ---------------------------------------------------------

    def bench_throughput(
        self,
        count: int,
        max_workers: int,
        label: str = "",
        operator_env: dict[str, str] | None = None,
        admission_policy: bool = False,
    ) -> dict[str, float]:
        """N copy_on_write Sandboxes to Active through the operator, with the parts apart.

        ``operator_env`` is added to the operator's environment (``--operator-src`` puts another
        operator tree first on its PYTHONPATH, for a before/after in one run). With
        ``admission_policy`` the chart's MutatingAdmissionPolicy is bound to the operator's
        namespace only (the bare applies' namespaces stay without it).
        """
        label = label or f"kopf max_workers {max_workers}"
        if admission_policy:
            label += ", admission policy"
        tag = f"w{max_workers}-{len(self.rows)}"
        source = make_source(self.work / f"d-source-{tag}", "copy_on_write")

        def manifests(plan: str) -> list[dict[str, Any]]:
            return [
                sandbox_manifest(f"{plan}-{i:03d}", plan, "copy_on_write", source,
                                 resource_id=f"res-{i:03d}")
                for i in range(count)
            ]  # fmt: skip

        # Apply alone: the same objects into namespaces no operator watches; the median of three
        # (one kubectl apply of 100 objects varies by 4x on a shared machine).
        applies = []
        apply_server_cpu = []  # API server + etcd CPU seconds of each bare apply
        for attempt in range(3):
            bare = self.namespace(f"bench-d-bare-{tag}-{attempt}")
            server_before = sum(self.server_cpu().values())
            applies.append(timed(lambda bare=bare: self.apply_all(bare, manifests("bare"))))
            apply_server_cpu.append(sum(self.server_cpu().values()) - server_before)
        apply_alone = sorted(applies)[1]
        # The core alone, in this process.
        factory = SandboxFactory()
        options = self.core_factory_kwargs(f"d-{tag}")

        def core() -> None:
            for i in range(count):
                sandbox = factory.create("copy_on_write", f"res-{i:03d}", str(source), **options)
                sandbox.create("core")
                sandbox.activate()

        os.sync()  # both timed parts start with no dirty data to write back
        usage_before = _usage_seconds()
        core_alone = timed(core)
        core_cpu = _usage_seconds() - usage_before
        # Its sandboxes stay (module docstring: no cleanup between figures).
        # Through the operator, talking to the API server directly; its requests are counted by
        # the API server's own apiserver_request_total (no proxy taking CPU from the run).
        cluster = self.namespace(f"bench-d-{tag}")
        policy = ""
        if admission_policy:
            policy = install_admission_policy(self.server, cluster.namespace, cluster)
        port = free_port()
        work = self.work / f"operator-d-{tag}"
        work.mkdir()
        env = {
            **OPERATOR_ENV,
            "SANDBOX_OPERATOR_METRICS_PORT": str(port),
            "SANDBOX_OPERATOR_MAX_WORKERS": str(max_workers),
        }
        env.update(operator_env or {})
        operator = OperatorProcess(self.server, cluster.namespace, work, extra_env=env)
        cluster.operator = operator
        operator.start()
        watcher = SandboxWatch(self.server, cluster.namespace)
        try:
            time.sleep(5)  # startup is not part of the figure
            os.sync()
            assert operator.process is not None
            before = self.operator_requests()
            every_before = self.operator_requests(every=True)
            server_before = self.server_cpu()
            cpu_before = cpu_seconds(operator.process.pid)
            loop_before = main_thread_cpu_seconds(operator.process.pid)
            children_before = children_cpu_seconds(operator.process.pid)
            profiler = self.start_profiler(operator.process.pid, tag)
            plan = "thru"
            started = time.perf_counter()
            self.apply_all(cluster, manifests(plan))
            applied = time.perf_counter() - started
            total = watcher.wait_active(count, timeout=60 + 3.0 * count) - started
            time.sleep(3)  # the last patches after Active
            cpu = cpu_seconds(operator.process.pid) - cpu_before
            loop_cpu = main_thread_cpu_seconds(operator.process.pid) - loop_before
            children_cpu = children_cpu_seconds(operator.process.pid) - children_before
            self.stop_profiler(profiler)
            after = self.operator_requests()
            every_after = self.operator_requests(every=True)
            server_cpu = {k: v - server_before[k] for k, v in self.server_cpu().items()}
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
                exposition = response.read().decode()
            latencies = sorted(watcher.latencies())
            load = os.getloadavg()[0]
            # What every write and watch event of one Sandbox carries (JSON bytes, as stored).
            one = json.loads(cluster.kubectl("get", "sandbox", f"{plan}-000", "-o", "json").stdout)
            object_bytes = {
                "object": len(json.dumps(one)),
                "managedFields": len(json.dumps(one["metadata"].get("managedFields"))),
                "annotations": len(json.dumps(one["metadata"].get("annotations"))),
                "status": len(json.dumps(one.get("status"))),
            }
        finally:
            watcher.stop()
            operator.stop()
            if policy:  # gone before the next figure: no binding left for later creates to match
                self.server.kubectl("delete", "-f", "-", input=policy, check=True)
            if self.profile_dir is not None:  # the log beside the profile (lines per object)
                for log in operator.log_paths:
                    shutil.copy(log, self.profile_dir / f"operator-{tag}.log")
        handler_sum = _sample(exposition, "sandbox_operator_reconcile_duration_seconds_sum",
                              'handler="provision"')  # fmt: skip
        handler_count = _sample(exposition, "sandbox_operator_reconcile_duration_seconds_count",
                                'handler="provision"')  # fmt: skip
        requests = {key: (after.get(key, 0) - before.get(key, 0)) / count for key in sorted(after)}
        requests = {key: value for key, value in requests.items() if value}
        figures = {
            "max_workers": max_workers,
            "admission_policy": admission_policy,
            "total_s": total,
            "apply_in_run_s": applied,
            "apply_alone_s": apply_alone,
            "apply_alone_runs_s": applies,
            "apply_alone_server_cpu_s": sorted(apply_server_cpu)[1],
            "core_alone_s": core_alone,
            "core_alone_cpu_s": core_cpu,
            "handler_sum_s": handler_sum,
            "handler_runs": handler_count,
            "handler_mean_s": handler_sum / handler_count if handler_count else 0.0,
            "operator_cpu_s": cpu,
            "operator_loop_cpu_s": loop_cpu,
            "operator_children_cpu_s": children_cpu,
            "anchor_s": apply_alone + core_alone,
            "ratio": total / (apply_alone + core_alone),
            "after_apply_s": total - applied,
            "latency_mean_s": sum(latencies) / len(latencies),
            "latency_p50_s": latencies[len(latencies) // 2],
            "latency_max_s": latencies[-1],
            "load_1min": load,
            **{f"{name}_cpu_s": value for name, value in server_cpu.items()},
            "object_bytes": object_bytes,
            "requests_all": {
                key: value - every_before.get(key, 0)
                for key, value in sorted(every_after.items())
                if value - every_before.get(key, 0)
            },
            "operator_writes_per_object": sum(requests.values()),
            **{f"requests {key}": value for key, value in requests.items()},
        }
        print(json.dumps(figures), flush=True)
        self.rows.append(
            (
                f"{count} Sandboxes to Active (copy_on_write), {label}",
                f"{total:.2f} s",
                f"kubectl apply alone {apply_alone:.2f} s (median of 3) + core alone "
                f"{core_alone:.2f} s",
                f"{apply_alone + core_alone:.2f} s",
                f"{figures['ratio']:.2f}x",
            )
        )
        self.note(
            f"{label}: apply in the run {applied:.2f} s; last Active {total - applied:.2f} s "
            f"after the apply returned; per Sandbox ADDED -> Active mean "
            f"{figures['latency_mean_s'] * 1000:.0f} ms (median "
            f"{figures['latency_p50_s'] * 1000:.0f} ms, max {figures['latency_max_s']:.2f} s); "
            f"provision handler {handler_count:.0f} runs, mean "
            f"{figures['handler_mean_s'] * 1000:.0f} ms ({handler_sum:.2f} s summed); core alone "
            f"{core_alone:.2f} s (CPU {core_cpu:.2f} s); operator CPU {cpu:.2f} s (kopf's loop "
            f"{loop_cpu:.2f} s, the other threads {cpu - loop_cpu - children_cpu:.2f} s, child "
            f"processes {children_cpu:.2f} s); operator writes per Sandbox "
            + ", ".join(f"{m} {v:.2f}" for m, v in requests.items())
            + f"; load average (1 min) {load:.1f}"
        )
        return figures

    def start_profiler(self, pid: int, tag: str) -> subprocess.Popen[bytes] | None:
        """With ``--profile DIR``: py-spy samples the operator from the apply to the end
        (``BENCH_PY_SPY_ARGS``: more py-spy options, e.g. ``--gil`` for the GIL holder only)."""
        if self.profile_dir is None:
            return None
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        out = self.profile_dir / f"operator-{tag}.speedscope.json"
        process = subprocess.Popen(
            [shutil.which("py-spy") or "py-spy", "record", "--pid", str(pid), "--rate", "200",
             "--format", "speedscope", "--output", str(out),
             *os.environ.get("BENCH_PY_SPY_ARGS", "").split()],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # py-spy attaches
        return process

    @staticmethod
    def stop_profiler(process: subprocess.Popen[bytes] | None) -> None:
        if process is not None:
            process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            process.wait(timeout=60)

    def server_cpu(self) -> dict[str, float]:
        """CPU seconds of the API server and etcd processes so far."""
        out = {}
        for name in ("apiserver", "etcd"):
            process = getattr(self.server, f"_{name}", None)
            out[name] = cpu_seconds(process.popen.pid) if process is not None else 0.0
        return out

    def operator_requests(self, every: bool = False) -> dict[str, float]:
        """The API server's count of the writes only the operator makes here, by verb and
        resource: PATCH of Sandboxes (and their status), POST of Events (apiserver_request_total;
        the apply's own GET/POST of Sandboxes and the bench's watch are left out). ``every``:
        every request of anyone, by verb and resource (a diagnostic of the run)."""
        raw = self.server.kubectl("get", "--raw", "/metrics", check=True).stdout
        out: dict[str, float] = {}
        for line in raw.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            verb, resource = labels.get("verb"), labels.get("resource")
            if not every and (verb, resource) not in (("PATCH", "sandboxes"), ("POST", "events")):
                continue
            key = f"{verb} {resource}" + (f"/{labels['subresource']}" if labels.get(
                "subresource") else "")  # fmt: skip
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def markdown(self) -> str:
        lines = [
            "| Operator (real API server) | Figure | Anchor (core, in-process) | Anchor | Ratio |",
            "|---|---:|---|---:|---:|",
        ]
        lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in self.rows]
        lines += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(lines) + "\n"


def _usage_seconds() -> float:
    """CPU seconds of this process and its waited-for children so far (the core's own cost)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _sample(exposition: str, name: str, label: str) -> float:
    """The value of the sample ``name{...label...}`` in a Prometheus exposition (0 if absent)."""
    for line in exposition.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=100)
    parser.add_argument("--plan-size", type=int, default=10)
    parser.add_argument("--rss-sandboxes", type=int, default=1000)
    parser.add_argument("--strategies", default="copy_on_write,git_worktree")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument(
        "--throughput", action="store_true", help="run only (d), once per --max-workers value"
    )
    parser.add_argument("--max-workers", default="6", help="kopf thread pools for (d)")
    parser.add_argument(
        "--operator-src",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="(d) also with the operator of another source tree (DIR holds operator/ and "
        "sandbox_core/, e.g. a `git archive` of main), run before this tree's; repeatable",
    )
    parser.add_argument("--rounds", type=int, default=1, help="(d) runs of each operator")
    parser.add_argument(
        "--admission-policy",
        default="off",
        help="(d) without (off) and/or with (on) the chart's MutatingAdmissionPolicy, e.g. off,on",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="(d) sample each operator with py-spy (speedscope files in DIR; py-spy on PATH)",
    )
    args = parser.parse_args()
    os.environ.update(GIT_ENV)  # the in-process core commits with an identity, as the operator

    work = Path(tempfile.mkdtemp(prefix="sandbox-bench-operator-"))
    print(f"work dir: {work}", flush=True)
    try:
        with LocalApiServer() as server:
            install_crds(server)  # and waits until they are Established
            bench = Bench(server, work)
            bench.profile_dir = args.profile
            if args.throughput:
                # kubectl's first call fills its discovery cache: not part of any figure.
                server.kubectl("get", "sandboxes", "-A", check=True)
                trees = [tuple(spec.split("=", 1)) for spec in args.operator_src]
                policies = [mode == "on" for mode in args.admission_policy.split(",")]
                for _ in range(args.rounds):
                    for policy in policies:
                        for name, tree in trees:
                            pythonpath = os.pathsep.join([f"{tree}/operator", tree])
                            for workers in args.max_workers.split(","):
                                bench.bench_throughput(
                                    args.sandboxes,
                                    int(workers),
                                    label=f"{name}, kopf max_workers {workers}",
                                    operator_env={"PYTHONPATH": pythonpath},
                                    admission_policy=policy,
                                )
                        for workers in args.max_workers.split(","):
                            bench.bench_throughput(
                                args.sandboxes,
                                int(workers),
                                label=f"this tree, max_workers {workers}",
                                admission_policy=policy,
                            )
                print("\n" + bench.markdown())
                if args.markdown:
                    args.markdown.write_text(bench.markdown())
                return 0
            cluster = bench.namespace("bench")
            operator = bench.operator(cluster, "operator")
            try:
                time.sleep(5)  # operator startup is not part of (a)
                for strategy in args.strategies.split(","):
                    bench.bench_to_active(cluster, strategy, args.sandboxes)
                    bench.bench_plancommit(cluster, strategy, args.plan_size)
            finally:
                operator.stop()
            bench.bench_rss(args.rss_sandboxes)
    except BaseException:
        for log in sorted(work.glob("operator*/operator-*.log")):
            print(f"--- {log} (tail)\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = bench.markdown()
    print("\n" + table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
