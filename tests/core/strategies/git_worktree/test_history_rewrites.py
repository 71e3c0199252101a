"""A branch of the original rewritten after the sandbox was made (reset, amend, rebase, a forced
ref move): the commit never brings a dropped commit back.

The policy (docs/git-worktree.md, "A branch rewritten since create"): the sandbox records its
base commit (in its record, shown by ``describe``); when the target no longer contains it, only
the sandbox's own change (base -> sandbox tree) is replayed onto the target, as one commit
whose only parent is the target; where that change overlaps what the rewrite changed, the
commit is refused as a conflict naming the base and the target's commit, nothing touched.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_core import GitWorktreeSandbox, SandboxStatus
from sandbox_core.describe import describe
from sandbox_core.errors import SandboxConflictError
from tests.support.gitrepo import GIT_ENV, git, make_repo

SHARED = ("f0.txt", "f1.txt", "f2.txt", "f3.txt")
FLAGS = ("--assume-unchanged", "--skip-worktree")


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


def text(name: str, version: str) -> str:
    """One line of content, unlike every other (no rename is ever detected between two)."""
    return hashlib.sha256(f"{name}:{version}".encode()).hexdigest() + "\n"


def blob_id(data: str) -> str:
    raw = data.encode()
    return hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()  # noqa: S324 - git's id


def tree_of(repo: Path, commit: str) -> dict[str, str]:
    """{path: blob id} of ``commit``."""
    listed = git(repo, "ls-tree", "-r", "-z", commit)
    entries = {}
    for entry in listed.split("\0"):
        if entry:
            info, _, path = entry.partition("\t")
            entries[path] = info.split()[2]
    return entries


def commits_of(repo: Path, ref: str) -> set[str]:
    return set(git(repo, "rev-list", ref).split())


def work(repo: Path, i: int, shared: str) -> str:
    """A commit on the original: changes ``shared`` and adds ``c<i>.txt``; its id."""
    (repo / shared).write_text(text(shared, f"c{i}"))
    (repo / f"c{i}.txt").write_text(text("c", str(i)))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"c{i}")
    return git(repo, "rev-parse", "HEAD")


def rewrite(repo: Path, kind: str, depth: int) -> None:
    """Rewrite ``main``: drop the last ``depth`` commits, amend the last, drop one commit in the
    middle by a rebase, amend one in the middle and rebase the rest onto it, or move the
    branch to a side line made from the root."""
    if kind == "reset":
        git(repo, "reset", "-q", "--hard", f"HEAD~{depth}")
    elif kind == "amend":
        (repo / "amended.txt").write_text(text("amended", "1"))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--amend", "-m", "amended")
    elif kind == "rebase":
        git(repo, "rebase", "-q", "--onto", f"HEAD~{depth}", f"HEAD~{depth - 1}")
    elif kind == "edit":  # amend a commit in the middle, replay the ones after it
        target = git(repo, "rev-parse", f"HEAD~{depth - 1}")
        git(repo, "checkout", "-q", "--detach", target)
        (repo / "edited.txt").write_text(text("edited", "1"))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--amend", "-m", "edited")
        git(repo, "rebase", "-q", "--onto", "HEAD", target, "main")
    elif kind == "force":
        root = git(repo, "rev-list", "--max-parents=0", "HEAD")
        git(repo, "checkout", "-q", "-b", "side", root)
        (repo / "side.txt").write_text(text("side", "1"))
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "side")
        git(repo, "checkout", "-q", "-B", "main", "side")
        git(repo, "branch", "-q", "-D", "side")


def make_world(tmp: Path, n: int) -> tuple[Path, list[str]]:
    repo = make_repo(tmp / "repo", {name: text(name, "root") for name in SHARED})
    made = [work(repo, i, SHARED[i % len(SHARED)]) for i in range(n)]
    return repo, made


def land(sandbox: GitWorktreeSandbox, two_phase: bool) -> str:
    if two_phase:
        sandbox.prepare("tx")
        return str(sandbox.apply_prepared("tx").metadata["landed_as"])
    return str(sandbox.commit().metadata["landed_as"])


# -- named cases --------------------------------------------------------------------------------


@pytest.mark.parametrize("two_phase", [False, True], ids=["one-shot", "two-phase"])
@pytest.mark.parametrize("kind", ["reset", "amend", "rebase", "edit", "force"])
def test_rewritten_branch_gets_only_the_sandbox_change(
    tmp_path: Path, kind: str, two_phase: bool
) -> None:
    repo, made = make_world(tmp_path, 3)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("new.txt")).write_text("the sandbox's work\n")
    base = made[-1]
    rewrite(repo, kind, 2)
    old = git(repo, "rev-parse", "main")
    dropped = commits_of(repo, base) - commits_of(repo, old)
    assert dropped
    assert land(sandbox, two_phase) == "replay"
    new = git(repo, "rev-parse", "main")
    assert git(repo, "rev-parse", f"{new}^@") == old  # one parent: the rewritten target
    assert not (dropped & commits_of(repo, "main")), "a dropped commit came back"
    expected = {**tree_of(repo, old), "new.txt": blob_id("the sandbox's work\n")}
    assert tree_of(repo, "main") == expected
    assert git(repo, "status", "--porcelain") == ""
    assert sandbox.commit_landed()
    sandbox.rollback()  # undo: back to the rewritten target exactly
    assert git(repo, "rev-parse", "main") == old
    assert not (repo / "new.txt").exists()
    sandbox.cleanup()


@pytest.mark.parametrize("two_phase", [False, True], ids=["one-shot", "two-phase"])
def test_change_overlapping_the_rewrite_is_a_conflict_naming_base_and_current(
    tmp_path: Path, two_phase: bool
) -> None:
    """The sandbox edits a file a dropped commit changed, which the reset took back: a
    conflict saying the branch was rewritten, naming base and current; nothing touched."""
    repo, made = make_world(tmp_path, 2)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("f1.txt")).write_text("the sandbox's f1\n")  # c1 changed f1
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    old = git(repo, "rev-parse", "main")
    before = tree_of(repo, old), sorted(p.name for p in repo.iterdir())
    assert sandbox.review().conflicts == ["f1.txt"]
    with pytest.raises(SandboxConflictError) as caught:
        land(sandbox, two_phase)
    assert caught.value.conflicts == ["f1.txt"]
    message = str(caught.value)
    assert "rewritten" in message
    assert made[-1] in message
    assert old in message
    assert git(repo, "rev-parse", "main") == old
    assert (tree_of(repo, old), sorted(p.name for p in repo.iterdir())) == before
    assert sandbox.status is SandboxStatus.ACTIVE
    sandbox.cleanup()


def test_base_is_recorded_durably_and_described(tmp_path: Path) -> None:
    """The base commit is in the sandbox's record (survives a reopen) and in ``describe``."""
    repo, made = make_world(tmp_path, 1)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    assert describe(sandbox)["metadata"]["base_commit"] == made[0]
    reopened = GitWorktreeSandbox.reopen(sandbox.to_record())
    assert describe(reopened)["metadata"]["base_commit"] == made[0]
    sandbox.cleanup()


