"""Forks and pre-commit checks with the pod executor on the real API server (tier 2,
docs/forks.md, "Forks in workspace Pods").

The test plays the kubelet for each workspace Pod (``tests.support.kubelet``): a real agent
process per Pod, on a loopback address of its own, with the source claim's directory mounted
at the Pod's source mount in a mount namespace of its own. The operator (pod executor) carries
the parent's checkpoint from the parent's agent to each fork's; the forks start from it in
their own scratch volumes, keep working after the parent is deleted, and a PlanCommit's checks
run through each fork's agent (the actor's door, bwrap jail): a failing one ends the PlanCommit
Failed with its exit code and output, nothing touched; a passing one lets the named fork be
committed and the other discarded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox_api.naming import child_object_name
from tests.support.kubelet import Kubelet
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    make_dir,
    plancommit_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow  # needs bwrap for the source mount: hack/setup.sh installs it


def claim_sandbox(name: str, plan: str, parent: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "planId": plan,
        "resourceId": name,
        "strategy": "copy_on_write",
        "source": {"persistentVolumeClaim": {"claimName": "originals", "subPath": "data"}},
    }
    if parent:
        spec["source"]["fromCheckpoint"] = {"sandbox": parent, "checkpoint": "explore"}
    return {
        "apiVersion": "sandbox.cleveragents.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": spec,
    }


def originals_claim() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "originals"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def start_pod(cluster: Cluster, template: Kubelet, name: str, ip: str, source: Path) -> Kubelet:
    """The kubelet's part for Sandbox ``name``'s workspace Pod, once the operator made it."""
    kubelet = Kubelet(
        cluster,
        template.work / name,
        template.port,
        template.dsn,
        pod=child_object_name(name, "ws"),
        secret=child_object_name(name, "agent"),
        ip=ip,
        source=source,
    )
    wait_for(lambda: cluster.get("pod", kubelet.pod), 60, f"the workspace Pod of {name}")
    kubelet.start_container()
    kubelet.report_ready()
    return kubelet


def test_forks_in_workspace_pods_start_from_the_carried_checkpoint_and_checks_run_in_them(
    cluster: Cluster, pod_operator: tuple[OperatorProcess, Kubelet], tmp_path: Path
) -> None:
    operator, template = pod_operator
    source = tmp_path / "claim-originals"
    make_dir(source / "data", {"app.txt": "v0\n", "keep.txt": "kept\n"})
    cluster.create(originals_claim())
    kubelets: list[Kubelet] = []
    try:
        cluster.create(claim_sandbox("parent", "plan-pf"))
        kubelets.append(start_pod(cluster, template, "parent", "127.0.0.1", source))
        parent = cluster.wait_active("parent")
        (Path(parent["sandboxPath"]) / "app.txt").write_text("v1 (parent)\n")
        cluster.create(checkpoint_manifest("explore", "parent"))
        ready = cluster.wait_phase("checkpoint", "explore", {"Ready", "Failed"})
        assert ready["phase"] == "Ready", ready
        (Path(parent["sandboxPath"]) / "late.txt").write_text("after the checkpoint\n")

        roots = {}
        for n in (1, 2):
            cluster.create(claim_sandbox(f"try-{n}", "plan-pf", parent="parent"))
            kubelets.append(start_pod(cluster, template, f"try-{n}", f"127.0.0.{n + 1}", source))
        for n in (1, 2):
            status = cluster.wait_active(f"try-{n}")
            root = Path(status["sandboxPath"])
            assert str(template.work / f"try-{n}") in str(root)  # its own scratch volume
            assert (root / "app.txt").read_text() == "v1 (parent)\n"
            assert not (root / "late.txt").exists()
            roots[n] = root
        assert "carried from parent" in operator.logs()

        # The parent goes; the forks never need it again.
        cluster.kubectl("delete", "sandbox", "parent", "--timeout=60s")
        kubelets[0].stop()
        (roots[1] / "answer").write_text("1\n")
        (roots[2] / "answer").write_text("2\n")

        failing = {"name": "no", "sandbox": "try-2", "command": ["sh", "-c", "cat answer; exit 3"]}
        cluster.create(plancommit_manifest("bad", "plan-pf", sandboxes=["try-2"], checks=[failing]))
        bad = cluster.wait_phase("plancommit", "bad", {"Committed", "Failed"})
        assert bad["phase"] == "Failed", bad
        [result] = bad["validation"]
        assert (result["exitCode"], result["passed"]) == (3, False), result
        assert result["outputTail"].strip() == "2", result
        assert (source / "data" / "app.txt").read_text() == "v0\n"

        passing = {"name": "yes", "sandbox": "try-1", "command": ["grep", "-q", "1", "answer"]}
        cluster.create(
            plancommit_manifest("good", "plan-pf", sandboxes=["try-1"], checks=[passing])
        )
        good = cluster.wait_phase("plancommit", "good", {"Committed", "Failed"}, timeout=120)
        assert good["phase"] == "Committed", good
        assert [(r["name"], r["exitCode"]) for r in good["validation"]] == [("yes", 0)]
        assert good["discardedSandboxes"] == ["try-2"]
        data = source / "data"
        assert sorted(p.name for p in data.iterdir()) == ["answer", "app.txt", "keep.txt"]
        assert (data / "app.txt").read_text() == "v1 (parent)\n"
        assert (data / "answer").read_text() == "1\n"
        wait_for(lambda: cluster.gone("sandbox", "try-2"), 60, "the other fork discarded")
    finally:
        (tmp_path / "operator.log").write_text(operator.logs())
        cluster.kubectl("delete", "plancommits,sandboxes", "--all", "--timeout=60s", check=False)
        for kubelet in kubelets:
            kubelet.stop()
