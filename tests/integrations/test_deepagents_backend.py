"""The Deep Agents backend keeps the product's promises: writes land in the sandbox only, reach
the original through the plan's commit, and never escape the sandbox's root."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_client.integrations.deepagents import SandboxBackend
from sandbox_core.actor.actions import LocalActions
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.store import SandboxStore
from sandbox_core.paths import relative_to_root


def test_an_agents_writes_reach_the_original_only_through_the_commit(
    actions: LocalActions, tmp_path: Path
) -> None:
    backend = SandboxBackend(actions)
    original = tmp_path / "original"
    assert backend.write(f"{backend.root}/notes.md", "from the agent\n").error is None
    assert backend.edit(f"{backend.root}/README.md", "original", "edited").error is None
    ran = backend.execute("echo built > build.txt && cat README.md")
    assert (ran.exit_code, ran.output) == (0, "the edited\n")
    assert sorted(p.name for p in original.iterdir()) == ["README.md"]
    assert (original / "README.md").read_text() == "the original\n"

    host = SandboxHost(SandboxStore(tmp_path / "state"))
    sandbox = host.reopen(actions.sandbox_id)
    sandbox.commit()
    host.save(sandbox)
    assert (original / "README.md").read_text() == "the edited\n"
    assert (original / "notes.md").read_text() == "from the agent\n"
    assert (original / "build.txt").read_text() == "built\n"


@pytest.mark.parametrize(
    "path",
    ["relative.txt", "/etc/passwd", "{root}/../escape.txt", "{root}"],
)
def test_paths_outside_the_sandbox_are_refused(actions: LocalActions, path: str) -> None:
    backend = SandboxBackend(actions)
    target = path.format(root=backend.root)
    [uploaded] = backend.upload_files([(target, b"x")])
    [downloaded] = backend.download_files([target])
    assert uploaded.error == "invalid_path"
    assert (downloaded.content, downloaded.error) == (None, "invalid_path")
    assert not Path(backend.root).parent.joinpath("escape.txt").exists()


def test_an_agent_cannot_write_git_control_files(actions: LocalActions) -> None:
    backend = SandboxBackend(actions)
    [uploaded] = backend.upload_files([(f"{backend.root}/.git/config", b"[core]\n")])
    assert uploaded.error == "invalid_path"
    assert not Path(backend.root, ".git").exists()


def test_a_failed_file_does_not_stop_the_batch(actions: LocalActions) -> None:
    backend = SandboxBackend(actions)
    root = backend.root
    results = backend.upload_files([(f"{root}/a.txt", b"a"), ("/etc/x", b"x"), (f"{root}/b", b"b")])
    assert [r.error for r in results] == [None, "invalid_path", None]
    got = backend.download_files([f"{root}/missing", f"{root}/a.txt", f"{root}"])
    assert [(r.content, r.error) for r in got] == [
        (None, "file_not_found"),
        (b"a", None),
        (None, "invalid_path"),
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "/", "c.txt"]), max_size=6))
def test_relative_to_root_never_leaves_the_root(parts: list[str]) -> None:
    root = "/srv/sandbox/tree"
    path = root + "/" + "/".join(parts)
    rel = relative_to_root(root, path)
    if rel is not None:
        assert not rel.startswith("/") and ".." not in rel.split("/") and rel not in ("", ".")
