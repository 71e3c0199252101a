"""Two-phase plan commit of the ``git_worktree`` strategy (issue 9), on real repositories.

review -> prepare -> apply_prepared / abort_prepared, the crash of a real process in the middle
of an apply (SIGKILL) finished by a fresh process, and a differential property test: prepare +
apply leaves the original exactly as the one-shot ``commit`` does.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_core import GitWorktreeSandbox, SandboxStatus
from sandbox_core.errors import SandboxCommitError, SandboxConflictError
from tests.support.gitrepo import GIT_ENV, git, make_repo

REPO_ROOT = Path(__file__).resolve().parents[4]
BASE = {"a.txt": "one\ntwo\nthree\n", "b.txt": "bee\n", "dir/c.txt": "sea\n", "dir/d.bin": "d\n"}


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


def original_state(repo: Path) -> tuple[str, str, bytes, dict[str, tuple[int, str]]]:
    """(HEAD, branch, index file bytes, {path: (mode, sha256 of content)}) of a checkout."""
    files = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if rel == ".git" or rel.startswith(".git/") or path.is_dir():
            continue
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        files[rel] = (path.lstat().st_mode, hashlib.sha256(data).hexdigest())
    head = git(repo, "rev-parse", "HEAD")
    branch = git(repo, "symbolic-ref", "-q", "HEAD")
    return head, branch, (repo / ".git" / "index").read_bytes(), files


def prepared_refs(repo: Path) -> list[str]:
    return [
        line
        for line in git(repo, "for-each-ref", "--format=%(refname)").splitlines()
        if line.startswith("refs/sandbox/prepared/")
    ]


def new_sandbox(repo: Path, root: Path, resource: str = "r") -> GitWorktreeSandbox:
    sandbox = GitWorktreeSandbox(resource, str(repo), sandbox_root=str(root))
    sandbox.create("plan")
    return sandbox


def edit(sandbox: GitWorktreeSandbox) -> None:
    """Change a.txt (2 lines out, 3 in), delete b.txt, add e.txt (5 bytes) and bin (4 bytes)."""
    Path(sandbox.get_path("a.txt")).write_text("one\nTWO\nTHREE\nfour\n")
    Path(sandbox.get_path("b.txt")).unlink()
    Path(sandbox.get_path("new/e.txt")).parent.mkdir()
    Path(sandbox.get_path("new/e.txt")).write_text("e\ne\ne")
    Path(sandbox.get_path("bin")).write_bytes(b"\0\1\2\3")


# -- review -------------------------------------------------------------------------------------


def test_review_counts_paths_lines_and_bytes(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    summary = sandbox.review()
    assert summary.strategy == "git_worktree"
    assert summary.added == ["bin", "new/e.txt"]
    assert summary.changed == ["a.txt"]
    assert summary.deleted == ["b.txt"]
    # a.txt +3 -2, b.txt -1, new/e.txt +3; bin is binary: no lines
    assert (summary.lines_added, summary.lines_removed) == (6, 3)
    assert summary.bytes_changed == len("one\nTWO\nTHREE\nfour\n") + 5 + 4
    assert summary.conflicts == []
    assert summary.digest.startswith("sha256:") and len(summary.digest) == 7 + 64


def test_review_moves_nothing_and_its_digest_is_stable(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    tree = Path(sandbox.get_path(""))
    admin = Path(str(sandbox.context.metadata["worktree_admin_dir"]))  # type: ignore[union-attr]
    before_original = original_state(repo)
    before_sandbox = (git(tree, "rev-parse", "HEAD"), (admin / "index").read_bytes())
    first = sandbox.review()
    second = sandbox.review()
    assert first.digest == second.digest
    assert original_state(repo) == before_original
    assert (git(tree, "rev-parse", "HEAD"), (admin / "index").read_bytes()) == before_sandbox
    assert sandbox.status is SandboxStatus.ACTIVE

    (tree / "a.txt").write_text("one\nTWO\nTHREE\nfive\n")  # content
    content = sandbox.review().digest
    assert content != first.digest
    (tree / "a.txt").chmod(0o755)  # git mode
    mode = sandbox.review().digest
    assert mode not in (first.digest, content)
    (tree / "a.txt").chmod(0o644)
    assert sandbox.review().digest == content, "same content and mode: same digest"


def test_review_digest_equals_prepare_digest(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    reviewed = sandbox.review()
    prepared = sandbox.prepare("tx-digest")
    assert prepared.digest == reviewed.digest
    assert prepared.summary is not None
    assert prepared.summary.added == reviewed.added
    assert prepared.summary.lines_added == reviewed.lines_added
    assert sandbox.review().digest == reviewed.digest, "prepare's snapshot changes no content"
    sandbox.abort_prepared("tx-digest")


def test_review_reports_merge_conflicts_and_local_edits(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    (repo / "dir" / "c.txt").write_text("unrelated local edit\n")
    assert sandbox.review().conflicts == []
    (repo / "a.txt").write_text("local edit\n")
    assert sandbox.review().conflicts == ["a.txt"]
    git(repo, "checkout", "--", "a.txt")
    (repo / "a.txt").write_text("one\nzwei\nthree\n")
    git(repo, "commit", "-qam", "moved on")
    before = original_state(repo)
    assert sandbox.review().conflicts == ["a.txt"]  # a real merge conflict
    assert original_state(repo) == before
    git(repo, "checkout", "-q", "-b", "other")
    assert sandbox.review().conflicts == ["HEAD"]


def test_review_after_the_original_moved_without_conflict(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    first = sandbox.review()
    (repo / "dir" / "c.txt").write_text("moved\n")
    git(repo, "commit", "-qam", "moved on")
    again = sandbox.review()
    assert again.conflicts == []
    assert again.digest == first.digest, "the digest names the sandbox's change, not the target"


# -- prepare / abort ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["merge-conflict", "local-edit", "staged-edit"])
def test_prepare_of_a_conflicting_change_touches_nothing(tmp_path: Path, kind: str) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    if kind == "merge-conflict":
        (repo / "a.txt").write_text("one\nzwei\nthree\n")
        git(repo, "commit", "-qam", "moved on")
    else:
        (repo / "new").mkdir()
        (repo / "new" / "e.txt").write_text("mine\n")
        if kind == "staged-edit":
            git(repo, "add", "new/e.txt")
    before = original_state(repo)
    with pytest.raises(SandboxConflictError) as raised:
        sandbox.prepare("tx-conflict")
    assert raised.value.conflicts == (["a.txt"] if kind == "merge-conflict" else ["new/e.txt"])
    assert original_state(repo) == before
    assert prepared_refs(repo) == []
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.abort_prepared("tx-conflict")  # the coordinator aborts every step: safe
    assert original_state(repo) == before


def test_prepare_then_abort_leaves_no_ref_and_touches_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    before = original_state(repo)
    sandbox.abort_prepared("tx-never")  # nothing prepared: fine
    prepared = sandbox.prepare("tx-abort", "two-phase")
    assert prepared.details["merge_commit"] == prepared.details["sandbox_commit"]
    assert len(prepared_refs(repo)) == 3
    assert original_state(repo) == before
    reopened = GitWorktreeSandbox.reopen(sandbox.to_record())  # abort from the txid alone
    reopened.abort_prepared("tx-abort")
    reopened.abort_prepared("tx-abort")
    assert prepared_refs(repo) == []
    assert original_state(repo) == before
    assert reopened.status is SandboxStatus.ACTIVE
    with pytest.raises(SandboxCommitError, match="no commit prepared"):
        reopened.apply_prepared("tx-abort")
    assert original_state(repo) == before
    assert reopened.commit().added_files == ["bin", "new/e.txt"], "still commits afterwards"


def test_invalid_txid_is_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    for txid in ("../x", "a/b", "x" * 65, "a..b"):
        with pytest.raises(SandboxCommitError):
            sandbox.prepare(txid)
    assert prepared_refs(repo) == []


# -- apply --------------------------------------------------------------------------------------


def twin_repos(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    """Two repositories with the same commit (same ids): a clone of the first."""
    first = make_repo(tmp_path / "one", files)
    second = tmp_path / "two"
    subprocess.run(
        ["git", "clone", "-q", str(first), str(second)], check=True, env={**os.environ, **GIT_ENV}
    )
    git(second, "checkout", "-q", "-B", "main", "origin/main")
    git(second, "remote", "remove", "origin")
    return first, second


@pytest.mark.parametrize("moved", [False, True])
def test_prepare_then_apply_equals_the_one_shot_commit(
    tmp_path: Path, moved: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fixed dates: both repositories get the same commit ids, so results compare to the id.
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2026-01-02T00:00:00Z")
    monkeypatch.setenv("GIT_AUTHOR_DATE", "2026-01-02T00:00:00Z")
    one, two = twin_repos(tmp_path, BASE)
    sandboxes = []
    for repo, root in ((one, tmp_path / "root1"), (two, tmp_path / "root2")):
        sandbox = GitWorktreeSandbox(
            "r", str(repo), sandbox_root=str(root), sandbox_id="01TWINSANDBOX0000000000000"
        )
        sandbox.create("plan")
        edit(sandbox)
        sandboxes.append(sandbox)
    if moved:  # the original moved on since create: a real merge
        for repo in (one, two):
            (repo / "dir" / "c.txt").write_text("moved\n")
            git(repo, "commit", "-qam", "moved on")
    committed = sandboxes[0].commit("same message")
    sandboxes[1].prepare("tx-twin", "same message")
    applied = GitWorktreeSandbox.reopen(sandboxes[1].to_record()).apply_prepared("tx-twin")
    assert applied.metadata["txid"] == "tx-twin"
    for field in ("added_files", "changed_files", "deleted_files"):
        assert getattr(applied, field) == getattr(committed, field)
    assert applied.metadata["landed_as"] == committed.metadata["landed_as"]
    assert applied.metadata["landed_as"] == ("merge" if moved else "fast-forward")
    assert git(one, "rev-parse", "HEAD^{tree}") == git(two, "rev-parse", "HEAD^{tree}")
    assert applied.commit_ref == committed.commit_ref, "same commit, to the id"
    assert original_state(one)[3] == original_state(two)[3]
    assert git(two, "status", "--porcelain") == ""


def test_apply_is_idempotent_and_commit_landed_and_rollback_work(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    pre = git(repo, "rev-parse", "HEAD")
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    assert sandbox.commit_landed() is False
    prepared = sandbox.prepare("tx-idem")
    assert sandbox.commit_landed() is False
    result = sandbox.apply_prepared("tx-idem")
    assert sandbox.status is SandboxStatus.COMMITTED
    assert sandbox.apply_prepared("tx-idem") is result  # recorded: returned as it is
    assert git(repo, "rev-parse", "HEAD") == prepared.details["merge_commit"]
    # A fresh process that never recorded the apply: apply again, or adopt the landed commit.
    record = {**sandbox.to_record(), "status": "active", "last_commit": None}
    again = GitWorktreeSandbox.reopen(record).apply_prepared("tx-idem")
    assert again.commit_ref == result.commit_ref
    assert git(repo, "rev-list", "--count", "HEAD") == "2", "never merged twice"
    adopted = GitWorktreeSandbox.reopen(record)
    assert adopted.commit_landed() is True
    adopted.adopt_landed_commit()
    assert adopted.last_commit is not None
    assert adopted.last_commit.commit_ref == result.commit_ref
    assert adopted.last_commit.metadata["pre_commit_sha"] == pre
    adopted.rollback()
    assert git(repo, "rev-parse", "HEAD") == pre
    assert (repo / "b.txt").read_text() == "bee\n"
    assert not (repo / "bin").exists()
    adopted.cleanup()
    assert prepared_refs(repo) == []
    assert git(repo, "for-each-ref", "refs/tags/sandbox/") == ""


def test_nothing_changed_reviews_empty_and_applies_as_a_no_op(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    summary = sandbox.review()
    assert (summary.added, summary.changed, summary.deleted, summary.conflicts) == ([], [], [], [])
    assert (summary.lines_added, summary.bytes_changed) == (0, 0)
    before = original_state(repo)
    prepared = sandbox.prepare("tx-empty")
    assert prepared.digest == summary.digest
    assert sandbox.apply_prepared("tx-empty").metadata["landed_as"] == "no-op"
    assert original_state(repo) == before


def test_detached_head_original_moves_its_head_by_compare_and_swap(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    git(repo, "checkout", "-q", "--detach")
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    prepared = sandbox.prepare("tx-detached")
    result = GitWorktreeSandbox.reopen(sandbox.to_record()).apply_prepared("tx-detached")
    assert result.metadata["branch"] == "HEAD"
    assert git(repo, "rev-parse", "HEAD") == prepared.details["merge_commit"]
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "rev-parse", "main") != git(repo, "rev-parse", "HEAD"), "main stays"


def test_a_branch_moved_between_prepare_and_apply_is_refused_untouched(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    sandbox.prepare("tx-moved")
    (repo / "dir" / "c.txt").write_text("someone else\n")
    git(repo, "commit", "-qam", "someone else wrote the repository")
    before = original_state(repo)
    with pytest.raises(SandboxCommitError, match="moved from") as raised:
        sandbox.apply_prepared("tx-moved")
    assert not raised.value.conflicts
    assert original_state(repo) == before
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.abort_prepared("tx-moved")
    assert prepared_refs(repo) == []


def test_local_edit_after_prepare_refuses_the_apply_untouched(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    sandbox.prepare("tx-edit")
    (repo / "a.txt").write_text("edited after prepare\n")
    before = original_state(repo)
    with pytest.raises(SandboxConflictError) as raised:
        sandbox.apply_prepared("tx-edit")
    assert raised.value.conflicts == ["a.txt"]
    assert original_state(repo) == before
    assert sandbox.status is SandboxStatus.ACTIVE


def test_cleanup_removes_prepared_refs_of_this_sandbox_only(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    first = new_sandbox(repo, tmp_path / "root", "r1")
    second = new_sandbox(repo, tmp_path / "root", "r2")
    Path(first.get_path("x")).write_text("x\n")
    Path(second.get_path("y")).write_text("y\n")
    first.prepare("tx-clean")
    second.prepare("tx-clean")
    first.prepare("tx-other")
    first.cleanup()
    assert prepared_refs(repo) == [
        f"refs/sandbox/prepared/tx-clean/{second.sandbox_id}/{kind}"
        for kind in ("new", "old", "tip")
    ]
    second.cleanup()
    assert prepared_refs(repo) == []


def test_two_sandboxes_of_one_repository_chain_under_one_txid(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    first = new_sandbox(repo, tmp_path / "root", "r1")
    second = new_sandbox(repo, tmp_path / "root", "r2")
    Path(first.get_path("a.txt")).write_text("one\ntwo\nthree\nfirst\n")
    Path(second.get_path("dir/c.txt")).write_text("second\n")
    before = original_state(repo)
    p1 = first.prepare("tx-chain")
    p2 = second.prepare("tx-chain")
    assert p2.details["expected_old"] == p1.details["merge_commit"]
    assert original_state(repo) == before
    first.apply_prepared("tx-chain")
    second.apply_prepared("tx-chain")
    assert (repo / "a.txt").read_text().endswith("first\n")
    assert (repo / "dir" / "c.txt").read_text() == "second\n"
    assert git(repo, "status", "--porcelain") == ""

    third = new_sandbox(repo, tmp_path / "root", "r3")
    fourth = new_sandbox(repo, tmp_path / "root", "r4")
    Path(third.get_path("b.txt")).write_text("third\n")
    Path(fourth.get_path("b.txt")).write_text("fourth\n")
    third.prepare("tx-clash")
    with pytest.raises(SandboxConflictError) as raised:
        fourth.prepare("tx-clash")  # the two sandboxes conflict: found before anything lands
    assert raised.value.conflicts == ["b.txt"]


def test_no_repository_code_runs_in_review_prepare_apply_abort(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    marker = tmp_path / "ran"
    hooks = repo / ".git" / "hooks"
    for name in (
        "reference-transaction",
        "post-checkout",
        "post-index-change",
        "pre-commit",
        "post-merge",
        "fsmonitor-watchman",
    ):
        (hooks / name).write_text(f"#!/bin/sh\necho {name} >> {marker}\n")
        (hooks / name).chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(hooks / "fsmonitor-watchman"))
    (repo / ".gitattributes").write_text("*.txt filter=evil\n")
    git(repo, "config", "filter.evil.clean", f"sh -c 'echo clean >> {marker}; cat'")
    git(repo, "config", "filter.evil.smudge", f"sh -c 'echo smudge >> {marker}; cat'")
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    sandbox.review()
    sandbox.prepare("tx-code")
    sandbox.abort_prepared("tx-code")
    sandbox.prepare("tx-code2")
    sandbox.apply_prepared("tx-code2")
    assert not marker.exists(), marker.read_text()


# -- a real crash in the middle of apply --------------------------------------------------------

CHILD = """
import json, os, signal, sys
sys.path.insert(0, {root!r})
from sandbox_core import GitWorktreeSandbox
from sandbox_core.strategies.git_worktree import GitCommand

