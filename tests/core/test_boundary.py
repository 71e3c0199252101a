"""Boundary algebra (seed 002): resources sharing a boundary share one sandbox."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sandbox_core import SandboxFactory
from sandbox_core.boundary import Resource, ResourceRegistry
from sandbox_core.host.manager import SandboxManager


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(key, "t")
    for key in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(key, "t@example.invalid")
    path = tmp_path / "repo"
    (path / "src").mkdir(parents=True)
    (path / "src" / "a.py").write_text("a = 1\n")
    (path / "src" / "b.py").write_text("b = 1\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "."], check=True)
    subprocess.run(["git", "-C", str(path), "commit", "-qm", "base"], check=True)
    return path


@pytest.fixture
def manager() -> SandboxManager:
    return SandboxManager(SandboxFactory(), cleanup_on_exit=False)


def test_two_files_in_one_repository_share_one_sandbox(
    repo: Path, tmp_path: Path, manager: SandboxManager
) -> None:
    root = str(tmp_path / "sandboxes")
    registry = ResourceRegistry(
        [
            Resource(
                "repo",
                str(repo),
                sandbox_strategy="git_worktree",
                sandbox_options={"sandbox_root": root},
            ),
            Resource("src", str(repo / "src"), parent_id="repo"),
            Resource("a", str(repo / "src" / "a.py"), parent_id="src"),
            Resource("b", str(repo / "src" / "b.py"), parent_id="src", sandbox_strategy="inherit"),
        ]
    )
    file_a, file_b = registry.get("a"), registry.get("b")
    assert manager.resolve_sandbox_key(file_a, registry) == "repo"
    assert manager.resolve_sandbox_key(file_b, registry) == "repo"
    sandbox_a = manager.get_or_create_sandbox_for_resource("plan-1", file_a, registry)
    sandbox_b = manager.get_or_create_sandbox_for_resource("plan-1", file_b, registry)
    assert sandbox_a is sandbox_b
    assert sandbox_a.strategy == "git_worktree"
    assert sandbox_a.context.original_path == str(repo)
    assert manager.list_sandboxes("plan-1") == [sandbox_a]

    Path(sandbox_a.get_path("src/a.py")).write_text("a = 2\n")
    Path(sandbox_b.get_path("src/b.py")).write_text("b = 2\n")
    assert [r.success for r in manager.commit_all("plan-1")] == [True]
    assert (repo / "src" / "a.py").read_text() == "a = 2\n"
    assert (repo / "src" / "b.py").read_text() == "b = 2\n"
    manager.cleanup_all("plan-1")


def test_the_top_most_boundary_wins(tmp_path: Path, manager: SandboxManager) -> None:
    outer = tmp_path / "outer"
    (outer / "inner").mkdir(parents=True)
    registry = ResourceRegistry(
        [
            Resource("outer", str(outer), sandbox_strategy="none"),
            Resource(
                "inner", str(outer / "inner"), parent_id="outer", sandbox_strategy="copy_on_write"
            ),
            Resource("file", str(outer / "inner" / "x"), parent_id="inner"),
        ]
    )
    assert manager.resolve_sandbox_key(registry.get("file"), registry) == "outer"
    assert manager.resolve_sandbox_key(registry.get("inner"), registry) == "outer"


def test_boundary_cache_is_used_until_cleared(tmp_path: Path, manager: SandboxManager) -> None:
    registry = ResourceRegistry(
        [
            Resource("dir", str(tmp_path), sandbox_strategy="none"),
            Resource("file", str(tmp_path / "x"), parent_id="dir"),
        ]
    )
    file = registry.get("file")
    assert manager.resolve_sandbox_key(file, registry) == "dir"
    registry.add(Resource("dir", str(tmp_path)))  # the resource graph changes
    registry.add(Resource("file", str(tmp_path / "x"), parent_id="dir", sandbox_strategy="none"))
    assert manager.resolve_sandbox_key(file, registry) == "dir"  # cached
    manager.clear_boundary_cache()
    assert manager.resolve_sandbox_key(registry.get("file"), registry) == "file"


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            [Resource("a", "/x", parent_id="missing")],
            "parent resource missing of a is not registered",
        ),
        (
            [Resource("a", "/x", parent_id="b"), Resource("b", "/y", parent_id="a")],
            "resource parent chain has a cycle at a",
        ),
        ([Resource("a", "/x")], "resource a has no sandbox strategy and no ancestor with one"),
    ],
)
def test_broken_resource_graphs_are_refused(
    manager: SandboxManager, resources: list[Resource], message: str
) -> None:
    registry = ResourceRegistry(resources)
    with pytest.raises(ValueError, match=message):
        manager.resolve_sandbox_key(resources[0], registry)
