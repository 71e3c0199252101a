"""``sandbox-core``: the command-line face of sandbox_core.

Every command works on sandboxes persisted in a state directory (``--state-dir``, default
``$SANDBOX_CORE_STATE_DIR`` or ``~/.local/state/sandbox-core``), so separate invocations — and the
operator's pod executor, which drives this CLI through the exec API — see the same sandboxes.

Output is human-readable; ``--json`` prints exactly one JSON document on stdout instead.
Errors print ``{"error": {"type": ..., "message": ...}}`` with ``--json``.

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
       (ChangedSinceApproval, issue 9); every participant was aborted, nothing changed
    11 ``commit-plan --two-phase`` refused: the plan cannot be committed in two phases
       (TwoPhaseUnavailableError: more than one participant that cannot prepare durably, or a
       PostgreSQL server with max_prepared_transactions = 0); nothing changed. With ``--auto``
       the plan falls back to the saga instead and says so.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from sandbox_core import _fs_utils
from sandbox_core._db import redact
from sandbox_core._describe import describe as _describe
from sandbox_core.base import BaseSandbox
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
from sandbox_core.factory import SandboxFactory, SandboxStrategy
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.host.manager import SandboxManager, drop_finished_journal
from sandbox_core.host.store import SandboxStore
from sandbox_core.plan.review import PlanReview

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


@click.group(epilog=EXIT_CODES_HELP)
@click.option("--json", "json_output", is_flag=True, help="Print one JSON document on stdout.")
@click.option(
    "--state-dir",
    envvar="SANDBOX_CORE_STATE_DIR",
    type=click.Path(file_okay=False),
    help="Where sandbox records live (default ~/.local/state/sandbox-core).",
)
@click.option(
    "--sandbox-root",
    envvar="SANDBOX_CORE_ROOT",
    type=click.Path(file_okay=False),
    help="Where sandbox copies, worktrees and overlay layers are made.",
)
@click.version_option(package_name="sandbox-operator")
@click.pass_context
def main(
    ctx: click.Context, json_output: bool, state_dir: str | None, sandbox_root: str | None
) -> None:
    """Isolated, reviewable, all-or-nothing writes for plan executions."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = CliState(json_output, state_dir, sandbox_root)


@main.command()
@click.option("--plan", "plan_id", required=True, help="Plan id owning the sandbox.")
@click.option("--resource", "resource_id", required=True, help="Resource id being sandboxed.")
@click.option(
    "--strategy",
    required=True,
    type=click.Choice([s.value for s in SandboxStrategy]),
    help="Sandbox strategy.",
)
@click.option("--option", "options", multiple=True, help="Strategy option KEY=VALUE (repeatable).")
@click.option("--sandbox-id", default=None, help="Use this id (a ULID) instead of a new one.")
@click.argument("original_path")
@click.pass_obj
def create(
    state: CliState,
    plan_id: str,
    resource_id: str,
    strategy: str,
    options: tuple[str, ...],
    sandbox_id: str | None,
    original_path: str,
) -> None:
    """Create a sandbox of ORIGINAL_PATH (a directory, a git repository, or a database DSN)."""
    extra: dict[str, Any] = _parse_options(options)
    if state.sandbox_root:
        extra.setdefault("sandbox_root", state.sandbox_root)
    if sandbox_id:
        extra["sandbox_id"] = sandbox_id

    def run() -> None:
        sandbox = state.factory.create(strategy, resource_id, original_path, **extra)
        with _progress(state, f"creating {strategy} sandbox of {redact(original_path)}"):
            try:
                sandbox.create(plan_id)
            except SandboxError:
                # The strategy already undid its partial work; leave no orphan record either.
                sandbox.cleanup()
                raise
        state.store.save(sandbox)
        info = _describe(sandbox)
        state.emit(info, f"{sandbox.sandbox_id}\t{strategy}\t{info['sandbox_path']}")

    _guard(state, run)


@main.command("list")
@click.option("--plan", "plan_id", default=None, help="Only this plan's sandboxes.")
@click.pass_obj
def list_(state: CliState, plan_id: str | None) -> None:
    """List persisted sandboxes."""

    def run() -> None:
        sandboxes = [state.factory.reopen(r) for r in state.store.records(plan_id)]
        rows = [_describe(s) for s in sandboxes]
        lines = [
            f"{r['sandbox_id']}\t{r['plan_id']}\t{r['resource_id']}\t{r['strategy']}\t{r['status']}"
            for r in rows
        ]
        state.emit({"sandboxes": rows}, "\n".join(lines) if lines else "no sandboxes")

    _guard(state, run)


