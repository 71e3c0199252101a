"""Deleting a Sandbox never waits for its original (tier 2, real API server, local executor):
whatever the user did to the directory, repository or database file a Sandbox was made from
(removed it, put a file in its place), whatever the actor put in place of its own sandbox
directory (a file, a link to the original), and whatever the operator's settings became since
(other allowed roots), the finalizers of the Sandbox and its Checkpoints remove what they made,
under the operator's own sandbox root and state directory, and let the objects go. The
original, or what now stands in its place, is never touched."""

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
    checkpoint_manifest,
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
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _replace_by_a_file(path: Path) -> None:
    _remove(path)
    path.write_text("the user's file\n")


CHANGES = {
    "s-git": _replace_by_a_file,
    "s-copy": _remove,
    "s-overlay": _replace_by_a_file,
    "s-none": _remove,
    "s-db": _replace_by_a_file,
}
"""What the user did to each original (both fates for files, directories and repositories)."""


def test_every_strategy_and_its_checkpoints_are_deleted_whatever_became_of_its_original(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    originals = every_strategy(cluster, tmp_path)
    ids = {name: cluster.wait_active(name)["sandboxId"] for name in originals}
    made = {name: made_by(operator, sandbox_id) for name, sandbox_id in ids.items()}
    assert all(made.values()), made
    snapshotted = ("s-git", "s-copy", "s-overlay", "s-none")
    for name in snapshotted:
        cluster.create(checkpoint_manifest(f"c-{name}", name))
    for name in snapshotted:
        assert (
            cluster.wait_phase("checkpoint", f"c-{name}", {"Ready", "Failed"})["phase"] == "Ready"
        )

    for name, path in originals.items():
        CHANGES[name](path)
    # The Checkpoints first, while their Sandboxes are still there; then the Sandboxes.
    cluster.kubectl("delete", "checkpoint", *(f"c-{name}" for name in snapshotted), "--wait=false")
    wait_for(
        lambda: all(cluster.gone("checkpoint", f"c-{name}") for name in snapshotted),
        30,
        "every Checkpoint gone",
    )
    assert list((operator.work_dir / "state" / "checkpoints").rglob("*.json")) == []
    cluster.kubectl("delete", "sandbox", *originals, "--wait=false")

    wait_for(
        lambda: all(cluster.gone("sandbox", name) for name in originals), 30, "every Sandbox gone"
    )
    assert {name: made_by(operator, i) for name, i in ids.items()} == {n: [] for n in ids}
    for name, path in originals.items():
        if CHANGES[name] is _replace_by_a_file:
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


def test_a_worktree_sandbox_is_deleted_whatever_its_actor_put_in_place_of_its_directory(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """The actor removed its git worktree and left a file there, or a link to the original:
    the finalizer removes the file or the link (never following it) and the registration."""
    operator.start()
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    cluster.create(sandbox_manifest("s-file", "plan-a", "git_worktree", repo, "file"))
    cluster.create(sandbox_manifest("s-link", "plan-a", "git_worktree", repo, "link"))
    paths = {name: Path(cluster.wait_active(name)["sandboxPath"]) for name in ("s-file", "s-link")}
    for path in paths.values():
        shutil.rmtree(path)
    paths["s-file"].write_text("the actor's file\n")
    paths["s-link"].symlink_to(repo)

    cluster.kubectl("delete", "sandbox", "s-file", "s-link", "--wait=false")

    wait_for(
        lambda: cluster.gone("sandbox", "s-file") and cluster.gone("sandbox", "s-link"),
        30,
        "both Sandboxes gone",
    )
    assert [p for p in paths.values() if p.exists() or p.is_symlink()] == []
    assert (repo / "f.txt").read_text() == "r0\n"
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert git(repo, "branch", "--list", "sandbox/*").strip() == ""
    assert git(repo, "status", "--porcelain") == ""


def _records(operator: OperatorProcess) -> set[str]:
    """Ids of the checkpoints the operator keeps (one record each)."""
    return {p.stem for p in (operator.work_dir / "state" / "checkpoints").rglob("*.json")}


def test_a_checkpoint_deletes_its_own_snapshot_whatever_its_status_says(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """The snapshot is found by the Checkpoint's uid, not by ``status.checkpointId``: a status
    that lost the id (a write that never landed, a status wiped) still deletes the snapshot, and
    one that names another Checkpoint's snapshot never deletes that one."""
    operator.start()
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    cluster.create(sandbox_manifest("s-copy", "plan-c", "copy_on_write", data))
    cluster.wait_active("s-copy")
    names = ("c-lost", "c-forged", "c-kept")
    for name in names:
        cluster.create(checkpoint_manifest(name, "s-copy"))
    ids = {
        name: cluster.wait_phase("checkpoint", name, {"Ready", "Failed"})["checkpointId"]
        for name in names
    }
    assert _records(operator) == set(ids.values())
    cluster.kubectl(
        "patch", "checkpoint", "c-lost", "--subresource=status", "--type=json",
        "-p", '[{"op": "remove", "path": "/status/checkpointId"}]',
    )  # fmt: skip
    cluster.kubectl(
        "patch", "checkpoint", "c-forged", "--subresource=status", "--type=merge",
        "-p", f'{{"status": {{"checkpointId": "{ids["c-kept"]}"}}}}',
    )  # fmt: skip

    cluster.kubectl("delete", "checkpoint", "c-lost", "c-forged", "--wait=false")

    wait_for(
        lambda: cluster.gone("checkpoint", "c-lost") and cluster.gone("checkpoint", "c-forged"),
        30,
        "both Checkpoints gone",
    )
    assert _records(operator) == {ids["c-kept"]}
