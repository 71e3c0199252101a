"""SandboxManager under concurrency: 16 threads x 10 plans on real copy_on_write sandboxes."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sandbox_core import SandboxFactory, SandboxStatus
from sandbox_core.host.manager import SandboxManager

THREADS = 16
PLANS = 10
RESOURCES = 3


def _originals(tmp_path: Path) -> dict[tuple[str, str], Path]:
    originals = {}
    for plan in range(PLANS):
        for resource in range(RESOURCES):
            path = tmp_path / "originals" / f"p{plan}-r{resource}"
            path.mkdir(parents=True)
            (path / "data.txt").write_text("original\n")
            originals[(f"plan-{plan}", f"res-{resource}")] = path
    return originals


def test_concurrent_get_or_create_and_commit_all(tmp_path: Path) -> None:
    originals = _originals(tmp_path)
    root = str(tmp_path / "sandboxes")
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
    created = Counter[str]()
    counter_lock = threading.Lock()
    real_create = manager.factory.create

    def counting_create(*args: Any, **kwargs: Any) -> Any:
        sandbox = real_create(*args, **kwargs)
        with counter_lock:
            created[sandbox.sandbox_id] += 1
        return sandbox

    manager.factory.create = counting_create  # type: ignore[method-assign]
    barrier = threading.Barrier(THREADS)

    def worker(index: int) -> dict[tuple[str, str], str]:
        barrier.wait()
        seen = {}
        # Every thread asks for every sandbox, each in its own order.
        keys = sorted(originals, key=lambda key: hash((key, index)))
        for plan_id, resource_id in keys:
            sandbox = manager.get_or_create_sandbox(
                plan_id,
                resource_id,
                str(originals[(plan_id, resource_id)]),
                "copy_on_write",
                sandbox_root=root,
            )
            Path(sandbox.get_path(f"from-thread-{index}.txt")).write_text(f"{index}\n")
            seen[(plan_id, resource_id)] = sandbox.sandbox_id
        return seen

    with ThreadPoolExecutor(THREADS) as pool:
        views = list(pool.map(worker, range(THREADS)))

    # No lost and no duplicate sandboxes: every thread saw the same one per key.
    assert all(view == views[0] for view in views)
    assert len(set(views[0].values())) == PLANS * RESOURCES
    assert sorted(created) == sorted(views[0].values())
    assert set(created.values()) == {1}
    assert sorted(manager.plan_ids()) == sorted(f"plan-{n}" for n in range(PLANS))

    # 16 threads commit the 10 plans: some plans get two concurrent commit_all calls.
    barrier = threading.Barrier(THREADS)

    def committer(index: int) -> tuple[str, list[Any]]:
        plan_id = f"plan-{index % PLANS}"
        barrier.wait()
        return plan_id, manager.commit_all(plan_id)

    with ThreadPoolExecutor(THREADS) as pool:
        outcomes = list(pool.map(committer, range(THREADS)))

    per_plan: dict[str, list[Any]] = {}
    for plan_id, results in outcomes:
        assert all(result.success for result in results)
        per_plan.setdefault(plan_id, []).extend(results)
    for plan_id, results in per_plan.items():
        # Each sandbox committed exactly once, whichever call got there first.
        assert sorted(r.sandbox_id for r in results) == sorted(
            sb.sandbox_id for sb in manager.list_sandboxes(plan_id)
        )
        for sandbox in manager.list_sandboxes(plan_id):
            assert sandbox.status is SandboxStatus.COMMITTED
    for path in originals.values():
        names = sorted(p.name for p in path.iterdir())
        assert names == ["data.txt", *sorted(f"from-thread-{n}.txt" for n in range(THREADS))]

    assert manager.cleanup_abandoned() == PLANS * RESOURCES
    assert manager.plan_ids() == []
    assert list((tmp_path / "sandboxes").rglob("from-thread-*")) == []


def test_a_slow_commit_does_not_block_other_plans(tmp_path: Path) -> None:
    """Per-plan locks: plan B is served while plan A's commit is in progress."""
    originals = _originals(tmp_path)
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
    root = str(tmp_path / "sandboxes")
    slow = manager.get_or_create_sandbox(
        "plan-0", "res-0", str(originals[("plan-0", "res-0")]), "copy_on_write", sandbox_root=root
    )
    entered, release = threading.Event(), threading.Event()
    real_commit = slow.commit

    def blocking_commit(message: str | None = None) -> Any:
        entered.set()
        assert release.wait(30)
        return real_commit(message)

    slow.commit = blocking_commit
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(manager.commit_all, "plan-0")
        assert entered.wait(30)
        other = manager.get_or_create_sandbox(
            "plan-1",
            "res-0",
            str(originals[("plan-1", "res-0")]),
            "copy_on_write",
            sandbox_root=root,
        )
        assert manager.commit_all("plan-1")[0].success
        assert other.status is SandboxStatus.COMMITTED
        assert not pending.done()
        release.set()
        assert pending.result(30)[0].success
    manager.cleanup_all("plan-0")
    manager.cleanup_all("plan-1")
