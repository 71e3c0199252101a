"""The main job (``sandbox-core demo``): the core on real input, start to finish.

1. Build a git repository of real size from a real source tree on this machine (Go's ``src``
   tree when Go is installed, else Python's standard library), plus a plain directory resource.
2. Plan 1: a ``git_worktree`` sandbox on the repository and a ``copy_on_write`` sandbox on the
   directory; edit files in both, show the diffs, commit the plan atomically, show the originals.
3. Plan 2: the same two strategies, but someone commits a conflicting change to the repository
   meanwhile. The atomic commit commits the directory first, hits the conflict on the repository,
   compensates the directory (LIFO), and both originals are left exactly as they were.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from sandbox_core.describe import sandbox_diff
from sandbox_core.host.manager import SandboxManager
from sandbox_core.host.store import SandboxStore
from sandbox_core.strategies.factory import SandboxFactory

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "sandbox-demo",
    "GIT_AUTHOR_EMAIL": "demo@sandbox.invalid",
    "GIT_COMMITTER_NAME": "sandbox-demo",
    "GIT_COMMITTER_EMAIL": "demo@sandbox.invalid",
}
_EXCLUDE = shutil.ignore_patterns("__pycache__", "site-packages", "*.pyc", "testdata")


def _say(text: str) -> None:
    print(text, flush=True)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    done = subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    )
    return done.stdout.strip()


def _default_source_tree() -> Path:
    go = shutil.which("go")
    if go:
        goroot = subprocess.run([go, "env", "GOROOT"], capture_output=True, text=True, check=False)
        candidate = Path(goroot.stdout.strip()) / "src"
        if goroot.returncode == 0 and candidate.is_dir():
            return candidate
    return Path(sysconfig.get_paths()["stdlib"])


def _build_inputs(workdir: Path, source_tree: Path) -> tuple[Path, Path]:
    repo, docs = workdir / "repo", workdir / "docs"
    _say(f"building a git repository from {source_tree} ...")
    started = time.monotonic()
    shutil.copytree(source_tree, repo, symlinks=True, ignore=_EXCLUDE)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"import {source_tree.name}")
    files = int(_git(repo, "ls-files", "--", ".").count("\n")) + 1
    _say(
        f"  {repo}: {files} files, HEAD {_git(repo, 'rev-parse', '--short', 'HEAD')} "
        f"({time.monotonic() - started:.1f}s)"
    )
    docs.mkdir()
    for name in ("README.md", "CHANGELOG.md"):
        (docs / name).write_text(f"# {name}\n\nWritten by the demo.\n", encoding="utf-8")
    (docs / "guides").mkdir()
    (docs / "guides" / "setup.md").write_text("Install, then run.\n", encoding="utf-8")
    _say(f"  {docs}: a plain directory resource with 3 files")
    return repo, docs


def _pick_source_file(repo: Path) -> str:
    tracked = _git(repo, "ls-files").splitlines()
    preferred = [p for p in tracked if p.endswith((".go", ".py")) and "/" in p]
    return sorted(preferred or tracked)[len(preferred or tracked) // 2]


def _append(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def run_demo(workdir: Path | None = None, source_tree: str | None = None) -> int:
    """Run the demo; return the process exit code (0 when every expectation held)."""
    root = workdir or Path(tempfile.mkdtemp(prefix="sandbox-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    tree = Path(source_tree) if source_tree else _default_source_tree()
    repo, docs = _build_inputs(root, tree)
    store = SandboxStore(root / "state")
    sandbox_root = str(root / "sandboxes")
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False, store=store)
    target = _pick_source_file(repo)

    _say("\n== plan-1: two sandboxes, edits, diff, atomic commit")
    git_sb = manager.get_or_create_sandbox(
        "plan-1", "repo", str(repo), "git_worktree", sandbox_root=sandbox_root
    )
    dir_sb = manager.get_or_create_sandbox(
        "plan-1", "docs", str(docs), "copy_on_write", sandbox_root=sandbox_root
    )
    _append(git_sb.get_path(target), "\n// edited in a sandbox by plan-1\n")
    Path(git_sb.get_path("SANDBOX_NOTES.md")).write_text("plan-1 was here\n", encoding="utf-8")
    _append(dir_sb.get_path("README.md"), "\nplan-1 added this line.\n")
    Path(dir_sb.get_path("guides/setup.md")).unlink()
    _say(
        f"originals untouched so far: {target} unchanged = "
        f"{_git(repo, 'status', '--porcelain') == ''}"
    )
    for sandbox in (git_sb, dir_sb):
        _say(f"\n-- diff of {sandbox.strategy} sandbox {sandbox.sandbox_id}:")
        _say(sandbox_diff(sandbox).rstrip() or "(no changes)")
    results = manager.commit_all("plan-1")
    ok = all(r.success for r in results)
    for result in results:
        _say(
            f"committed {result.sandbox_id}: changed={result.changed_files} "
            f"added={result.added_files} deleted={result.deleted_files} ref={result.commit_ref}"
        )
    _say(f"repository HEAD is now: {_git(repo, 'log', '-1', '--format=%h %s')}")
    _say(f"docs/README.md ends with: {(docs / 'README.md').read_text().splitlines()[-1]!r}")
    _say(f"docs/guides/setup.md exists: {(docs / 'guides' / 'setup.md').exists()}")
    manager.cleanup_all("plan-1")

    _say("\n== plan-2: a conflicting change lands on the original; the commit is compensated")
    snapshot = root / "docs-before-plan-2"
    shutil.copytree(docs, snapshot, symlinks=True)
    dir_sb = manager.get_or_create_sandbox(
        "plan-2", "docs", str(docs), "copy_on_write", sandbox_root=sandbox_root
    )
    git_sb = manager.get_or_create_sandbox(
        "plan-2", "repo", str(repo), "git_worktree", sandbox_root=sandbox_root
    )
    Path(dir_sb.get_path("CHANGELOG.md")).write_text("plan-2 rewrote the changelog\n")
    Path(git_sb.get_path(target)).write_text("plan-2's version\n", encoding="utf-8")
    (repo / target).write_text("someone else's version\n", encoding="utf-8")
    _git(repo, "commit", "-q", "-am", "a concurrent change by someone else")
    head_before = _git(repo, "rev-parse", "HEAD")
    results = manager.commit_all("plan-2")
    failed = [r for r in results if not r.success]
    if failed:
        meta = failed[0].metadata
        _say(f"atomic commit failed as expected: {failed[0].error}")
        _say(f"  rolled back (compensated): {meta.get('rolled_back_ids')}")
        _say(f"  failed rollbacks: {meta.get('failed_rollback_ids')}")
    unchanged_repo = _git(repo, "rev-parse", "HEAD") == head_before
    unchanged_docs = not _tree_differs(snapshot, docs)
    _say(f"repository HEAD unchanged: {unchanged_repo}; docs unchanged: {unchanged_docs}")
    manager.cleanup_all("plan-2")
    shutil.rmtree(snapshot)
    success = ok and bool(failed) and unchanged_repo and unchanged_docs
    _say(f"\ndemo {'PASSED' if success else 'FAILED'} (work dir: {root})")
    return 0 if success else 1


def _tree_differs(left: Path, right: Path) -> bool:
    comparison = filecmp.dircmp(left, right)
    stack = [comparison]
    while stack:
        current = stack.pop()
        if current.left_only or current.right_only or current.diff_files or current.funny_files:
            return True
        stack.extend(current.subdirs.values())
    return False
