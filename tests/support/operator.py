"""Helpers shared by the operator's real-API-server tests and BDD steps.

`OperatorProcess` runs ``python -m kopf run --standalone --namespace NS -m sandbox_operator.main``
as a subprocess against the tier-2 API server, with the local executor, so that tests can kill it
(SIGKILL) and start a new one. `Cluster` wraps kubectl for one namespace.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

# Re-exported: the operator tests, BDD steps and benchmarks import them from here.
from tests.support.gitrepo import GIT_ENV as GIT_ENV
from tests.support.gitrepo import git as git
from tests.support.gitrepo import make_repo as make_repo
from tests.support.helm import run_helm

REPO_ROOT = Path(__file__).resolve().parents[2]


def files_at(commit: str, paths: list[str], into: Path) -> Path:
    """``paths`` of this repository as they were at ``commit`` (``git archive``), under ``into``.

    The upgrade tests run what a user's cluster ran: an earlier chart or operator.
    """
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit, *paths],
        capture_output=True, check=True,
    )  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


CRD_DIR = REPO_ROOT / "crds"
API = "sandbox.cleveragents.io/v1beta1"

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float = 60.0, what: str = "condition") -> T:
    """Poll ``probe`` every 0.25 s until it returns a truthy value; return it.

    Raises:
        AssertionError: it never did within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def make_dir(path: Path, files: Mapping[str, str]) -> Path:
    """A plain directory with ``files``."""
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


