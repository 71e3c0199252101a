"""What every ``sandbox-core`` command shares: the exit codes, the click context object
(:class:`CliState`: output mode, state directory, factory) and the one mapping of core errors to
exit codes (:func:`_guard`).

Exit codes:
    0  success
    1  a sandbox error (creation, rollback, cleanup, I/O)
    2  usage error (bad arguments; click's own code)
    3  not found (unknown sandbox or checkpoint id)
    4  invalid state for the operation (SandboxStateError); also ``commit-plan`` refused because
       the plan can only be committed in part (PlanRerunRequiredError, case 38)
    5  commit refused because of conflicts; nothing was changed
    6  atomic plan commit failed and every committed sandbox was compensated
    7  atomic plan commit failed and at least one compensation failed (``recover`` retries it;
       ``recover`` exits 7 too while a compensation still fails, case 21); for a two-phase
       commit: an abort, or an apply after the decision, failed and ``recover`` finishes it
    8  a lock file left by another process (e.g. git's index.lock) blocks it; nothing changed
    9  permission denied, or the resource's owner is another user not trusted; nothing changed
    10 ``commit-plan`` refused: the plan changed since the approved digest
       (ChangedSinceApproval); every participant was aborted, nothing changed
    11 ``commit-plan --two-phase`` refused: the plan cannot be committed in two phases
       (TwoPhaseUnavailableError: more than one participant that cannot prepare durably, or a
       PostgreSQL server with max_prepared_transactions = 0); nothing changed. With ``--auto``
       the plan falls back to the saga instead and says so.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from sandbox_core.errors import (
    AtomicCommitError,
    ChangedSinceApprovalError,
    SandboxCommitError,
    SandboxError,
    SandboxLockedError,
    SandboxPermissionError,
    SandboxStateError,
    TwoPhaseUnavailableError,
)
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.host.manager import SandboxManager
from sandbox_core.host.store import SandboxStore
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.factory import SandboxFactory

EXIT_ERROR = 1
EXIT_NOT_FOUND = 3
EXIT_STATE = 4
EXIT_CONFLICT = 5
EXIT_COMPENSATED = 6
EXIT_COMPENSATION_FAILED = 7
EXIT_LOCKED = 8
EXIT_PERMISSION = 9
EXIT_CHANGED_SINCE_APPROVAL = 10
EXIT_TWO_PHASE_UNAVAILABLE = 11

EXIT_CODES_HELP = (
    "Exit codes: 0 success; 1 sandbox error; 2 usage; 3 not found; 4 invalid state; "
    "5 commit refused for conflicts (nothing changed); 6 commit-plan failed, all compensated; "
    "7 commit-plan failed and a compensation failed; 8 a leftover lock file blocks it (retry, "
    "or remove the lock named in the message if no git runs); 9 permission denied or "
    "untrusted owner (fix access, or --option trust_repository_owner=true); 10 commit-plan "
    "refused: changed since the approved digest (nothing changed); 11 commit-plan --two-phase "
    "refused: two phases unavailable (nothing changed)."
)


class CliState:
    """Options shared by every command (the click context object)."""

    def __init__(self, json_output: bool, state_dir: str | None, sandbox_root: str | None) -> None:
        self.json_output = json_output
        self.store = SandboxStore(state_dir)
        self.sandbox_root = sandbox_root
        self.factory = SandboxFactory()

    def emit(self, payload: dict[str, Any], human: str) -> None:
        """Print ``payload`` as JSON with ``--json``, else the human-readable text."""
        if self.json_output:
            click.echo(json.dumps(payload, indent=2, sort_keys=True, default=str))
        else:
            click.echo(human)

    def fail(self, code: int, exc: BaseException, **extra: Any) -> NoReturn:
        """Report ``exc`` and exit with ``code``."""
        if self.json_output:
            error = {"type": type(exc).__name__, "message": str(exc), **extra}
            click.echo(json.dumps({"error": error}, indent=2, sort_keys=True, default=str))
        else:
            click.echo(f"error: {exc}", err=True)
        sys.exit(code)

    def load(self, sandbox_id: str) -> BaseSandbox:
        """Re-open a persisted sandbox (exit 3 when unknown)."""
        try:
            record = self.store.load(sandbox_id)
        except SandboxError as exc:
            self.fail(EXIT_NOT_FOUND, exc)
        return self.factory.reopen(record)

    @contextmanager
    def locked(self, sandbox_id: str) -> Iterator[BaseSandbox]:
        """Re-open a sandbox under its plan's cross-process lock, for commands that change it.

        Two invocations acting on one plan (``commit`` beside ``rollback``, two ``commit-plan``)
        run one after the other, and the second re-reads what the first recorded.
        """
        try:
            record = self.store.load(sandbox_id)
        except SandboxError as exc:
            self.fail(EXIT_NOT_FOUND, exc)
        plan_id = str((record.get("context") or {}).get("plan_id") or f"sandbox:{sandbox_id}")
        with self.store.plan_lock(plan_id):
            yield self.load(sandbox_id)

    def manager(self) -> SandboxManager:
        """A manager over the state directory, with the plan's sandboxes re-opened lazily."""
        return SandboxManager(self.factory, cleanup_on_exit=False, store=self.store)

    def checkpoints(self) -> CheckpointManager:
        """A checkpoint manager persisting into the state directory."""
        return CheckpointManager(state_dir=self.store.state_dir)


