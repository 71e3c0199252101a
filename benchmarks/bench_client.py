"""Client file-operation cost: write_file + read_file through sandbox_client vs the file system.

Run: ``.venv/bin/python benchmarks/bench_client.py [--calls 100] [--runs 3]
[--strategies copy_on_write,git_worktree,overlay] [--markdown FILE]``.

One run starts etcd + kube-apiserver (``tests/support/apiserver/harness.py``),
installs ``crds/`` and runs the operator with the local executor (``tests/support/operator.py``);
per strategy one Active Sandbox. Then, per run, N pairs of ``write_file`` + ``read_file`` of a
1 KiB file (a new path per pair) through:

- the sync client (``Sandbox.write_file`` / ``read_file``): each call reads the Sandbox object
  from the API server (phase, path, executor) and then touches the sandbox path;
- the async client (``sandbox_client.aio``), the same calls awaited one after the other;
- the anchor: ``open().write`` / ``open().read`` on ``status.sandboxPath`` directly, which is
  what the local executor's file operations do underneath.

Medians of the runs, printed side by side with the ratio to the anchor.

``--agent`` adds the pod executor's path (through the workspace agent): a real
workspace agent process (``sandbox-core serve-workspace``, one git_worktree sandbox) on this
machine's first non-loopback address, a Pod object whose status points at it, the Sandbox's
token Secret, and a Sandbox object (status ``executor: pod``) in a namespace no operator
watches. The same N pairs then go through the sync and the async client, whose calls read the
Sandbox object and reach the agent through the tier-2 API server's pod proxy, beside the same
pairs straight to the agent's address (``DirectTransport``: no API server) and through the file
system on the agent's sandbox path. Tier 3 (a real workspace Pod) measures the sync client
through the agent in ``e2e/test_client_pod_executor.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from sandbox_client import Plan, Sandbox, SandboxClient, aio  # noqa: E402
from tests.support.apiserver.harness import LocalApiServer  # noqa: E402
from tests.support.operator import (  # noqa: E402
    GIT_ENV,
    Cluster,
    OperatorProcess,
    install_crds,
    make_dir,
    make_repo,
)

PAYLOAD = "".join(f"line {n:04d} of a one-kibibyte file.\n" for n in range(32))[:1024]


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def through_client(sandbox: Sandbox, calls: int, tag: str) -> None:
    for i in range(calls):
        path = f"bench/{tag}/f{i:03d}.txt"
        sandbox.write_file(path, PAYLOAD)
        assert sandbox.read_file(path) == PAYLOAD


def through_async_client(kubeconfig: str, namespace: str, name: str, calls: int, tag: str) -> float:
    async def run() -> float:
        async with aio.SandboxClient(kubeconfig=kubeconfig, namespace=namespace) as client:
            sandbox = client.sandbox(name)
            await sandbox.info()  # connect outside the measurement, as the sync client does
            started = time.perf_counter()
            for i in range(calls):
                path = f"bench/{tag}/f{i:03d}.txt"
                await sandbox.write_file(path, PAYLOAD)
                assert await sandbox.read_file(path) == PAYLOAD
            return time.perf_counter() - started

    return asyncio.run(run())


def through_file_system(root: Path, calls: int, tag: str) -> None:
    for i in range(calls):
        path = root / "bench" / tag / f"f{i:03d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(PAYLOAD)
        with open(path, encoding="utf-8") as handle:
            assert handle.read() == PAYLOAD


def agent_row(server: LocalApiServer, work: Path, calls: int, runs: int) -> str:
    """The ``--agent`` row (see the module docstring)."""
    import base64
    import json

    from sandbox_operator.executors.agent_client import AgentClient

    from sandbox_client.agent_files import AgentFileOperations, DirectTransport, secret_name
    from tests.support.client_agent import (
        POD,
        SANDBOX_ID,
        TOKEN,
        Agent,
        pod_manifest,
        sandbox_info,
    )

    files = {f"f{i}.txt": PAYLOAD for i in range(20)}
    repo = make_repo(work / "agent-repo", files)
    (work / "agent").mkdir()
    agent = Agent(work / "agent").start()
    try:
        calls_ = AgentClient(agent.url, TOKEN, timeout_seconds=30)
        body = {
            "plan_id": "bench", "resource_id": "repo", "strategy": "git_worktree",
            "original": str(repo), "sandbox_id": SANDBOX_ID,
        }  # fmt: skip
        calls_.call("POST", "/v1/sandboxes", body, request_id="bench-create")
        calls_.call("POST", f"/v1/sandboxes/{SANDBOX_ID}/activate", request_id="bench-activate")
        namespace = "bench-client-agent"  # no operator watches it
        server.kubectl("create", "namespace", namespace, check=True)
        cluster = Cluster(server, namespace)
        cluster.kubectl("create", "serviceaccount", "default", check=False)
        info = sandbox_info(namespace)
        token = base64.b64encode(TOKEN.encode()).decode()
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name(info)},
                "data": {"token": token},
            }
        )
        cluster.create(pod_manifest(agent.port))
        pod_status = {
            "phase": "Running",
            "podIP": agent.host,
            "podIPs": [{"ip": agent.host}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        cluster.kubectl(
            "patch", "pod", POD, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": pod_status}),
        )  # fmt: skip
        sandbox_object = {
            "apiVersion": "sandbox.cleveragents.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": info.name},
            "spec": info.raw["spec"],
        }
        cluster.create(sandbox_object)
        cluster.kubectl(
            "patch", "sandbox", info.name, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": info.raw["status"]}),
        )  # fmt: skip
        kubeconfig = str(server.kubeconfig_path)
        root = next((work / "agent" / "sandboxes").rglob("f0.txt")).parent
        direct = AgentFileOperations(DirectTransport(agent.url, TOKEN))
        direct_info = info

        def straight(tag: str) -> None:
            for i in range(calls):
                path = f"bench/{tag}/f{i:03d}.txt"
                direct.write_file(direct_info, path, PAYLOAD.encode())
                assert direct.read_file(direct_info, path) == PAYLOAD.encode()

        with SandboxClient(kubeconfig=kubeconfig, namespace=namespace) as client:
            sandbox = client.sandbox(info.name)
            sandbox.read_file("f0.txt")  # connection and token outside the measurement
            ours, async_ours, agent_only, anchor = [], [], [], []
            for run in range(runs):
                ours.append(timed(lambda r=run: through_client(sandbox, calls, f"client{r}")))
                async_ours.append(
                    through_async_client(kubeconfig, namespace, info.name, calls, f"async{run}")
                )
                agent_only.append(timed(lambda r=run: straight(f"direct{r}")))
                anchor.append(timed(lambda r=run: through_file_system(root, calls, f"fs{r}")))
    finally:
        agent.stop()
    sync_s, async_s = statistics.median(ours), statistics.median(async_ours)
    direct_s, fs_s = statistics.median(agent_only), statistics.median(anchor)
    return (
        f"| git_worktree, pod executor: workspace agent via the pod proxy "
        f"(straight to the agent: {direct_s:.3f} s) | {sync_s:.3f} s | {async_s:.3f} s | "
        f"{fs_s * 1000:.1f} ms | {sync_s / fs_s:.0f}x | {async_s / fs_s:.0f}x "
        f"| {sync_s / (2 * calls) * 1000:.2f} ms |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--strategies", default="copy_on_write,git_worktree,overlay")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument(
        "--agent", action="store_true", help="add the pod executor's row (workspace agent)"
    )
    args = parser.parse_args()
    os.environ.update(GIT_ENV)
    work = Path(tempfile.mkdtemp(prefix="sandbox-bench-client-"))
    rows: list[str] = []
    try:
        with LocalApiServer() as server:
            install_crds(server)
            server.kubectl("create", "namespace", "bench-client", check=True)
            cluster = Cluster(server, "bench-client")
            (work / "operator").mkdir()
            operator = OperatorProcess(server, cluster.namespace, work / "operator").start()
            cluster.operator = operator
            kubeconfig = str(server.kubeconfig_path)
            try:
                with SandboxClient(kubeconfig=kubeconfig, namespace=cluster.namespace) as client:
                    plan = Plan(client, "bench")
                    for strategy in args.strategies.split(","):
                        files = {f"f{i}.txt": PAYLOAD for i in range(20)}
                        source = (
                            make_repo(work / strategy, files)
                            if strategy == "git_worktree"
                            else make_dir(work / strategy, files)
                        )
                        plan.add_sandbox(strategy.replace("_", "-"), strategy, source)
                    for info in plan.wait_ready(timeout=180):
                        sandbox = client.sandbox(info.name)
                        root = Path(info.sandbox_path)
                        sandbox.info()  # the first request opens the connection
                        ours, async_ours, anchor = [], [], []
                        for run in range(args.runs):
                            ours.append(
                                timed(
                                    lambda s=sandbox, r=run: through_client(
                                        s, args.calls, f"client{r}"
                                    )
                                )
                            )
                            async_ours.append(
                                through_async_client(
                                    kubeconfig,
                                    cluster.namespace,
                                    info.name,
                                    args.calls,
                                    f"async{run}",
                                )
                            )
                            anchor.append(
                                timed(
                                    lambda p=root, r=run: through_file_system(
                                        p, args.calls, f"fs{r}"
                                    )
                                )
                            )
                        sync_s, async_s = statistics.median(ours), statistics.median(async_ours)
                        fs_s = statistics.median(anchor)
                        line = (
                            f"| {info.spec.strategy} | {sync_s:.3f} s | {async_s:.3f} s | "
                            f"{fs_s * 1000:.1f} ms | {sync_s / fs_s:.0f}x | {async_s / fs_s:.0f}x "
                            f"| {sync_s / (2 * args.calls) * 1000:.2f} ms |"
                        )
                        rows.append(line)
                        print(line, flush=True)
                    plan.delete(cleanup=True)
                if args.agent:
                    line = agent_row(server, work, args.calls, args.runs)
                    rows.append(line)
                    print(line, flush=True)
            finally:
                operator.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    header = (
        f"{args.calls} x (write_file + read_file) of a 1 KiB file, median of {args.runs} runs\n\n"
        "| strategy | sync client | async client | local file system | sync ratio "
        "| async ratio | sync per call |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    table = header + "\n".join(rows) + "\n"
    print("\n" + table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