def test_branch_that_only_moved_forward_still_merges(tmp_path: Path) -> None:
    """Control: new commits on top of the base are no rewrite (a merge, both parents)."""
    repo, made = make_world(tmp_path, 1)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "sbx"))
    sandbox.create("p")
    Path(sandbox.get_path("new.txt")).write_text("n\n")
    work(repo, 5, "f3.txt")
    assert sandbox.commit().metadata["landed_as"] == "merge"
    assert made[0] in commits_of(repo, "main")
    sandbox.cleanup()


# -- the property -------------------------------------------------------------------------------


@settings(
    max_examples=int(os.environ.get("SANDBOX_PROPERTY_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n=st.integers(1, 4),
    kind=st.sampled_from(["none", "reset", "amend", "rebase", "edit", "force"]),
    depth=st.integers(1, 4),
    after=st.lists(st.sampled_from(SHARED), max_size=2),
    edits=st.dictionaries(st.sampled_from([*SHARED, "s.txt"]), st.integers(0, 1), min_size=1),
    flags=st.dictionaries(st.sampled_from(SHARED), st.sampled_from(FLAGS), max_size=2),
    hidden=st.sets(st.sampled_from(SHARED)),
    two_phase=st.booleans(),
)
def test_no_dropped_commit_comes_back_and_no_hidden_edit_is_lost(
    tmp_path_factory: pytest.TempPathFactory,
    n: int,
    kind: str,
    depth: int,
    after: list[str],
    edits: dict[str, int],
    flags: dict[str, str],
    hidden: set[str],
    two_phase: bool,
) -> None:
    """Random history (N commits), a random rewrite at a random depth, random new commits
    after it, random sandbox edits, random index flags with hidden local edits; one-shot or
    two-phase. Oracle: the result is the three-way merge of the sandbox's own change onto the
    target (base as merge base), or a conflict naming exactly the paths that refuse it with
    nothing touched; no dropped commit is in the result; every hidden edit is kept."""
    tmp = tmp_path_factory.mktemp("rewrite")
    repo, made = make_world(tmp, n)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp / "sbx"))
    sandbox.create("p")
    for name, version in edits.items():
        Path(sandbox.get_path(name)).write_text(text(name, f"sandbox{version}"))
    base = made[-1]
    depth = min(depth, n) if kind in ("reset", "rebase", "edit") else depth
    rewrite(repo, kind, depth)
    for j, name in enumerate(after):
        work(repo, 10 + j, name)
    for name, flag in flags.items():
        git(repo, "update-index", flag, name)
    hidden_edits = {name for name in hidden if name in flags}
    for name in hidden_edits:
        (repo / name).write_text("my hidden local edit\n")
    old = git(repo, "rev-parse", "main")
    dropped = commits_of(repo, base) - commits_of(repo, old)

    b, o = tree_of(repo, base), tree_of(repo, old)
    t = {**b, **{name: blob_id(text(name, f"sandbox{v}")) for name, v in edits.items()}}
    merge_conflicts = sorted(
        p for p in set(b) | set(o) | set(t) if len({b.get(p), o.get(p), t.get(p)}) == 3
    )
    expected = dict(o)
    for p in set(b) | set(t):
        if t.get(p) != b.get(p):
            expected[p] = t[p]
    written = sorted(p for p in set(expected) | set(o) if expected.get(p) != o.get(p))
    overlap = sorted(set(written) & hidden_edits)
    visible_before = {
        p: (repo / p).read_bytes() for p in o if p not in hidden_edits and (repo / p).exists()
    }

    try:
        land(sandbox, two_phase)
    except SandboxConflictError as exc:
        assert exc.conflicts == (merge_conflicts or overlap)
        assert git(repo, "rev-parse", "main") == old
        assert sandbox.status is SandboxStatus.ACTIVE
        for p, data in visible_before.items():
            assert (repo / p).read_bytes() == data
    else:
        assert not merge_conflicts
        assert not overlap
        assert tree_of(repo, "main") == expected
        for p in written:
            assert (repo / p).read_text() == text(p, f"sandbox{edits[p]}")
    assert not (dropped & commits_of(repo, "main")), "a dropped commit came back"
    for name in hidden_edits:
        assert (repo / name).read_text() == "my hidden local edit\n"
    sandbox.cleanup()
