"""The kubelet's two parts for a workspace Pod on the API server tier, which has no kubelet:
:class:`Kubelet` runs the Pod's main process (``sandbox-core serve-workspace``) with the Pod's
environment and token file (a warm-pool Pod's: its bootstrap-token file and allowed roots, no
token yet), and reports the Pod's status (Running, Ready, podIP 127.0.0.1) through the status
subresource. :data:`POD` is the workspace Pod of Sandbox ``s-db`` (:data:`SECRET` its token
Secret; a :class:`Kubelet` may play another Pod); :data:`KEY` the operator's agent key. The
multi-node tier's fake kubelet starts one per workspace Pod it runs
(`tests.support.apiserver.multinode.FakeKubelet.agents`).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from sandbox_api.naming import child_object_name
from sandbox_core.agent import wire
from tests.support.operator import Cluster, wait_for

KEY = "agent-key-" + "x" * 40
POD = child_object_name("s-db", "ws")
SECRET = child_object_name("s-db", "agent")


class Kubelet:
    """The kubelet's part for one workspace Pod: its main process and its status."""

    def __init__(
        self,
        namespace: Cluster,
        work: Path,
        port: int,
        dsn: str,
        pod: str = POD,
        secret: str = SECRET,
        ip: str = "127.0.0.1",
        source: Path | None = None,
    ) -> None:
        self.cluster = namespace
        self.work = work
        self.port = port
        self.dsn = dsn
        self.pod = pod
        self.secret = secret
        self.ip = ip  # the Pod's IP: one loopback address per Pod, all on the agent's one port
        self.source = source  # mounted at the Pod's source mount, as the source claim would be
        self.agent: subprocess.Popen[bytes] | None = None

    def start_container(self) -> None:
        """Run the Pod's command with the Pod's token file and environment. A warm-pool Pod
        (a ``bootstrap`` Secret volume) gets its bootstrap-token file and its declared allowed
        roots instead, and no token file: its agent waits for the hand-over."""
        self.work.mkdir(parents=True, exist_ok=True)
        token_file = self.work / "token"
        pod = self.cluster.get("pod", self.pod)
        assert pod is not None
        container = pod["spec"]["containers"][0]
        assert container["command"] == ["sandbox-core", "serve-workspace"]
        env = {**os.environ, "SANDBOX_SOURCE_DSN": self.dsn}
        bootstrap = next((v for v in pod["spec"]["volumes"] if v["name"] == "bootstrap"), None)
        if bootstrap is None:
            token_file.write_bytes(self._secret_token(self.secret))
        else:
            token_file.unlink(missing_ok=True)  # none until the hand-over
            boot = self.work / "bootstrap-token"
            boot.write_bytes(self._secret_token(bootstrap["secret"]["secretName"]))
            declared = {e["name"]: e.get("value", "") for e in container.get("env") or []}
            assert declared[wire.BOOTSTRAP_TOKEN_FILE_ENV] == wire.BOOTSTRAP_TOKEN_FILE
            env[wire.BOOTSTRAP_TOKEN_FILE_ENV] = str(boot)
            env[wire.ALLOWED_ROOTS_ENV] = declared[wire.ALLOWED_ROOTS_ENV]
        scratch = self.scratch_dir(pod)
        with open(self.work / "agent.log", "ab") as log:
            self.agent = subprocess.Popen(
                [
                    *self._mounts(),
                    sys.executable, "-m", "sandbox_core.cli",
                    "--state-dir", str(scratch / "state"),
                    "--sandbox-root", str(scratch / "sandboxes"),
                    "serve-workspace", "--host", self.ip, "--port", str(self.port),
                    "--token-file", str(token_file),
                ],
                env=env, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip

    def _secret_token(self, name: str) -> bytes:
        secret = self.cluster.get("secret", name)
        assert secret is not None, f"secret {name}"
        return base64.b64decode(secret["data"]["token"])

    def _mounts(self) -> list[str]:
        """With a ``source``: bwrap with this machine's root as it is, plus ``source`` at the
        Pod's source mount (``/workspace/source``, which does not exist here), in a mount
        namespace of the agent's own; nothing else changes for it."""
        if self.source is None:
            return []
        from sandbox_operator.executors.pod_manifests import SOURCE_MOUNT

        argv = ["bwrap", "--die-with-parent"]  # the agent goes with the "container"
        for entry in sorted(Path("/").iterdir()):
            if entry.name == "dev" or str(entry) == str(Path(SOURCE_MOUNT).parent):
                continue
            if entry.is_symlink():
                argv += ["--symlink", os.readlink(entry), str(entry)]
            else:
                argv += ["--dev-bind", str(entry), str(entry)]
        argv += ["--dev-bind", "/dev", "/dev"]
        return [*argv, "--bind", str(self.source), SOURCE_MOUNT, "--"]

    def sync_token(self) -> bytes:
        """Bring the token Secret's current value to the Pod's token file, as the kubelet does
        for a Secret volume (a new file renamed over the old one); returns the value."""
        secret = self.cluster.get("secret", self.secret)
        assert secret is not None
        value = base64.b64decode(secret["data"]["token"])
        staged = self.work / "token.new"
        staged.write_bytes(value)
        staged.replace(self.work / "token")
        return value

    def scratch_dir(self, pod: dict[str, Any]) -> Path:
        """The Pod's ``/workspace/scratch`` as the kubelet would give it: the claim's directory
        (the same for every Pod mounting the claim), or a new directory per Pod for an
        emptyDir (lost with the Pod)."""
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "scratch")
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            return self.work / "claims" / claim
        return self.work / "pods" / pod["metadata"]["uid"] / "scratch"

    def serving(self) -> bool:
        """Whether the agent answers its readiness probe (``GET /healthz``) at the Pod's IP."""
        try:
            with urllib.request.urlopen(f"http://{self.ip}:{self.port}/healthz", timeout=1) as r:
                return bool(r.read() == b"ok")
        except OSError:
            return False

    def report_ready(self) -> None:
        """Once the readiness probe passes (``GET /healthz``), patch the current Pod's status:
        Running, Ready, podIP ``ip``."""
        wait_for(self.serving, 60, "the agent's readiness probe")
        wait_for(lambda: self.cluster.get("pod", self.pod), 60, "the workspace Pod")
        status = {
            "status": {
                "phase": "Running",
                "podIP": self.ip,
                "podIPs": [{"ip": self.ip}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }
        self.cluster.kubectl(
            "patch",
            "pod",
            self.pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )

    def stop(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(timeout=10)
