"""The chart installed with ``helm install``: the operator Pod
runs and reports healthy, its metrics are served, and the CRDs read well in kubectl."""

from __future__ import annotations

import json

from e2e.conftest import Release
from e2e.kube import Kube, wait_until

PROBE = (
    "import sys, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    with urllib.request.urlopen(url, timeout=5) as r:\n"
    "        print(r.status, r.read().decode()[:20000])\n"
)


def test_operator_pod_runs_and_reports_healthy(kube: Kube, operator_release: Release) -> None:
    pods = operator_release.pod_names(kube)
    assert len(pods) == 1
    pod = kube.json("get", "pod", pods[0], "-n", operator_release.namespace)
    assert pod["status"]["phase"] == "Running"
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] is True and status["restartCount"] == 0
    # kopf's liveness endpoint and the Prometheus metrics, from inside the Pod.
    out = kube.kubectl(
        "exec", "-n", operator_release.namespace, pods[0], "--",
        "python3", "-c", PROBE, "http://127.0.0.1:8080/healthz", "http://127.0.0.1:9090/metrics",
    )  # fmt: skip
    health, metrics = out.split("\n", 1)[0], out
    assert health.startswith("200 ")
    assert "sandbox_operator_reconciles_total" in metrics


def test_operator_log_lines_are_json(kube: Kube, operator_release: Release) -> None:
    pod = operator_release.pod_names(kube)[0]
    lines = wait_until(
        "operator log lines",
        lambda: kube.kubectl("logs", "-n", operator_release.namespace, pod).splitlines() or None,
        30,
    )
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records, lines[:5]
    assert all({"time", "level", "message"} <= set(r) for r in records)


def test_explain_and_printer_columns_read_well(kube: Kube, operator_release: Release) -> None:
    """``kubectl explain sandbox.spec`` documents every field; ``kubectl get`` shows the
    printer columns (Phase, Ready, Strategy, Plan, Age). The output is kept in
    docs/testing-tiers.md."""
    explain = kube.kubectl("explain", "sandbox.spec")
    for field in ("planId", "resourceId", "strategy", "source", "ttlSecondsAfterFinished"):
        assert f"{field}\t" in explain or f"  {field}" in explain, field
    assert "planId\t<string> -required-" in explain
    source = kube.kubectl("explain", "sandbox.spec.source")
    assert "persistentVolumeClaim" in source and "secretRef" in source
    for resource, short in (
        ("sandboxes", "sbx"),
        ("plancommits", "pcommit"),
        ("checkpoints", "ckpt"),
    ):
        header = kube.kubectl("get", short, "-A").splitlines()
        crd = kube.json("get", "crd", f"{resource}.sandbox.cleveragents.io")
        columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
        assert "Phase" in columns and "Age" in columns, columns
        assert not header or "PHASE" in header[0]
