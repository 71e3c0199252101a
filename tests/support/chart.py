"""The Helm chart for tests: ``helm`` itself (a module-scoped fixture: from ``$SANDBOX_K8S_BIN``
or built by ``hack/build-k8s-binaries.sh``), the chart rendered by ``helm template``, and the
objects looked up in it. Loaded as a pytest plugin (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.apiserver.harness import BIN_ENV_VAR, BUILD_SCRIPT
from tests.support.helm import run_helm as _run_helm
from tests.support.operator import CHART_DIR


def _find_helm() -> Path:
    from_env = os.environ.get(BIN_ENV_VAR)
    if from_env:
        bin_dir = Path(from_env)
    else:
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=True
        )
        bin_dir = Path(result.stdout.strip().splitlines()[-1])
    helm = bin_dir / "helm"
    assert os.access(helm, os.X_OK), f"no helm in {bin_dir}"
    return helm


@pytest.fixture(scope="module")
def helm() -> Path:
    return _find_helm()


def _render(
    helm: Path, *sets: str, namespace: str = "sandbox-system", api_versions: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    args = ["template", "rel", str(CHART_DIR), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    for api in api_versions:
        args += ["--api-versions", api]
    result = _run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def _env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(objects)["env"]}
