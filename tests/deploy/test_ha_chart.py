"""The chart's high-availability and monitoring objects (issue 11, sections 1 and 5), rendered by
``helm template`` and checked: replicas with leader election, the PodDisruptionBudget, a
RollingUpdate, the Lease RBAC, the image digest, and the optional ServiceMonitor and
PrometheusRule whose alert expressions use only metrics that operator/sandbox_operator/metrics.py
defines.
"""

from __future__ import annotations

import re
from pathlib import Path

import prometheus_client
from sandbox_operator.kube import leader, metrics

from tests.support.chart import _container, _env, _one, _render
from tests.support.helm import run_helm as _run_helm

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "sandbox-operator"

DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_two_replicas_one_active_through_a_lease(helm: Path) -> None:
    objects = _render(helm)
    spec = _one(objects, "Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    env = _env(objects)
    assert env["SANDBOX_OPERATOR_LEADER_ELECTION"] == "true"
    assert env["SANDBOX_OPERATOR_LEADER_ELECTION_LEASE_NAME"] == "rel-sandbox-operator-leader"
    assert env["SANDBOX_OPERATOR_STANDBY_HEALTH_PORT"] == "8080"  # the liveness probe's port
    assert env["SANDBOX_OPERATOR_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert float(env["SANDBOX_OPERATOR_RENEW_DEADLINE_SECONDS"]) < float(
        env["SANDBOX_OPERATOR_LEASE_DURATION_SECONDS"]
    )
    pdb = _one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    role = _one(objects, "Role", "rel-sandbox-operator-leader-election")
    assert role["metadata"]["namespace"] == "sandbox-system"
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["rel-sandbox-operator-leader"],
            "verbs": ["get", "update"],
        }
    ]
    binding = _one(objects, "RoleBinding", "rel-sandbox-operator-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_one_replica_has_no_disruption_budget(helm: Path) -> None:
    objects = _render(helm, "replicaCount=1")
    assert not [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    off = _render(helm, "leaderElection.enabled=false", "replicaCount=1")
    # No Lease role; the only Role left is the agent key's (test_chart_privileges.py).
    roles = [o["metadata"]["name"] for o in off if o["kind"] == "Role"]
    assert roles == ["rel-sandbox-operator-agent-key"]
    assert _env(off)["SANDBOX_OPERATOR_LEADER_ELECTION"] == "false"


def test_image_digest_wins_over_the_tag(helm: Path) -> None:
    objects = _render(helm, f"image.digest={DIGEST}", "image.tag=9.9.9")
    assert _container(objects)["image"] == f"cleveragents/sandbox-operator@{DIGEST}"
    assert _env(objects)["SANDBOX_OPERATOR_WORKSPACE_IMAGE"] == (
        f"cleveragents/sandbox-operator@{DIGEST}"
    )
    bad = _run_helm(helm, "template", "rel", str(CHART_DIR), "--set", "image.digest=latest")
    assert bad.returncode != 0
    assert "/image/digest" in bad.stderr


def test_monitoring_objects_are_off_by_default(helm: Path) -> None:
    kinds = {o["kind"] for o in _render(helm)}
    assert not {"ServiceMonitor", "PrometheusRule"} & kinds


def _metric_names() -> set[str]:
    """Every sample name the operator exposes (counters with and without ``_total``)."""
    names: set[str] = set()
    for module in (metrics, leader):
        for value in vars(module).values():
            if isinstance(value, prometheus_client.metrics.MetricWrapperBase):
                for family in value.collect():
                    names.add(family.name)
                    names |= {f"{family.name}{suffix}" for suffix in ("_total", "_count", "_sum")}
    return names


def test_service_monitor_and_alerts_match_the_metrics(helm: Path) -> None:
    objects = _render(
        helm,
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prom",
        "metrics.prometheusRule.enabled=true",
    )
    monitor = _one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = _one(objects, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    rule = _one(objects, "PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(alerts) == {
        "SandboxPlanCommitFailed", "SandboxCompensationFailed", "SandboxReconcileErrors",
    }  # fmt: skip
    known = _metric_names()
    for name, alert in alerts.items():
        used = set(re.findall(r"\b(sandbox_operator_[a-z_]+)\{", alert["expr"]))
        assert used, name
        assert used <= known, (name, used - known)
        assert 'job="rel-sandbox-operator-metrics"' in alert["expr"]
        assert "{{ $" not in alert["expr"]
        assert "{{" in alert["annotations"]["description"]  # Prometheus templating survives
    assert 'phase="Failed"' in alerts["SandboxPlanCommitFailed"]["expr"]
    assert 'outcome="error"' in alerts["SandboxReconcileErrors"]["expr"]
    assert alerts["SandboxCompensationFailed"]["labels"]["severity"] == "critical"
    # The phase label value the alert filters on is one the operator writes.
    plancommit = (Path(metrics.__file__).parents[1] / "resources" / "plancommit.py").read_text()
    assert '"Failed"' in plancommit or "FAILED" in plancommit
