"""Local work hidden from ``git status`` by index flags, and the module store of submodules.

Case 40: a tracked file marked ``assume-unchanged`` or ``skip-worktree`` whose bytes the user
changed is invisible to ``status`` but not to ``read-tree -m -u``. The property: prepare sees
what apply sees, so a plan is refused at prepare (every participant aborted, nothing touched)
and never "decided, then stuck". Also: sparse checkout, and a repository with submodules whose
module store (``.git/modules``) stays as it was while ``git status`` works throughout.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_core import GitWorktreeSandbox, SandboxFactory, SandboxManager, SandboxStatus
from sandbox_core.errors import SandboxConflictError
from sandbox_core.host.store import SandboxStore
from tests.support.gitrepo import GIT_ENV, git, make_repo

FLAGS = ("--assume-unchanged", "--skip-worktree")


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


def tree_state(top: Path) -> dict[str, str]:
    """{path: sha256 of content} of every file outside ``.git``."""
    files = {}
    for path in sorted(top.rglob("*")):
        rel = path.relative_to(top).as_posix()
        if rel == ".git" or rel.startswith(".git/") or path.is_dir():
            continue
        files[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def folder_state(top: Path) -> dict[str, tuple[int, str]]:
    """{path: (mode, sha256)} of every file below ``top`` (for a git store)."""
    found = {}
    for path in sorted(top.rglob("*")):
        if path.is_file() and not path.is_symlink():
            data = hashlib.sha256(path.read_bytes()).hexdigest()
            found[path.relative_to(top).as_posix()] = (path.stat().st_mode, data)
    return found


# -- case 40 -----------------------------------------------------------------------------------


def case40_world(tmp_path: Path, flag: str) -> tuple[SandboxManager, Path, Path]:
    repo = make_repo(tmp_path / "repo", {"config.ini": "db=prod\n", "f": "x\n"})
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a1\n")
    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(tmp_path / "state")
    )
    root = str(tmp_path / "sbx")
    d = manager.get_or_create_sandbox("p40", "docs", str(docs), "copy_on_write", sandbox_root=root)
    s = manager.get_or_create_sandbox("p40", "repo", str(repo), "git_worktree", sandbox_root=root)
    git(repo, "update-index", flag, "config.ini")
    (repo / "config.ini").write_text("db=localhost  # my machine only\n")
    Path(s.get_path("config.ini")).write_text("db=prod\ntimeout=5\n")
    Path(d.get_path("a.txt")).write_text("a2\n")
    return manager, repo, docs


@pytest.mark.parametrize("flag", FLAGS)
def test_case_40_hidden_local_work_is_found_at_prepare(tmp_path: Path, flag: str) -> None:
    """Case 40, two-phase: the conflict is found at prepare with conflicts ['config.ini'],
    every participant is aborted, docs/a.txt is still a1, main unmoved, both ACTIVE; recover
    finds nothing half done; the hidden edit is kept."""
    manager, repo, docs = case40_world(tmp_path, flag)
    head = git(repo, "rev-parse", "main")
    results = manager.commit_plan("p40", mode="two_phase")
    assert [r.success for r in results] == [False]
    assert "could not be prepared" in str(results[0].error)
    assert results[0].metadata["phase"] == "failed"
    state = manager.journal_for("p40").load()
    assert state is not None
    assert state.phase.value != "applying"
    failed = [step for step in state.steps if step.error]
    assert [step.conflicts for step in failed] == [["config.ini"]]
    assert failed[0].error.startswith("SandboxConflictError")
    manager.recover("p40")
    assert (docs / "a.txt").read_text() == "a1\n"
    assert git(repo, "rev-parse", "main") == head
    assert (repo / "config.ini").read_text() == "db=localhost  # my machine only\n"
    assert [s.status for s in manager.list_sandboxes("p40")] == [SandboxStatus.ACTIVE] * 2
    assert "refs/sandbox/prepared/" not in git(repo, "for-each-ref")
    manager.cleanup_all("p40")


@pytest.mark.parametrize("flag", FLAGS)
def test_case_40_one_shot_refuses_and_keeps_the_edit(tmp_path: Path, flag: str) -> None:
    """Case 40, variant ``S.commit()`` alone: a conflict, original untouched, S ACTIVE."""
    manager, repo, _docs = case40_world(tmp_path, flag)
    sandbox = next(s for s in manager.list_sandboxes("p40") if s.strategy == "git_worktree")
    before = tree_state(repo), git(repo, "rev-parse", "main")
    with pytest.raises(SandboxConflictError) as caught:
        sandbox.commit()
    assert caught.value.conflicts == ["config.ini"]
    assert (tree_state(repo), git(repo, "rev-parse", "main")) == before
    assert sandbox.status is SandboxStatus.ACTIVE
    manager.cleanup_all("p40")


@pytest.mark.parametrize("flag", FLAGS)
def test_case_40_review_names_the_hidden_edit(tmp_path: Path, flag: str) -> None:
    """Review, read-only, names the path a commit would be refused on."""
    manager, _repo, _docs = case40_world(tmp_path, flag)
    sandbox = next(s for s in manager.list_sandboxes("p40") if s.strategy == "git_worktree")
    assert sandbox.review().conflicts == ["config.ini"]
    manager.cleanup_all("p40")


@pytest.mark.parametrize("flag", FLAGS)
def test_flagged_file_left_clean_is_merged(tmp_path: Path, flag: str) -> None:
    """A flagged file whose bytes are those of the index is no conflict: the commit lands."""
    repo = make_repo(tmp_path / "repo", {"config.ini": "db=prod\n", "f": "x\n"})
    git(repo, "update-index", flag, "config.ini")
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("config.ini")).write_text("db=prod\ntimeout=5\n")
    txid = "t1"
    sandbox.prepare(txid)
    sandbox.apply_prepared(txid)
    assert (repo / "config.ini").read_text() == "db=prod\ntimeout=5\n"
    assert git(repo, "status", "--porcelain") == ""
    sandbox.cleanup()


# -- the property: prepare and apply agree, hidden work is never lost ---------------------------

FILES = ("a.txt", "b.txt", "dir/c.txt")


@settings(
    max_examples=int(os.environ.get("SANDBOX_PROPERTY_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    flags=st.dictionaries(st.sampled_from(FILES), st.sampled_from(FLAGS), max_size=3),
    hidden=st.sets(st.sampled_from(FILES)),
    edits=st.sets(st.sampled_from(FILES), min_size=1),
    two_phase=st.booleans(),
)
def test_hidden_work_is_never_lost_and_prepare_agrees_with_apply(
    tmp_path_factory: pytest.TempPathFactory,
    flags: dict[str, str],
    hidden: set[str],
    edits: set[str],
    two_phase: bool,
) -> None:
    """Random index flags and hidden edits: the commit lands exactly when no hidden edit is on
    a path the sandbox changes; otherwise it is refused (at prepare in two-phase) naming those
    paths, with the original untouched. A hidden edit is always kept."""
    tmp = tmp_path_factory.mktemp("hidden")
    repo = make_repo(tmp / "repo", {name: f"{name} base\n" for name in FILES})
    for name, flag in flags.items():
        git(repo, "update-index", flag, name)
    hidden_edits = {name for name in hidden if name in flags}
    for name in hidden_edits:
        (repo / name).write_text(f"{name} local\n")
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp / "sbx"))
    sandbox.create("p")
    for name in edits:
        Path(sandbox.get_path(name)).write_text(f"{name} sandbox\n")
    before = tree_state(repo), git(repo, "rev-parse", "main")
    blocked = sorted(hidden_edits & edits)
    try:
        if two_phase:
            sandbox.prepare("tx")
            sandbox.apply_prepared("tx")
        else:
            sandbox.commit()
    except SandboxConflictError as exc:
        assert blocked, exc
        assert exc.conflicts == blocked
        assert (tree_state(repo), git(repo, "rev-parse", "main")) == before
        assert sandbox.status is SandboxStatus.ACTIVE
    else:
        assert not blocked
        for name in edits:
            assert (repo / name).read_text() == f"{name} sandbox\n"
    for name in hidden_edits:
        assert (repo / name).read_text() == f"{name} local\n"
    sandbox.cleanup()


# -- sparse checkout ---------------------------------------------------------------------------


def test_sparse_checkout_path_outside_the_cone_is_committed_to_the_index(tmp_path: Path) -> None:
    """A path outside the sparse cone (skip-worktree, absent on purpose) that the sandbox
    changes is no conflict; a file put there by hand with other bytes is (prepare and
    one-shot alike)."""
    repo = make_repo(tmp_path / "repo", {"in/a.txt": "a\n", "out/b.txt": "b\n"})
    git(repo, "sparse-checkout", "set", "in")
    assert not (repo / "out" / "b.txt").exists()
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    target = Path(sandbox.get_path("in/a.txt"))
    target.write_text("a2\n")
    hidden = repo / "out" / "b.txt"
    hidden.parent.mkdir(exist_ok=True)
    hidden.write_text("mine\n")
    git(repo, "update-index", "--skip-worktree", "out/b.txt")
    assert sandbox.review().conflicts == []
    hidden.unlink()
    sandbox.prepare("t")
    sandbox.apply_prepared("t")
    assert (repo / "in" / "a.txt").read_text() == "a2\n"
    assert git(repo, "status", "--porcelain") == ""
    sandbox.cleanup()


# -- submodules: the module store is untouched, git status works throughout --------------------


def make_super(tmp_path: Path) -> Path:
    sub = make_repo(tmp_path / "subsrc", {"s.txt": "s\n"})
    top = make_repo(tmp_path / "super", {"a.txt": "a\n"})
    subprocess.run(
        ["git", "-C", str(top), "-c", "protocol.file.allow=always", "submodule", "add", "-q",
         str(sub), "lib"],
        check=True, capture_output=True, env={**os.environ, **GIT_ENV},
    )  # fmt: skip
    git(top, "commit", "-qm", "add lib")
    return top


def store_without_sandbox_admin(top: Path) -> dict[str, tuple[int, str]]:
    """The module store, leaving out the registrations of worktrees (the sandbox's own) and
    the store's index, whose stat cache the watching ``git status`` itself refreshes."""
    state = folder_state(top / ".git" / "modules")
    return {
        k: v
        for k, v in state.items()
        if "/worktrees/" not in f"/{k}" and not k.endswith(("index", "sandbox-core.lock"))
    }


@pytest.mark.parametrize("ending", ["commit", "rollback", "two_phase", "undo_commit"])
def test_module_store_untouched_and_status_works_throughout(tmp_path: Path, ending: str) -> None:
    """``git status`` in the original works before, during (from a concurrent thread) and
    after the commit or rollback; the module store (objects, refs, config, HEAD) is as it was,
    apart from the sandbox's own worktree registration, which cleanup removes."""
    top = make_super(tmp_path)
    store = store_without_sandbox_admin(top)
    assert git(top, "status", "--porcelain") == ""
    sandbox = GitWorktreeSandbox("r", str(top), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("a.txt")).write_text("a2\n")
    failures: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            done = subprocess.run(
                ["git", "-C", str(top), "status", "--porcelain"], capture_output=True, text=True
            )
            if done.returncode != 0:
                failures.append(done.stderr)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        if ending == "commit":
            sandbox.commit()
        elif ending == "undo_commit":
            sandbox.commit()
            sandbox.rollback()  # back to the pre-commit state, under the watcher's feet
        elif ending == "two_phase":
            sandbox.prepare("t")
            sandbox.apply_prepared("t")
        else:
            sandbox.rollback()
        sandbox.cleanup()
    finally:
        stop.set()
        watcher.join()
    assert failures == []
    assert git(top, "status", "--porcelain") == ""
    assert store_without_sandbox_admin(top) == store
    assert not list((top / ".git" / "modules" / "lib").glob("worktrees/*"))


@pytest.mark.parametrize("two_phase", [False, True], ids=["one-shot", "two-phase"])
@pytest.mark.parametrize("flag", FLAGS)
def test_flagged_file_with_stale_stat_data_is_no_conflict(
    tmp_path: Path, flag: str, two_phase: bool
) -> None:
    """A flagged file whose bytes are unchanged but whose stat data is stale (``touch``): the
    commit lands (``update-index --refresh`` alone skips assume-unchanged entries), and the
    flags of other files stay as the user set them."""
    repo = make_repo(tmp_path / "repo", {"config.ini": "db=prod\n", "other.ini": "o\n"})
    git(repo, "update-index", flag, "config.ini")
    git(repo, "update-index", flag, "other.ini")
    (repo / "other.ini").write_text("my hidden edit\n")
    os.utime(repo / "config.ini", (1_000_000_000, 1_000_000_000))
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("config.ini")).write_text("db=prod\ntimeout=5\n")
    if two_phase:
        sandbox.prepare("t")
        sandbox.apply_prepared("t")
    else:
        sandbox.commit()
    assert (repo / "config.ini").read_text() == "db=prod\ntimeout=5\n"
    assert (repo / "other.ini").read_text() == "my hidden edit\n"
    tags = dict(line.split(" ", 1)[::-1] for line in git(repo, "ls-files", "-v").splitlines())
    assert tags["other.ini"] == ("h" if flag == "--assume-unchanged" else "S")
    sandbox.cleanup()