@contextmanager
def _progress(state: CliState, label: str) -> Iterator[None]:
    """Show elapsed seconds on stderr while a long step runs (human mode only)."""
    if state.json_output or not sys.stderr.isatty():
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(0.5):
            click.echo(f"\r{label} ... {time.monotonic() - started:5.1f}s", err=True, nl=False)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        click.echo(f"\r{label} ... done in {time.monotonic() - started:.1f}s", err=True)


def _guard(state: CliState, action: Callable[[], None]) -> None:
    """Run ``action``, mapping core errors to the documented exit codes."""
    try:
        action()
    except TwoPhaseUnavailableError as exc:
        state.fail(EXIT_TWO_PHASE_UNAVAILABLE, exc)
    except ChangedSinceApprovalError as exc:
        state.fail(
            EXIT_CHANGED_SINCE_APPROVAL,
            exc,
            approved_digest=exc.approved_digest,
            actual_digest=exc.actual_digest,
        )
    except SandboxLockedError as exc:  # before the phase classes it also belongs to
        state.fail(EXIT_LOCKED, exc, lock_path=exc.lock_path)
    except SandboxPermissionError as exc:
        state.fail(EXIT_PERMISSION, exc)
    except SandboxCommitError as exc:
        if exc.conflicts:
            state.fail(EXIT_CONFLICT, exc, conflicts=exc.conflicts)
        state.fail(EXIT_ERROR, exc)
    except SandboxStateError as exc:
        state.fail(EXIT_STATE, exc)
    except AtomicCommitError as exc:
        code = EXIT_COMPENSATION_FAILED if exc.failed_rollback_ids else EXIT_COMPENSATED
        state.fail(
            code,
            exc,
            rolled_back_ids=exc.rolled_back_ids,
            failed_rollback_ids=exc.failed_rollback_ids,
        )
    except (SandboxError, ValueError, OSError) as exc:
        state.fail(EXIT_ERROR, exc)


def _parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--option")
        options[key] = value
    return options


def _format_result(result: dict[str, Any]) -> str:
    lines = [
        f"sandbox {result['sandbox_id']}: {'committed' if result['success'] else 'FAILED'}"
        + (f" ({result['commit_ref']})" if result.get("commit_ref") else "")
    ]
    for label, key in (("changed", "changed_files"), ("added", "added_files")):
        if result.get(key):
            lines.append(f"  {label}: {', '.join(result[key])}")
    if result.get("deleted_files"):
        lines.append(f"  deleted: {', '.join(result['deleted_files'])}")
    if result.get("error"):
        lines.append(f"  error: {result['error']}")
    return "\n".join(lines)
