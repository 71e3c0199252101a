"""Two-phase overlap check of operator plans on the real kube-apiserver (issue 9, tier 2).

Two directory Sandboxes of one plan whose sources are the same volume at the same or nested
sub-paths, writing one path, are a conflict found before any original is touched: the
PlanCommit ends Failed with a condition naming both Sandboxes and the path, nothing applied.
Sources are compared by volume and sub-path from the Sandbox spec (``plan_sources``), not by
the path the executor's handle names (the same mount path in every workspace Pod). Tier 2 runs
the local executor, so the volumes here are node paths; the PersistentVolumeClaim identities
are covered in ``tests/operator/unit/test_plan_sources.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    make_dir,
    plancommit_manifest,
    run_operator,
    sandbox_manifest,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, prefix="ovl")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path, cleanup_kinds="sandboxes")


def test_two_sandboxes_of_nested_sub_paths_writing_one_path_fail_before_anything_is_applied(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    data = make_dir(tmp_path / "data", {"a.txt": "a0\n", "sub/f.txt": "f0\n"})
    cluster.create(sandbox_manifest("outer", "plan-ov", "copy_on_write", data))
    outer = cluster.wait_active("outer")
    cluster.create(sandbox_manifest("inner", "plan-ov", "overlay", data / "sub",
                                    options={"overlayMode": "fallback"}))  # fmt: skip
    inner = cluster.wait_active("inner")
    (Path(outer["sandboxPath"]) / "a.txt").write_text("a1\n")
    (Path(outer["sandboxPath"]) / "sub" / "f.txt").write_text("f from outer\n")
    (Path(inner["sandboxPath"]) / "f.txt").write_text("f from inner\n")
    cluster.create(plancommit_manifest("pc-ov", "plan-ov"))
    status = cluster.wait_phase("pcommit", "pc-ov", {"Committed", "Failed"})
    assert status["phase"] == "Failed", status
    assert status["mode"] == "TwoPhase"
    assert status["failedSandboxId"] == inner["sandboxId"]
    states = {s["name"]: s["state"] for s in status["sandboxes"]}
    assert states == {"outer": "Aborted", "inner": "Failed"}
    committed = cluster.condition("pcommit", "pc-ov", "Committed")
    assert committed is not None and committed["reason"] == "Conflict", committed
    for word in (outer["sandboxId"], inner["sandboxId"], "f.txt"):
        assert word in committed["message"], committed
    # Nothing applied, nothing staged beside the originals.
    assert (data / "a.txt").read_text() == "a0\n"
    assert (data / "sub" / "f.txt").read_text() == "f0\n"
    assert sorted(p.name for p in data.iterdir()) == ["a.txt", "sub"]
    assert sorted(p.name for p in (data / "sub").iterdir()) == ["f.txt"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".data")) == []


def test_sandboxes_of_other_volumes_or_disjoint_paths_never_clash(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    data = make_dir(tmp_path / "data", {"f.txt": "f0\n", "g.txt": "g0\n"})
    other = make_dir(tmp_path / "other", {"f.txt": "o0\n"})
    cluster.create(sandbox_manifest("one", "plan-ok", "copy_on_write", data))
    one = cluster.wait_active("one")
    cluster.create(sandbox_manifest("two", "plan-ok", "copy_on_write", data))
    two = cluster.wait_active("two")
    cluster.create(sandbox_manifest("three", "plan-ok", "copy_on_write", other))
    three = cluster.wait_active("three")
    (Path(one["sandboxPath"]) / "f.txt").write_text("f1\n")
    (Path(two["sandboxPath"]) / "g.txt").write_text("g1\n")  # same volume, another path
    (Path(three["sandboxPath"]) / "f.txt").write_text("o1\n")  # same name, another volume
    cluster.create(plancommit_manifest("pc-ok", "plan-ok"))
    status = cluster.wait_phase("pcommit", "pc-ok", {"Committed", "Failed"})
    assert status["phase"] == "Committed", status
    assert (data / "f.txt").read_text() == "f1\n"
    assert (data / "g.txt").read_text() == "g1\n"
    assert (other / "f.txt").read_text() == "o1\n"
