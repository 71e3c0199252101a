"""Core benchmark: create, commit, rollback and checkpoint per strategy, beside the raw tools.

Run: ``python benchmarks/bench_core.py [--source-tree DIR] [--repeat N] [--markdown FILE]
[--only directories|git]`` (``--only directories``: the copy_on_write and overlay rows alone;
``--only git``: the git_worktree rows only, with their anchors).

Every figure is the median of ``--repeat`` runs and is printed next to its anchor measured in the
same run (``git worktree add``, ``cp -a``, ``rsync -a --delete``, ``mount -t overlay``), with the
ratio. The input is a real source tree on this machine (Go's ``src`` when Go is installed, else
Python's standard library), which has well over 5,000 files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_core import SandboxFactory
from sandbox_core.cli.demo import _default_source_tree
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.strategies.base import BaseSandbox

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@sandbox.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@sandbox.invalid",
}
CHANGED_FILES = 10
MANY_CHANGED_FILES = 1000
# Git trusts an index entry only when the file's mtime is older than the index file ("racily
# clean" otherwise: it re-hashes the file). In real use a commit or checkpoint comes long after
# create; editing in the same second as create would make git re-hash every file and measure a
# case that does not happen. So every git-backed measurement waits this long after create.
RACY_CLEAN_WAIT = 1.1


def run(*cmd: str, cwd: Path | None = None) -> None:
    subprocess.run(cmd, check=True, capture_output=True, cwd=cwd, env=GIT_ENV)


def timed(action: Callable[[], object]) -> float:
    # Dirty pages of the previous step (a copy just made, a tree just deleted) are written
    # back first, so that their writeback is not timed as part of the next step.
    os.sync()
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def median(samples: list[float]) -> float:
    return statistics.median(samples)


class Bench:
    """Holds the work dir and the rows of the result table."""

    def __init__(self, work: Path, source_tree: Path, repeat: int, only: str = "all") -> None:
        self.work = work
        self.repeat = repeat
        self.only = only
        self.directories_only = only == "directories"
        self.rows: list[tuple[str, float, str, float]] = []
        self.repo = work / "repo"
        self.tree = work / "tree"
        shutil.copytree(source_tree, self.tree, symlinks=True)
        if not self.directories_only:  # the git rows' repository
            shutil.copytree(source_tree, self.repo, symlinks=True)
            run("git", "init", "-q", "-b", "main", cwd=self.repo)
            run("git", "add", "-A", cwd=self.repo)
            run("git", "commit", "-q", "-m", "import", cwd=self.repo)
        self.files = sum(1 for p in self.tree.rglob("*") if p.is_file())
        self.targets = (
            sorted(str(p.relative_to(self.tree)) for p in self.tree.rglob("*.go"))[
                :: max(1, self.files // 200)
            ][:CHANGED_FILES]
            or sorted(str(p.relative_to(self.tree)) for p in self.tree.rglob("*") if p.is_file())[
                :CHANGED_FILES
            ]
        )
        go_files = sorted(str(p.relative_to(self.tree)) for p in self.tree.rglob("*.go"))
        self.many_targets = go_files[:: max(1, len(go_files) // MANY_CHANGED_FILES)][
            :MANY_CHANGED_FILES
        ]
        self.factory = SandboxFactory()
        self.counter = 0

    def row(self, label: str, ours: float, anchor_label: str, anchor: float) -> None:
        self.rows.append((label, ours, anchor_label, anchor))
        print(
            f"{label:<44} {ours * 1000:9.1f} ms   {anchor_label:<34} {anchor * 1000:9.1f} ms"
            f"   ratio {ours / anchor:5.2f}x",
            flush=True,
        )

    def new_sandbox(self, strategy: str, original: Path, **options: object) -> BaseSandbox:
        self.counter += 1
        sandbox_root = self.work / "sandboxes"
        return self.factory.create(
            strategy,
            f"res-{self.counter}",
            str(original),
            sandbox_root=str(sandbox_root),
            **options,
        )

    def edit(self, root: str | Path, marker: str, targets: list[str] | None = None) -> None:
        for rel in self.targets if targets is None else targets:
            with open(Path(root) / rel, "a", encoding="utf-8") as handle:
                handle.write(f"\n// {marker}\n")

    # -- create -------------------------------------------------------------------------

    def bench_create(self) -> None:
        if not self.directories_only:
            self._bench_git_create()
        if self.only != "git":
            self._bench_directory_create()

    def _bench_git_create(self) -> None:
        ours, raw = [], []
        for i in range(self.repeat):
            sandbox = self.new_sandbox("git_worktree", self.repo)
            ours.append(timed(lambda s=sandbox: s.create("bench")))
            sandbox.cleanup()
            path = self.work / f"raw-wt-{i}"
            raw.append(
                timed(
                    lambda p=path, n=i: run(
                        "git",
                        "-C",
                        str(self.repo),
                        "worktree",
                        "add",
                        "-q",
                        "-b",
                        f"raw-{n}",
                        str(p),
                    )
                )
            )
            run("git", "-C", str(self.repo), "worktree", "remove", "--force", str(path))
            run("git", "-C", str(self.repo), "branch", "-D", f"raw-{i}")
        self.row("git_worktree create", median(ours), "git worktree add", median(raw))

    def _bench_directory_create(self) -> None:
        # Each copying create is timed beside a `cp -a` of its own round (the disk's state
        # drifts between rounds), alternating which of the two goes first.
        rows = [
            ("copy_on_write create", "copy_on_write", {}),
            ("overlay (kernel) create", "overlay", {"mode": "kernel"}),
            ("overlay (fallback) create", "overlay", {"mode": "fallback"}),
        ]
        for label, strategy, options in rows:
            ours, raw = [], []
            if options.get("mode") == "kernel":
                ours = [self._time_create(strategy, **options) for _ in range(self.repeat)]
                self.row(label, median(ours), *self._overlay_anchor())
                continue
            for i in range(self.repeat):
                if i % 2:
                    raw.append(self._time_cp(i))
                ours.append(self._time_create(strategy, **options))
                if not i % 2:
                    raw.append(self._time_cp(i))
            self.row(label, median(ours), "cp -a", median(raw))

    def _time_create(self, strategy: str, **options: object) -> float:
        sandbox = self.new_sandbox(strategy, self.tree, **options)
        took = timed(lambda: sandbox.create("bench"))
        sandbox.cleanup()
        return took

    def _time_cp(self, index: int) -> float:
        dest = self.work / f"raw-cp-{index}"
        took = timed(lambda: run("cp", "-a", str(self.tree), str(dest)))
        shutil.rmtree(dest)
        return took

    def _overlay_anchor(self) -> tuple[str, float]:
        samples = []
        for i in range(self.repeat):
            base = self.work / f"raw-ovl-{i}"
            for sub in ("upper", "work", "merged"):
                (base / sub).mkdir(parents=True)
            opts = f"lowerdir={self.tree},upperdir={base}/upper,workdir={base}/work"
            samples.append(
                timed(
                    lambda b=base, o=opts: run(
                        "mount", "-t", "overlay", "overlay", "-o", o, str(b / "merged")
                    )
                )
            )
            run("umount", str(base / "merged"))
            shutil.rmtree(base)
        return "mount -t overlay", median(samples)

    # -- commit and rollback ------------------------------------------------------------

    def rsync_anchor(self) -> float:
        samples = []
        for i in range(self.repeat):
            src, dst = self.work / f"rs-src-{i}", self.work / f"rs-dst-{i}"
            run("cp", "-a", str(self.tree), str(src))
            run("cp", "-a", str(self.tree), str(dst))
            time.sleep(RACY_CLEAN_WAIT)  # same setup as the sandboxes' commits
            self.edit(src, f"rsync {i}")
            samples.append(
                timed(lambda s=src, d=dst: run("rsync", "-a", "--delete", f"{s}/", f"{d}/"))
            )
            shutil.rmtree(src)
            shutil.rmtree(dst)
        return median(samples)

    def git_commit_anchor(self) -> float:
        samples = []
        for i in range(self.repeat):
            path = self.work / f"raw-gc-{i}"
            run("git", "-C", str(self.repo), "worktree", "add", "-q", "-b", f"gc-{i}", str(path))
            time.sleep(RACY_CLEAN_WAIT)
            self.edit(path, f"raw git {i}")

            def commit_and_merge(p: Path = path, n: int = i) -> None:
                run("git", "-C", str(p), "add", "-A")
                run("git", "-C", str(p), "commit", "-q", "-m", "raw")
                run("git", "-C", str(self.repo), "merge", "-q", "--ff-only", f"gc-{n}")

            samples.append(timed(commit_and_merge))
            run("git", "-C", str(self.repo), "worktree", "remove", "--force", str(path))
        return median(samples)

    def bench_commit_and_rollback(self) -> None:
        rsync = self.rsync_anchor() if self.only != "git" else 0.0
        cases: list[tuple[str, Path, dict[str, object], str, float]] = []
        if not self.directories_only:
            git_raw = self.git_commit_anchor()
            cases.append(
                ("git_worktree", self.repo, {}, "git add+commit+merge --ff-only", git_raw)
            )
        cases += [
            ("copy_on_write", self.tree, {}, "rsync -a --delete", rsync),
            ("overlay", self.tree, {"mode": "kernel"}, "rsync -a --delete", rsync),
            ("overlay", self.tree, {"mode": "fallback"}, "rsync -a --delete", rsync),
        ]
        if self.only == "git":
            cases = cases[:1]
        for strategy, original, options, anchor_label, anchor in cases:
            commits, rollbacks = [], []
            for i in range(self.repeat):
                sandbox = self.new_sandbox(strategy, original, **options)
                sandbox.create("bench")
                time.sleep(RACY_CLEAN_WAIT)
                self.edit(sandbox.get_path(""), f"{strategy} {i}")
                commits.append(timed(sandbox.commit))
                rollbacks.append(timed(sandbox.rollback))
                sandbox.cleanup()
            label = strategy + (f" ({options['mode']})" if options else "")
            self.row(f"{label} commit {CHANGED_FILES} files", median(commits), anchor_label, anchor)
            self.row(f"{label} rollback after commit", median(rollbacks), anchor_label, anchor)

    # -- checkpoints --------------------------------------------------------------------

    def bench_checkpoint(self) -> None:
        small = self.work / "small-repo"
        small.mkdir()
        for i in range(200):
            (small / f"f{i}.go").write_text(f"package p // {i}\n", encoding="utf-8")
        run("git", "init", "-q", "-b", "main", cwd=small)
        run("git", "add", "-A", cwd=small)
        run("git", "commit", "-q", "-m", "small", cwd=small)
        large = f"{self.files}-file repo"
        small_10, _ = self._checkpoint(small, [f"f{i}.go" for i in range(CHANGED_FILES)])
        large_10, snapshot_10 = self._checkpoint(self.repo, self.targets, anchor=True)
        large_many, snapshot_many = self._checkpoint(self.repo, self.many_targets, anchor=True)
        self.row(
            f"git checkpoint, {CHANGED_FILES} changed, {large}",
            large_10,
            "same on 200-file repo",
            small_10,
        )
        full_snapshot = "full directory snapshot (cp -a of the worktree)"
        self.row(
            f"git checkpoint, {CHANGED_FILES} changed, {large}",
            large_10,
            full_snapshot,
            snapshot_10,
        )
        self.row(
            f"git checkpoint, {len(self.many_targets)} changed, {large}",
            large_many,
            full_snapshot,
            snapshot_many,
        )

    def _checkpoint(
        self, repo: Path, targets: list[str], *, anchor: bool = False
    ) -> tuple[float, float]:
        """Median checkpoint time after editing ``targets``, and (with ``anchor``) the median
        time of ``cp -a`` of the same edited worktree (the naive full snapshot)."""
        samples, copies = [], []
        for i in range(self.repeat):
            sandbox = self.new_sandbox("git_worktree", repo)
            sandbox.create("bench")
            time.sleep(RACY_CLEAN_WAIT)
            self.edit(sandbox.get_path(""), f"ckpt {i}", targets)
            if anchor:
                dest = self.work / f"snapshot-{i}"
                worktree = sandbox.get_path("")
                copies.append(timed(lambda d=dest, w=worktree: run("cp", "-a", w, str(d))))
                shutil.rmtree(dest)
            manager = CheckpointManager()
            samples.append(
                timed(lambda s=sandbox, m=manager: m.create_checkpoint(s, "bench", "pre_apply"))
            )
            sandbox.cleanup()
        return median(samples), median(copies) if copies else 0.0

    def markdown(self) -> str:
        lines = [
            f"Input: {self.files} files ({CHANGED_FILES} changed for commits), "
            f"median of {self.repeat} runs, one run of `python benchmarks/bench_core.py`.",
            "",
            "| operation | sandbox_core | anchor | anchor time | ratio |",
            "|---|---:|---|---:|---:|",
        ]
        for label, ours, anchor_label, anchor in self.rows:
            lines.append(
                f"| {label} | {ours * 1000:.1f} ms | {anchor_label} | {anchor * 1000:.1f} ms "
                f"| {ours / anchor:.2f}x |"
            )
        return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source-tree", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--markdown", default=None, help="Write the table to this file too.")
    parser.add_argument(
        "--only",
        choices=("all", "directories", "git"),
        default="all",
        help="directories: the copy/overlay rows; git: the git_worktree rows.",
    )
    args = parser.parse_args()
    source = Path(args.source_tree) if args.source_tree else _default_source_tree()
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-", dir="/var/tmp") as tmp:
        bench = Bench(Path(tmp), source, args.repeat, args.only)
        print(f"input: {source} ({bench.files} files)", flush=True)
        bench.bench_create()
        bench.bench_commit_and_rollback()
        if not bench.directories_only:
            bench.bench_checkpoint()
        table = bench.markdown()
    if args.markdown:
        Path(args.markdown).write_text(table, encoding="utf-8")
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
