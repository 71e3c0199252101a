"""Sandboxes and checkpoints outlive the process that made them (DESIGN.md: re-openable).

Each step runs in its own Python process, sharing only the state directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def run_step(code: str, **values: Any) -> Any:
    """Run ``code`` in a fresh interpreter with ``values`` as globals; return its JSON output."""
    prelude = "import json, sys\nvalues = json.loads(sys.argv[1])\nglobals().update(values)\n"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), json.dumps(values)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(key, "t")
    for key in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(key, "t@example.invalid")
    original = tmp_path / "D"
    original.mkdir()
    (original / "g").write_text("d0\n")
    repo = tmp_path / "R"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "base"]):
        if args[0] == "add":
            (repo / "f").write_text("r0\n")
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    return {
        "state_dir": str(tmp_path / "state"),
        "root": str(tmp_path / "sandboxes"),
        "original": str(original),
        "repo": str(repo),
    }


CREATE = """
from sandbox_core import SandboxFactory, SandboxStore
from sandbox_core.host.manager import SandboxManager
manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(state_dir))
cow = manager.get_or_create_sandbox("plan-x", "D", original, "copy_on_write", sandbox_root=root)
open(cow.get_path("g"), "w").write("d1\\n")
git = manager.get_or_create_sandbox("plan-x", "R", repo, "git_worktree", sandbox_root=root)
open(git.get_path("f"), "w").write("r1\\n")
manager.persist("plan-x")
print(json.dumps({"D": cow.sandbox_id, "R": git.sandbox_id}))
"""

REOPEN_AND_COMMIT = """
from sandbox_core import SandboxStore
from sandbox_core.host.manager import SandboxManager
manager = SandboxManager.load(SandboxStore(state_dir))
sandboxes = manager.list_sandboxes("plan-x")
found = {sb.resource_id: [sb.sandbox_id, sb.status.value] for sb in sandboxes}
edited = open(manager.get_sandbox("plan-x", "D").get_path("g")).read()
results = manager.commit_all("plan-x")
print(json.dumps({"found": found, "edited": edited, "results": [r.success for r in results]}))
"""

CLEANUP = """
from sandbox_core import SandboxStore
from sandbox_core.host.manager import SandboxManager
manager = SandboxManager.load(SandboxStore(state_dir))
statuses = sorted(sb.status.value for sb in manager.list_sandboxes("plan-x"))
cleaned = manager.cleanup_abandoned()
print(json.dumps({"statuses": statuses, "cleaned": cleaned,
                  "left": SandboxStore(state_dir).records("plan-x")}))
"""


def test_sandboxes_reopen_in_another_process_and_commit(workspace: dict[str, str]) -> None:
    ids = run_step(CREATE, **workspace)
    # Nothing reached the originals yet.
    assert Path(workspace["original"], "g").read_text() == "d0\n"
    assert Path(workspace["repo"], "f").read_text() == "r0\n"

    second = run_step(REOPEN_AND_COMMIT, **workspace)
    assert second["found"] == {"D": [ids["D"], "active"], "R": [ids["R"], "active"]}
    assert second["edited"] == "d1\n"
    assert second["results"] == [True, True]
    assert Path(workspace["original"], "g").read_text() == "d1\n"
    assert Path(workspace["repo"], "f").read_text() == "r1\n"

    third = run_step(CLEANUP, **workspace)
    assert third == {"statuses": ["committed", "committed"], "cleaned": 2, "left": []}
    assert list(Path(workspace["root"]).rglob("g")) == []


CHECKPOINT = """
from sandbox_core import SandboxStore
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.host.manager import SandboxManager
manager = SandboxManager.load(SandboxStore(state_dir))
checkpoints = CheckpointManager(state_dir=state_dir)
made = {}
for resource_id in ("D", "R"):
    sandbox = manager.get_sandbox("plan-x", resource_id)
    made[resource_id] = checkpoints.create_checkpoint(sandbox, "plan-x", "pre_apply").model_dump(
        mode="json")
open(manager.get_sandbox("plan-x", "D").get_path("g"), "w").write("broken\\n")
open(manager.get_sandbox("plan-x", "R").get_path("f"), "w").write("broken\\n")
open(manager.get_sandbox("plan-x", "R").get_path("extra"), "w").write("x\\n")
print(json.dumps(made))
"""

RESTORE = """
from sandbox_core import SandboxFactory, SandboxStore
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.host.manager import SandboxManager
store = SandboxStore(state_dir)
manager = SandboxManager.load(store)
checkpoints = CheckpointManager(state_dir=state_dir, sandbox_resolver=manager.find_sandbox)
restored = {}
for resource_id in ("D", "R"):
    sandbox = manager.get_sandbox("plan-x", resource_id)
    [checkpoint] = checkpoints.list_checkpoints(sandbox.sandbox_id)
    restored[resource_id] = checkpoints.rollback_to(checkpoint)
d = manager.get_sandbox("plan-x", "D")
r = manager.get_sandbox("plan-x", "R")
import os
print(json.dumps({"restored": restored, "g": open(d.get_path("g")).read(),
                  "f": open(r.get_path("f")).read(), "extra": os.path.exists(r.get_path("extra"))}))
"""


def test_checkpoints_restore_from_another_process(workspace: dict[str, str]) -> None:
    run_step(CREATE, **workspace)
    made = run_step(CHECKPOINT, **workspace)
    assert made["D"]["metadata"]["checkpoint_kind"] == "directory"
    assert made["R"]["metadata"]["checkpoint_kind"] == "git_ref"
    assert made["R"]["snapshot_path"] == ""
    assert Path(made["D"]["snapshot_path"], "g").read_text() == "d1\n"

    after = run_step(RESTORE, **workspace)
    assert after == {"restored": {"D": True, "R": True}, "g": "d1\n", "f": "r1\n", "extra": False}
    # The originals were never touched by checkpoints.
    assert Path(workspace["original"], "g").read_text() == "d0\n"
    assert Path(workspace["repo"], "f").read_text() == "r0\n"
