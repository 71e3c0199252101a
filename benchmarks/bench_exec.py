"""A command through the workspace agent beside the same command as a local subprocess.

Two figures, each with its anchor from the same run (docs/benchmarks.md):

- one ``true``: ``POST .../exec`` to a real agent on 127.0.0.1 (jail, git metadata copy, audit
  append, NDJSON stream), against ``subprocess.run(["true"])`` in this process, and against the
  same command in the jail without the agent (:class:`CommandRunner`, the local executor's path);
- 100 MiB of output (``head -c``): streamed through the agent as NDJSON and decoded, as binary
  frames read by a plain ``http.client`` reader, and as frames read by the client's own reader
  (``AgentActor.exec_stream`` over ``DirectTransport``), against ``head -c ... | cat >
  /dev/null``-style reading of a local pipe in this process; and, to show where the time goes,
  the same command in the jail read straight from its pipe (``bwrap`` alone), and through the
  command runner without the agent (:class:`CommandRunner`: the jail, the git metadata copy,
  the audit append).

No cluster: the pod proxy and ``kubectl exec`` are not in these figures (tier 3 measures them).

Usage: ``.venv/bin/python benchmarks/bench_exec.py [--calls 20] [--mib 100] [--streams 3]``;
prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "operator")]

from sandbox_client.actor import AgentActor  # noqa: E402
from sandbox_client.agent_files import DirectTransport  # noqa: E402
from sandbox_core.actor.exec import CommandRunner, ExecRequest  # noqa: E402
from sandbox_core.actor.jail import BASE_ENV, Jail  # noqa: E402
from sandbox_core.agent import wire  # noqa: E402
from sandbox_core.host.host import SandboxHost  # noqa: E402
from sandbox_core.host.store import SandboxStore  # noqa: E402
from sandbox_core.strategies.base import BaseSandbox  # noqa: E402
from tests.support.agent import AgentProcess  # noqa: E402
from tests.support.client_agent import SANDBOX_ID, sandbox_info  # noqa: E402
from tests.support.exec_stream import ExecStream  # noqa: E402
from tests.support.gitrepo import GIT_ENV, make_repo  # noqa: E402


def through_agent(
    agent: AgentProcess, body: dict, request_id: str, frames: bool = False
) -> tuple[float, int]:
    """Seconds for one exec through the agent, and the stdout bytes decoded."""
    start = time.perf_counter()
    token = agent.token_file.read_text()
    stream = ExecStream(agent.url, token, SANDBOX_ID, body, request_id, frames=frames)
    size = 0
    if frames:
        for tag, data in stream.frames():
            size += len(data) if tag == wire.FRAME_STDOUT else 0
        stream.close()
        return time.perf_counter() - start, size
    for event in stream.events():
        if event["event"] == "stdout":
            size += len(base64.b64decode(event["data_b64"]))
        elif event["event"] == "exit" and event["exit_code"] != 0:
            raise RuntimeError(event)
    stream.close()
    return time.perf_counter() - start, size


def through_client(agent: AgentProcess, size: int) -> float:
    """Seconds for ``head -c size`` through the client's own reader (``AgentActor.exec_stream``
    over ``DirectTransport``: frames, no API server), every chunk counted."""
    actor = AgentActor(DirectTransport(agent.url, agent.token_file.read_text()))
    argv = ["head", "-c", str(size), "/dev/zero"]
    start = time.perf_counter()
    got = 0
    for chunk in actor.exec_stream(sandbox_info(), argv, max_output_bytes=size, timeout=120):
        got += len(chunk.data or b"") if chunk.kind == "stdout" else 0
    seconds = time.perf_counter() - start
    assert got == size, (got, size)
    return seconds


def local_pipe(size: int, jail_in: Path | None = None) -> float:
    """Seconds for ``head -c size`` read from its pipe in this process; in a jail built on
    the directory ``jail_in`` when given (``bwrap`` alone: no agent, no runner)."""
    argv = ["head", "-c", str(size), "/dev/zero"]
    start = time.perf_counter()
    if jail_in is None:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE)
    else:
        jail = Jail()
        jail.check()  # chooses the /proc mode once, outside the timing
        start = time.perf_counter()
        process = jail.spawn(
            str(jail_in), str(jail_in), argv, dict(BASE_ENV), stdout=subprocess.PIPE
        )
    with process as proc:
        assert proc.stdout is not None
        got = 0
        while data := proc.stdout.read(1024 * 1024):
            got += len(data)
    assert got == size, (got, size)
    return time.perf_counter() - start


def through_runner(runner: CommandRunner, sandbox: BaseSandbox, size: int) -> float:
    """Seconds for ``head -c size`` through the command runner (the local executor's path),
    every chunk counted."""
    request = ExecRequest(argv=("head", "-c", str(size), "/dev/zero"), max_output_bytes=size)
    start = time.perf_counter()
    got = sum(len(chunk.data) for chunk in runner.start(sandbox, request))
    seconds = time.perf_counter() - start
    assert got == size, (got, size)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--streams", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(GIT_ENV)
    size = args.mib * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="bench-exec-") as tmp:
        work = Path(tmp)
        repo = make_repo(work / "repo", {"f.txt": "x\n"})
        agent = AgentProcess(work).start()
        try:
            body = {"plan_id": "p", "resource_id": "r", "strategy": "git_worktree",
                    "original": str(repo), "sandbox_id": SANDBOX_ID}  # fmt: skip
            agent.client().call("POST", wire.CREATE.template, body, request_id="create")
            agent.client().call("POST", wire.ACTIVATE.path(sid=SANDBOX_ID), request_id="act")
            agent_true, local_true, jail_true = [], [], []
            host = SandboxHost(SandboxStore(work / "state"))
            runner = CommandRunner(work / "bench-state")
            for n in range(args.calls):
                agent_true.append(through_agent(agent, {"argv": ["true"]}, f"true-{n}")[0])
                start = time.perf_counter()
                subprocess.run(["true"], check=True)
                local_true.append(time.perf_counter() - start)
                sandbox = host.reopen(SANDBOX_ID)
                start = time.perf_counter()
                runner.run(sandbox, ExecRequest(argv=("true",)))
                jail_true.append(time.perf_counter() - start)
            big = {"argv": ["head", "-c", str(size), "/dev/zero"], "max_output_bytes": size}
            ndjson, framed, client, pipe, jailed, ran = [], [], [], [], [], []
            (work / "jail").mkdir()
            for n in range(args.streams):
                seconds, got = through_agent(agent, big, f"big-{n}")
                assert got == size, (got, size)
                ndjson.append(seconds)
                seconds, got = through_agent(agent, big, f"big-frames-{n}", frames=True)
                assert got == size, (got, size)
                framed.append(seconds)
                client.append(through_client(agent, size))
                pipe.append(local_pipe(size))
                jailed.append(local_pipe(size, work / "jail"))
                ran.append(through_runner(runner, host.reopen(SANDBOX_ID), size))
        finally:
            agent.stop()
    a, loc, j = (statistics.median(x) * 1000 for x in (agent_true, local_true, jail_true))
    agent_mib, frames_mib, client_mib, pipe_mib, jail_mib, runner_mib = (
        args.mib / statistics.median(x) for x in (ndjson, framed, client, pipe, jailed, ran)
    )
    print(f"| figure (median of {args.calls}; streams: of {args.streams}) | through the agent "
          f"| anchor | ratio |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    print(f"| one `true` | {a:.1f} ms | local subprocess {loc:.2f} ms | {a / loc:.0f}x |")
    print(f"| one `true` | {a:.1f} ms | the jail without the agent {j:.1f} ms | {a / j:.2f}x |")
    for what, mib in (("NDJSON", agent_mib), ("frames", frames_mib),
                      ("frames, the client's reader", client_mib),
                      ("without the agent: the jail alone", jail_mib),
                      ("without the agent: the command runner", runner_mib)):  # fmt: skip
        print(f"| {args.mib} MiB of stdout streamed, {what} | {mib:.0f} MiB/s | local pipe "
              f"{pipe_mib:.0f} MiB/s | {mib / pipe_mib:.2f}x |")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
