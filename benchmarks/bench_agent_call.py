"""One workspace-agent call beside one ``sandbox-core`` process doing the same.

The anchor is what an exec into the workspace Pod costs per operation: a Python ``sandbox-core
--json status ID`` started for each call; the agent answers from one long-lived process. This
measures both on this machine, without a cluster (no exec API and no pod network in either
figure, so the difference is the process start and imports the agent saves): a real git
repository, a real git_worktree sandbox, the agent on 127.0.0.1.

Usage: ``.venv/bin/python benchmarks/bench_agent_call.py [--calls 20]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "operator")]

from sandbox_operator.executors.agent_client import AgentClient, derive_token  # noqa: E402

from tests.support.apiserver.harness import free_port  # noqa: E402
from tests.support.gitrepo import GIT_ENV, make_repo  # noqa: E402

SANDBOX_ID = "01HZX0A7Q3J0F8K2M4N6P8R0T2"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        work = Path(tmp)
        repo = make_repo(work / "repo", {"f.txt": "x\n"})
        token = derive_token(b"k" * 32, "uid")
        (work / "token").write_text(token)
        port = free_port()
        env = {**os.environ, **GIT_ENV}
        cli = [sys.executable, "-m", "sandbox_core.cli", "--state-dir", str(work / "state"),
               "--sandbox-root", str(work / "sandboxes")]  # fmt: skip
        agent = subprocess.Popen(
            [*cli, "serve-workspace", "--host", "127.0.0.1", "--port", str(port),
             "--token-file", str(work / "token")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            client = AgentClient(f"http://127.0.0.1:{port}", token, 30)
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.call("GET", "/v1/sandboxes/none")
                except Exception as exc:
                    if "NotFound" in str(exc) or type(exc).__name__ == "AgentNotFound":
                        break
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            body = {"plan_id": "p", "resource_id": "r", "strategy": "git_worktree",
                    "original": str(repo), "sandbox_id": SANDBOX_ID}  # fmt: skip
            client.call("POST", "/v1/sandboxes", body, request_id="create")
            agent_times, cli_times = [], []
            for _ in range(args.calls):
                start = time.perf_counter()
                client.call("GET", f"/v1/sandboxes/{SANDBOX_ID}")
                agent_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                subprocess.run([*cli, "--json", "status", SANDBOX_ID], env=env,
                               capture_output=True, check=True)  # fmt: skip
                cli_times.append(time.perf_counter() - start)
        finally:
            agent.terminate()
            agent.wait(timeout=10)
    agent_ms = statistics.median(agent_times) * 1000
    cli_ms = statistics.median(cli_times) * 1000
    header = f"| call (median of {args.calls}) | agent (one process, HTTP) | sandbox-core process |"
    print(header + " ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| status of a git_worktree sandbox | {agent_ms:.1f} ms | {cli_ms:.0f} ms | "
          f"{cli_ms / agent_ms:.0f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
