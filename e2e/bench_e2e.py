"""Operator latency with a real workspace Pod (tier 3) beside the local executor (tier 2).

Two flows, each measured both ways:

(a) Sandbox apply -> Active: ``kubectl apply`` of one git_worktree Sandbox, then polling
    ``.status.phase`` every 0.2 s. Pod executor: on the cluster behind ``KUBECONFIG`` (the chart
    must be installed: release ``sbx-e2e``, as the e2e suite leaves it while it runs, or any
    operator watching all namespaces), the repository on a claim of the default StorageClass.
    Local executor: the tier-2 API server (``tests/apiserver/harness.py``) with the operator as a
    subprocess, the repository on a local path.
(b) PlanCommit apply -> Committed for 3 Sandboxes (copy_on_write, overlay, git_worktree), each
    with one changed file.

Usage: ``eval "$(e2e/cluster env)" && .venv/bin/python e2e/bench_e2e.py [--runs 3]``.
Prints a Markdown table (median of the runs) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from e2e.conftest import (  # noqa: E402
    RELEASE,
    Originals,
    _toolbox,
    plancommit_manifest,
    sandbox_manifest,
    write_in_sandbox,
)
from e2e.kube import CHART, Kube, wait_until  # noqa: E402

POLL = 0.2


def timed_until(check: Callable[[], bool], timeout: float = 300.0) -> float:
    """Seconds until ``check()`` holds, polling every 0.2 s."""
    start = time.perf_counter()
    wait_until("the benchmark condition", lambda: check() or None, timeout, interval=POLL)
    return time.perf_counter() - start


def phase_is(
    status: Callable[[str, str], dict[str, Any]], kind: str, name: str, phase: str
) -> Callable[[], bool]:
    """A check that ``status(kind, name)`` has reached ``phase``."""

    def check() -> bool:
        return status(kind, name).get("phase") == phase

    return check


# --- pod executor, on the cluster ----------------------------------------------------------------


def cluster_runs(runs: int) -> tuple[list[float], list[float]]:
    kube = Kube()
    installed = kube.run(
        [kube.helm_path, "status", RELEASE, "-n", "sandbox-e2e-system"], check=False
    )
    if installed.returncode != 0:
        image = os.environ.get("E2E_IMAGE", "localhost/sandbox-operator:e2e")
        repository, _, tag = image.rpartition(":")
        kube.helm(
            "upgrade", "--install", RELEASE, str(CHART), "-n", "sandbox-e2e-system",
            "--create-namespace", "--set", f"image.repository={repository}",
            "--set", f"image.tag={tag}", "--wait",
        )  # fmt: skip
    namespace = f"bench-{os.getpid()}"
    kube.kubectl("create", "namespace", namespace)
    sandbox_times: list[float] = []
    commit_times: list[float] = []

    def cluster_status(kind: str, name: str) -> dict[str, Any]:
        return kube.status(kind, namespace, name)

    try:
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "originals"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        image = os.environ.get("E2E_IMAGE", "localhost/sandbox-operator:e2e")
        kube.apply(namespace, claim, _toolbox("originals", image, "IfNotPresent"))
        kube.kubectl(
            "wait", "-n", namespace, "--for=condition=Ready", "pod/toolbox", "--timeout=120s"
        )
        originals = Originals(kube, namespace)
        for run in range(runs):
            originals.sh(
                f"mkdir -p r{run}/app r{run}/data r{run}/layer && cd r{run}"
                " && printf 'x\\n' > app/f.txt && printf 'x\\n' > data/g.txt"
                " && printf 'x\\n' > layer/h.txt"
                " && git -C app init -q -b main && git -C app add -A"
                " && git -c user.name=b -c user.email=b@b -C app commit -qm init"
            )
            plan = f"bench-{run}"
            kube.apply(namespace, sandbox_manifest(f"g{run}", plan, "git_worktree", f"r{run}/app"))
            sandbox_times.append(
                timed_until(phase_is(cluster_status, "sandbox", f"g{run}", "Active"))
            )
            kube.apply(
                namespace,
                sandbox_manifest(f"c{run}", plan, "copy_on_write", f"r{run}/data"),
                sandbox_manifest(f"o{run}", plan, "overlay", f"r{run}/layer"),
            )
            statuses = {}
            for name in (f"g{run}", f"c{run}", f"o{run}"):
                statuses[name] = kube.wait_phase("sandbox", namespace, name, {"Active"})
            for name, path in ((f"g{run}", "f.txt"), (f"c{run}", "g.txt"), (f"o{run}", "h.txt")):
                write_in_sandbox(kube, namespace, statuses[name], path, "y\n")
            kube.apply(namespace, plancommit_manifest(f"pc{run}", plan))
            commit_times.append(
                timed_until(phase_is(cluster_status, "plancommit", f"pc{run}", "Committed"))
            )
    finally:
        for kind in ("plancommits", "sandboxes"):
            kube.kubectl(
                "delete",
                kind,
                "--all",
                "-n",
                namespace,
                "--wait=true",
                "--timeout=180s",
                check=False,
            )
        kube.kubectl("delete", "namespace", namespace, "--wait=true", check=False)
    return sandbox_times, commit_times


# --- local executor, on the tier-2 API server -----------------------------------------------------


def local_runs(runs: int) -> tuple[list[float], list[float]]:
    from tests.apiserver.harness import LocalApiServer
    from tests.operator import support

    sandbox_times: list[float] = []
    commit_times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp, LocalApiServer() as server:
        cluster = support.Cluster.fresh(server, "bench")
        work = Path(tmp)
        (work / "op").mkdir()
        operator = support.OperatorProcess(server, cluster.namespace, work / "op")
        cluster.operator = operator
        operator.start()
        try:
            for run in range(runs):
                repo = support.make_repo(work / f"r{run}" / "app", {"f.txt": "x\n"})
                data = support.make_dir(work / f"r{run}" / "data", {"g.txt": "x\n"})
                layer = support.make_dir(work / f"r{run}" / "layer", {"h.txt": "x\n"})
                plan = f"bench-{run}"
                cluster.create(support.sandbox_manifest(f"g{run}", plan, "git_worktree", repo))
                sandbox_times.append(
                    timed_until(phase_is(cluster.status, "sandbox", f"g{run}", "Active"))
                )
                cluster.create(support.sandbox_manifest(f"c{run}", plan, "copy_on_write", data))
                cluster.create(
                    support.sandbox_manifest(
                        f"o{run}", plan, "overlay", layer, options={"overlayMode": "fallback"}
                    )
                )
                for name, path in (
                    (f"g{run}", "f.txt"),
                    (f"c{run}", "g.txt"),
                    (f"o{run}", "h.txt"),
                ):
                    status = cluster.wait_phase("sandbox", name, {"Active"})
                    (Path(status["sandboxPath"]) / path).write_text("y\n")
                cluster.create(support.plancommit_manifest(f"pc{run}", plan))
                commit_times.append(
                    timed_until(phase_is(cluster.status, "plancommit", f"pc{run}", "Committed"))
                )
        finally:
            operator.stop()
    return sandbox_times, commit_times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    pod_sbx, pod_commit = cluster_runs(args.runs)
    local_sbx, local_commit = local_runs(args.runs)

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} s (runs: {', '.join(f'{v:.2f}' for v in values)})"

    print("| flow | pod executor (real cluster) | local executor (tier-2 API server) | ratio |")
    print("| --- | --- | --- | --- |")
    for label, pod, local in (
        ("Sandbox apply -> Active (git_worktree)", pod_sbx, local_sbx),
        ("PlanCommit apply -> Committed (3 sandboxes)", pod_commit, local_commit),
    ):
        ratio = statistics.median(pod) / statistics.median(local)
        print(f"| {label} | {cell(pod)} | {cell(local)} | {ratio:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
