# Generated from tests/client/_async/test_review.py by hack/unasync.py: do not edit.
"""``Plan.review()``, ``pending()`` and ``Plan.approve(digest)`` against the real API server and
the operator (tier 2, local executor): the review waits at AwaitingApproval with the plan's
changes and digest and names its creator; a digest that is not the reviewed one is refused by
the client with nothing recorded; the creator's own approval is recorded but never counts; the
reviewed digest approved by another person (alice, impersonated) commits exactly the reviewed
changes and the PlanCommit names her. Written once, for the async client; hack/unasync.py
generates the blocking client's copy. ``kubectl sandbox review`` / ``approve``:
tests/client/test_plugin.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_client import NotFoundError, PlanCommitPhase, RefusedError
from sandbox_client.client import Plan, SandboxClient
from tests.support.approvals import grant_plancommit_rights
from tests.support.client import ClientEnv, three_sources

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

WRONG = "sha256:" + "0" * 64
ADMIN = "sandbox-test-admin"


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as connected:
        yield connected


def test_review_then_a_wrong_digest_is_refused_and_another_person_commits_it(
    client: SandboxClient, env: ClientEnv, tmp_path: Path
) -> None:
    grant_plancommit_rights(env.cluster)
    sources = three_sources(tmp_path)
    assert (client.whoami()).user == ADMIN
    with Plan(client, "rev-plan", client.namespace) as plan:
        data = plan.add_sandbox("data", "copy_on_write", str(sources["data"]))
        plan.wait_ready(timeout=90)
        with pytest.raises(NotFoundError):
            plan.approve(WRONG)  # nothing reviewed yet
        data.write_file("new.txt", "n1\n")
        review = plan.review(timeout=90)
        assert review.phase is PlanCommitPhase.AWAITING_APPROVAL
        assert review.digest.startswith("sha256:") and not review.has_conflicts
        assert review.created_by == ADMIN
        [row] = review.sandboxes
        assert (row.name, row.strategy, row.added) == (data.name, "copy_on_write", 1)
        assert "A new.txt" in row.paths
        again = plan.review(timeout=30)
        assert again.plancommit == review.plancommit  # the waiting one again
        assert not (sources["data"] / "new.txt").exists()
        [waiting] = plan.pending()
        assert (waiting.plancommit, waiting.digest, waiting.approvals) == (
            review.plancommit,
            review.digest,
            [],
        )

        with pytest.raises(RefusedError) as refused:
            plan.approve(WRONG, wait=False)
        assert refused.value.reason == "DigestMismatch"
        mine = plan.approve(review.digest, timeout=60)  # the creator's: seen, not counted
        assert not mine.done and mine.phase is PlanCommitPhase.AWAITING_APPROVAL
        [decision] = (client.plancommit_review(review.plancommit)).approvals
        assert (decision.user, decision.counted, decision.reason) == (ADMIN, False, "Creator")
        assert not (sources["data"] / "new.txt").exists()

        with SandboxClient(
            kubeconfig=env.kubeconfig, namespace=env.namespace, impersonate="alice"
        ) as alice:
            assert (alice.whoami()).user == "alice"
            result = Plan(alice, "rev-plan", client.namespace).approve(
                review.digest, timeout=90
            )
        assert result.committed, result.conditions
        assert result.raw["status"]["approvedBy"] == "alice"
        assert result.raw["spec"]["approvals"][-1]["user"] == "alice"
        assert (sources["data"] / "new.txt").read_text() == "n1\n"
        assert plan.pending() == []
