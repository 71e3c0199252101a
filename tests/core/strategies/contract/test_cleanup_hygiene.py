"""Cleanup leaves nothing behind and is idempotent, for every strategy (issue 7, "Hygiene").

After cleanup: no artefact and no empty per-strategy folder (``cow/``, ``git/``, ``overlay/``,
``txn/``) under the sandbox root, no sandbox record and no finished commit journal in the state
directory, no branch, tag or worktree registration in a git original. Cleaning up again, from the
same object, from a stale copy reopened before another process cleaned up, or through the CLI
with an id that is already gone, succeeds and changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox_core import SandboxFactory, SandboxStatus, SandboxStore
from sandbox_core.host.manager import SandboxManager, state_dir_journal_path
from tests.support.gitrepo import GIT_ENV
from tests.support.hygiene import CASES, IDS, edit, leftovers, make_original

pytestmark = pytest.mark.usefixtures("git_identity")


@pytest.mark.parametrize("then", ["commit", "rollback", "nothing"])
@pytest.mark.parametrize(("strategy", "options"), CASES, ids=IDS)
def test_cleanup_all_leaves_nothing_behind(
    tmp_path: Path, strategy: str, options: dict[str, Any], then: str
) -> None:
    original = make_original(tmp_path, strategy)
    manager = SandboxManager(
        SandboxFactory(), cleanup_on_exit=False, store=SandboxStore(tmp_path / "state")
    )
    sandbox = manager.get_or_create_sandbox(
        "p-clean", "r", str(original), strategy, sandbox_root=str(tmp_path / "sbx"), **options
    )
    edit(strategy, sandbox)
    if then == "commit":
        assert [r.success for r in manager.commit_all("p-clean")] == [True]
    elif then == "rollback":
        manager.rollback_all("p-clean")
    manager.cleanup_all("p-clean")
    assert sandbox.status is SandboxStatus.CLEANED_UP
    assert leftovers(tmp_path, original) == {}
    # Idempotent: again, and from a fresh manager over the same store.
    manager.cleanup_all("p-clean")
    sandbox.cleanup()
    SandboxManager.load(SandboxStore(tmp_path / "state")).cleanup_all("p-clean")
    assert leftovers(tmp_path, original) == {}


@pytest.mark.parametrize(("strategy", "options"), CASES, ids=IDS)
def test_cleanup_of_a_stale_copy_after_another_process_cleaned_up(
    tmp_path: Path, strategy: str, options: dict[str, Any]
) -> None:
    """Two handles on one sandbox (two processes): the second cleanup finds nothing and succeeds."""
    original = make_original(tmp_path, strategy)
    store = SandboxStore(tmp_path / "state")
    factory = SandboxFactory()
    sandbox = factory.create(
        strategy, "r", str(original), sandbox_root=str(tmp_path / "sbx"), **options
    )
    sandbox.create("p-stale")
    edit(strategy, sandbox)
    store.save(sandbox)
    close = getattr(sandbox, "close", None)
    if callable(close):
        close()
    stale = factory.reopen(store.load(sandbox.sandbox_id))
    sandbox.cleanup()
    store.delete(sandbox.sandbox_id)
    stale.cleanup()
    assert stale.status is SandboxStatus.CLEANED_UP
    assert leftovers(tmp_path, original) == {}


def test_a_shared_strategy_folder_stays_while_another_sandbox_uses_it(tmp_path: Path) -> None:
    original = make_original(tmp_path, "copy_on_write")
    factory = SandboxFactory()
    first, second = (
        factory.create("copy_on_write", f"r{i}", str(original), sandbox_root=str(tmp_path / "sbx"))
        for i in range(2)
    )
    first.create("p")
    second.create("p")
    first.cleanup()
    assert sorted(p.name for p in (tmp_path / "sbx" / "cow").iterdir()) == [second.sandbox_id]
    second.cleanup()
    assert list((tmp_path / "sbx").iterdir()) == []


def _disk_full(*_args: Any, **_kwargs: Any) -> Any:
    raise OSError(28, "No space left on device")


# Where each file strategy's create fails after it made <root>/<kind>/<id>/ (fault injection).
FAILING_CREATE = {
    "copy_on_write": ("sandbox_core.strategies.copy_on_write.copy_with_baseline", {}),
    "overlay-fallback": (
        "sandbox_core.strategies.overlay.sandbox.copy_with_baseline",
        {"mode": "fallback"},
    ),
    "git_worktree": (
        "sandbox_core.strategies.git_worktree.GitWorktreeSandbox._free_branch",
        {},
    ),
}


@pytest.mark.parametrize("case", sorted(FAILING_CREATE))
def test_a_failed_create_leaves_no_strategy_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Issue 7, hygiene: a create that fails midway (here the disk fills) removes its own
    folder and the per-strategy folder it made; the original is untouched."""
    target, options = FAILING_CREATE[case]
    strategy = case.split("-")[0]
    original = make_original(tmp_path, strategy)
    before = sorted(p.name for p in original.iterdir())
    monkeypatch.setattr(target, _disk_full)
    sandbox = SandboxFactory().create(
        strategy, "r", str(original), sandbox_root=str(tmp_path / "sbx"), **options
    )
    with pytest.raises(Exception, match="No space left on device"):
        sandbox.create("p-full")
    assert sandbox.status is SandboxStatus.ERRORED
    assert leftovers(tmp_path, original) == {}
    assert sorted(p.name for p in original.iterdir()) == before


