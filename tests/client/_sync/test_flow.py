# Generated from tests/client/_async/test_flow.py by hack/unasync.py: do not edit.
"""The client against the real API server and the operator (tier 2, local executor).

Issue 10, "Done means": a plan of three Sandboxes of different strategies on real sources,
writes through the client, diff, checkpoint and restore, rollback, commit, a failing commit
surfaced as a typed result with the rolled-back ids, typed errors, cleanup. Written once, for the
async client; hack/unasync.py generates the blocking client's copy of this module.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_client import (
    ConflictError,
    NotFoundError,
    RefusedError,
    SandboxPhase,
    WaitTimeoutError,
)
from sandbox_client.client import Plan, SandboxClient
from tests.support.client import ClientEnv, make_dir, make_repo, three_sources
from tests.support.operator import Cluster, git

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as connected:
        yield connected


def test_plan_of_three_strategies_write_diff_checkpoint_restore_commit_cleanup(
    client: SandboxClient, tmp_path: Path
) -> None:
    sources = three_sources(tmp_path)
    with Plan(client, "flow-ok", client.namespace) as plan:
        repo = plan.add_sandbox("repo", "git_worktree", sources["repo"])
        data = plan.add_sandbox("data", "copy_on_write", str(sources["data"]))
        layer = plan.add_sandbox("layer", "overlay", sources["layer"])
        infos = plan.wait_ready(timeout=90)
        assert {i.name for i in infos} == {repo.name, data.name, layer.name}
        assert all(i.phase is SandboxPhase.ACTIVE and i.ready for i in infos)
        assert {i.spec.strategy for i in infos} == {"git_worktree", "copy_on_write", "overlay"}
        paths = {i.name: Path(i.sandbox_path) for i in infos}

        repo.write_file("src/app.py", "print('v1')\n")
        repo.write_file("docs/new.md", "new\n")  # untracked in the worktree
        data.write_file("new/n.txt", b"n1\n")
        layer.write_file("o.txt", "o1\n")
        assert repo.read_file("src/app.py") == "print('v1')\n"
        assert data.read_bytes("new/n.txt") == b"n1\n"
        assert (sources["repo"] / "src/app.py").read_text() == "print('v0')\n"  # original as was
        assert not (sources["data"] / "new").exists()
        assert data.list_files() == ["g.txt", "new/n.txt", "sub/h.txt"]
        assert data.list_files("sub") == ["sub/h.txt"]
        assert ".git" not in " ".join(repo.list_files())

        repo_diff = repo.diff()
        assert "-print('v0')" in repo_diff and "+print('v1')" in repo_diff
        assert "b/docs/new.md" in repo_diff
        # The diff used a private index: the worktree's own index still has nothing staged.
        assert git(paths[repo.name], "diff", "--cached", "--name-only") == ""
        assert "b/new/n.txt" in data.diff() and "+o1" in layer.diff()

        checkpoint = data.checkpoint("after_write", {"step": "1"})
        assert checkpoint.phase == "Ready" and checkpoint.kind == "directory-snapshot"
        data.write_file("g.txt", "broken\n")
        data.write_file("new/n.txt", "broken\n")
        restored = data.restore(checkpoint)
        assert restored.phase is SandboxPhase.ACTIVE
        assert data.read_file("g.txt") == "d0\n"
        assert data.read_file("new/n.txt") == "n1\n"

        tag = repo.checkpoint("before_bad_edit")
        assert tag.kind == "git-tag"
        repo.write_file("src/app.py", "print('bad')\n")
        repo.restore(tag.name)
        assert repo.read_file("src/app.py") == "print('v1')\n"

        layer.rollback()
        assert layer.read_file("o.txt") == "o0\n"
        layer.write_file("o.txt", "o2\n")

        progress: list[str] = []
        result = plan.commit(
            message="apply flow-ok", on_progress=lambda r: progress.append(r.phase.value)
        )
        assert result.committed and result.done, result
        assert result.rolled_back_ids == [] and result.failed_rollback_ids == []
        assert [s.state.value for s in result.steps] == ["Committed"] * 3
        assert all(r.success for r in result.results)
        committed = result.condition("Committed")
        assert committed is not None and committed.status == "True"
        assert progress and progress[-1] == "Committed"
        assert (sources["repo"] / "src/app.py").read_text() == "print('v1')\n"
        assert (sources["repo"] / "docs/new.md").read_text() == "new\n"
        assert git(sources["repo"], "log", "-1", "--format=%s") == "apply flow-ok"
        assert (sources["data"] / "new/n.txt").read_text() == "n1\n"
        assert (sources["layer"] / "o.txt").read_text() == "o2\n"

        history = data.history()
        kinds = [h.kind for h in history]
        assert kinds[0] == "commit" and "restore" in kinds and "checkpoint" in kinds
        assert [h.time for h in history] == sorted((h.time for h in history), reverse=True)
        names = [s.name for s in plan.sandboxes()]
    # The context manager deleted the Sandboxes; the finalizers removed their artefacts.
    assert client.list_sandboxes(plan_id="flow-ok") == []
    for name in names:
        with pytest.raises(NotFoundError):
            client.get_sandbox(name)
    assert not any(p.exists() for p in paths.values())
    assert client.list_checkpoints(sandbox=data.name) == []
    assert (sources["data"] / "new/n.txt").read_text() == "n1\n"  # cleanup never undoes a commit


def test_failed_commit_is_a_typed_result_with_the_rolled_back_ids(
    client: SandboxClient, tmp_path: Path
) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    repo = make_repo(tmp_path / "repo", {"f.txt": "line1\n"})
    plan = Plan(client, "flow-bad", client.namespace)
    copy = plan.add_sandbox("data", "copy_on_write", data)
    worktree = plan.add_sandbox("repo", "git_worktree", repo)
    plan.wait_ready(timeout=90)
    copy.write_file("g.txt", "d1\n")
    worktree.write_file("f.txt", "sandbox\n")
    (repo / "f.txt").write_text("main\n")  # the original moves on: a merge conflict (case 03)
    git(repo, "commit", "-qam", "main moved")
    head = git(repo, "rev-parse", "HEAD")

    result = plan.commit(timeout=120, mode="Saga")  # compensation: the saga

    assert not result.committed and result.done
    assert result.phase.value == "Failed"
    copy_info, git_info = copy.info(), worktree.info()
    copy_id, git_id = copy_info.sandbox_id, git_info.sandbox_id
    assert result.rolled_back_ids == [copy_id]
    assert result.failed_rollback_ids == []
    assert result.failed_sandbox_id == git_id
    condition = result.condition("Committed")
    assert condition is not None and condition.status == "False"
    assert condition.reason in ("Conflict", "SandboxCommitFailed")
    assert worktree.name in condition.message
    rolled = result.condition("RolledBack")
    assert rolled is not None and copy_id in rolled.message
    assert (data / "g.txt").read_text() == "d0\n"  # compensated
    assert git(repo, "rev-parse", "HEAD") == head  # the original is exactly as it was
    assert [c.name for c in plan.commits()] == [result.name]
    history = client.history(worktree.name)
    assert history[0].outcome == "Failed"

    plan.delete(cleanup=True)
    assert plan.sandboxes() == [] and plan.commits() == []


def test_paths_that_leave_the_sandbox_are_refused(
    client: SandboxClient, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    repo = make_repo(tmp_path / "repo", {"f.txt": "x\n"})
    with Plan(client, "flow-paths", client.namespace) as plan:
        copy = plan.add_sandbox("data", "copy_on_write", data)
        worktree = plan.add_sandbox("repo", "git_worktree", repo)
        plan.wait_ready(timeout=90)
        info = copy.info()
        root = Path(info.sandbox_path)
        (root / "escape").symlink_to(outside)
        (root / "passwd-link").symlink_to("/etc/passwd")
        for path in ("../x", "/etc/passwd", "a/../../x", "escape/x", "passwd-link", "a\x00b"):
            with pytest.raises(RefusedError) as refused:
                copy.write_file(path, "no\n")
            assert refused.value.reason == "PathTraversal", path
            with pytest.raises(RefusedError):
                copy.read_file(path)
        with pytest.raises(RefusedError):
            copy.list_files("..")
        with pytest.raises(RefusedError) as reserved:
            worktree.write_file(".git/config", "no\n")
        assert reserved.value.reason == "ReservedPath"
        with pytest.raises(RefusedError) as directory:
            copy.write_file("", "no\n")
        assert directory.value.reason == "InvalidState"
        assert list(outside.iterdir()) == []
        assert sorted(p.name for p in data.iterdir()) == ["g.txt"]
        with pytest.raises(NotFoundError):
            copy.read_file("missing.txt")


def test_typed_errors_carry_the_reason_and_message(
    client: SandboxClient, tmp_path: Path
) -> None:
    with pytest.raises(NotFoundError) as missing:
        client.sandbox("no-such-sandbox").info()
    assert missing.value.reason == "NotFound"
    plan = Plan(client, "flow-errors", client.namespace)
    with pytest.raises(RefusedError) as invalid:
        plan.add_sandbox("rel", "copy_on_write", "relative/path")  # CEL: must be absolute
    assert invalid.value.reason == "Invalid" and "absolute" in invalid.value.message
    with pytest.raises(RefusedError) as bad_strategy:
        plan.add_sandbox("x", "no_such_strategy", str(tmp_path))
    assert bad_strategy.value.reason == "Invalid"
    gone = plan.add_sandbox("gone", "copy_on_write", tmp_path / "does-not-exist")
    with pytest.raises(ConflictError) as exists:
        plan.add_sandbox("gone", "copy_on_write", tmp_path / "does-not-exist")
    assert exists.value.reason == "AlreadyExists"
    with pytest.raises(RefusedError) as errored:
        gone.wait_ready(timeout=60)
    assert errored.value.reason == "SandboxCreationFailed"
    assert "does-not-exist" in errored.value.message
    plan.delete(cleanup=True)


def test_wait_ends_with_a_timeout_error_naming_the_last_state(
    local_apiserver: Any, tmp_path: Path
) -> None:
    """No operator watches this namespace: the watch must give up at the deadline."""
    cluster = Cluster.fresh(local_apiserver, prefix="clnoop")
    with SandboxClient(
        kubeconfig=str(local_apiserver.kubeconfig_path), namespace=cluster.namespace
    ) as client:
        plan = Plan(client, "never-ready", keep=True)
        plan.add_sandbox("data", "copy_on_write", make_dir(tmp_path / "d", {"a": "1\n"}))
        with pytest.raises(WaitTimeoutError) as timeout:
            plan.wait_ready(timeout=2)
        assert timeout.value.reason == "Timeout"
        assert "never-ready-data: no phase" in timeout.value.message
        assert isinstance(timeout.value, TimeoutError)
        with pytest.raises(WaitTimeoutError):
            plan.commit(timeout=1)
        # No finalizer was ever added (no operator), so deletion is immediate.
        plan.delete(cleanup=True, timeout=30)
        assert plan.sandboxes() == []


def test_client_reads_namespace_and_context_from_kubeconfig(
    local_apiserver: Any, tmp_path: Path
) -> None:
    config = tmp_path / "kubeconfig"
    original = Path(local_apiserver.kubeconfig_path).read_text()
    config.write_text(original)
    subprocess.run(
        [
            "kubectl",
            "--kubeconfig",
            str(config),
            "config",
            "set-context",
            "--current",
            "--namespace",
            "team-a",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, **local_apiserver.env()},
    )
    with SandboxClient(kubeconfig=str(config)) as client:
        assert client.namespace == "team-a"
    with SandboxClient(kubeconfig=str(config), namespace="other") as client:
        assert client.namespace == "other"
