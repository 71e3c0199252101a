"""The operator end to end on this machine (the README's first command runs it after the core demo).

1. Start etcd + kube-apiserver on 127.0.0.1 (the tier-2 harness), install the CRDs from ``crds/``.
2. Run the operator (``kopf run``) with the local executor against it.
3. Build a real git repository (from a real source tree on the machine), a directory and an
   assets tree; apply the ``examples/`` Sandboxes with their ``nodePath`` pointed at them.
4. Write into the sandboxes, apply ``examples/plancommit.yaml``, ``kubectl wait`` for Committed.
5. A second plan whose git sandbox conflicts with a change made to the original meanwhile: its
   PlanCommit fails, the directory sandbox is compensated, and ``kubectl get`` shows the ids.

Everything it starts is stopped at the end; the work directory is printed.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from sandbox_operator.kube.conditions import find_condition  # noqa: E402

from sandbox_core.cli.demo import _build_inputs, _default_source_tree, _git  # noqa: E402
from tests.support.apiserver.harness import LocalApiServer  # noqa: E402
from tests.support.operator import Cluster, OperatorProcess, install_crds  # noqa: E402

NAMESPACE = "sandbox-demo"
EXAMPLES = ROOT / "examples"


def say(text: str) -> None:
    print(text, flush=True)


class Demo:
    """The tier-2 test helpers (`Cluster`, `OperatorProcess`) plus output for a reader."""

    def __init__(self, server: LocalApiServer, work: Path) -> None:
        self.cluster = Cluster(server, NAMESPACE)
        self.operator = OperatorProcess(server, NAMESPACE, work)
        self.cluster.operator = self.operator  # waits fail fast if the operator died

    def kubectl(self, *args: str) -> str:
        done = self.cluster.kubectl(*args, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return str(done.stdout).strip()

    def show(self, *args: str) -> None:
        say(f"$ kubectl {' '.join(args)}")
        say(self.kubectl(*args))

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.create(manifest)

    def wait(self, resource: str, condition: str, timeout: int = 120) -> None:
        say(f"$ kubectl wait --for={condition} {resource} --timeout={timeout}s")
        say(self.kubectl("wait", f"--for={condition}", resource, f"--timeout={timeout}s"))

    def status(self, kind: str, name: str) -> dict[str, Any]:
        return self.cluster.status(kind, name)

    def wait_phase(self, kind: str, name: str, phases: set[str]) -> dict[str, Any]:
        return dict(self.cluster.wait_phase(kind, name, phases, timeout=120))


def example(filename: str, paths: dict[str, Path], **overrides: Any) -> dict[str, Any]:
    """An ``examples/`` manifest with its nodePath pointed at the demo's inputs."""
    manifest = yaml.safe_load((EXAMPLES / filename).read_text())
    spec = manifest["spec"]
    if "source" in spec:
        spec["source"]["nodePath"] = str(paths[spec["resourceId"]])
    for key, value in overrides.items():
        if key == "name":
            manifest["metadata"]["name"] = value
        else:
            spec[key] = value
    return dict(manifest)


def run(work: Path) -> int:
    repo, docs = _build_inputs(work, _default_source_tree())
    assets = work / "assets"
    (assets / "img").mkdir(parents=True)
    (assets / "img" / "logo.svg").write_text("<svg/>\n")
    paths = {"repo": repo, "docs": docs, "assets": assets}
    target = "SANDBOX_DEMO.md"

    say("\n== starting etcd + kube-apiserver on 127.0.0.1")
    with LocalApiServer() as server:
        install_crds(server)
        server.kubectl("create", "namespace", NAMESPACE, check=True)
        say(f"API server {server.server_url} ready; CRDs installed")
        demo = Demo(server, work)
        demo.operator.start()
        try:
            return demo_flow(demo, paths, target, repo, docs)
        finally:
            demo.cluster.kubectl("delete", "sandboxes,checkpoints,plancommits", "--all",
                                 "--timeout=60s", check=False)
            demo.operator.stop()
            say(f"operator log: {demo.operator.log_paths[-1]}")


