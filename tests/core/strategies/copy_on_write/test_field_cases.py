"""copy_on_write on the field cases 05, 06, 08, 09 and its policies (real trees, real git)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxCommitError
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.tree import sync as fs
from sandbox_core.tree.ops import backup_directory, safe_restore
from sandbox_core.tree.original_lock import OriginalLock
from sandbox_core.tree.scan import scan_tree
from sandbox_core.tree.sync import recover_sync

REPO_ROOT = Path(__file__).resolve().parents[4]
SHM = Path("/dev/shm")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def _sh(script: str, cwd: Path) -> str:
    proc = subprocess.run(
        ["sh", "-ec", script], cwd=cwd, capture_output=True, text=True, check=True
    )
    return proc.stdout


def _manifest(root: Path) -> dict[str, str]:
    """``sha256sum`` of every file below ``root`` (the cases' old.manifest / new.manifest)."""
    return {
        rel: hashlib.sha256((root / rel).read_bytes()).hexdigest()
        for rel, entry in scan_tree(root).items()
        if entry.kind == "file"
    }


def _state(root: Path) -> dict[str, tuple[str, int, str | None]]:
    out: dict[str, tuple[str, int, str | None]] = {}
    for rel, entry in scan_tree(root).items():
        content = entry.target
        if entry.kind == "file":
            content = (root / rel).read_text()
        out[rel] = (entry.kind, entry.mode, content)
    return out


def _staging_leftovers(*dirs: Path) -> list[str]:
    return sorted(str(p) for d in dirs if d.exists() for p in d.iterdir() if ".sandbox-" in p.name)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sandboxes"
    path.mkdir()
    return path


@pytest.fixture
def shm_root(tmp_path: Path) -> Iterator[Path]:
    # Unique per run: two test runs on one machine (CI beside a developer) share /dev/shm.
    path = Path(tempfile.mkdtemp(prefix=f"cow-{tmp_path.name}-", dir=SHM))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=True)


def _sandbox(src: Path, root: Path) -> CopyOnWriteSandbox:
    sandbox = CopyOnWriteSandbox("res-1", str(src), sandbox_root=str(root))
    sandbox.create("plan-1")
    return sandbox


# -- case 06: symlink loop and dangling symlink ----------------------------------------------


def test_case06_links_are_copied_and_committed_as_links(tmp_path: Path, root: Path) -> None:
    _sh(
        "mkdir -p src/a/b && echo hi > src/a/b/f; ln -s ../.. src/a/b/up;"
        " ln -s /nonexistent/target src/dangling; ln -s b/f src/a/rel",
        tmp_path,
    )
    src = tmp_path / "src"
    started = time.monotonic()
    sandbox = _sandbox(src, root)
    assert time.monotonic() - started < 5
    s = Path(sandbox.get_path(""))
    for link, target in {
        "a/b/up": "../..",
        "dangling": "/nonexistent/target",
        "a/rel": "b/f",
    }.items():
        assert (s / link).is_symlink()
        assert os.readlink(s / link) == target
    assert _sh("find . -type d | wc -l", s).strip() == "3"

    _sh("echo more >> a/b/f; ln -sfn b/g a/rel", s)
    result = sandbox.commit()

    assert result.changed_files == ["a/b/f", "a/rel"]
    assert (src / "a" / "b" / "f").read_text().splitlines()[-1] == "more"
    assert os.readlink(src / "a" / "b" / "up") == "../.."
    assert os.readlink(src / "dangling") == "/nonexistent/target"
    assert os.readlink(src / "a" / "rel") == "b/g"
    for link in ("a/b/up", "dangling", "a/rel"):
        assert (src / link).is_symlink()
    assert _sh("find src -type d | wc -l", tmp_path).strip() == "3"


# -- case 08: a path changes type --------------------------------------------------------------


