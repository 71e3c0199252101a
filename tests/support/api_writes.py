"""The operator's writes to the API server per new Sandbox, read from the server's own
``apiserver_request_total`` counters: the throughput and admission-policy tests on the real API
server share the measurement.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from tests.support.operator import Cluster, OperatorProcess, make_dir, sandbox_manifest, wait_for

SANDBOXES = 8
WRITES = ("PATCH sandboxes", "PATCH sandboxes/status", "POST events")


def writes(server: Any) -> dict[str, float]:
    """``apiserver_request_total`` of the operator's writes, by verb and resource."""
    raw = server.kubectl("get", "--raw", "/metrics", check=True).stdout
    out = dict.fromkeys(WRITES, 0.0)
    for line in raw.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        key = f"{labels.get('verb')} {labels.get('resource')}"
        if labels.get("subresource"):
            key += f"/{labels['subresource']}"
        if key in out:
            out[key] += float(line.rsplit(" ", 1)[1])
    return out


def writes_per_new_sandbox(
    server: Any, cluster: Cluster, operator: OperatorProcess, tmp_path: Path, prefix: str
) -> tuple[dict[str, float], list[str]]:
    """Start the operator, warm it up with one Sandbox, then create :data:`SANDBOXES`
    copy_on_write Sandboxes (of one 5-file source under ``tmp_path``) of plan ``<prefix>-plan``
    and wait until each is Active with its Event and kopf is idle.

    Returns the operator's writes (:data:`WRITES`) per new Sandbox and the Sandboxes' names.
    """
    source = make_dir(tmp_path / "source", {f"f{i}.txt": f"line {i}\n" for i in range(5)})
    operator.start()
    # The operator is up and idle (its startup writes, if any, are not counted).
    cluster.create(sandbox_manifest("warm", f"{prefix}-warm", "copy_on_write", source))
    cluster.wait_active("warm")
    wait_for(lambda: cluster.events("warm") or None, 30, "the warm-up Event")
    time.sleep(2)
    before = writes(server)
    names = [f"{prefix}-{i}" for i in range(SANDBOXES)]
    for name in names:
        cluster.create(sandbox_manifest(name, f"{prefix}-plan", "copy_on_write", source))
    for name in names:
        cluster.wait_active(name)
    wait_for(
        lambda: all(cluster.events(name) for name in names) or None, 30, "one Event per Sandbox"
    )
    time.sleep(3)  # anything kopf would still do (another cycle, another patch) lands now
    after = writes(server)
    return {key: (after[key] - before[key]) / SANDBOXES for key in WRITES}, names
