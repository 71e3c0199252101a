"""The chart's Grafana dashboard: off by default; when on, a ConfigMap with the sidecar's label
holding valid dashboard JSON whose queries use only metrics the operator defines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import prometheus_client
from sandbox_operator.kube import leader, lifecycle_metrics, metrics

from tests.support.chart import _one, _render

SUFFIXES = ("", "_total", "_count", "_sum", "_bucket")


def _metric_names() -> set[str]:
    """Every sample name the operator exposes, histogram and counter suffixes included."""
    names: set[str] = set()
    for module in (metrics, leader, lifecycle_metrics):
        for value in vars(module).values():
            if isinstance(value, prometheus_client.metrics.MetricWrapperBase):
                names |= {f"{family.name}{s}" for family in value.collect() for s in SUFFIXES}
    names |= {family.name for family in lifecycle_metrics.PHASES.collect()}
    return names


def test_the_dashboard_is_off_by_default(helm: Path) -> None:
    assert not [o for o in _render(helm) if o["kind"] == "ConfigMap"]


def test_the_dashboard_config_map_is_labelled_for_the_sidecar(helm: Path) -> None:
    objects = _render(
        helm,
        "metrics.grafanaDashboard.enabled=true",
        "metrics.grafanaDashboard.namespace=monitoring",
        "metrics.grafanaDashboard.annotations.grafana_folder=Sandboxes",
    )
    config_map = _one(objects, "ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Sandboxes"}
    dashboard = json.loads(config_map["data"]["sandbox-operator.json"])
    assert dashboard["uid"] == "sandbox-operator"
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Sandbox create → Active", "PlanCommit phases (p90)", "Objects per phase"} <= titles
    known = _metric_names()
    used: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = set(re.findall(r"\b(sandbox_operator_[a-z_]+)\{", target["expr"]))
            assert names, (panel["title"], target["expr"])
            used |= names
    assert used - known == set()
    # Every lifecycle metric is on the dashboard.
    assert {
        "sandbox_operator_sandbox_create_to_active_seconds_bucket",
        "sandbox_operator_sandbox_startup_phase_seconds_bucket",
        "sandbox_operator_plan_commit_phase_seconds_bucket",
        "sandbox_operator_objects",
        "sandbox_operator_build_info",
    } <= used


def test_the_dashboard_labels_replace_the_default(helm: Path) -> None:
    objects = _render(
        helm,
        "metrics.grafanaDashboard.enabled=true",
        "metrics.grafanaDashboard.labels.grafana_dashboard=null",
        "metrics.grafanaDashboard.labels.dashboards=sandbox",
    )
    labels = _one(objects, "ConfigMap")["metadata"]["labels"]
    assert labels["dashboards"] == "sandbox"
    assert "grafana_dashboard" not in labels