def demo_flow(demo: Demo, paths: dict[str, Path], target: str, repo: Path, docs: Path) -> int:
    say("\n== plan-demo-1: three Sandboxes from examples/, edits, PlanCommit")
    for name in ("sandbox-git-worktree.yaml", "sandbox-copy-on-write.yaml",
                 "sandbox-overlay.yaml"):
        demo.apply(example(name, paths))
    for name in ("demo-repo", "demo-docs", "demo-assets"):
        demo.wait(f"sandbox/{name}", "condition=Ready")
    demo.show("get", "sandboxes", "-o", "wide")
    sandbox_paths = {n: demo.status("sandbox", n)["sandboxPath"]
                     for n in ("demo-repo", "demo-docs", "demo-assets")}
    Path(sandbox_paths["demo-repo"], target).write_text("written by plan-demo-1\n")
    Path(sandbox_paths["demo-docs"], "README.md").write_text("# rewritten by plan-demo-1\n")
    Path(sandbox_paths["demo-assets"], "img", "banner.svg").write_text("<svg id='b'/>\n")
    demo.apply(example("plancommit.yaml", paths))
    demo.wait("plancommit/plan-demo-1-commit", "condition=Committed")
    demo.show("get", "plancommits")
    say(f"repository: {_git(repo, 'log', '-1', '--format=%h %s')}; "
        f"{target} = {(repo / target).read_text().strip()!r}")
    say(f"docs/README.md = {(docs / 'README.md').read_text().strip()!r}; "
        f"assets/img/banner.svg exists = {(paths['assets'] / 'img' / 'banner.svg').exists()}")

    say("\n== plan-demo-2: a conflicting change lands on the original; the PlanCommit fails")
    demo.apply(example("sandbox-copy-on-write.yaml", paths, name="demo2-docs",
                       planId="plan-demo-2"))
    demo.apply(example("sandbox-git-worktree.yaml", paths, name="demo2-repo",
                       planId="plan-demo-2"))
    for name in ("demo2-docs", "demo2-repo"):
        demo.wait(f"sandbox/{name}", "condition=Ready")
    docs_before = (docs / "README.md").read_text()
    Path(demo.status("sandbox", "demo2-docs")["sandboxPath"], "README.md").write_text("plan 2\n")
    Path(demo.status("sandbox", "demo2-repo")["sandboxPath"], target).write_text("plan 2\n")
    (repo / target).write_text("someone else's change\n")
    _git(repo, "commit", "-q", "-am", "a concurrent change by someone else")
    head = _git(repo, "rev-parse", "HEAD")
    demo.apply(example("plancommit.yaml", paths, name="plan-demo-2-commit", planId="plan-demo-2"))
    status = demo.wait_phase("plancommit", "plan-demo-2-commit", {"Failed", "Committed"})
    demo.show("get", "plancommits")
    demo.show("get", "plancommit", "plan-demo-2-commit", "-o",
              "custom-columns=PHASE:.status.phase,ROLLED_BACK:.status.rolledBackIds,"
              "FAILED_ROLLBACKS:.status.failedRollbackIds,FAILED:.status.failedSandboxId")
    for condition in status.get("conditions", []):
        say(f"  {condition['type']}={condition['status']} ({condition['reason']}): "
            f"{condition['message']}")
    unchanged = _git(repo, "rev-parse", "HEAD") == head and (
        (docs / "README.md").read_text() == docs_before
    )
    say(f"originals unchanged after the failed PlanCommit: {unchanged}")
    # TwoPhase (the default) aborts before any original changes; Saga compensates what landed.
    # Either way the plan ends Failed with RolledBack=True and the originals as they were.
    rolled_back = find_condition(status.get("conditions"), "RolledBack") or {}
    ok = status.get("phase") == "Failed" and rolled_back.get("status") == "True" and unchanged
    say(f"\noperator demo {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="sandbox-operator-demo-"))
    say(f"work dir: {work}")
    return run(work)


if __name__ == "__main__":
    sys.exit(main())
