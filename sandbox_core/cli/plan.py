"""The plan commands of ``sandbox-core``: ``commit-plan``, ``review``, ``recover`` and
``cleanup-plan``, each on every sandbox of one plan under the plan's lock.

They are plain click commands; :mod:`sandbox_core.cli.main` adds them to the group.
"""

from __future__ import annotations

import click

from sandbox_core.actor.audit import AuditLog
from sandbox_core.cli.context import (
    EXIT_CHANGED_SINCE_APPROVAL,
    EXIT_COMPENSATED,
    EXIT_COMPENSATION_FAILED,
    EXIT_CONFLICT,
    CliState,
    _format_result,
    _guard,
)
from sandbox_core.errors import AtomicCommitError, ChangedSinceApprovalError, SandboxCommitError
from sandbox_core.plan.review import PlanReview


@click.command("cleanup-plan")
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


@click.command("commit-plan")
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

    ``--two-phase``: every conflict is found before any original is touched; refused
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


@click.command()
@click.argument("plan_id")
@click.option("--max-paths", default=20, show_default=True, help="Paths per sandbox in --json.")
@click.pass_obj
def review(state: CliState, plan_id: str, max_paths: int) -> None:
    """What committing PLAN_ID would change now, per sandbox, and the plan digest.

    Takes no locks on the originals and changes nothing. Approve the digest with
    ``commit-plan --approved-digest``. ``--json`` prints ``PlanReview.to_dict()``.
    """

    def run() -> None:
        manager = state.manager()
        manager.reopen_plan(plan_id)
        found = manager.review_plan(plan_id)
        found = found.with_activity(  # what the actors did (docs/actor.md)
            {
                summary.sandbox_id: AuditLog(state.store.state_dir, summary.sandbox_id).summary(
                    max_paths
                )
                for summary in found.sandboxes
            }
        )
        state.emit(found.to_dict(max_paths=max_paths), _review_table(found))

    _guard(state, run)


@click.command()
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
            # Two-phase: an abort or an apply after the decision failed again.
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