@main.command()
@click.argument("sandbox_id")
@click.pass_obj
def status(state: CliState, sandbox_id: str) -> None:
    """Show one sandbox."""
    sandbox = state.load(sandbox_id)
    info = _describe(sandbox)
    state.emit(info, json.dumps({k: v for k, v in info.items() if k != "record"}, indent=2))


@main.command()
@click.argument("sandbox_id")
@click.argument("resource_path")
@click.pass_obj
def path(state: CliState, sandbox_id: str, resource_path: str) -> None:
    """Print the sandbox path of RESOURCE_PATH (activates the sandbox)."""

    def run() -> None:
        with state.locked(sandbox_id) as sandbox:
            try:
                resolved = sandbox.get_path(resource_path)
            finally:
                state.store.save(sandbox)
            state.emit({"sandbox_id": sandbox_id, "path": resolved}, resolved)

    _guard(state, run)


def sandbox_diff(sandbox: BaseSandbox) -> str:
    """Unified diff of the sandbox against its original.

    Uses the strategy's own ``diff()`` when it has one (git_worktree); for a database
    (transaction_rollback) lists the pending write statements; else compares the trees.
    """
    native = getattr(sandbox, "diff", None)
    if callable(native):
        return str(native())
    pending = getattr(sandbox, "statements", None)
    if callable(pending):
        lines = []
        for entry in pending():
            params = f"  -- params: {json.dumps(entry['params'])}" if entry.get("params") else ""
            lines.append(f"{entry['sql'].rstrip(';')};{params}")
        return "\n".join(lines) + ("\n" if lines else "")
    context = sandbox.context
    if context is None:
        raise SandboxStateError(f"sandbox {sandbox.sandbox_id} has not been created")
    return _fs_utils.compute_diff(context.original_path, context.sandbox_path)


@main.command()
@click.argument("sandbox_id")
@click.pass_obj
def diff(state: CliState, sandbox_id: str) -> None:
    """Show the unified diff between the sandbox and its original."""
    sandbox = state.load(sandbox_id)

    def run() -> None:
        text = sandbox_diff(sandbox)
        state.emit({"sandbox_id": sandbox_id, "diff": text}, text.rstrip("\n") or "(no changes)")

    _guard(state, run)


@main.command()
@click.argument("sandbox_id")
@click.option("-m", "--message", default=None, help="Commit message.")
@click.pass_obj
def commit(state: CliState, sandbox_id: str, message: str | None) -> None:
    """Commit one sandbox's changes to its original."""

    def run() -> None:
        with state.locked(sandbox_id) as sandbox:
            try:
                result = sandbox.commit(message)
            finally:
                state.store.save(sandbox)
            state.emit(result.to_dict(), _format_result(result.to_dict()))

    _guard(state, run)


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


@main.command()
@click.argument("sandbox_id")
@click.pass_obj
def rollback(state: CliState, sandbox_id: str) -> None:
    """Discard the sandbox's changes (ACTIVE) or undo its commit (COMMITTED)."""

    def run() -> None:
        with state.locked(sandbox_id) as sandbox:
            try:
                sandbox.rollback()
            finally:
                state.store.save(sandbox)
            state.emit(_describe(sandbox), f"sandbox {sandbox_id}: {sandbox.status.value}")

    _guard(state, run)


