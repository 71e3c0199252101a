"""Deleting a Sandbox never waits for its original (tier 2, real API server, local executor):
whatever the user did to the directory, repository or database file a Sandbox was made from
(removed it, put a file in its place), and whatever the operator's settings became since (other
allowed roots), the finalizer removes what the Sandbox made, under the operator's own sandbox
root and state directory, and lets the object go. The original, or what now stands in its
place, is never touched."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    db_sandbox,
    git,
    make_dir,
    make_repo,
    run_operator,
    sandbox_manifest,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, prefix="orig")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path, cleanup_kinds="sandboxes")


def made_by(operator: OperatorProcess, sandbox_id: str) -> list[Path]:
    """What the operator keeps for ``sandbox_id``: paths under its sandbox root and state
    directory that name it (copies, worktrees, upper dirs, records)."""
    found = []
    for top in (operator.work_dir / "sandboxes", operator.work_dir / "state"):
        found += [p for p in top.rglob("*") if sandbox_id in p.name]
    return found


def every_strategy(cluster: Cluster, tmp_path: Path) -> dict[str, Path]:
    """One Sandbox of each strategy the local executor runs, over its own original; returns
    each Sandbox's original by name (created, not yet Active)."""
    originals = {
        "s-git": make_repo(tmp_path / "repo", {"f.txt": "r0\n"}),
        "s-copy": make_dir(tmp_path / "data", {"g.txt": "d0\n"}),
        "s-overlay": make_dir(tmp_path / "layer", {"h.txt": "o0\n"}),
        "s-none": make_dir(tmp_path / "plain", {"n.txt": "n0\n"}),
        "s-db": tmp_path / "app.db",
    }
    with sqlite3.connect(originals["s-db"]) as connection:
        connection.execute("CREATE TABLE notes (body TEXT)")
    cluster.create(secret_manifest("db", f"sqlite:///{originals['s-db']}"))
    for name, strategy in (
        ("s-git", "git_worktree"),
        ("s-copy", "copy_on_write"),
        ("s-overlay", "overlay"),
        ("s-none", "none"),
    ):
        cluster.create(sandbox_manifest(name, "plan-o", strategy, originals[name]))
    cluster.create(db_sandbox("s-db", "plan-o", "db"))
    return originals


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def _replace_by_a_file(path: Path) -> None:
    _remove(path)
    path.write_text("the user's file\n")


@pytest.mark.parametrize(
    "change", [_remove, _replace_by_a_file], ids=["original-removed", "original-now-a-file"]
)
def test_every_strategy_is_deleted_and_cleaned_up_whatever_became_of_its_original(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path, change: Any
) -> None:
    operator.start()
    originals = every_strategy(cluster, tmp_path)
    ids = {name: cluster.wait_active(name)["sandboxId"] for name in originals}
    made = {name: made_by(operator, sandbox_id) for name, sandbox_id in ids.items()}
    assert all(made.values()), made

    for path in originals.values():
        change(path)
    cluster.kubectl("delete", "sandbox", *originals, "--wait=false")

    wait_for(
        lambda: all(cluster.gone("sandbox", name) for name in originals), 30, "every Sandbox gone"
    )
    assert {name: made_by(operator, i) for name, i in ids.items()} == {n: [] for n in ids}
    for path in originals.values():
        if change is _replace_by_a_file:
            assert path.read_text() == "the user's file\n"
        else:
            assert not path.exists()


def test_a_sandbox_outside_the_operators_new_allowed_roots_is_still_cleaned_up(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """The operator restarted with other ``NODE_PATH_ROOTS``: the Sandboxes it made before
    now have a refused spec, and their deletion still removes what they made."""
    allowed = tmp_path / "allowed"
    operator.start({"SANDBOX_OPERATOR_NODE_PATH_ROOTS": str(allowed)})
    repo = make_repo(allowed / "repo", {"f.txt": "r0\n"})
    data = make_dir(allowed / "data", {"g.txt": "d0\n"})
    cluster.create(sandbox_manifest("s-git", "plan-r", "git_worktree", repo))
    cluster.create(sandbox_manifest("s-copy", "plan-r", "copy_on_write", data))
    ids = {name: cluster.wait_active(name)["sandboxId"] for name in ("s-git", "s-copy")}
    assert all(made_by(operator, i) for i in ids.values())
    operator.stop()

    operator.start({"SANDBOX_OPERATOR_NODE_PATH_ROOTS": str(tmp_path / "elsewhere")})
    cluster.kubectl("delete", "sandbox", "s-git", "s-copy", "--wait=false")

    wait_for(
        lambda: cluster.gone("sandbox", "s-git") and cluster.gone("sandbox", "s-copy"),
        30,
        "both Sandboxes gone",
    )
    assert {name: made_by(operator, i) for name, i in ids.items()} == {n: [] for n in ids}
    assert (data / "g.txt").read_text() == "d0\n"
    assert (repo / "f.txt").read_text() == "r0\n"
    # The worktree's registration and branch went with it; the repository is as it was.
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert git(repo, "branch", "--list", "sandbox/*").strip() == ""
    assert git(repo, "status", "--porcelain") == ""