class Cluster:
    """kubectl against the tier-2 server, in one namespace."""

    def __init__(self, server: Any, namespace: str) -> None:
        self.server = server
        self.namespace = namespace
        self.operator: OperatorProcess | None = None  # waits fail fast when it died

    @classmethod
    def fresh(cls, server: Any, prefix: str = "op") -> Cluster:
        """A new namespace with a unique name (CRDs installed once per server)."""
        install_crds(server)
        namespace = f"{prefix}-{uuid.uuid4().hex[:8]}"
        server.kubectl("create", "namespace", namespace, check=True)
        return cls(server, namespace)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        """kubectl in this namespace."""
        return self.server.kubectl("-n", self.namespace, *args, input=input, check=check)

    def apply(self, manifest: dict[str, Any]) -> Any:
        """``kubectl apply`` one manifest; returns the completed process (check=False)."""
        return self.server.kubectl(
            "-n", self.namespace, "apply", "-f", "-", input=json.dumps(manifest), check=False
        )

    def create(self, manifest: dict[str, Any]) -> None:
        """Apply and require success."""
        result = self.apply(manifest)
        assert result.returncode == 0, result.stderr

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        result = self.kubectl("get", kind, name, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        data: dict[str, Any] = json.loads(result.stdout)
        return data

    def status(self, kind: str, name: str) -> dict[str, Any]:
        """``.status`` of the object ({} when absent)."""
        return dict((self.get(kind, name) or {}).get("status") or {})

    def condition(self, kind: str, name: str, type_: str) -> dict[str, Any] | None:
        """One condition of the object, or None."""
        for condition in self.status(kind, name).get("conditions") or []:
            if condition.get("type") == type_:
                return dict(condition)
        return None

    def wait_active(self, name: str) -> dict[str, Any]:
        """Wait for Sandbox ``name`` to settle; assert it is Active (not Errored); its status."""
        status = self.wait_phase("sandbox", name, {"Active", "Errored"})
        assert status["phase"] == "Active", status
        return status

    def wait_phase(
        self, kind: str, name: str, phases: set[str], timeout: float = 90.0, handled: bool = False
    ) -> dict:
        """Wait until ``.status.phase`` is one of ``phases``; return the status.

        With ``handled``, also until kopf has finished handling the object (its diff-base,
        ``status.lastHandledConfiguration``, is stored). A PlanCommit's journal writes its
        terminal phase before its handler returns, and kopf stores the diff-base in one more
        ``/status`` patch after it: a status read between the two is not yet the settled one.
        """

        def probe() -> dict[str, Any] | None:
            if self.operator is not None:
                self.operator.assert_alive()
            status = self.status(kind, name)
            settled = not handled or status.get("lastHandledConfiguration")
            return status if status.get("phase") in phases and settled else None

        what = "handled, phase" if handled else "phase"
        return wait_for(probe, timeout, f"{kind}/{name} {what} in {sorted(phases)}")

    def events(self, name: str) -> list[dict[str, Any]]:
        """Events about the object ``name`` in this namespace."""
        result = self.kubectl(
            "get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json"
        )
        return list(json.loads(result.stdout).get("items") or [])

    def gone(self, kind: str, name: str) -> bool:
        """True when the object no longer exists."""
        return self.get(kind, name) is None


_installed: set[str] = set()


def install_crds(server: Any) -> None:
    """Apply ``crds/`` once per server and wait until they are Established."""
    key = str(server.server_url)
    if key in _installed:
        return
    server.kubectl("apply", "-f", str(CRD_DIR), check=True)
    for name in ("sandboxes", "checkpoints", "plancommits"):
        crd = f"crd/{name}.sandbox.cleveragents.io"
        jsonpath = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
        wait_for(
            lambda crd=crd, jsonpath=jsonpath: (
                server.kubectl("get", crd, "-o", jsonpath).stdout.strip() == "True"
            ),
            60,
            f"{crd} Established",
        )
    _installed.add(key)


CHART_DIR = REPO_ROOT / "charts" / "sandbox-operator"
POLICY_TEMPLATE = "templates/admission-policy.yaml"


def admission_policy_yaml(server: Any, release: str, watch_namespace: str) -> str:
    """The chart's MutatingAdmissionPolicy and its binding for ``watch_namespace``, as
    ``helm template`` renders them with ``admissionPolicy.enabled=true`` (helm from the
    server's binaries, in a private helm home)."""
    result = run_helm(
        server.bin_dir / "helm", "template", release, str(CHART_DIR), "--show-only",
        POLICY_TEMPLATE, "--set", "admissionPolicy.enabled=true", "--set",
        f"watchNamespace={watch_namespace}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def install_admission_policy(server: Any, release: str, cluster: Cluster) -> str:
    """Install the chart's admission policy for ``cluster``'s namespace and wait until the API
    server applies it (a server-side dry-run create gets the finalizer); returns the YAML
    (``kubectl delete -f -`` it to remove the policy)."""
    manifest = admission_policy_yaml(server, release, cluster.namespace)
    server.kubectl("apply", "-f", "-", input=manifest, check=True)
    probe = json.dumps(sandbox_manifest("policy-probe", "probe", "none", Path("/nonexistent")))

    def applied() -> bool:
        result = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=probe, check=False
        )
        if result.returncode != 0:
            return False
        return bool(json.loads(result.stdout)["metadata"].get("finalizers"))

    wait_for(applied, 60, "the admission policy in effect")
    return manifest


def sandbox_manifest(
    name: str,
    plan_id: str,
    strategy: str,
    node_path: Path | str,
    resource_id: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Sandbox over ``node_path`` (local executor)."""
    return {
        "apiVersion": API,
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "planId": plan_id,
            "resourceId": resource_id or name,
            "strategy": strategy,
            "source": {"nodePath": str(node_path)},
            **spec,
        },
    }


def plancommit_manifest(name: str, plan_id: str, **spec: Any) -> dict[str, Any]:
    """A PlanCommit of ``plan_id``."""
    return {
        "apiVersion": API,
        "kind": "PlanCommit",
        "metadata": {"name": name},
        "spec": {"planId": plan_id, **spec},
    }


def checkpoint_manifest(name: str, sandbox: str, phase: str = "pre_execute") -> dict[str, Any]:
    """A Checkpoint of Sandbox ``sandbox``."""
    return {
        "apiVersion": API,
        "kind": "Checkpoint",
        "metadata": {"name": name},
        "spec": {"sandboxName": sandbox, "phase": phase, "metadata": {"by": "test"}},
    }


def pod_executor_env(namespace: str, key_file: Path, port: int, **extra: str) -> dict[str, str]:
    """The operator's environment for the pod executor in ``namespace`` (its Pods there, its
    peers labelled as the chart labels them), the agent key at ``key_file`` and the agents on
    ``port``; ``extra`` adds ``SANDBOX_OPERATOR_<NAME>`` settings (``WARM_POOL_SIZE="1"``)."""
    return {
        "SANDBOX_OPERATOR_EXECUTOR": "pod",
        "SANDBOX_OPERATOR_AGENT_KEY_FILE": str(key_file),
        "SANDBOX_OPERATOR_AGENT_PORT": str(port),
        "SANDBOX_OPERATOR_POD_NAMESPACE": namespace,
        "SANDBOX_OPERATOR_POD_LABELS": "app.kubernetes.io/name=sandbox-operator",
        **{f"SANDBOX_OPERATOR_{name}": value for name, value in extra.items()},
    }


class OperatorProcess:
    """The operator as a subprocess (local executor) watching one namespace."""

    def __init__(
        self,
        server: Any,
        namespace: str,
        work_dir: Path,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.server = server
        self.namespace = namespace
        self.work_dir = work_dir
        self.extra_env = dict(extra_env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.log_paths: list[Path] = []

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment of the operator process."""
        env = self.server.env()
        env.update(GIT_ENV)
        env.update(
            {
                "SANDBOX_OPERATOR_EXECUTOR": "local",
                "SANDBOX_OPERATOR_STATE_DIR": str(self.work_dir / "state"),
                "SANDBOX_OPERATOR_SANDBOX_ROOT": str(self.work_dir / "sandboxes"),
                "SANDBOX_OPERATOR_METRICS_PORT": "0",
                "SANDBOX_OPERATOR_RETRY_DELAY_SECONDS": "1",
                "SANDBOX_OPERATOR_TTL_CHECK_INTERVAL_SECONDS": "1",
                "SANDBOX_OPERATOR_WATCH_SERVER_TIMEOUT_SECONDS": "60",
                "SANDBOX_OPERATOR_WATCH_CLIENT_TIMEOUT_SECONDS": "70",
                "PYTHONPATH": os.pathsep.join(
                    [str(REPO_ROOT / "operator"), str(REPO_ROOT), env.get("PYTHONPATH", "")]
                ),
            }
        )
        env.update(self.extra_env)
        env.update(extra or {})
        return env

    def start(self, extra_env: Mapping[str, str] | None = None) -> OperatorProcess:
        """Start a new operator process (the previous one must be stopped)."""
        log = self.work_dir / f"operator-{len(self.log_paths)}.log"
        self.log_paths.append(log)
        with open(log, "wb") as handle:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kopf",
                    "run",
                    "--standalone",
                    "--namespace",
                    self.namespace,
                    "-m",
                    "sandbox_operator.main",
                ],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=self.env(extra_env),
                cwd=self.work_dir,
            )
        return self

    def assert_alive(self) -> None:
        """Raise AssertionError with the log tail when the process has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"operator exited with {self.process.returncode}:\n{self.logs()[-4000:]}"
            )

    def wait_exit(self, timeout: float = 60.0) -> int:
        """Wait for the process to end by itself (e.g. a fault hook's SIGKILL)."""
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def logs(self) -> str:
        """All operator logs so far."""
        return "\n".join(p.read_text(errors="replace") for p in self.log_paths if p.exists())


def run_operator(
    server: Any,
    cluster: Cluster,
    tmp_path: Path,
    *,
    cleanup_kinds: str = "sandboxes,checkpoints",
    check_pruning: bool = True,
) -> Iterator[OperatorProcess]:
    """The body of the tier-2 ``operator`` fixtures: yields an operator of ``cluster``'s
    namespace (not started: tests start it, some with fault hooks), then lets its finalizers
    remove what the test made, stops it and prints its log (shown when the test failed).

    Args:
        cleanup_kinds: the kinds deleted before the operator stops (``kubectl delete``).
        check_pruning: assert that no status field the operator wrote was pruned (case 15).
    """
    work = tmp_path / "operator"
    work.mkdir()
    process = OperatorProcess(server, cluster.namespace, work)
    cluster.operator = process
    yield process
    left = ""
    try:
        if process.process is not None and process.process.poll() is None:
            # kubectl's own timeout, under the subprocess's: a deletion that does not finish
            # is reported (below) instead of killing kubectl and skipping the operator's stop.
            deleted = cluster.server.kubectl(
                "-n", cluster.namespace, "delete", cleanup_kinds, "--all", "--timeout=60s",
                timeout=90.0,
            )  # fmt: skip
            if deleted.returncode != 0:
                left = cluster.server.kubectl(
                    "-n", cluster.namespace, "get", cleanup_kinds, "-o", "yaml"
                ).stdout
    finally:
        process.stop()
        print(process.logs()[-8000:])
    assert not left, f"the operator's finalizers did not remove what the test made:\n{left[-4000:]}"
    if check_pruning:
        assert "Patching failed with inconsistencies" not in process.logs()


def secret_manifest(name: str, dsn: str) -> dict[str, Any]:
    """A Secret holding ``dsn`` under key ``dsn``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {"dsn": base64.b64encode(dsn.encode()).decode()},
    }


def db_sandbox(name: str, plan: str, secret: str) -> dict[str, Any]:
    """A transaction_rollback Sandbox reading its DSN from Secret ``secret``."""
    return {
        "apiVersion": "sandbox.cleveragents.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "planId": plan,
            "resourceId": name,
            "strategy": "transaction_rollback",
            "source": {"secretRef": {"name": secret}},
        },
    }


def ready(cluster: Cluster, name: str) -> dict[str, Any]:
    """Wait until Sandbox ``name`` is Active with Ready=True; return its status."""
    status = cluster.wait_phase("sandbox", name, {"Active", "Errored"})
    assert status["phase"] == "Active", status
    assert cluster.condition("sandbox", name, "Ready")["status"] == "True"
    return status


def write_in_sandbox(status: dict[str, Any], name: str, text: str) -> None:
    """An actor's write: straight into the sandbox path."""
    (Path(status["sandboxPath"]) / name).write_text(text)


def three_sandbox_plan(cluster: Cluster, tmp_path: Path, plan: str) -> dict[str, Any]:
    """git_worktree, copy_on_write and overlay Sandboxes of ``plan``, Active, each with a write."""
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    layer = make_dir(tmp_path / "layer", {"h.txt": "o0\n"})
    cluster.create(sandbox_manifest("sa-git", plan, "git_worktree", repo))
    cluster.create(sandbox_manifest("sb-copy", plan, "copy_on_write", data))
    cluster.create(sandbox_manifest("sc-overlay", plan, "overlay", layer))
    out: dict[str, Any] = {"repo": repo, "data": data, "layer": layer}
    for name, file, text in (
        ("sa-git", "f.txt", "r1\n"),
        ("sb-copy", "g.txt", "d1\n"),
        ("sc-overlay", "h.txt", "o1\n"),
    ):
        status = ready(cluster, name)
        write_in_sandbox(status, file, text)
        out[name] = status
    return out
