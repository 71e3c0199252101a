"""A plan of three Active copy_on_write Sandboxes, each edited in its sandbox, and the wait for
an operator that the core's fault hook kills (``SANDBOX_CORE_FAULT``) or whose PlanCommit
``pc-kp`` becomes terminal: the kill-point and resume tests on the real API server share them.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.operator import Cluster, OperatorProcess, make_dir, sandbox_manifest

BEFORE, AFTER = "v0\n", "v1\n"
RESOURCES = ("r1", "r2", "r3")
TERMINAL = {"Committed", "RolledBack", "Failed"}


def edited_plan(cluster: Cluster, tmp_path: Path, plan: str) -> list[Path]:
    """Three Active copy_on_write Sandboxes of ``plan`` (resources r1..r3), each with its edit."""
    originals = [make_dir(tmp_path / name, {"f.txt": BEFORE}) for name in RESOURCES]
    for name, original in zip(RESOURCES, originals, strict=True):
        cluster.create(sandbox_manifest(f"sb-{name}", plan, "copy_on_write", original, name))
    for name in RESOURCES:
        status = cluster.wait_phase("sandbox", f"sb-{name}", {"Active", "Errored"})
        assert status["phase"] == "Active", status
        (Path(status["sandboxPath"]) / "f.txt").write_text(AFTER)
    return originals


def killed_or_done(cluster: Cluster, operator: OperatorProcess, timeout: float = 90.0) -> bool:
    """True once the operator process exited (the fault hook), False once the plan is terminal."""
    assert operator.process is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if operator.process.poll() is not None:
            return True
        if cluster.status("pcommit", "pc-kp").get("phase") in TERMINAL:
            return False
        time.sleep(0.3)
    raise AssertionError(f"neither killed nor terminal after {timeout}s: {operator.logs()[-3000:]}")
