"""The workspace agent as a real process for tests: ``sandbox-core serve-workspace`` on
127.0.0.1 (a free port) with a token file holding the token of :data:`UID` under :data:`KEY`,
its log in the work directory, and an :class:`AgentClient` that calls it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

from sandbox_operator.executors.agent_client import AgentClient, derive_token

from tests.support.apiserver.harness import free_port
from tests.support.gitrepo import GIT_ENV

KEY = b"k" * 32
UID = "0b0c3d1e-1111-4222-8333-944455556666"
SANDBOX_ID = "01HZX0A7Q3J0F8K2M4N6P8R0T2"


class AgentProcess:
    """``sandbox-core serve-workspace`` on 127.0.0.1 with a token file."""

    def __init__(self, work: Path, env: dict[str, str] | None = None) -> None:
        self.work = work
        self.port = free_port()
        self.token_file = work / "token"
        self.token_file.write_text(derive_token(KEY, UID))
        self.extra_env = env or {}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        env = {**os.environ, **GIT_ENV, **self.extra_env}
        with open(self.work / "agent.log", "ab") as log:
            self.process = self._popen(env, log)
        return self._wait_ready()

    def _popen(self, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable, "-m", "sandbox_core.cli",
                "--state-dir", str(self.work / "state"),
                "--sandbox-root", str(self.work / "sandboxes"),
                "serve-workspace", "--host", "127.0.0.1", "--port", str(self.port),
                "--token-file", str(self.token_file),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )  # fmt: skip

    def _wait_ready(self) -> AgentProcess:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as reply:  # noqa: S310
                    if reply.read() == b"ok":
                        return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError((self.work / "agent.log").read_text())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, token: str | None = None) -> AgentClient:
        return AgentClient(self.url, token or derive_token(KEY, UID), timeout_seconds=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
