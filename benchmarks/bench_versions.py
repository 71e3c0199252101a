"""The same commit and rollback timed in two checkouts of the project, in turn. Not a test.

Run: ``python benchmarks/bench_versions.py OLD_CHECKOUT [--new NEW_CHECKOUT] [--rounds 3]
[--runs 5] [--files 10] [--source DIR] [--strategies git_worktree,copy_on_write,...]``

Why: the core benchmark's anchors (``cp -a``, ``rsync``, ``git``) are disk-bound and move 2x to
5x between runs of one session, so a ratio can move with its anchor. Timing the product's own
operation at an older commit (``git worktree add --detach OLD <commit>``) in turn with the
current one compares code with code on the same disk state. Each round runs every strategy in
a fresh process per checkout (new first, then old); each figure is the median of ``--runs``
sandboxes (create, wait 1.1 s so git's racy-clean check settles, edit ``--files`` files, then
time ``commit()`` and ``rollback()`` in milliseconds). ``--source`` must be a git repository
(the directory strategies take its files; the sandbox ignores ``.git`` there).

``--paired N``: instead, one long-lived process per checkout and strategy, and N pairs of single
sandboxes timed in alternation (new, old, then old, new), so that a load change on a shared
machine falls on both sides of a pair. Printed per operation: the median wall time of each side,
their ratio, the median of the per-pair ratios, and the same for the CPU time of the process
(``time.process_time``: user and system time of all its threads; it leaves out the time spent
waiting for a CPU, which is what load inflates).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("git_worktree", "copy_on_write", "overlay:fallback", "overlay:kernel")


def measure(checkout: str, strategy: str, source: str, runs: int, files: int) -> dict[str, float]:
    """In this process (``checkout`` first on ``sys.path``): medians in ms."""
    sys.path.insert(0, checkout)
    from sandbox_core import SandboxFactory

    name, _, mode = strategy.partition(":")
    options = {"mode": mode} if mode else {}
    commits, rollbacks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(runs):
            sandbox = SandboxFactory().create(
                name, f"res-{index}", source, sandbox_root=tmp, **options
            )
            sandbox.create("bench")
            time.sleep(1.1)
            root = Path(sandbox.get_path(""))
            edited = sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
            for path in edited[:files]:
                path.write_text(path.read_text(errors="replace") + f"// {index}\n")
            began = time.perf_counter()
            sandbox.commit()
            commits.append(time.perf_counter() - began)
            began = time.perf_counter()
            sandbox.rollback()
            rollbacks.append(time.perf_counter() - began)
            sandbox.cleanup()
    return {
        "commit_ms": statistics.median(commits) * 1000,
        "rollback_ms": statistics.median(rollbacks) * 1000,
    }


def serve(checkout: str, strategy: str, source: str, files: int) -> None:
    """For ``--paired``: per line on stdin, one sandbox (create, wait 0.3 s, edit ``files``
    files), then ``commit()`` and ``rollback()`` timed; prints ``[commit, rollback]`` wall ms
    and ``[commit, rollback]`` CPU ms as one JSON list."""
    sys.path.insert(0, checkout)
    from sandbox_core import SandboxFactory

    name, _, mode = strategy.partition(":")
    options = {"mode": mode} if mode else {}
    with tempfile.TemporaryDirectory() as tmp:
        for index, _line in enumerate(sys.stdin):
            sandbox = SandboxFactory().create(
                name, f"pair-{index}", source, sandbox_root=tmp, **options
            )
            sandbox.create("bench")
            time.sleep(0.3)
            root = Path(sandbox.get_path(""))
            edited = sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
            for path in edited[:files]:
                path.write_text(path.read_text(errors="replace") + f"// {index}\n")
            figures = []
            for operation in (sandbox.commit, sandbox.rollback):
                wall, cpu = time.perf_counter(), time.process_time()
                operation()
                figures += [(time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000]
            sandbox.cleanup()
            print(json.dumps(figures), flush=True)


def paired(args: argparse.Namespace) -> None:
    """``--paired``: see the module docstring."""
    print("| strategy | operation | new ms | old ms | ratio | pair ratio | CPU ms | CPU ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for strategy in args.strategies.split(","):
        workers = []
        for checkout in (args.new, args.old):
            command = [sys.executable, __file__, args.old, "--serve", checkout, strategy,
                       "--files", str(args.files), "--source", args.source]  # fmt: skip
            workers.append(
                subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            )
        results: list[list[list[float]]] = [[], []]
        for number in range(args.paired):
            for side in (0, 1) if number % 2 == 0 else (1, 0):
                stdin, stdout = workers[side].stdin, workers[side].stdout
                assert stdin is not None and stdout is not None
                stdin.write("go\n")
                stdin.flush()
                results[side].append(json.loads(stdout.readline()))
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait()
        for column, operation in ((0, "commit"), (2, "rollback")):
            new = [r[column] for r in results[0]]
            old = [r[column] for r in results[1]]
            cpu_new = statistics.median(r[column + 1] for r in results[0])
            cpu_old = statistics.median(r[column + 1] for r in results[1])
            pairs = statistics.median(a / b for a, b in zip(new, old, strict=True))
            print(
                f"| {strategy} | {operation} | {statistics.median(new):.1f} "
                f"| {statistics.median(old):.1f} "
                f"| {statistics.median(new) / statistics.median(old):.2f}x | {pairs:.2f}x "
                f"| {cpu_new:.1f}/{cpu_old:.1f} | {cpu_new / cpu_old:.2f}x |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="the older checkout (a git worktree at the commit)")
    parser.add_argument("--new", default=str(REPO_ROOT))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--source", default=str(REPO_ROOT))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--paired", type=int, default=0, metavar="N")
    parser.add_argument("--one", nargs=2, metavar=("CHECKOUT", "STRATEGY"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--serve", nargs=2, metavar=("CHECKOUT", "STRATEGY"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1], args.source, args.files)
        return 0
    if args.paired:
        paired(args)
        return 0
    if args.one:
        figures = measure(args.one[0], args.one[1], args.source, args.runs, args.files)
        print(json.dumps(figures))
        return 0
    print("| strategy | operation | round | new ms | old ms | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for round_number in range(1, args.rounds + 1):
        for strategy in args.strategies.split(","):
            pair = []
            for checkout in (args.new, args.old):
                done = subprocess.run(
                    [sys.executable, __file__, args.old, "--one", checkout, strategy,
                     "--runs", str(args.runs), "--files", str(args.files),
                     "--source", args.source],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                pair.append(json.loads(done.stdout.splitlines()[-1]))
            for key in ("commit_ms", "rollback_ms"):
                new, old = pair[0][key], pair[1][key]
                operation = key.removesuffix("_ms")
                print(
                    f"| {strategy} | {operation} | {round_number} | {new:.1f} | {old:.1f} "
                    f"| {new / old:.2f}x |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
