"""kube-score (a static checker of Kubernetes manifests) on the rendered chart: no critical item
that docs/operations.md ("Static checks") does not justify, and the items it was added for are
fixed (replica spread, readiness probe, ephemeral storage).

kube-score comes from ``$SANDBOX_KUBE_SCORE`` (a path to the binary) or is built and cached by
``hack/build-kube-score.sh`` from the Go module proxy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.chart import _container, _one, _render
from tests.support.helm import run_helm as _run_helm
from tests.support.operator import CHART_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-kube-score.sh"
OPERATIONS = REPO_ROOT / "docs" / "operations.md"
CRITICAL = 1  # kube-score's grade of a critical item (warning 5, almost OK 7, OK 10)


@pytest.fixture(scope="module")
def kube_score() -> Path:
    from_env = os.environ.get("SANDBOX_KUBE_SCORE")
    if from_env:
        binary = Path(from_env)
    else:
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=True, timeout=1800
        )
        binary = Path(result.stdout.strip().splitlines()[-1]) / "kube-score"
    assert os.access(binary, os.X_OK), f"no kube-score at {binary}"
    return binary


def _criticals(helm: Path, kube_score: Path, tmp_path: Path, *sets: str) -> set[tuple[str, str]]:
    """``(kind/name, check id)`` of every critical item kube-score finds in the chart rendered
    with ``sets``."""
    args = ["template", "rel", str(CHART_DIR), "--namespace", "sandbox-system"]
    for item in sets:
        args += ["--set", item]
    rendered = _run_helm(helm, *args)
    assert rendered.returncode == 0, rendered.stderr
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered.stdout)
    result = subprocess.run(
        [str(kube_score), "score", "--output-format", "json", "--kubernetes-version", "v1.35",
         str(manifest)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    # Exit 1 means "critical items found"; anything else is a failure of kube-score itself.
    assert result.returncode in (0, 1), result.stderr
    scored: list[dict[str, Any]] = json.loads(result.stdout)
    assert {o["type_meta"]["kind"] for o in scored} >= {"Deployment", "Job", "NetworkPolicy"}
    return {
        (f"{o['type_meta']['kind']}/{o['object_meta']['name']}", c["check"]["id"])
        for o in scored
        for c in o["checks"]
        if c["grade"] == CRITICAL and not c["skipped"]
    }


def _justified() -> set[str]:
    """Check ids in the table of docs/operations.md's "Static checks" section."""
    text = OPERATIONS.read_text()
    start = text.index("## Static checks")
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.MULTILINE))


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("metrics.enabled=false",),
        ("podAntiAffinity=hard", "metrics.serviceMonitor.enabled=true"),
        ("watchNamespaces={team-a,team-b}", "leaderElection.enabled=false", "replicaCount=1"),
    ],
    ids=["defaults", "no-metrics", "hard-spread", "namespaced-single"],
)
def test_no_critical_item_that_the_docs_do_not_justify(
    helm: Path, kube_score: Path, tmp_path: Path, sets: tuple[str, ...]
) -> None:
    justified = _justified()
    assert justified, "docs/operations.md justifies no kube-score check: the parser is broken"
    criticals = _criticals(helm, kube_score, tmp_path, *sets)
    unjustified = sorted(item for item in criticals if item[1] not in justified)
    assert unjustified == []


def test_the_justified_items_are_still_found(helm: Path, kube_score: Path, tmp_path: Path) -> None:
    """A justification whose item kube-score no longer reports is stale: drop it from the docs."""
    found = {check for _, check in _criticals(helm, kube_score, tmp_path)}
    assert _justified() <= found


def test_operator_replicas_spread_over_nodes(helm: Path) -> None:
    spec = _one(_render(helm), "Deployment")["spec"]["template"]["spec"]
    selector = {"app.kubernetes.io/name": "sandbox-operator", "app.kubernetes.io/instance": "rel"}
    anti = spec["affinity"]["podAntiAffinity"]
    (preferred,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }
    hard = _one(_render(helm, "podAntiAffinity=hard"), "Deployment")["spec"]["template"]["spec"]
    (required,) = hard["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["topologyKey"] == "kubernetes.io/hostname"
    none = _one(_render(helm, "podAntiAffinity=none"), "Deployment")["spec"]["template"]["spec"]
    assert "affinity" not in none
    spread = _one(
        _render(
            helm,
            "topologySpreadConstraints[0].maxSkew=1",
            "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        ),
        "Deployment",
    )["spec"]["template"]["spec"]
    assert spread["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
        }
    ]


def test_an_unknown_spread_mode_is_refused(helm: Path) -> None:
    result = _run_helm(
        helm, "template", "rel", str(CHART_DIR), "--set", "podAntiAffinity=sometimes"
    )
    assert result.returncode != 0
    assert "podAntiAffinity" in result.stderr


def test_readiness_probe_differs_from_liveness_and_answers_on_a_standby(helm: Path) -> None:
    container = _container(_render(helm))
    assert container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert container["readinessProbe"] != container["livenessProbe"]
    without_metrics = _container(_render(helm, "metrics.enabled=false"))
    assert without_metrics["readinessProbe"]["tcpSocket"] == {"port": "health"}


def test_every_container_bounds_its_ephemeral_storage(helm: Path) -> None:
    objects = _render(helm)
    pods = [_one(objects, "Deployment"), _one(objects, "Job")]
    for pod in pods:
        for container in pod["spec"]["template"]["spec"]["containers"]:
            resources = container["resources"]
            assert resources["requests"]["ephemeral-storage"], container["name"]
            assert resources["limits"]["ephemeral-storage"], container["name"]