def test_a_journal_that_still_owes_a_compensation_is_kept(tmp_path: Path) -> None:
    """Hygiene never destroys the only record of what must still be undone (case 21)."""
    from sandbox_core.host.manager import drop_finished_journal
    from sandbox_core.plan.journal import FileCommitJournal, JournalPhase, JournalState

    store = SandboxStore(tmp_path / "state")
    journal = FileCommitJournal(state_dir_journal_path(store.state_dir, "p"))
    journal.save(JournalState(plan_id="p", phase=JournalPhase.COMPENSATING))
    assert drop_finished_journal(store, "p") is False
    assert journal.path.exists()
    journal.save(JournalState(plan_id="p", phase=JournalPhase.FAILED))
    assert drop_finished_journal(store, "p") is True
    assert not journal.path.exists()


# -- the CLI ------------------------------------------------------------------------------------

CLI = [sys.executable, "-m", "sandbox_core.cli", "--json"]


def run_cli(env: dict[str, str], *args: str, expect: int = 0) -> Any:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == expect, done.stdout + done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


@pytest.mark.parametrize(("strategy", "options"), CASES, ids=IDS)
def test_cli_cleanup_is_idempotent_and_leaves_nothing_behind(
    tmp_path: Path, strategy: str, options: dict[str, Any]
) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SANDBOX_CORE_")}
    env.update(GIT_ENV)
    env["SANDBOX_CORE_STATE_DIR"] = str(tmp_path / "state")
    env["SANDBOX_CORE_ROOT"] = str(tmp_path / "sbx")
    original = make_original(tmp_path, strategy)
    extra = [arg for key, value in options.items() for arg in ("--option", f"{key}={value}")]
    created = run_cli(
        env, "create", "--plan", "p-cli", "--resource", "r", "--strategy", strategy, *extra,
        str(original),
    )
    sandbox_id = created["sandbox_id"]
    if strategy != "transaction_rollback":
        Path(run_cli(env, "path", sandbox_id, "v")["path"]).write_text("1\n")
    if strategy != "none":
        run_cli(env, "checkpoint", sandbox_id, "--phase", "pre_commit")
        assert (tmp_path / "state" / "checkpoints").is_dir()
    run_cli(env, "commit-plan", "p-cli")

    first = run_cli(env, "cleanup", sandbox_id)
    assert first == {"sandbox_id": sandbox_id, "status": "cleaned_up", "already": False}
    assert leftovers(tmp_path, original) == {}
    again = run_cli(env, "cleanup", sandbox_id)
    assert again == {"sandbox_id": sandbox_id, "status": "cleaned_up", "already": True}
    assert leftovers(tmp_path, original) == {}


def test_cli_cleanup_refuses_an_id_that_is_a_path(tmp_path: Path) -> None:
    env = {**os.environ, "SANDBOX_CORE_STATE_DIR": str(tmp_path / "state")}
    out = run_cli(env, "cleanup", "../etc", expect=1)
    assert "invalid sandbox id" in out["error"]["message"]


@pytest.mark.parametrize("in_its_place", ["a file", "a link to the original"])
@pytest.mark.parametrize(
    ("strategy", "options"), CASES[:3], ids=["git_worktree", "copy_on_write", "overlay-fallback"]
)
def test_cleanup_leaves_nothing_behind_whatever_stands_in_place_of_the_sandbox_directory(
    tmp_path: Path, strategy: str, options: dict[str, Any], in_its_place: str
) -> None:
    """An actor replaced its sandbox directory by a file, or by a link to the original: cleanup
    still succeeds, removes the file or link (never following it) and everything else, and the
    original keeps its files."""
    original = make_original(tmp_path, strategy)
    sandbox = SandboxFactory().create(
        strategy, "r", str(original), sandbox_root=str(tmp_path / "sbx"), **options
    )
    sandbox.create("p-replaced")
    path = Path(sandbox.to_record()["context"]["sandbox_path"])
    subprocess.run(["rm", "-rf", str(path)], check=True)
    if in_its_place == "a file":
        path.write_text("the actor's file\n")
    else:
        path.symlink_to(original)
    sandbox.cleanup()
    assert sandbox.status is SandboxStatus.CLEANED_UP
    assert not path.is_symlink() and not path.exists()
    assert leftovers(tmp_path, original) == {}
    assert (original / "v").read_text() == "0\n"