@main.command()
@click.argument("sandbox_id")
@click.pass_obj
def cleanup(state: CliState, sandbox_id: str) -> None:
    """Remove every artefact of the sandbox and forget it. The original is never touched.

    Idempotent: an id with no record (already cleaned up) succeeds (exit 0, ``"already": true``).
    Nothing is left behind: the record, the sandbox's checkpoints (records and snapshots), and
    the plan's finished commit journal once its last sandbox is gone.
    """

    def forget_checkpoints() -> None:
        checkpoints = state.checkpoints()
        for checkpoint in checkpoints.list_checkpoints(sandbox_id):
            checkpoints.delete_checkpoint(checkpoint.checkpoint_id)

    def run() -> None:
        try:
            record = state.store.load(sandbox_id)
        except SandboxError:
            record = None
        if record is None:
            state.store.delete(sandbox_id)  # validates the id (no path traversal)
            forget_checkpoints()
            payload = {"sandbox_id": sandbox_id, "status": "cleaned_up", "already": True}
            state.emit(payload, "already cleaned up")
            return
        with state.locked(sandbox_id) as sandbox:
            sandbox.cleanup()
            forget_checkpoints()
            state.store.delete(sandbox_id)
            plan_id = sandbox.context.plan_id if sandbox.context else None
            if plan_id:
                drop_finished_journal(state.store, plan_id)
            payload = {"sandbox_id": sandbox_id, "status": sandbox.status.value, "already": False}
            state.emit(payload, "cleaned up")

    _guard(state, run)


@main.command()
@click.argument("sandbox_id")
@click.option("--phase", default="manual", show_default=True, help="Phase label of the checkpoint.")
@click.option("--meta", "meta", multiple=True, help="Metadata KEY=VALUE (repeatable).")
@click.pass_obj
def checkpoint(state: CliState, sandbox_id: str, phase: str, meta: tuple[str, ...]) -> None:
    """Snapshot the sandbox so it can be restored later."""

    def run() -> None:
        with state.locked(sandbox_id) as sandbox:
            plan_id = sandbox.context.plan_id if sandbox.context else ""
            metadata = _parse_options(meta)
            created = state.checkpoints().create_checkpoint(sandbox, plan_id, phase, metadata)
            payload = created.model_dump(mode="json")
            state.emit(payload, f"{created.checkpoint_id}\t{phase}\t{created.snapshot_path}")

    _guard(state, run)


@main.command("cleanup-plan")
@click.argument("plan_id")
@click.pass_obj
def cleanup_plan(state: CliState, plan_id: str) -> None:
    """Clean up every sandbox of PLAN_ID and delete the plan's checkpoints.

    ``SandboxManager.cleanup_all``: nothing is left behind, and a plan already cleaned up (or
    never seen) succeeds with no change (idempotent, exit 0).
    """

    def run() -> None:
        manager = state.manager()
        with state.store.plan_lock(plan_id):
            sandbox_ids = [sandbox.sandbox_id for sandbox in manager.reopen_plan(plan_id)]
            manager.cleanup_all(plan_id)
        state.emit(
            {"plan_id": plan_id, "cleaned_up": sandbox_ids},
            f"plan {plan_id}: {len(sandbox_ids)} sandbox(es) cleaned up",
        )

    _guard(state, run)


@main.command()
@click.argument("checkpoint_id")
@click.pass_obj
def restore(state: CliState, checkpoint_id: str) -> None:
    """Restore a sandbox to CHECKPOINT_ID."""
    manager = state.checkpoints()

    def run() -> None:
        found = manager.get_checkpoint(checkpoint_id)
        if found is None:
            state.fail(EXIT_NOT_FOUND, SandboxError(f"no checkpoint with id {checkpoint_id}"))
        with state.locked(found.sandbox_id) as sandbox:
            if not sandbox.status.is_open:
                raise SandboxStateError(
                    f"cannot restore sandbox {sandbox.sandbox_id} in status "
                    f"{sandbox.status.value}: only created, active or rolled-back sandboxes"
                )
            if not manager.restore(sandbox, found):
                raise SandboxError(f"restore of checkpoint {checkpoint_id} failed")
            state.store.save(sandbox)
        state.emit(
            {"checkpoint_id": checkpoint_id, "sandbox_id": found.sandbox_id, "restored": True},
            f"sandbox {found.sandbox_id} restored to checkpoint {checkpoint_id}",
        )

    _guard(state, run)


