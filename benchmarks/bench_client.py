"""Client file-operation cost: write_file + read_file through sandbox_client vs the file system.

Run: ``.venv/bin/python benchmarks/bench_client.py [--calls 100] [--runs 3]
[--strategies copy_on_write,git_worktree,overlay] [--markdown FILE]``.

Issue 10, "Benchmark". One run starts etcd + kube-apiserver (``tests/apiserver/harness.py``),
installs ``crds/`` and runs the operator with the local executor (``tests/operator/support.py``);
per strategy one Active Sandbox. Then, per run, N pairs of ``write_file`` + ``read_file`` of a
1 KiB file (a new path per pair) through:

- the sync client (``Sandbox.write_file`` / ``read_file``): each call reads the Sandbox object
  from the API server (phase, path, executor) and then touches the sandbox path;
- the async client (``sandbox_client.aio``), the same calls awaited one after the other;
- the anchor: ``open().write`` / ``open().read`` on ``status.sandboxPath`` directly, which is
  what the local executor's file operations do underneath.

Medians of the runs, printed side by side with the ratio to the anchor.
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
from tests.apiserver.harness import LocalApiServer  # noqa: E402
from tests.operator.support import (  # noqa: E402
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--strategies", default="copy_on_write,git_worktree,overlay")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
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
