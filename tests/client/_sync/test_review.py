# Generated from tests/client/_async/test_review.py by hack/unasync.py: do not edit.
"""``Plan.review()`` and ``Plan.approve(digest)`` against the real API server and the operator
(tier 2, local executor; issues 9 and 10): the review waits at AwaitingApproval with the plan's
changes and digest, a wrong digest is refused and the PlanCommit keeps waiting, the right one
commits exactly the reviewed changes. Written once, for the async client; hack/unasync.py
generates the blocking client's copy. ``kubectl sandbox review`` / ``approve``:
tests/client/test_plugin.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_client import NotFoundError, PlanCommitPhase
from sandbox_client.client import Plan, SandboxClient
from tests.support.client import ClientEnv, three_sources

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

WRONG = "sha256:" + "0" * 64


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as connected:
        yield connected


def test_review_then_a_wrong_digest_waits_and_the_reviewed_digest_commits(
    client: SandboxClient, tmp_path: Path
) -> None:
    sources = three_sources(tmp_path)
    with Plan(client, "rev-plan", client.namespace) as plan:
        data = plan.add_sandbox("data", "copy_on_write", str(sources["data"]))
        plan.wait_ready(timeout=90)
        with pytest.raises(NotFoundError):
            plan.approve(WRONG)  # nothing reviewed yet
        data.write_file("new.txt", "n1\n")
        review = plan.review(timeout=90)
        assert review.phase is PlanCommitPhase.AWAITING_APPROVAL
        assert review.digest.startswith("sha256:") and not review.has_conflicts
        [row] = review.sandboxes
        assert (row.name, row.strategy, row.added) == (data.name, "copy_on_write", 1)
        assert "A new.txt" in row.paths
        again = plan.review(timeout=30)
        assert again.plancommit == review.plancommit  # the waiting one again
        assert not (sources["data"] / "new.txt").exists()

        refused = plan.approve(WRONG, wait=False)
        assert not refused.done
        approved = client.wait(
            "plancommits",
            lambda objs: (
                objs[review.plancommit]
                if any(
                    c.get("type") == "Approved" and c.get("reason") == "DigestMismatch"
                    for c in objs[review.plancommit].get("status", {}).get("conditions") or []
                )
                else None
            ),
            60,
            "DigestMismatch",
            name=review.plancommit,
        )
        assert approved["status"]["phase"] == "AwaitingApproval"
        assert not (sources["data"] / "new.txt").exists()

        result = plan.approve(review.digest, timeout=90)
        assert result.committed, result.conditions
        assert (sources["data"] / "new.txt").read_text() == "n1\n"