@main.command("commit-plan")
@click.argument("plan_id")
@click.option("-m", "--message", default=None, help="Commit message for every sandbox.")
@click.option(
    "--two-phase",
    "mode",
    flag_value="two_phase",
    default=None,
    help="Two-phase commit only: refuse (exit 11) when the plan cannot use it.",
)
@click.option(
    "--saga",
    "mode",
    flag_value="saga",
    help="The saga (the default): commit one by one and compensate on failure (seed 002).",
)
@click.option(
    "--auto",
    "mode",
    flag_value="auto",
    help="Two phases when the plan can use them, else the saga (the result says why).",
)
@click.option(
    "--approved-digest",
    default=None,
    help="Plan digest from `sandbox-core review`; a plan that changed since is refused (exit 10).",
)
@click.pass_obj
def commit_plan(
    state: CliState,
    plan_id: str,
    message: str | None,
    mode: str | None,
    approved_digest: str | None,
) -> None:
    """Atomically commit every sandbox of PLAN_ID: all committed, or none changed.

    ``--two-phase``: every conflict is found before any original is touched (issue 9); refused
    (exit 11) when the plan cannot use two phases. ``--auto``: two phases, falling back to the
    saga when they cannot be used (the result says why, ``fallback_reason``). Default
    (``--saga``): the seed's saga, commit one by one and compensate (LIFO) on failure.
    """

    def run() -> None:
        manager = state.manager()
        with state.store.plan_lock(plan_id):
            manager.reopen_plan(plan_id)  # under the lock: never act on a stale status
            results = manager.commit_plan(
                plan_id,
                mode="two_phase" if mode == "two_phase" else "auto" if mode == "auto" else "saga",
                message=message,
                approved_digest=approved_digest,
            )
        payload = {"plan_id": plan_id, "results": [r.to_dict() for r in results]}
        failed = [r for r in results if not r.success]
        if failed:
            meta = failed[0].metadata
            if meta.get("reason") == "ChangedSinceApproval":
                state.fail(
                    EXIT_CHANGED_SINCE_APPROVAL,
                    ChangedSinceApprovalError(
                        failed[0].error or "changed since approval",
                        approved_digest=str(meta.get("approved_digest") or ""),
                        actual_digest=str(meta.get("digest") or ""),
                    ),
                    approved_digest=meta.get("approved_digest"),
                    actual_digest=meta.get("digest"),
                    results=payload["results"],
                )
            if meta.get("mode") == "two_phase" and meta.get("conflicts"):
                state.fail(
                    EXIT_CONFLICT,
                    SandboxCommitError(failed[0].error or "conflict", list(meta["conflicts"])),
                    conflicts=meta["conflicts"],
                    results=payload["results"],
                )
            error = AtomicCommitError(
                failed[0].error or "atomic commit failed",
                list(meta.get("rolled_back_ids", [])),
                list(meta.get("failed_rollback_ids", [])),
            )
            code = EXIT_COMPENSATION_FAILED if error.failed_rollback_ids else EXIT_COMPENSATED
            if meta.get("mode") == "two_phase" and meta.get("phase") in ("applying", "aborting"):
                code = EXIT_COMPENSATION_FAILED  # left open: `recover` finishes it
            if not state.json_output:
                click.echo(f"  rolled back: {', '.join(error.rolled_back_ids) or '(none)'}")
                if error.failed_rollback_ids:
                    click.echo(f"  FAILED rollbacks: {', '.join(error.failed_rollback_ids)}")
            state.fail(
                code,
                error,
                rolled_back_ids=error.rolled_back_ids,
                failed_rollback_ids=error.failed_rollback_ids,
                results=payload["results"],
            )
        human = "\n".join(_format_result(r.to_dict()) for r in results)
        state.emit(payload, human or "nothing to commit")

    _guard(state, run)


