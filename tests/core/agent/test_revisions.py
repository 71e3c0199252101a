"""A sandbox's revision (the counter callers put into request ids) survives a restart of the
agent and goes on from where the last process left it; a cleanup forgets it."""

from __future__ import annotations

from pathlib import Path

from sandbox_core.agent.operations import AgentConfig, Operations
from tests.support.gitrepo import make_repo

SID = "01HZX0A7Q3J0F8K2M4N6P8R0T9"


def operations(tmp_path: Path) -> Operations:
    return Operations(
        AgentConfig(state_dir=tmp_path / "state", sandbox_root=tmp_path / "sb", environ={})
    )


def test_the_revision_goes_on_across_a_restart_and_a_cleanup_forgets_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "x\n"})
    first = operations(tmp_path)
    body = {"plan_id": "p", "resource_id": "r", "strategy": "copy_on_write",
            "original": str(repo), "sandbox_id": SID}  # fmt: skip
    created = first.create(body)["revision"]
    first.put_bytes(SID, "a.txt", b"1", False)
    first.read_text(SID, "a.txt", 0, None)  # a read is not a change
    assert first.revision(SID) == created + 1
    again = operations(tmp_path)  # a restarted agent reads what the last one wrote
    assert again.revision(SID) == created + 1
    again.put_bytes(SID, "a.txt", b"2", True)
    assert (again.revision(SID), operations(tmp_path).revision(SID)) == (created + 2, created + 2)
    again.cleanup(SID)
    assert again.revision(SID) == 0 and operations(tmp_path).revision(SID) == 0
    assert again.create(body)["revision"] == created