def test_case08_type_swaps_commit_and_checkpoint_restore(tmp_path: Path, root: Path) -> None:
    _sh("mkdir -p src/x && echo inner > src/x/inner.txt; echo y > src/y", tmp_path)
    src = tmp_path / "src"
    sandbox = _sandbox(src, root)
    s = Path(sandbox.get_path(""))
    checkpoints = CheckpointManager(state_dir=tmp_path / "state")
    c0 = checkpoints.create_checkpoint(sandbox, "plan-1", "pre_execute")
    swap = "rm -r x && echo now-a-file > x; rm y && mkdir y && echo child > y/child.txt"

    _sh(swap, s)
    assert checkpoints.rollback_to(c0) is True
    assert (s / "x" / "inner.txt").read_text() == "inner\n"
    assert (s / "y").is_file()
    assert (s / "y").read_text() == "y\n"

    _sh(swap, s)
    result = sandbox.commit()
    assert result.changed_files == ["x", "y"]
    assert result.added_files == ["y/child.txt"]
    assert result.deleted_files == ["x/inner.txt"]
    assert (src / "x").is_file()
    assert (src / "x").read_text() == "now-a-file\n"
    assert (src / "y").is_dir()
    assert (src / "y" / "child.txt").read_text() == "child\n"
    assert not (src / "x" / "inner.txt").exists()
    assert sorted(os.listdir(src)) == ["x", "y"]
    assert _staging_leftovers(tmp_path) == []


def test_case08_snapshot_and_restore_with_fs_utils(tmp_path: Path) -> None:
    _sh("mkdir -p src/x && echo inner > src/x/inner.txt; echo y > src/y", tmp_path)
    src = tmp_path / "src"
    backup_directory(src, tmp_path / "c0")
    before = _state(src)
    _sh("rm -r x && echo now-a-file > x; rm y && mkdir y && echo child > y/child.txt", src)
    safe_restore(tmp_path / "c0", src)
    assert _state(src) == before
    assert sorted(os.listdir(tmp_path)) == ["src"]


# -- case 09: staging on another filesystem, crash mid-commit --------------------------------


def _case09_source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(1, 201):
        (src / "sub" / f"f{i}").write_text(f"old {i}\n")
    return src


def _rewrite_all(sandbox: CopyOnWriteSandbox) -> None:
    for i in range(1, 201):
        Path(sandbox.get_path(f"sub/f{i}")).write_text(f"new {i}\n")


