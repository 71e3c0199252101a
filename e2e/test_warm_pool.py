"""The warm pool on a real cluster (tier 3): with ``workspace.warmPool`` set, Sandboxes over a
ReadWriteMany claim become Active on a pre-started pool Pod, beside the same Sandbox in another
shape on a Pod of its own; prints (and keeps in ``/tmp/bench-warm-pool.md``) the p50/p90 table
of e2e/bench_e2e.py's :func:`~e2e.bench_e2e.warm_pool_runs` for docs/benchmarks.md.

Run: ``flock /tmp/sandbox-e2e.lock bash hack/e2e.sh -k warm_pool -s`` (``BENCH_RUNS``, default
5, sets the rounds). The ratio to the Pod's own start is reported, not asserted (a timed goal,
not a pass condition on a shared machine); every pool Sandbox must have taken a pool Pod.
"""

from __future__ import annotations

import os
from pathlib import Path

from e2e.bench_e2e import warm_pool_runs, warm_pool_table
from e2e.conftest import Release
from e2e.kube import Kube


def test_warm_pool_apply_to_active_beside_a_cold_pod(kube: Kube, operator_release: Release) -> None:
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    times = warm_pool_runs(kube, operator_release.namespace, runs)
    table = warm_pool_table(times)
    Path("/tmp/bench-warm-pool.md").write_text(table + "\n")  # noqa: S108 - a report
    print(table)
    assert len(times["pool"]) == len(times["cold"]) == len(times["pod_start"]) == runs
    # Taking a Ready Pod is faster than starting one, whatever the machine's load.
    assert sorted(times["pool"])[runs // 2] < sorted(times["cold"])[runs // 2]
