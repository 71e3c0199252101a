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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="the older checkout (a git worktree at the commit)")
    parser.add_argument("--new", default=str(REPO_ROOT))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--source", default=str(REPO_ROOT))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--one", nargs=2, metavar=("CHECKOUT", "STRATEGY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
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
