"""``Plan.review()`` and ``Plan.approve(digest)`` (sync and async) and ``kubectl sandbox review`` /
``approve`` against the real API server and the operator (tier 2, local executor; issues 9 and
10): the review waits at AwaitingApproval with the plan's changes and digest, a wrong digest is
refused and the PlanCommit keeps waiting, the right one commits exactly the reviewed changes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sandbox_client import NotFoundError, Plan, PlanCommitPhase, SandboxClient, aio
from sandbox_client.kubectl_plugin import EXIT_OK, EXIT_REFUSED, cli
from tests.apiserver.fixtures import local_apiserver  # noqa: F401 - pytest fixture
from tests.client_support import ClientEnv, client_env_for, three_sources

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

WRONG = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def env(local_apiserver: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientEnv]:  # noqa: F811
    yield from client_env_for(local_apiserver, tmp_path_factory.mktemp("operator"), "clrev")


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as connected:
        yield connected


def test_review_then_a_wrong_digest_waits_and_the_reviewed_digest_commits(
    client: SandboxClient, tmp_path: Path
) -> None:
    sources = three_sources(tmp_path)
    with Plan(client, "rev-sync", client.namespace) as plan:
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
        assert plan.review(timeout=30).plancommit == review.plancommit  # the waiting one again
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


def test_async_review_and_approve(env: ClientEnv, tmp_path: Path) -> None:
    sources = three_sources(tmp_path)

    async def flow() -> None:
        async with aio.SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as ac:
            plan = aio.Plan(ac, "rev-async", env.namespace)
            try:
                data = await plan.add_sandbox("data", "copy_on_write", str(sources["data"]))
                await plan.wait_ready(timeout=90)
                await data.write_file("a.txt", "a\n")
                review = await plan.review(timeout=90)
                assert review.sandboxes[0].added == 1
                result = await plan.approve(review.digest, timeout=90)
                assert result.committed
            finally:
                await plan.delete(cleanup=True)

    asyncio.run(flow())
    assert (sources["data"] / "a.txt").read_text() == "a\n"


def plugin(env: ClientEnv, *args: str) -> Result:
    """``kubectl sandbox ARGS -n NS --kubeconfig K`` in-process."""
    return CliRunner().invoke(
        cli, [*args, "-n", env.namespace, "--kubeconfig", env.kubeconfig], catch_exceptions=False
    )


def test_kubectl_sandbox_review_and_approve(
    client: SandboxClient, env: ClientEnv, tmp_path: Path
) -> None:
    sources = three_sources(tmp_path)
    with Plan(client, "rev-cli", client.namespace) as plan:
        data = plan.add_sandbox("data", "copy_on_write", str(sources["data"]))
        plan.wait_ready(timeout=90)
        data.write_file("c.txt", "c\n")
        shown = plugin(env, "review", "rev-cli", "-o", "json")
        assert shown.exit_code == 0, shown.output
        review = json.loads(shown.stdout)
        assert review["phase"] == "AwaitingApproval" and review["sandboxes"][0]["added"] == 1
        table = plugin(env, "review", "rev-cli", "-o", "wide")
        assert f"digest: {review['digest']}" in table.stdout and "+1 ~0 -0" in table.stdout
        assert "A c.txt" in table.stdout
        wrong = plugin(env, "approve", "rev-cli", "--digest", "sha256:bad")
        assert wrong.exit_code == EXIT_REFUSED, wrong.output  # not sha256 + 64 hex: Invalid
        done = plugin(env, "approve", "rev-cli", "--digest", review["digest"])
        assert done.exit_code == EXIT_OK, done.output
        assert "Committed" in done.stdout
        assert (sources["data"] / "c.txt").read_text() == "c\n"