def _review_table(review: PlanReview) -> str:
    """The human form of ``sandbox-core review``: one row per sandbox, then the digest."""
    header = (
        "SANDBOX",
        "RESOURCE",
        "STRATEGY",
        "A",
        "M",
        "D",
        "+LINES",
        "-LINES",
        "BYTES",
        "STMTS",
        "CONFLICTS",
    )
    rows = [header] + [
        (
            s.sandbox_id,
            s.resource_id,
            s.strategy,
            str(len(s.added)),
            str(len(s.changed)),
            str(len(s.deleted)),
            str(s.lines_added),
            str(s.lines_removed),
            str(s.bytes_changed),
            str(s.statements),
            ", ".join(s.conflicts) or "-",
        )
        for s in review.sandboxes
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.append(f"plan {review.plan_id} digest {review.digest}")
    if review.has_conflicts:
        lines.append("CONFLICTS: committing now would fail; nothing would be changed")
    return "\n".join(lines)


@main.command()
@click.argument("plan_id")
@click.option("--max-paths", default=20, show_default=True, help="Paths per sandbox in --json.")
@click.pass_obj
def review(state: CliState, plan_id: str, max_paths: int) -> None:
    """What committing PLAN_ID would change now, per sandbox, and the plan digest (issue 9).

    Takes no locks on the originals and changes nothing. Approve the digest with
    ``commit-plan --approved-digest``. ``--json`` prints ``PlanReview.to_dict()``.
    """

    def run() -> None:
        manager = state.manager()
        manager.reopen_plan(plan_id)
        found = manager.review_plan(plan_id)
        state.emit(found.to_dict(max_paths=max_paths), _review_table(found))

    _guard(state, run)


@main.command()
@click.argument("plan_id")
@click.pass_obj
def recover(state: CliState, plan_id: str) -> None:
    """Finish a plan commit interrupted by a crash (all committed, or all compensated).

    Also retries compensations that failed (case 21). Exit 7 while one still fails; run again
    once its cause is gone. Running it on a finished plan changes nothing.
    """

    def run() -> None:
        manager = state.manager()
        with state.store.plan_lock(plan_id):
            manager.reopen_plan(plan_id)
            journal = manager.recover(plan_id)
        if journal is None:
            state.emit({"plan_id": plan_id, "journal": None}, f"plan {plan_id}: no commit journal")
            return
        payload = {"plan_id": plan_id, "journal": journal.model_dump(mode="json")}
        if not journal.phase.is_terminal:
            # Case 21: a compensation failed again; the journal stays open for the next run.
            # Two-phase (issue 9): an abort or an apply after the decision failed again.
            still = (
                f"compensation still failing for {', '.join(journal.failed_rollback_ids)}"
                if journal.mode == "saga"
                else f"two-phase {journal.phase.value} not finished ({journal.error})"
            )
            error = AtomicCommitError(
                f"plan {plan_id}: {still}; run recover again once the cause is fixed",
                journal.rolled_back_ids,
                journal.failed_rollback_ids,
            )
            state.fail(
                EXIT_COMPENSATION_FAILED,
                error,
                rolled_back_ids=error.rolled_back_ids,
                failed_rollback_ids=error.failed_rollback_ids,
                journal=payload["journal"],
            )
        state.emit(payload, f"plan {plan_id}: {journal.phase.value} ({journal.reason.value})")

    _guard(state, run)


@main.command("serve-workspace")
@click.option(
    "--port", type=int, default=None, help="Listen port (default $SANDBOX_AGENT_PORT or 8471)."
)
@click.option("--host", default=None, help="Listen address (default 0.0.0.0).")
@click.option(
    "--token-file",
    default=None,
    help="File holding the bearer token (default $SANDBOX_AGENT_TOKEN_FILE).",
)
@click.pass_obj
def serve_workspace(
    state: CliState, port: int | None, host: str | None, token_file: str | None
) -> None:
    """The workspace Pod's main process: the workspace agent (HTTP, token-authenticated)."""
    from dataclasses import replace

    from sandbox_core.agent import AgentConfig, serve  # aiohttp only in the agent process

    config = AgentConfig.from_env()
    config = replace(
        config,
        state_dir=Path(state.store.state_dir),
        sandbox_root=Path(state.sandbox_root or config.sandbox_root),
        port=port or config.port,
        host=host or config.host,
        token_file=Path(token_file) if token_file else config.token_file,
    )
    serve(config)


@main.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the demo builds its repository (default: a new temp dir).",
)
@click.option("--source-tree", default=None, help="Real source tree to build the repository from.")
def demo(workdir: str | None, source_tree: str | None) -> None:
    """The main job: a real repository, two sandboxes, a diff, an atomic commit, a compensation."""
    from sandbox_core._demo import run_demo

    sys.exit(run_demo(Path(workdir) if workdir else None, source_tree))


def run() -> None:
    """Console entry point: like ``main()``, but usage errors honour ``--json`` too (exit 2)."""
    try:
        main.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        if "--json" in sys.argv[1:]:
            error = {"type": "UsageError", "message": exc.format_message()}
            click.echo(json.dumps({"error": error}, indent=2, sort_keys=True))
        else:
            exc.show()
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    run()