record, point, half = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
real_run = GitCommand.run

def crash(self, *args, **kwargs):
    lines = str(kwargs.get("stdin") or "").splitlines()
    moves_main = "refs/heads/main" in args or any(
        line.split()[1:2] == ["refs/heads/main"] for line in lines
    )
    if point == "before-ref" and args[:1] == ("update-ref",) and moves_main:
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "in-read-tree" and args[:2] == ("read-tree", "-m"):
        with open(half, "w") as handle:  # read-tree wrote this file, then the process died
            handle.write("one\\nTWO\\nTHREE\\nfour\\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return real_run(self, *args, **kwargs)

GitCommand.run = crash
sandbox = GitWorktreeSandbox.reopen(record)
print(json.dumps(sandbox.apply_prepared("tx-crash").to_dict()))
"""


def run_apply(
    record: dict[str, object], point: str, half: Path
) -> subprocess.CompletedProcess[str]:
    code = CHILD.format(root=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(record), point, str(half)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("point", ["before-ref", "in-read-tree"])
def test_sigkill_in_the_middle_of_apply_then_a_fresh_apply_finishes(
    tmp_path: Path, point: str
) -> None:
    repo = make_repo(tmp_path / "repo", BASE)
    pre = git(repo, "rev-parse", "HEAD")
    sandbox = new_sandbox(repo, tmp_path / "root")
    edit(sandbox)
    (repo / "dir" / "c.txt").write_text("the user's unrelated work\n")
    prepared = sandbox.prepare("tx-crash")
    record = sandbox.to_record()

    crashed = run_apply(record, point, repo / "a.txt")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert git(repo, "rev-parse", "HEAD") == pre, "the ref had not moved"
    assert (repo / "a.txt").read_text() == "one\nTWO\nTHREE\nfour\n", "files half-written"

    finished = run_apply(record, "none", repo / "a.txt")
    assert finished.returncode == 0, finished.stderr
    result = json.loads(finished.stdout)
    assert result["commit_ref"] == prepared.details["merge_commit"]
    assert result["added_files"] == ["bin", "new/e.txt"]
    assert git(repo, "rev-parse", "HEAD") == prepared.details["merge_commit"]
    assert git(repo, "status", "--porcelain") == " M dir/c.txt", "exactly: the user's work kept"
    assert (repo / "dir" / "c.txt").read_text() == "the user's unrelated work\n"
    assert not (repo / "b.txt").exists()
    assert (repo / "new" / "e.txt").read_text() == "e\ne\ne"
    assert git(repo, "rev-list", "--count", "HEAD") == "2"

    again = run_apply(record, "none", repo / "a.txt")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["commit_ref"] == result["commit_ref"]
    assert git(repo, "rev-list", "--count", "HEAD") == "2", "never merged twice"


# -- property: prepare + apply == commit --------------------------------------------------------

NAMES = st.sampled_from(["a.txt", "b.txt", "dir/c.txt", "dir/d.bin", "n1", "sub/n2", "dir/n3"])
EDITS = st.lists(
    st.tuples(
        st.sampled_from(["write", "delete", "chmod", "symlink"]),
        NAMES,
        st.binary(max_size=40),
    ),
    max_size=6,
)


def apply_edits(top: Path, edits: list[tuple[str, str, bytes]]) -> None:
    for action, name, data in edits:
        path = top / name
        if action == "delete":
            if path.is_symlink() or path.is_file():
                path.unlink()
            continue
        if path.is_symlink() or (path.exists() and not path.is_file()):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if action == "write":
            path.write_bytes(data)
        elif action == "chmod" and path.is_file():
            path.chmod(path.stat().st_mode ^ stat.S_IXUSR)
        elif action == "symlink" and not path.exists():
            path.symlink_to("a.txt")


@settings(
    max_examples=int(os.environ.get("SANDBOX_HYPOTHESIS_EXAMPLES", "4")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(edits=EDITS, moved=st.booleans())
def test_property_prepare_and_apply_leave_the_original_as_commit_does(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[str, str, bytes]], moved: bool
) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    one, two = twin_repos(tmp, BASE)
    results = []
    for index, repo in enumerate((one, two)):
        sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp / f"root{index}"))
        sandbox.create("plan")
        apply_edits(Path(sandbox.get_path("")), edits)
        if moved:
            (repo / "dir" / "d.bin").write_text("moved\n")
            git(repo, "commit", "-qam", "moved on")
        results.append(sandbox)
    try:
        committed = results[0].commit("m")
        results[1].prepare("tx-prop", "m")
        applied = results[1].apply_prepared("tx-prop")
    except SandboxConflictError as exc:  # a sandbox edit of d.bin meets the move: both refuse
        assert moved and "dir/d.bin" in exc.conflicts
        with pytest.raises(SandboxConflictError):
            results[1].prepare("tx-prop", "m")
        assert prepared_refs(two) == []
        return
    assert (applied.added_files, applied.changed_files, applied.deleted_files) == (
        committed.added_files,
        committed.changed_files,
        committed.deleted_files,
    )
    assert git(one, "rev-parse", "HEAD^{tree}") == git(two, "rev-parse", "HEAD^{tree}")
    assert original_state(one)[3] == original_state(two)[3]
    assert git(one, "status", "--porcelain") == git(two, "status", "--porcelain")
