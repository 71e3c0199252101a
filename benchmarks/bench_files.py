"""One actor file operation through the workspace agent beside the same with the local executor.

Both sides run the one implementation (``sandbox_core.actor``): the local side does what the
operator's local executor does per call (re-open the sandbox from its store, then
``ActorDoor(...).files().write`` / ``read_text``, the change audited with an fsync); the agent
side sends the same operation to a real workspace agent process on 127.0.0.1 (``sandbox-core
serve-workspace``), over HTTP with the Sandbox's token, as the operator's pod executor does
(``AgentClient``: one connection per call), or over one kept-alive connection (``--keep-alive``,
what a long-lived client does). No cluster: the pod network and the API server's pod proxy are
not in either figure.

Usage: ``.venv/bin/python benchmarks/bench_files.py [--calls 200] [--strategies copy_on_write,
git_worktree] [--keep-alive] [--before CHECKOUT]``; prints a Markdown table (medians of a write
and a read of 1 KiB, interleaved), the ratio agent / local, the floor of one exchange with the
agent (an empty ``GET /healthz``, median, after the pairs) and the load average. The design's
goal is at most 1.5x. ``--before CHECKOUT`` starts a second agent from another checkout (``git
worktree add DIR <commit>``: the code before a change) and runs each pair on both agents in
turn, so that both see the same load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "operator")]

from sandbox_operator.executors.agent_client import AgentClient, derive_token  # noqa: E402

from sandbox_core.actor.door import ActorDoor  # noqa: E402
from sandbox_core.agent import wire  # noqa: E402
from sandbox_core.host.host import SandboxHost  # noqa: E402
from sandbox_core.host.store import SandboxStore  # noqa: E402
from sandbox_core.strategies.factory import SandboxFactory  # noqa: E402
from tests.support.apiserver.harness import free_port  # noqa: E402
from tests.support.gitrepo import GIT_ENV, make_repo  # noqa: E402

AGENT_ID = "01HZX0A7Q3J0F8K2M4N6P8R0T2"
LOCAL_ID = "01HZX0A7Q3J0F8K2M4N6P8R0T3"
PAYLOAD = b"x" * 1024


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def start_agent(
    work: Path, token: str, checkout: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """A workspace agent on 127.0.0.1 over ``work``; ``checkout``: serve the ``sandbox_core`` of
    another checkout (the code before a change), else this one's."""
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    (work / "token").write_text(token)
    agent = subprocess.Popen(
        [sys.executable, "-m", "sandbox_core.cli", "--state-dir", str(work / "agent-state"),
         "--sandbox-root", str(work / "agent-sandboxes"), "serve-workspace",
         "--host", "127.0.0.1", "--port", str(port), "--token-file", str(work / "token")],
        env={**os.environ, **GIT_ENV, "PYTHONPATH": str(checkout or REPO_ROOT)},
        cwd=checkout or REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        probe = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            probe.request("GET", wire.HEALTHZ.template)
            if probe.getresponse().status == 200:
                return agent, port
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        finally:
            probe.close()


def keep_alive_call(
    connection: http.client.HTTPConnection, token: str
) -> Callable[[str, str, bytes | None, dict[str, str], str], None]:
    def call(method: str, path: str, body: bytes | None, query: dict[str, str], rid: str) -> None:
        headers = {wire.AUTHORIZATION_HEADER: wire.BEARER_PREFIX + token}
        if rid:
            headers[wire.REQUEST_ID_HEADER] = rid
        target = path + "?" + "&".join(f"{k}={v}" for k, v in query.items())
        connection.request(method, target, body=body, headers=headers)
        reply = connection.getresponse()
        json.loads(reply.read())
        assert reply.status == 200, reply.status

    return call


class Side:
    """One agent's side of the run: its client, its kept-alive connection, its times."""

    def __init__(self, port: int, token: str, strategy: str, repo: Path) -> None:
        self.port = port
        self.client = AgentClient(f"http://127.0.0.1:{port}", token, 30)
        body = {"plan_id": "p", "resource_id": "r", "strategy": strategy,
                "original": str(repo), "sandbox_id": AGENT_ID}  # fmt: skip
        self.client.call("POST", wire.CREATE.template, body, request_id="create")
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.fast = keep_alive_call(self.connection, token)
        self.times: list[float] = []

    def pair(self, index: int, keep_alive: bool) -> None:
        """A write and its read, timed (per call)."""
        put, text = wire.FILE_PUT.path(sid=AGENT_ID), wire.FILE_TEXT.path(sid=AGENT_ID)
        rel = f"bench/{index % 50}.txt"
        start = time.perf_counter()
        if keep_alive:
            self.fast("PUT", put, PAYLOAD, {"path": rel}, f"w-{index}")
            self.fast("GET", text, None, {"path": rel}, "")
        else:
            self.client.call("PUT", put, PAYLOAD, query={"path": rel}, request_id=f"w-{index}")
            self.client.call("GET", text, query={"path": rel})
        self.times.append((time.perf_counter() - start) / 2)


def run(
    strategy: str, calls: int, keep_alive: bool, before: Path | None = None
) -> tuple[float, float, float, float | None]:
    """Medians in ms: the agent, the local executor, an empty exchange, and the agent of the
    ``before`` checkout (None without one), each pair of the two agents run in turn."""
    with tempfile.TemporaryDirectory(prefix="bench-files-") as tmp:
        work = Path(tmp)
        repo = make_repo(work / "repo", {"f.txt": "x\n"})
        token = derive_token(b"k" * 32, "uid")
        agent, port = start_agent(work, token)
        old_agent = None if before is None else start_agent(work / "before", token, before)[0:2]
        try:
            side = Side(port, token, strategy, repo)
            old = None if old_agent is None else Side(old_agent[1], token, strategy, repo)
            # The local executor's side: its own store and sandbox over the same original.
            store = SandboxStore(str(work / "local-state"))
            factory = SandboxFactory()
            SandboxHost(store, factory).provision(
                "p", "r2", str(repo), strategy, sandbox_id=LOCAL_ID, activate=True,
                sandbox_root=str(work / "local-sandboxes"),
            )  # fmt: skip
            local_state = work / "local-state"

            def local_door() -> ActorDoor:
                return ActorDoor(factory.reopen(store.load(LOCAL_ID)), local_state)

            local_times: list[float] = []
            for index in range(calls):
                rel = f"bench/{index % 50}.txt"
                order = [side] if old is None else [side, old][:: 1 if index % 2 else -1]
                for each in order:
                    each.pair(index, keep_alive)
                start = time.perf_counter()
                local_door().files().write(rel, PAYLOAD)
                local_door().files().read_text(rel)
                local_times.append((time.perf_counter() - start) / 2)
            # The floor of an exchange: an empty GET /healthz, on the kept-alive connection or
            # on a connection of its own.
            empty_times: list[float] = []
            for _ in range(calls):
                start = time.perf_counter()
                fresh = http.client.HTTPConnection("127.0.0.1", port)
                used = side.connection if keep_alive else fresh
                used.request("GET", wire.HEALTHZ.template)
                used.getresponse().read()
                fresh.close()
                empty_times.append(time.perf_counter() - start)
            for each in (side, old):
                if each is not None:
                    each.connection.close()
        finally:
            for process in (agent, None if old_agent is None else old_agent[0]):
                if process is not None:
                    process.terminate()
                    process.wait(timeout=10)
    old_ms = None if old is None else median_ms(old.times)
    return median_ms(side.times), median_ms(local_times), median_ms(empty_times), old_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--strategies", default="copy_on_write,git_worktree")
    parser.add_argument("--keep-alive", action="store_true")
    parser.add_argument(
        "--before", type=Path, default=None,
        help="a checkout of the code before a change: its agent too, each pair run in turn",
    )  # fmt: skip
    args = parser.parse_args()
    transport = "one kept-alive connection" if args.keep_alive else "a connection per call"
    before = " | agent, code before | ratio before / local" if args.before else ""
    print(f"| strategy (median of {args.calls} write+read pairs, per call) | agent ({transport}) "
          "| local executor (same core API) | ratio agent / local | an empty exchange "
          f"(`GET /healthz`){before} | load average |")  # fmt: skip
    print("| --- " * (7 if args.before else 5) + "| --- |")
    for strategy in args.strategies.split(","):
        load = os.getloadavg()[0]
        agent_ms, local_ms, empty_ms, old_ms = run(
            strategy, args.calls, args.keep_alive, args.before
        )
        old = "" if old_ms is None else f" | {old_ms:.2f} ms | {old_ms / local_ms:.2f}x"
        print(f"| {strategy} | {agent_ms:.2f} ms | {local_ms:.2f} ms | "
              f"{agent_ms / local_ms:.2f}x | {empty_ms:.2f} ms{old} | {load:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
