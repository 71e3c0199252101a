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

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from sandbox_core._demo import _build_inputs, _default_source_tree, _git  # noqa: E402
from tests.apiserver.harness import LocalApiServer  # noqa: E402

NAMESPACE = "sandbox-demo"
EXAMPLES = ROOT / "examples"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "sandbox-demo",
    "GIT_AUTHOR_EMAIL": "demo@sandbox.invalid",
    "GIT_COMMITTER_NAME": "sandbox-demo",
    "GIT_COMMITTER_EMAIL": "demo@sandbox.invalid",
}


def say(text: str) -> None:
    print(text, flush=True)


class Demo:
    """One API server, one operator process, and the demo's inputs."""

    def __init__(self, server: LocalApiServer, work: Path) -> None:
        self.server = server
        self.work = work
        self.operator: subprocess.Popen[bytes] | None = None

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [str(self.server.kubectl_path), "--kubeconfig", str(self.server.kubeconfig_path),
             "-n", NAMESPACE, *args],
            input=stdin, capture_output=True, text=True, check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def show(self, *args: str) -> None:
        say(f"$ kubectl {' '.join(args)}")
        say(self.kubectl(*args))

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest))

    def start_operator(self) -> None:
        log = open(self.work / "operator.log", "wb")  # noqa: SIM115 - lives as long as the process
        env = {
            **os.environ,
            **GIT_ENV,
            "KUBECONFIG": str(self.server.kubeconfig_path),
            "SANDBOX_OPERATOR_EXECUTOR": "local",
            "SANDBOX_OPERATOR_STATE_DIR": str(self.work / "operator-state"),
            "SANDBOX_OPERATOR_SANDBOX_ROOT": str(self.work / "sandboxes"),
            "SANDBOX_OPERATOR_METRICS_PORT": "0",
            "SANDBOX_OPERATOR_RETRY_DELAY_SECONDS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)]),
        }
        self.operator = subprocess.Popen(
            [sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", NAMESPACE,
             "-m", "sandbox_operator.main"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work,
        )

    def stop_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                self.operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.operator.kill()

    def wait(self, resource: str, condition: str, timeout: int = 120) -> None:
        say(f"$ kubectl wait --for={condition} {resource} --timeout={timeout}s")
        say(self.kubectl("wait", f"--for={condition}", resource, f"--timeout={timeout}s"))

    def status(self, kind: str, name: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", kind, name, "-o", "json")).get("status") or {})

    def wait_phase(self, kind: str, name: str, phases: set[str], timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status(kind, name)
            if status.get("phase") in phases:
                return status
            time.sleep(0.5)
        raise RuntimeError(f"{kind}/{name} did not reach {phases}; see {self.work}/operator.log")


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
        demo = Demo(server, work)
        demo.kubectl("create", "namespace", NAMESPACE, check=False)
        server.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"), check=True)
        for crd in ("sandboxes", "checkpoints", "plancommits"):
            demo.kubectl("wait", "--for=condition=Established",
                         f"crd/{crd}.sandbox.cleveragents.io", "--timeout=60s")
        say(f"API server {server.server_url} ready; CRDs installed")
        demo.start_operator()
        try:
            return demo_flow(demo, paths, target, repo, docs)
        finally:
            demo.kubectl("delete", "sandboxes,checkpoints,plancommits", "--all",
                         "--timeout=60s", check=False)
            demo.stop_operator()
            say(f"operator log: {work / 'operator.log'}")


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
    ok = status.get("phase") == "Failed" and bool(status.get("rolledBackIds")) and unchanged
    say(f"\noperator demo {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="sandbox-operator-demo-"))
    say(f"work dir: {work}")
    return run(work)


if __name__ == "__main__":
    sys.exit(main())
