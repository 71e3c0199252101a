"""Issue 9 scenarios: two-phase plan commit, review and approval, on real directories and
real SQLite files (copy_on_write and transaction_rollback strategies; no test doubles)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, scenarios, then, when

from sandbox_core import SandboxFactory
from sandbox_core.host.manager import SandboxManager
from sandbox_core.plan.journal import MemoryCommitJournal

scenarios("two_phase_commit.feature")

PLAN = "p"


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
        self.journal = MemoryCommitJournal()
        self.originals: list[Path] = []
        self.databases: list[Path] = []
        self.results: list[Any] = []
        self.approved: str | None = None

    def texts(self) -> list[str]:
        return [(o / "value.txt").read_text() for o in self.originals]

    def rows(self) -> list[list[str]]:
        found = []
        for path in self.databases:
            conn = sqlite3.connect(path)
            try:
                found.append([r[0] for r in conn.execute("SELECT name FROM items ORDER BY 1")])
            finally:
                conn.close()
        return found


@pytest.fixture
def world(tmp_path: Path) -> Any:
    made = World(tmp_path)
    yield made
    made.manager.cleanup_all(PLAN)


@given("a manager over real directories")
def _manager(world: World) -> None:
    assert world.manager.list_sandboxes(PLAN) == []


@given(
    parsers.parse(
        'a plan "{plan}" of {count:d} copy_on_write sandboxes that each change their original'
    )
)
def _plan(world: World, plan: str, count: int) -> None:
    for index in range(1, count + 1):
        original = world.root / f"original-{index}"
        original.mkdir()
        (original / "value.txt").write_text("before\n")
        sandbox = world.manager.get_or_create_sandbox(
            plan, f"r{index}", str(original), "copy_on_write", sandbox_root=str(world.root / "b")
        )
        Path(sandbox.get_path("value.txt")).write_text(f"after {index}\n")
        world.originals.append(original)


@given(parsers.parse("the original of sandbox {index:d} was edited after the sandbox was made"))
def _edit_original(world: World, index: int) -> None:
    (world.originals[index - 1] / "value.txt").write_text("edited meanwhile\n")


@given("the plan was reviewed and its digest approved")
def _approve(world: World) -> None:
    review = world.manager.review_plan(PLAN)
    assert len(review.sandboxes) == len(world.originals) and not review.has_conflicts
    world.approved = review.digest


@given(parsers.parse("sandbox {index:d} is edited after the approval"))
def _edit_sandbox(world: World, index: int) -> None:
    sandbox = world.manager.list_sandboxes(PLAN)[index - 1]
    Path(sandbox.get_path("value.txt")).write_text("edited after approval\n")


@given(parsers.parse("the plan also has {count:d} SQLite sandboxes"))
def _sqlite(world: World, count: int) -> None:
    for index in range(count):
        path = world.root / f"db-{index}.sqlite"
        conn = sqlite3.connect(path)
        with conn:
            conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
        conn.close()
        sandbox = world.manager.get_or_create_sandbox(
            PLAN,
            f"db{index}",
            str(path),
            "transaction_rollback",
            sandbox_root=str(world.root / "b"),
        )
        sandbox.execute("INSERT INTO items VALUES ('new')")
        world.databases.append(path)


@when(parsers.parse('the plan is committed with mode "{mode}"'))
def _commit(world: World, mode: str) -> None:
    world.results = world.manager.commit_plan(PLAN, mode=mode, journal=world.journal)  # type: ignore[arg-type]


@when("the plan is committed with the approved digest")
def _commit_approved(world: World) -> None:
    world.results = world.manager.commit_plan(PLAN, approved_digest=world.approved)


@then("every original holds its sandbox's change")
def _all_changed(world: World) -> None:
    assert all(r.success for r in world.results)
    assert world.texts() == [f"after {i}\n" for i in range(1, len(world.originals) + 1)]
    assert world.rows() == [["new"]] * len(world.databases)


@then("no original was touched")
def _untouched(world: World) -> None:
    assert all(text in ("before\n", "edited meanwhile\n") for text in world.texts())
    assert world.results[0].metadata["touched_originals"] == 0
    assert world.results[0].metadata["rolled_back_ids"] == []


@then("no staged file is left beside any original")
def _no_staged(world: World) -> None:
    names = [p.name for p in world.root.iterdir()] + [
        p.name for o in world.originals for p in o.iterdir()
    ]
    assert [n for n in names if n.startswith(".")] == []


@then(parsers.parse('the journal records mode "{mode}" and phase "{phase}"'))
def _journal(world: World, mode: str, phase: str) -> None:
    state = world.journal.load()
    assert state is not None
    assert (state.mode, state.phase.value) == (mode, phase)


@then(parsers.parse('the commit fails with reason "{reason}" naming sandbox {index:d}'))
def _failed_naming(world: World, reason: str, index: int) -> None:
    assert len(world.results) == 1 and not world.results[0].success
    meta = world.results[0].metadata
    assert meta["reason"] == reason
    assert meta["failed_sandbox_id"] == world.manager.list_sandboxes(PLAN)[index - 1].sandbox_id
    assert meta["conflicts"] == ["value.txt"]


@then(parsers.parse('the commit fails with reason "{reason}" naming no sandbox'))
def _failed_unnamed(world: World, reason: str) -> None:
    assert len(world.results) == 1 and not world.results[0].success
    assert world.results[0].metadata["reason"] == reason
    assert world.results[0].metadata["failed_sandbox_id"] is None


@then(parsers.parse("the commit fails having rolled back {count:d} sandboxes"))
def _saga_failed(world: World, count: int) -> None:
    assert not world.results[0].success
    assert len(world.results[0].metadata["rolled_back_ids"]) == count


@then(parsers.parse('every sandbox of the plan is still "{status}"'))
def _statuses(world: World, status: str) -> None:
    assert {sb.status.value for sb in world.manager.list_sandboxes(PLAN)} == {status}


@then("every result says it fell back to the saga because of the last resource")
def _fell_back(world: World) -> None:
    assert {r.metadata["mode"] for r in world.results} == {"saga"}
    assert all("last resource" in r.metadata["fallback_reason"] for r in world.results)
    state = world.journal.load()
    assert state is not None and state.mode == "saga" and state.fallback_reason
