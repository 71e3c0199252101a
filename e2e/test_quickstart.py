"""The README's "On Kubernetes" quick start, run as written.

The shell block is taken from README.md's text, not copied here, so the README cannot drift from
what works. The one line that makes a kind cluster (``e2e/kind.sh up ...``) is left out: this
suite already runs on a cluster whose node has ``localhost/sandbox-operator:e2e``, the image the
README installs.

The quick start is for a *fresh* cluster: the test removes the suite's own release and the
CRDs first (the file is named to run last), then runs the block with bash ``-euo pipefail`` in
the repository root, then checks what the block promised: the commit reached the original on
the claim (the block's own ``git log``), the Sandbox carries the plan-id label, and
``helm uninstall`` left no custom object behind (the pre-delete hook, case 19).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from e2e.conftest import RELEASE
from e2e.kube import REPO_ROOT, Kube

README = REPO_ROOT / "README.md"
CLUSTER_LINE = re.compile(r"^e2e/kind\.sh up\b")
CRDS = [
    f"{plural}.sandbox.cleveragents.io" for plural in ("sandboxes", "checkpoints", "plancommits")
]


def quickstart_script(readme: Path = README) -> str:
    """The ``sh`` block of README.md's "On Kubernetes" section, without the kind line.

    Raises:
        AssertionError: the section or its block is missing, or the kind line is.
    """
    text = readme.read_text()
    section = text.split("\n## On Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "README.md 'On Kubernetes' has no ```sh block"
    lines = match.group(1).splitlines()
    assert any(CLUSTER_LINE.match(line) for line in lines), "the kind line is missing"
    return "\n".join(line for line in lines if not CLUSTER_LINE.match(line)) + "\n"


def test_quickstart_block_is_extracted_from_the_readme() -> None:
    script = quickstart_script()
    assert "helm install sandbox-operator charts/sandbox-operator" in script
    assert "kubectl apply -f examples/demo-repos.yaml" in script
    assert "e2e/kind.sh" not in script


def _fresh_cluster(kube: Kube) -> None:
    """Remove the suite's release and the CRDs (what a fresh cluster does not have)."""
    releases = json.loads(kube.helm("list", "-A", "-o", "json") or "[]")
    for release in releases:
        if release["name"] in (RELEASE, "sandbox-operator"):
            kube.helm("uninstall", release["name"], "-n", release["namespace"], "--wait")
    kube.kubectl("delete", "crd", *CRDS, "--ignore-not-found", "--wait=true", timeout=180)


def test_readme_quickstart_runs_on_a_fresh_cluster(kube: Kube) -> None:
    _fresh_cluster(kube)
    script = quickstart_script()
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=1500,
            check=False,
        )
        assert done.returncode == 0, (
            f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
        )
        # What the block showed: the labelled Sandbox and the committed PlanCommit.
        assert "demo-pvc-repo" in done.stdout
        assert "Committed" in done.stdout
        # helm uninstall's pre-delete hook deleted every custom object while the operator ran.
        for crd in CRDS:
            left = kube.kubectl("get", crd.split(".")[0], "-A", "-o", "name", check=False)
            assert left.strip() == "", f"left after helm uninstall: {left}"
        # The block's `git log` of the original on the claim shows the plan's commit.
        assert "Apply plan-demo-2" in done.stdout, done.stdout[-4000:]
    finally:
        kube.run(
            [kube.helm_path, "uninstall", "sandbox-operator", "-n", "sandbox-system", "--wait"],
            check=False,
            timeout=600,
        )
        kube.kubectl(
            "delete", "-f", str(REPO_ROOT / "examples" / "demo-repos.yaml"),
            "--ignore-not-found", "--wait=true", check=False, timeout=180,
        )  # fmt: skip
        kube.kubectl("delete", "crd", *CRDS, "--ignore-not-found", check=False, timeout=180)
