"""What only the asynchronous client (``sandbox_client.aio``) has, against the real API server
(tier 2): calls of one plan run concurrently (``asyncio.gather``), a failing commit of three
strategies compensated as a typed result, ``async with`` cleanup, concurrent waits on one
connection. The flow both clients share is tests/client/_async/test_flow.py (and its generated
blocking copy).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandbox_client import NotFoundError, RefusedError, SandboxPhase, WaitTimeoutError, aio
from tests.support.client import ClientEnv, make_dir, make_repo, three_sources
from tests.support.operator import Cluster, git

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


def test_async_plan_flow(env: ClientEnv, tmp_path: Path) -> None:
    sources = three_sources(tmp_path)

    async def flow() -> list[str]:
        async with aio.SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as client:
            async with aio.Plan(client, "async-ok") as plan:
                repo = await plan.add_sandbox("repo", "git_worktree", sources["repo"])
                data = await plan.add_sandbox("data", "copy_on_write", sources["data"])
                layer = await plan.add_sandbox(
                    "layer", "overlay", sources["layer"], options={"overlayMode": "fallback"}
                )
                infos = await plan.wait_ready(timeout=90)
                assert all(i.phase is SandboxPhase.ACTIVE for i in infos)
                assert {i.strategy_mode for i in infos} >= {"fallback"}
                paths = [i.sandbox_path for i in infos]

                await asyncio.gather(
                    repo.write_file("src/app.py", "print('async')\n"),
                    data.write_file("deep/er/x.txt", b"x\n"),
                    layer.write_file("o.txt", "o1\n"),
                )
                assert await repo.read_file("src/app.py") == "print('async')\n"
                assert "deep/er/x.txt" in await data.list_files()
                assert "+print('async')" in await repo.diff()
                assert (sources["data"] / "deep").exists() is False

                checkpoint = await layer.checkpoint("mid", {"k": "v"})
                assert checkpoint.kind == "upper-snapshot"
                await layer.write_file("o.txt", "bad\n")
                await layer.restore(checkpoint)
                assert await layer.read_file("o.txt") == "o1\n"
                await data.rollback()
                assert "deep/er/x.txt" not in await data.list_files()
                await data.write_file("g.txt", "d1\n")

                with pytest.raises(RefusedError) as refused:
                    await data.write_file("../../etc/x", "no")
                assert refused.value.reason == "PathTraversal"
                with pytest.raises(NotFoundError):
                    await plan.sandbox("no-such-resource")

                result = await plan.commit(message="async commit")
                assert result.committed and result.rolled_back_ids == []
                history = await data.history()
                assert history[0].kind == "commit"
            assert await client.list_sandboxes(plan_id="async-ok") == []
            return paths

    paths = asyncio.run(flow())
    assert (sources["repo"] / "src/app.py").read_text() == "print('async')\n"
    assert (sources["data"] / "g.txt").read_text() == "d1\n"
    assert (sources["layer"] / "o.txt").read_text() == "o1\n"
    assert not any(Path(p).exists() for p in paths)


def test_async_failed_commit_is_a_typed_result(env: ClientEnv, tmp_path: Path) -> None:
    data = make_dir(tmp_path / "data", {"g.txt": "d0\n"})
    layer = make_dir(tmp_path / "layer", {"o.txt": "o0\n"})
    repo = make_repo(tmp_path / "repo", {"f.txt": "line1\n"})

    async def flow() -> None:
        async with (
            aio.SandboxClient(kubeconfig=env.kubeconfig, namespace=env.namespace) as client,
            aio.Plan(client, "async-bad") as plan,
        ):
            copy = await plan.add_sandbox("a-data", "copy_on_write", data)
            over = await plan.add_sandbox("b-layer", "overlay", layer)
            tree = await plan.add_sandbox("c-repo", "git_worktree", repo)
            await plan.wait_ready(timeout=90)
            await copy.write_file("g.txt", "d1\n")
            await over.write_file("o.txt", "o1\n")
            await tree.write_file("f.txt", "mine\n")
            (repo / "f.txt").write_text("theirs\n")
            git(repo, "commit", "-qam", "moved")
            head = git(repo, "rev-parse", "HEAD")

            result = await plan.commit(mode="Saga")  # compensation: the saga

            assert not result.committed and result.phase.value == "Failed"
            landed = {(await copy.info()).sandbox_id, (await over.info()).sandbox_id}
            assert set(result.rolled_back_ids) == landed
            assert result.failed_sandbox_id == (await tree.info()).sandbox_id
            assert result.failed_rollback_ids == []
            condition = result.condition("Committed")
            assert condition is not None and condition.status == "False"
            assert git(repo, "rev-parse", "HEAD") == head
            assert (data / "g.txt").read_text() == "d0\n"
            assert (layer / "o.txt").read_text() == "o0\n"

    asyncio.run(flow())


def test_async_waits_are_watches_that_time_out(local_apiserver: Any, tmp_path: Path) -> None:
    """Without an operator two concurrent waits on one connection both end at their deadline."""
    cluster = Cluster.fresh(local_apiserver, prefix="clanoop")

    async def flow() -> None:
        async with aio.SandboxClient(
            kubeconfig=str(local_apiserver.kubeconfig_path), namespace=cluster.namespace
        ) as client:
            plan = aio.Plan(client, "async-never", keep=True)
            one = await plan.add_sandbox("one", "copy_on_write", make_dir(tmp_path / "1", {}))
            two = await plan.add_sandbox("two", "copy_on_write", make_dir(tmp_path / "2", {}))
            started = asyncio.get_running_loop().time()
            outcomes = await asyncio.gather(
                one.wait_ready(timeout=2), two.wait_ready(timeout=3), return_exceptions=True
            )
            elapsed = asyncio.get_running_loop().time() - started
            assert all(isinstance(o, WaitTimeoutError) for o in outcomes), outcomes
            assert 2.5 <= elapsed < 20, elapsed  # concurrent, and each waited its own time
            await plan.delete(cleanup=True, timeout=30)
            assert await plan.sandboxes() == []

    asyncio.run(flow())
