"""git_worktree review sees a same-size edit made in the second of the worktree's checkout
(git's racy-entry check needs the index's own mtime, so the throw-away index keeps it).
Found by the PlanCommit approval test on the real API server: the review showed no path."""

from __future__ import annotations

import time
from pathlib import Path

from sandbox_core import SandboxFactory
from tests.support.gitrepo import make_repo


def test_review_sees_a_same_size_edit_made_right_after_the_checkout(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "r0\n"})
    for attempt in range(3):  # the edit lands in the checkout's second on a normal machine
        sandbox = SandboxFactory().create(
            "git_worktree", f"r{attempt}", str(repo), sandbox_root=str(tmp_path / f"sb{attempt}")
        )
        sandbox.create("plan")
        Path(sandbox.get_path("f.txt")).write_text("r1\n")  # same size as r0
        time.sleep(1.1)  # the review's index copy is made in a later second than the edit
        summary = sandbox.review()
        assert summary.changed == ["f.txt"], summary
        assert sandbox.prepare("tx-racy").digest == summary.digest
        sandbox.abort_prepared("tx-racy")
        sandbox.cleanup()
