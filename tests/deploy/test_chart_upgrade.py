"""``helm upgrade`` from the previous chart (0.1.0: CRDs in its ``crds/`` directory) to this one
(templated CRDs, ``helm.sh/resource-policy: keep``), with live objects (issue 11 §3).

Runs on its own tier-2 API server, so that the CRDs are created by the old chart exactly as on a
user's cluster. The previous chart is read from git at the commit that last shipped it. The
operator runs as a subprocess (no kubelet on this tier) and is restarted after the upgrade, as
the Deployment's rollout would.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apiserver.harness import LocalApiServer
from tests.support.chart import CHART_DIR
from tests.support.helm import run_helm as _run_helm
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    files_at,
    git,
    make_repo,
    plancommit_manifest,
    sandbox_manifest,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

PREVIOUS_CHART_COMMIT = "8088162"
"""The last commit of chart 0.1.0 (CRDs in charts/sandbox-operator/crds/, install-only)."""
PREVIOUS_OPERATOR_COMMIT = "ea69d88"
"""The last commit whose operator watches v1alpha1 (run before the upgrade)."""
CRDS = [f"{p}.sandbox.cleveragents.io" for p in ("sandboxes", "checkpoints", "plancommits")]


def previous_chart(into: Path) -> Path:
    """charts/sandbox-operator as of :data:`PREVIOUS_CHART_COMMIT`, extracted under ``into``."""
    chart = files_at(PREVIOUS_CHART_COMMIT, ["charts/sandbox-operator"], into)
    chart = chart / "charts" / "sandbox-operator"
    assert (chart / "crds" / "sandboxes.yaml").is_file()
    return chart


def previous_operator(into: Path) -> str:
    """The operator at :data:`PREVIOUS_OPERATOR_COMMIT` (with its core and contract): a
    PYTHONPATH."""
    files_at(PREVIOUS_OPERATOR_COMMIT, ["operator", "sandbox_core", "sandbox_api"], into)
    return os.pathsep.join([str(into / "operator"), str(into)])


@pytest.fixture(scope="module")
def own_server() -> Iterator[LocalApiServer]:
    with LocalApiServer() as server:
        yield server


def test_upgrade_from_the_previous_chart_keeps_live_objects_reconciling(
    own_server: LocalApiServer, tmp_path: Path
) -> None:
    from tests.support.chart import _find_helm

    helm = _find_helm()
    kube = ["--kubeconfig", str(own_server.kubeconfig_path)]
    release = f"up-{uuid.uuid4().hex[:6]}"
    system = f"{release}-system"
    old = previous_chart(tmp_path / "old")
    installed = _run_helm(
        helm, "install", release, str(old), "-n", system, "--create-namespace", *kube
    )
    assert installed.returncode == 0, installed.stderr

    # Live objects under the old CRDs, reconciled by the operator.
    namespace = f"{release}-work"
    own_server.kubectl("create", "namespace", namespace, check=True)
    cluster = Cluster(own_server, namespace)
    work = tmp_path / "operator"
    work.mkdir()
    operator = OperatorProcess(own_server, namespace, work)
    cluster.operator = operator
    repo = make_repo(tmp_path / "repo", {"f.txt": "v1\n"})
    # The old chart's CRDs serve v1alpha1 only: the operator of that time watches it.
    operator.start({"PYTHONPATH": previous_operator(tmp_path / "previous")})
    try:
        old_sandbox = sandbox_manifest("s1", "plan-up", "git_worktree", repo)
        cluster.create({**old_sandbox, "apiVersion": "sandbox.cleveragents.io/v1alpha1"})
        status = cluster.wait_phase("sandbox", "s1", {"Active", "Errored"})
        assert status["phase"] == "Active"

        # Helm never upgraded crds/; the new chart templates them. A plain upgrade refuses to
        # adopt CRDs without Helm ownership; --take-ownership (chart README) does it once.
        plain = _run_helm(helm, "upgrade", release, str(CHART_DIR), "-n", system, *kube)
        assert plain.returncode != 0
        assert "invalid ownership metadata" in plain.stderr
        upgraded = _run_helm(
            helm, "upgrade", release, str(CHART_DIR), "-n", system, "--take-ownership", *kube
        )
        assert upgraded.returncode == 0, upgraded.stderr
        for name in CRDS:
            crd = own_server.kubectl_json("get", "crd", name)
            assert isinstance(crd, dict)
            assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
            assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
        # The upgraded schema is served: the API server republishes OpenAPI asynchronously.
        deadline = time.monotonic() + 60
        while True:
            explain = own_server.kubectl("explain", "sandbox.status.coreRecord.schemaVersion")
            if explain.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert explain.returncode == 0, explain.stderr
        # The chart's MutatingAdmissionPolicy reads a kind's new version from the OpenAPI the
        # API server republishes asynchronously: until then a create of it answers 503
        # "Resource kind ... not found" (a user's client retries it). A server-side dry run goes
        # through admission, so it says when a PlanCommit of the new version can be created.
        probe = plancommit_manifest("pc-probe", "plan-up")
        deadline = time.monotonic() + 60
        while True:
            dry_run = cluster.kubectl(
                "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
            )
            if dry_run.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert dry_run.returncode == 0, dry_run.stderr

        # The rollout: this tree's operator (v1beta1); the old object keeps reconciling.
        operator.stop()
        operator.start()
        (Path(status["sandboxPath"]) / "f.txt").write_text("v2\n")
        cluster.create(plancommit_manifest("pc-up", "plan-up"))
        done = cluster.wait_phase("pcommit", "pc-up", {"Committed", "Failed"})
        assert done["phase"] == "Committed", done
        assert (repo / "f.txt").read_text() == "v2\n"
        assert "pc-up" in git(repo, "log", "-1", "--format=%s")
        labels = (cluster.get("sandbox", "s1") or {})["metadata"].get("labels") or {}
        assert labels.get("sandbox.cleveragents.io/plan-id") == "plan-up"

        # A second upgrade (no flag needed now) and an uninstall that keeps the CRDs.
        again = _run_helm(helm, "upgrade", release, str(CHART_DIR), "-n", system, *kube)
        assert again.returncode == 0, again.stderr
        removed = _run_helm(helm, "uninstall", release, "-n", system, "--no-hooks", *kube)
        assert removed.returncode == 0, removed.stderr
        for name in CRDS:
            assert own_server.kubectl("get", "crd", name).returncode == 0
        assert cluster.get("sandbox", "s1") is not None
    finally:
        cluster.kubectl("delete", "sandbox-all", "--all", "--timeout=60s", check=False)
        operator.stop()
        print(operator.logs()[-6000:])
