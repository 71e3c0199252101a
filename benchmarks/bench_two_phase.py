"""Two-phase plan commit beside the saga.

Run: ``python benchmarks/bench_two_phase.py [--sandboxes 10] [--files 200] [--changed 20]
[--repeat 3] [--no-settle] [--markdown FILE]``.

Plans of ``--sandboxes`` copy_on_write sandboxes, each over its own real directory of
``--files`` files of 4 KiB, each changing ``--changed`` of them; journals are real files
(fsynced), as in the CLI. Figures (median of ``--repeat`` runs, each printed beside its anchor,
the saga, as a ratio from the same run):

Before each timed commit the set-up's dirty pages (the originals and sandboxes just written)
are written back (``os.sync``; ``--no-settle`` skips it): the two-phase prepare makes its staged
files durable with one ``syncfs`` of their filesystem, which would otherwise also pay for
writing back the whole set-up, a cost a commit of sandboxes made earlier does not have.

1. A plan whose last sandbox conflicts (its original was edited after the sandbox was made):
   originals touched before the failed result (goal: 0 for two phases vs N-1 for the saga) and
   the time to the failed result.
2. A plan that succeeds: time to commit (goal: two phases <= 1.2x the saga) and the window
   between the first original changed and the last (goal: the apply step only).

"Touched" and the window are measured around each participant's own ``commit()`` /
``apply_prepared()`` call (the only calls that change an original): a participant counts as
touched once such a call returned, and the window runs from the start of the first such call
to the end of the last.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_core.plan.journal import FileCommitJournal
from sandbox_core.plan.saga import PlanCommitSaga
from sandbox_core.plan.two_phase import TwoPhasePlanCommit
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox

BLOCK = b"x" * 4096


def watch(sandbox: Any, log: list[tuple[float, float]]) -> Any:
    """``sandbox`` with its calls that change the original timed into ``log`` (patched on the
    instance, so the coordinator still sees the sandbox itself)."""
    for name in ("commit", "apply_prepared"):
        action = getattr(sandbox, name)

        def timed(*args: Any, _action: Callable[..., Any] = action) -> Any:
            started = time.perf_counter()
            result = _action(*args)
            log.append((started, time.perf_counter()))
            return result

        setattr(sandbox, name, timed)
    return sandbox


def build(root: Path, count: int, files: int, changed: int, conflict: bool) -> list[Any]:
    """``count`` created sandboxes with their changes; the last conflicts when ``conflict``."""
    sandboxes = []
    for index in range(count):
        original = root / f"original-{index}"
        original.mkdir(parents=True)
        for number in range(files):
            (original / f"f{number:04d}.txt").write_bytes(BLOCK)
        sandbox = CopyOnWriteSandbox(f"r{index}", str(original), sandbox_root=str(root / "boxes"))
        sandbox.create("bench")
        for number in range(changed):
            Path(sandbox.get_path(f"f{number:04d}.txt")).write_bytes(b"changed\n" + BLOCK)
        if conflict and index == count - 1:
            (original / "f0000.txt").write_bytes(b"edited in the original\n")
        sandboxes.append(sandbox)
    return sandboxes


def one_run(
    mode: str, count: int, files: int, changed: int, conflict: bool, settle: bool = True
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-tpc-") as tmp:
        root = Path(tmp)
        log: list[tuple[float, float]] = []
        sandboxes = [watch(sb, log) for sb in build(root, count, files, changed, conflict)]
        if settle:
            os.sync()  # the set-up's dirty pages are not the commit's to write back
        journal = FileCommitJournal(root / "journal.json")
        started = time.perf_counter()
        if mode == "two_phase":
            results = TwoPhasePlanCommit(journal).run("bench", sandboxes)
        else:
            results = PlanCommitSaga(journal).run("bench", sandboxes)
        elapsed = time.perf_counter() - started
        failed = not results[0].success
        if failed != conflict:
            raise SystemExit(f"{mode}: unexpected outcome {results[0].error}")
        window = (max(end for _, end in log) - min(start for start, _ in log)) if log else 0.0
        for sandbox in sandboxes:
            sandbox.cleanup()
        return {"seconds": elapsed, "touched": float(len(log)), "window": window}


def paired_runs(repeat: int, **kwargs: Any) -> tuple[dict[str, float], dict[str, float]]:
    """Medians of ``repeat`` two-phase and saga runs, interleaved so load drifts hit both."""
    runs: dict[str, list[dict[str, float]]] = {"two_phase": [], "saga": []}
    for _ in range(repeat):
        for mode in runs:
            runs[mode].append(one_run(mode, **kwargs))
    two, saga = (
        {key: statistics.median(r[key] for r in runs[mode]) for key in runs[mode][0]}
        for mode in ("two_phase", "saga")
    )
    return two, saga


def ratio(value: float, anchor: float) -> str:
    return f"{value / anchor:.2f}x" if anchor else "n/a"


def main() -> None:
    logging.getLogger("sandbox_core").setLevel(logging.CRITICAL)  # the conflicts are expected
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=10)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--changed", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--markdown", default=None, help="Also write the table to this file.")
    parser.add_argument(
        "--no-settle",
        dest="settle",
        action="store_false",
        help="Do not write the set-up's dirty pages back before each timed commit.",
    )
    args = parser.parse_args()
    shape = {"count": args.sandboxes, "files": args.files, "changed": args.changed}
    rows = []
    for conflict in (True, False):
        two, saga = paired_runs(args.repeat, conflict=conflict, settle=args.settle, **shape)
        label = "last sandbox conflicts" if conflict else "plan succeeds"
        rows.append(
            (
                f"{label}: originals touched",
                f"{two['touched']:.0f}",
                f"{saga['touched']:.0f}",
                "0 vs N-1" if conflict else "N vs N",
            )
        )
        rows.append(
            (
                f"{label}: time to the result (ms)",
                f"{two['seconds'] * 1000:.1f}",
                f"{saga['seconds'] * 1000:.1f}",
                ratio(two["seconds"], saga["seconds"]),
            )
        )
        if not conflict:
            rows.append(
                (
                    f"{label}: window first..last original changed (ms)",
                    f"{two['window'] * 1000:.1f}",
                    f"{saga['window'] * 1000:.1f}",
                    ratio(two["window"], saga["window"]),
                )
            )
    header = ("figure", "two-phase", "saga (anchor)", "ratio / goal")
    lines = [
        f"{args.sandboxes} copy_on_write sandboxes x {args.files} files of 4 KiB, "
        f"{args.changed} changed each; median of {args.repeat}"
        + ("" if args.settle else "; set-up not written back before timing (--no-settle)"),
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
