"""A real workspace agent for the client tests and benchmarks (never a test module).

``sandbox-core serve-workspace`` on this machine's first non-loopback IPv4 address (the API
server refuses to proxy to loopback, and dials this one like a Pod IP), with the token the
operator would derive for :data:`UID`; the Sandbox as the client reads it once the pod executor
provisioned it; the workspace Pod's shape that matters to the pod proxy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from sandbox_operator.executors.agent_client import derive_token

from sandbox_api.naming import child_object_name
from sandbox_client.models import SandboxInfo
from tests.support.apiserver.harness import free_port
from tests.support.gitrepo import GIT_ENV

KEY = b"c" * 32
UID = "5f1d7c2e-0000-4aaa-8bbb-0c0d0e0f1011"
SANDBOX_ID = "01J0CL1ENTAGENTF1LES0000AB"
NAME = "repo-sbx"
POD = child_object_name(NAME, "ws")
TOKEN = derive_token(KEY, UID)


def host_address() -> str:
    """This machine's first non-loopback IPv4 address (the API server proxies to it)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout
    for address in out.split():
        if "." in address and not address.startswith("127."):
            return address
    raise AssertionError(f"no non-loopback IPv4 address on this machine: {out!r}")


class Agent:
    """``sandbox-core serve-workspace`` on the host address with a token file."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.host = host_address()
        self.port = free_port()
        self.token_file = work / "token"
        self.token_file.write_text(TOKEN)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Agent:
        with open(self.work / "agent.log", "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "sandbox_core.cli",
                    "--state-dir", str(self.work / "state"),
                    "--sandbox-root", str(self.work / "sandboxes"),
                    "serve-workspace", "--host", self.host, "--port", str(self.port),
                    "--token-file", str(self.token_file),
                ],
                env={**os.environ, **GIT_ENV}, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as reply:  # noqa: S310
                    if reply.read() == b"ok":
                        return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError((self.work / "agent.log").read_text())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def sandbox_info(namespace: str = "ns", phase: str = "Active") -> SandboxInfo:
    """The Sandbox as the client would read it once the pod executor provisioned it."""
    return SandboxInfo.from_object(
        {
            "metadata": {"name": NAME, "namespace": namespace, "uid": UID},
            "spec": {
                "planId": "plan-a",
                "resourceId": "repo",
                "strategy": "git_worktree",
                "source": {"persistentVolumeClaim": {"claimName": "src"}},
            },
            "status": {
                "phase": phase,
                "executor": "pod",
                "sandboxId": SANDBOX_ID,
                "workspacePod": POD,
            },
        }
    )


def pod_manifest(port: int) -> dict[str, Any]:
    """The workspace Pod's shape that matters to the proxy: the agent's port, declared first."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD},
        "spec": {
            "containers": [
                {
                    "name": "workspace",
                    "image": "sandbox-operator:test",
                    "ports": [{"name": "agent", "containerPort": port, "protocol": "TCP"}],
                }
            ]
        },
    }
