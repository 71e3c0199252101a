"""A two-phase plan over every strategy at once, and the fallback of a PostgreSQL server with
``max_prepared_transactions = 0`` (issue 9, §1), on real repositories, directories, SQLite and
PostgreSQL. The crash points are in tests/core/plan/test_two_phase_crash.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sandbox_core import SandboxFactory
from sandbox_core.errors import TwoPhaseUnavailableError
from sandbox_core.host.manager import SandboxManager
from sandbox_core.plan.journal import MemoryCommitJournal
from tests.support.gitrepo import git, make_repo
from tests.support.pg import Pg

PLAN = "mixed"


class Mixed:
    """One sandbox per strategy, each changing its original from ``old`` to ``new``."""

    def __init__(self, root: Path, database: Pg) -> None:
        self.root = root
        self.pg = database
        self.manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
        self.repo = make_repo(root / "repo", {"value": "old"})
        self.dirs = {name: self._dir(name) for name in ("cow", "ovl", "none")}
        self.sqlite = root / "db.sqlite"
        conn = sqlite3.connect(self.sqlite)
        with conn:
            conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
        conn.close()
        self._write(self._sandbox("git", str(self.repo), "git_worktree"))
        self._write(self._sandbox("cow", str(self.dirs["cow"]), "copy_on_write"))
        self._write(self._sandbox("ovl", str(self.dirs["ovl"]), "overlay", mode="fallback"))
        self._write(self._sandbox("none", str(self.dirs["none"]), "none"))
        for name, where in (("pg", database.dsn), ("sqlite", str(self.sqlite))):
            sandbox = self._sandbox(name, where, "transaction_rollback")
            if name == "pg":
                database.track(sandbox)
            sandbox.execute("INSERT INTO items VALUES ('new')")

    def _dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        (path / "value").write_text("old")
        return path

    def _sandbox(self, resource: str, original: str, strategy: str, **options: Any) -> Any:
        return self.manager.get_or_create_sandbox(
            PLAN, resource, original, strategy, sandbox_root=str(self.root / "boxes"), **options
        )

    @staticmethod
    def _write(sandbox: Any) -> None:
        Path(sandbox.get_path("value")).write_text("new")

    def values(self) -> dict[str, Any]:
        conn = sqlite3.connect(self.sqlite)
        try:
            lite = [r[0] for r in conn.execute("SELECT name FROM items")]
        finally:
            conn.close()
        return {
            "git": git(self.repo, "show", "HEAD:value"),
            "cow": (self.dirs["cow"] / "value").read_text(),
            "ovl": (self.dirs["ovl"] / "value").read_text(),
            "pg": self.pg.names(),
            "sqlite": lite,
        }

    def leftovers(self) -> list[str]:
        names = [p.name for p in self.root.iterdir() if p.name.startswith(".")]
        names += [p.name for d in self.dirs.values() for p in d.iterdir() if p.name != "value"]
        names += git(self.repo, "for-each-ref", "--format=%(refname)", "refs/sandbox/prepared")
        return names + self.pg.prepared()


@pytest.fixture
def mixed(pg: Pg, tmp_path: Path) -> Iterator[Mixed]:
    made = Mixed(tmp_path, pg)
    yield made
    made.manager.cleanup_all(PLAN)


OLD = {"git": "old", "cow": "old", "ovl": "old", "pg": [], "sqlite": []}
NEW = {"git": "new", "cow": "new", "ovl": "new", "pg": ["new"], "sqlite": ["new"]}


@pytest.mark.postgres
def test_every_strategy_in_one_plan_commits_in_two_phases(mixed: Mixed) -> None:
    journal = MemoryCommitJournal()
    results = mixed.manager.commit_plan(PLAN, journal=journal)
    assert all(r.success for r in results), results[0].error
    assert mixed.values() == NEW
    state = journal.load()
    assert state is not None and state.mode == "two_phase" and state.phase.value == "committed"
    last = [s.strategy for s in state.steps if s.last_resource]
    assert last == ["transaction_rollback"] and state.steps[-1].resource_id == "sqlite"
    mixed.manager.cleanup_all(PLAN)
    assert mixed.leftovers() == []


@pytest.mark.postgres
def test_a_diverging_last_resource_touches_no_original(mixed: Mixed) -> None:
    conn = sqlite3.connect(mixed.sqlite)
    with conn:
        conn.execute("INSERT INTO items VALUES ('new')")  # the replayed INSERT now fails
    conn.close()
    results = mixed.manager.commit_plan(PLAN)
    assert not results[0].success
    meta = results[0].metadata
    assert meta["failed_sandbox_id"] == mixed.manager.get_sandbox(PLAN, "sqlite").sandbox_id
    assert meta["touched_originals"] == 0 and meta["conflicts"]
    assert {k: v for k, v in mixed.values().items() if k != "sqlite"} == {
        k: v for k, v in OLD.items() if k != "sqlite"
    }
    assert mixed.leftovers() == []


@pytest.mark.postgres
def test_server_without_prepared_transactions_falls_back_to_the_saga(
    noprep: Pg,
    tmp_path: Path,
) -> None:
    manager = SandboxManager(SandboxFactory(), cleanup_on_exit=False)
    directory = tmp_path / "dir"
    directory.mkdir()
    (directory / "value").write_text("old")
    boxes = str(tmp_path / "boxes")
    cow = manager.get_or_create_sandbox(
        PLAN, "cow", str(directory), "copy_on_write", sandbox_root=boxes
    )
    Path(cow.get_path("value")).write_text("new")
    db = manager.get_or_create_sandbox(
        PLAN, "pg", noprep.dsn, "transaction_rollback", sandbox_root=boxes
    )
    noprep.track(db)
    db.execute("INSERT INTO items VALUES ('new')")
    try:
        with pytest.raises(TwoPhaseUnavailableError, match="max_prepared_transactions"):
            manager.commit_plan(PLAN, mode="two_phase")
        assert (directory / "value").read_text() == "old" and noprep.names() == []
        assert [p.name for p in directory.iterdir()] == ["value"]
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
        journal = MemoryCommitJournal()
        results = manager.commit_plan(PLAN, mode="auto", journal=journal)
        assert all(r.success for r in results)
        assert all("max_prepared_transactions" in r.metadata["fallback_reason"] for r in results)
        assert (directory / "value").read_text() == "new" and noprep.names() == ["new"]
        state = journal.load()
        assert state is not None and state.mode == "saga"
        assert state.fallback_reason and "max_prepared_transactions" in state.fallback_reason
    finally:
        manager.cleanup_all(PLAN)


def test_pg_prepared_xacts_reader_works(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        assert int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0
