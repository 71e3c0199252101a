"""Crash at every boundary of the two-phase plan commit, every strategy (issue 9, "Done means").

Each case builds a real plan (a real git repository, directories, SQLite files, the real
PostgreSQL server) persisted in a state directory, then runs ``sandbox-core commit-plan
--two-phase`` in a child process that SIGKILLs itself at one fault point
(``SANDBOX_CORE_FAULT=<point>:<index>``, the saga's hook), then ``sandbox-core recover`` in a
fresh process. The outcome must be all or nothing (before the decision: every original as it
was; after it: every original changed), with no staged file, no prepared git ref and no prepared
PostgreSQL transaction (``pg_prepared_xacts``) left. The crash table this checks is in
docs/two-phase-commit.md.

Plans: the strategy under test first, then a copy_on_write sandbox (so there is always a second
participant to abort or roll forward); SQLite is the last resource of ``[copy_on_write, sqlite]``;
PostgreSQL is ``[copy_on_write, postgresql]``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sandbox_core.host.manager import SandboxManager
from sandbox_core.host.store import SandboxStore
from sandbox_core.strategies.factory import SandboxFactory
from tests.support.gitrepo import GIT_ENV, git, make_repo

PLAN = "plan-crash"
KINDS = [
    pytest.param("git_worktree", id="git_worktree"),
    pytest.param("copy_on_write", id="copy_on_write"),
    pytest.param("overlay-kernel", id="overlay-kernel", marks=pytest.mark.overlay_kernel),
    pytest.param("overlay-fallback", id="overlay-fallback"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("sqlite", id="sqlite-last-resource"),
    pytest.param("none", id="none"),
]


def crash_points(steps: int, last_resource: int | None) -> list[tuple[str, int, bool]]:
    """Every ``(point, index, changed_after_recovery)`` of a plan of ``steps`` participants.

    Before the decision recovery aborts (originals unchanged); after it recovery rolls
    forward. With a last resource, its ``before_apply`` is still before the decision and its
    ``after_apply`` is the decision itself (it committed; the record was not written yet).
    """
    points: list[tuple[str, int, bool]] = []
    for index in range(1, steps + 1):
        points += [("before_prepare", index, False), ("after_prepare", index, False)]
    points.append(("after_decision", 0, True))
    for index in range(1, steps + 1):
        points.append(("before_apply", index, index != last_resource))
        points.append(("after_apply", index, True))
    return points


ALL_CASES = [
    pytest.param(
        kind.values[0], point, index, changed, id=f"{kind.id}-{point}-{index}", marks=kind.marks
    )
    for kind in KINDS
    for point, index, changed in crash_points(2, 2 if kind.values[0] == "sqlite" else None)
]


@dataclass
class Participant:
    """One sandbox of the plan and how to read its original."""

    kind: str
    original: str
    read: Any  # () -> str: the original's observable value
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    tmp: Path
    state_dir: Path
    participants: list[Participant]
    pg_dsn: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **GIT_ENV, "PGPASSWORD": "sandbox"}

    def cli(self, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
        env = self.env
        env.pop("SANDBOX_CORE_FAULT", None)
        if fault:
            env["SANDBOX_CORE_FAULT"] = fault
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "sandbox_core.cli",
                "--state-dir",
                str(self.state_dir),
                "--json",
                *args,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            check=False,
        )


def _directory(tmp: Path, name: str) -> Participant:
    original = tmp / name
    original.mkdir()
    (original / "value").write_text("old")
    return Participant("copy_on_write", str(original), lambda: (original / "value").read_text())


def _participant(kind: str, tmp: Path, pg_dsn: str | None) -> Participant:
    if kind in ("copy_on_write", "overlay-kernel", "overlay-fallback"):
        made = _directory(tmp, "dir")
        if kind != "copy_on_write":
            made.kind, made.options = "overlay", {"mode": kind.removeprefix("overlay-")}
        return made
    if kind == "none":
        made = _directory(tmp, "passthrough")
        made.kind = "none"
        return made
    if kind == "git_worktree":
        repo = make_repo(tmp / "repo", {"value": "old"})
        return Participant(kind, str(repo), lambda: git(repo, "show", "HEAD:value"))
    if kind == "sqlite":
        path = tmp / "db.sqlite"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
            conn.execute("INSERT INTO items VALUES ('old')")
        conn.close()

        def read_sqlite() -> str:
            conn = sqlite3.connect(path)
            try:
                return ",".join(r[0] for r in conn.execute("SELECT name FROM items ORDER BY 1"))
            finally:
                conn.close()

        return Participant("transaction_rollback", str(path), read_sqlite)
    assert kind == "postgresql" and pg_dsn is not None
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
        conn.execute("INSERT INTO items VALUES ('old')")

    def read_pg() -> str:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT name FROM items ORDER BY 1").fetchall()
        return ",".join(r[0] for r in rows)

    return Participant("transaction_rollback", pg_dsn, read_pg)


def _write(sandbox: Any, participant: Participant) -> None:
    if participant.kind == "transaction_rollback":
        sandbox.execute("INSERT INTO items VALUES ('new')")
        sandbox.close()  # the child reopens and replays the log: hold no lock here
    else:
        Path(sandbox.get_path("value")).write_text("new")


def build_plan(kind: str, tmp: Path, pg_dsn: str | None) -> Plan:
    """The plan of the module docstring, persisted in a fresh state directory."""
    tested = _participant(kind, tmp, pg_dsn)
    helper = _directory(tmp, "helper")
    participants = [helper, tested] if kind in ("sqlite", "postgresql") else [tested, helper]
    plan = Plan(tmp, tmp / "state", participants, pg_dsn)
    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(plan.state_dir)
    )
    for number, participant in enumerate(participants):
        sandbox = manager.get_or_create_sandbox(
            PLAN,
            f"r{number}",
            participant.original,
            participant.kind,
            sandbox_root=str(tmp / "boxes"),
            **participant.options,
        )
        _write(sandbox, participant)
    manager.persist(PLAN)
    return plan


def old_value(participant: Participant) -> str:
    return "old"


def new_value(participant: Participant) -> str:
    return "new" if participant.kind != "transaction_rollback" else "new,old"


def leftovers(plan: Plan, txid: str, *, refs: bool = True) -> list[str]:
    """Anything staged under ``txid`` that is still there: files, prepared xacts and (with
    ``refs``) git refs. A committed git sandbox keeps its prepared refs until cleanup (they make
    a repeated apply idempotent), so those are checked after cleanup."""
    found = [
        str(path)
        for path in plan.tmp.rglob("*")
        if path.name.startswith(".")
        and ("sandbox-" in path.name or txid in path.name)
        and "boxes" not in path.parts
        and "state" not in path.parts
    ]
    for participant in plan.participants:
        if refs and participant.kind == "git_worktree":
            refs = git(Path(participant.original), "for-each-ref", "--format=%(refname)")
            found += [ref for ref in refs.splitlines() if txid in ref]
    if plan.pg_dsn is not None:
        with psycopg.connect(plan.pg_dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"{txid}%",)
            ).fetchall()
        found += [f"prepared transaction {row[0]}" for row in rows]
    return found


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """A schema DSN for the PostgreSQL cases only (others need no server)."""
    if "postgresql" not in request.node.name:
        yield None
        return
    yield request.getfixturevalue("postgres_schema_dsn")


@pytest.mark.parametrize(("kind", "point", "index", "changed"), ALL_CASES)
def test_crash_then_recover_is_all_or_nothing(
    kind: str, point: str, index: int, changed: bool, tmp_path: Path, pg: str | None
) -> None:
    plan = build_plan(kind, tmp_path, pg)
    txid = "never-prepared"
    try:
        crashed = plan.cli("commit-plan", PLAN, "--two-phase", fault=f"{point}:{index}")
        assert crashed.returncode == -9, crashed.stdout + crashed.stderr
        journal = json.loads(next((plan.state_dir / "journals").iterdir()).read_text())
        assert journal["mode"] == "two_phase"
        txid = journal["txid"]
        recovered = plan.cli("recover", PLAN)
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        state = json.loads(recovered.stdout)["journal"]
        assert state["phase"] == ("committed" if changed else "rolled_back")
        values = [p.read() for p in plan.participants if p.kind != "none"]
        expected = [
            new_value(p) if changed else old_value(p) for p in plan.participants if p.kind != "none"
        ]
        assert values == expected
        assert leftovers(plan, txid, refs=not changed) == []
        again = plan.cli("recover", PLAN)
        assert json.loads(again.stdout)["journal"] == state  # recovery is idempotent
        if not changed:
            # Nothing was touched: the plan commits cleanly afterwards.
            done = plan.cli("commit-plan", PLAN, "--two-phase")
            assert done.returncode == 0, done.stdout + done.stderr
            assert [p.read() for p in plan.participants if p.kind != "none"] == [
                new_value(p) for p in plan.participants if p.kind != "none"
            ]
            assert leftovers(plan, txid) == []
    finally:
        store = SandboxStore(plan.state_dir)
        SandboxManager.load(store).cleanup_all(PLAN)
    assert leftovers(plan, txid) == []