@pytest.mark.parametrize("variant", ["A", "B"])
def test_case09_commit_from_tmpfs_sandbox_root(
    tmp_path: Path, shm_root: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    src = _case09_source(tmp_path)
    assert os.stat(src).st_dev != os.stat(SHM).st_dev
    old = _manifest(src)
    if variant == "A":  # TMPDIR on tmpfs; the default sandbox root follows it
        monkeypatch.setenv("TMPDIR", str(shm_root))
        monkeypatch.delenv("SANDBOX_CORE_ROOT", raising=False)
        monkeypatch.setattr(tempfile, "tempdir", None)
        sandbox = CopyOnWriteSandbox("res-1", str(src))
        sandbox.create("plan-1")
    else:  # the product's sandbox root configured on tmpfs
        sandbox = _sandbox(src, shm_root)
    assert Path(sandbox.get_path("")).is_relative_to(shm_root)
    _rewrite_all(sandbox)
    new = _manifest(Path(sandbox.get_path("")))

    result = sandbox.commit()

    assert len(result.changed_files) == 200
    assert _manifest(src) == new
    assert new != old
    assert _staging_leftovers(tmp_path, shm_root) == []
    sandbox.rollback()  # from COMMITTED, across filesystems too
    assert _manifest(src) == old
    sandbox.cleanup()
    assert not sandbox.base_dir.exists()
    assert [p for p in shm_root.rglob("*") if not p.is_dir()] == []
    assert _staging_leftovers(tmp_path, shm_root) == []


_COMMIT_AND_DIE = textwrap.dedent(
    """
    import json, os, signal, sys
    from sandbox_core.tree import sync as fs
    from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
    record = json.loads(open(sys.argv[1]).read())
    kill_after = int(sys.argv[2])
    done = []
    def hook(path):
        done.append(path)
        if len(done) == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    fs.fault_hook = hook
    CopyOnWriteSandbox.reopen(record).commit()
    """
)


@pytest.mark.parametrize(("kill_after", "expect"), [(100, "old"), (201, "new")])
def test_case09c_sigkill_mid_commit_then_recovery_is_exactly_old_or_new(
    tmp_path: Path, shm_root: Path, kill_after: int, expect: str
) -> None:
    src = _case09_source(tmp_path)
    old = _manifest(src)
    sandbox = _sandbox(src, shm_root)
    _rewrite_all(sandbox)
    new = _manifest(Path(sandbox.get_path("")))
    record_file = tmp_path / "record.json"
    record_file.write_text(json.dumps(sandbox.to_record()))

    # 200 changed paths: hook call 100 is midway through the swaps; call 201 is the one made
    # after the journal is marked applied (every path in, staging not yet removed).
    proc = subprocess.run(
        [sys.executable, "-c", _COMMIT_AND_DIE, str(record_file), str(kill_after)],
        cwd=REPO_ROOT,
        check=False,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL
    # Beside the original: the commit's staging, and the original's lock file, whose holder
    # (the killed process) is gone, so the next taker takes it over (docs/concurrency.md).
    left = [Path(p).name for p in _staging_leftovers(tmp_path)]
    assert sorted(n.split("-0")[0] for n in left) == [".src.sandbox-lock", ".src.sandbox-staging"]
    mixed = _manifest(src)
    if expect == "old":
        assert mixed not in (old, new)  # really killed midway

    outcomes = recover_sync(src)

    assert outcomes == (["rolled_back"] if expect == "old" else ["completed"])
    assert _manifest(src) == (old if expect == "old" else new)
    # The dead holder's lock file stays, free, until its sandbox is cleaned up.
    assert _staging_leftovers(tmp_path, shm_root) == [str(tmp_path / ".src.sandbox-lock")]
    assert OriginalLock(str(src)).holder() is None
    CopyOnWriteSandbox.reopen(json.loads(record_file.read_text())).cleanup()
    assert _staging_leftovers(tmp_path, shm_root) == []


def test_case09c_next_commit_recovers_first(tmp_path: Path, shm_root: Path) -> None:
    src = _case09_source(tmp_path)
    sandbox = _sandbox(src, shm_root)
    _rewrite_all(sandbox)
    new = _manifest(Path(sandbox.get_path("")))
    record_file = tmp_path / "record.json"
    record_file.write_text(json.dumps(sandbox.to_record()))
    subprocess.run(
        [sys.executable, "-c", _COMMIT_AND_DIE, str(record_file), "50"], cwd=REPO_ROOT, check=False
    )
    # The same sandbox, reopened after the crash, commits cleanly: the interrupted sync is
    # undone first and the whole change applied once.
    result = CopyOnWriteSandbox.reopen(json.loads(record_file.read_text())).commit()
    assert len(result.changed_files) == 200
    assert _manifest(src) == new
    assert _staging_leftovers(tmp_path, shm_root) == []


# -- case 05: the source is a linked git worktree --------------------------------------------


@pytest.fixture
def linked_worktree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    _sh(
        "git init -q -b main repo && cd repo && echo a > f && git add f && git commit -qm base;"
        " git worktree add -q -b feature ../wt;"
        " cd ../wt && echo feat > g && git add g && git commit -qm feat",
        tmp_path,
    )
    return tmp_path / "wt"


def _git(path: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(path), *args], capture_output=True, text=True, check=True
    ).stdout


def test_case05_linked_worktree_copy_gets_private_git_state(
    tmp_path: Path, root: Path, linked_worktree: Path
) -> None:
    wt, repo = linked_worktree, tmp_path / "repo"
    dotgit_before = (wt / ".git").read_text()
    feature_tip = _git(repo, "rev-parse", "feature")
    main_tip = _git(repo, "rev-parse", "main")
    sandbox = _sandbox(wt, root)
    assert sandbox.context is not None
    assert sandbox.context.metadata["git_admin"] == "private"
    s = Path(sandbox.get_path(""))

    _sh("echo x > newfile && git add newfile", s)

    assert _git(wt, "status", "--porcelain") == ""
    assert _git(s, "status", "--porcelain") == "A  newfile\n"
    _sh("git commit -qm in-sandbox", s)
    assert _git(repo, "rev-parse", "feature") == feature_tip  # no branch of the source moved
    assert _git(wt, "status", "--porcelain") == ""

    sandbox.rollback()
    sandbox.cleanup()
    assert (wt / ".git").is_file()
    assert (wt / ".git").read_text() == dotgit_before
    assert _git(wt, "status", "--porcelain") == ""
    assert str(wt) in _git(repo, "worktree", "list")
    assert (repo / ".git" / "worktrees" / "wt").is_dir()
    assert _git(repo, "rev-parse", "main") == main_tip


def test_case05_commit_brings_files_but_not_the_git_pointer(
    root: Path, linked_worktree: Path
) -> None:
    wt = linked_worktree
    dotgit_before = (wt / ".git").read_text()
    sandbox = _sandbox(wt, root)
    s = Path(sandbox.get_path(""))
    _sh("echo x > newfile && git add newfile", s)
    result = sandbox.commit()
    assert result.added_files == ["newfile"]
    assert (wt / ".git").read_text() == dotgit_before
    assert _git(wt, "status", "--porcelain") == "?? newfile\n"


# -- get_path containment ----------------------------------------------------------------------


def test_get_path_refuses_traversal_absolute_and_escaping_symlinks(
    tmp_path: Path, root: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "out").symlink_to(tmp_path)
    (src / "in").symlink_to("sub")
    sandbox = _sandbox(src, root)
    for bad in ("../etc/passwd", "a/../../x", "/etc/passwd", "out/secret", "out"):
        with pytest.raises(ValueError, match=r"^Path traversal not allowed$"):
            sandbox.get_path(bad)
    assert sandbox.get_path("in/ok.txt") == str(sandbox.tree_dir / "in" / "ok.txt")


# -- conflict policy -----------------------------------------------------------------------------


def test_commit_refuses_paths_changed_on_both_sides_and_keeps_original_only_changes(
    tmp_path: Path, root: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("both", "sandbox_only", "original_only"):
        (src / name).write_text("base\n")
    sandbox = _sandbox(src, root)
    Path(sandbox.get_path("both")).write_text("sandbox\n")
    Path(sandbox.get_path("sandbox_only")).write_text("sandbox\n")
    (src / "both").write_text("original\n")
    (src / "original_only").write_text("original\n")

    with pytest.raises(SandboxCommitError) as caught:
        sandbox.commit()
    assert caught.value.conflicts == ["both"]
    assert sandbox.status is SandboxStatus.ACTIVE
    assert (src / "sandbox_only").read_text() == "base\n"

    Path(sandbox.get_path("both")).write_text("original\n")  # resolved: same as the original
    result = sandbox.commit()
    assert result.changed_files == ["sandbox_only"]
    assert (src / "sandbox_only").read_text() == "sandbox\n"
    assert (src / "original_only").read_text() == "original\n"


# -- rollback --------------------------------------------------------------------------------


def test_rollback_from_committed_restores_the_original_exactly(tmp_path: Path, root: Path) -> None:
    _sh(
        "mkdir -p src/d/e src/keep && echo 1 > src/d/e/f && echo 2 > src/g && chmod 600 src/g;"
        " ln -s d/e src/link && echo k > src/keep/k",
        tmp_path,
    )
    src = tmp_path / "src"
    before = _state(src)
    sandbox = _sandbox(src, root)
    s = Path(sandbox.get_path(""))
    _sh(
        "rm -r d && echo file > d; chmod 755 g; ln -sfn keep link; mkdir -p n/m && echo n > n/m/x",
        s,
    )
    result = sandbox.commit()
    assert result.added_files == ["n", "n/m", "n/m/x"]
    assert result.changed_files == ["d", "g", "link"]
    assert result.deleted_files == ["d/e", "d/e/f"]
    # O(changes): the pre-commit backup holds only the replaced roots, not the tree.
    undo = json.loads((sandbox.base_dir / "precommit" / "undo.json").read_text(encoding="utf-8"))
    kept = [op["path"] for op in undo["ops"] if op["old"]]
    assert sorted(kept) == ["d", "g", "link"]
    assert len(os.listdir(sandbox.base_dir / "precommit" / "old")) == 3

    sandbox.rollback()

    assert sandbox.status is SandboxStatus.ROLLED_BACK
    assert _state(src) == before
    assert _state(s) == before  # the copy is reset too: no stale sandbox files
    assert _staging_leftovers(tmp_path, root) == []
    sandbox.get_path("again.txt")
    assert sandbox.status is SandboxStatus.ACTIVE


def test_rollback_from_active_resets_copy_and_rebases_on_the_original(
    tmp_path: Path, root: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("a\n")
    sandbox = _sandbox(src, root)
    Path(sandbox.get_path("tmp.txt")).write_text("temp\n")
    Path(sandbox.get_path("a")).unlink()
    (src / "b").write_text("b\n")  # the original moved on meanwhile
    sandbox.rollback()
    assert _state(sandbox.tree_dir) == _state(src)
    # After the reset the original's state is the new base: committing nothing changes nothing.
    sandbox.activate()
    result = sandbox.commit()
    assert (result.added_files, result.changed_files, result.deleted_files) == ([], [], [])


# -- reopen in another process --------------------------------------------------------------------


def test_reopen_in_another_process_commits_the_same_sandbox(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_CORE_ROOT", str(root))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("a\n")
    sandbox = CopyOnWriteSandbox("res-1", str(src))  # default root, from the environment
    sandbox.create("plan-1")
    Path(sandbox.get_path("new.txt")).write_text("from parent\n")
    record_file = tmp_path / "record.json"
    record_file.write_text(json.dumps(sandbox.to_record()))
    script = textwrap.dedent(
        """
        import json, sys
        from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
        sandbox = CopyOnWriteSandbox.reopen(json.loads(open(sys.argv[1]).read()))
        result = sandbox.commit("from child")
        open(sys.argv[1], "w").write(json.dumps(sandbox.to_record()))
        print(json.dumps(result.to_dict()))
        """
    )
    # The child has another default sandbox root: the record alone must locate the sandbox.
    env = {**os.environ, "SANDBOX_CORE_ROOT": str(tmp_path / "elsewhere")}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(record_file)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout)
    assert result["added_files"] == ["new.txt"]
    assert result["metadata"] == {"strategy": "copy_on_write", "message": "from child"}
    assert (src / "new.txt").read_text() == "from parent\n"
    reopened = CopyOnWriteSandbox.reopen(json.loads(record_file.read_text()))
    assert reopened.status is SandboxStatus.COMMITTED
    reopened.rollback()  # the backup written by the child undoes the child's commit
    assert not (src / "new.txt").exists()
    reopened.cleanup()
    assert not reopened.base_dir.exists()
    assert reopened.base_dir.parent == root / "cow"


def test_fault_hook_is_unset_by_default() -> None:
    assert fs.fault_hook is None


def test_two_sandboxes_committing_the_same_path_concurrently_one_wins(
    tmp_path: Path, root: Path
) -> None:
    import threading

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(300):
        (src / "sub" / f"f{i}").write_text("base\n")
    first, second = _sandbox(src, root), _sandbox(src, root)
    for sandbox, text in ((first, "first\n"), (second, "second\n")):
        for i in range(300):
            Path(sandbox.get_path(f"sub/f{i}")).write_text(text)
    outcomes: dict[str, object] = {}

    def commit(name: str, sandbox: CopyOnWriteSandbox) -> None:
        try:
            outcomes[name] = sandbox.commit()
        except SandboxCommitError as exc:
            outcomes[name] = exc

    threads = [
        threading.Thread(target=commit, args=(name, sandbox))
        for name, sandbox in (("first", first), ("second", second))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors = [o for o in outcomes.values() if isinstance(o, SandboxCommitError)]
    assert len(errors) == 1
    assert len(errors[0].conflicts) == 300
    contents = {(src / "sub" / f"f{i}").read_text() for i in range(300)}
    assert len(contents) == 1  # one sandbox's version everywhere, never a mix
    assert _staging_leftovers(tmp_path) == []
