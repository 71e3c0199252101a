"""``sandbox-core``: the command-line face of sandbox_core.

Every command works on sandboxes persisted in a state directory (``--state-dir``, default
``$SANDBOX_CORE_STATE_DIR`` or ``~/.local/state/sandbox-core``), so separate invocations — and the
operator's pod executor, which drives this CLI through the exec API — see the same sandboxes.

Output is human-readable; ``--json`` prints exactly one JSON document on stdout instead.
Errors print ``{"error": {"type": ..., "message": ...}}`` with ``--json``.

Exit codes: see :mod:`sandbox_core.cli.context`. The plan commands are in
:mod:`sandbox_core.cli.plan`, the demo in :mod:`sandbox_core.cli.demo`.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from sandbox_core.agent import wire
from sandbox_core.agent.operations import AgentConfig
from sandbox_core.cli.context import (
    EXIT_CODES_HELP,
    EXIT_NOT_FOUND,
    CliState,
    _format_result,
    _guard,
    _parse_options,
    _progress,
)
from sandbox_core.cli.demo import run_demo
from sandbox_core.cli.plan import cleanup_plan, commit_plan, recover, review
from sandbox_core.describe import describe as _describe
from sandbox_core.describe import sandbox_diff
from sandbox_core.errors import SandboxError, SandboxStateError
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.manager import drop_finished_journal
from sandbox_core.redaction import redact
from sandbox_core.strategies.factory import SandboxStrategy


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


# The plan commands (one plan's sandboxes under its lock) live in their own module.
main.add_command(cleanup_plan)
main.add_command(commit_plan)
main.add_command(review)
main.add_command(recover)


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
    """Create a sandbox of ORIGINAL_PATH (a directory, a git repository, or a database DSN).

    With ``--sandbox-id`` it may be run again: the sandbox that id names is printed (nothing is
    made twice), and what an interrupted run left is cleaned up and made again (case 18).
    """
    extra: dict[str, Any] = _parse_options(options)
    if state.sandbox_root:
        extra.setdefault("sandbox_root", state.sandbox_root)

    def run() -> None:
        with _progress(state, f"creating {strategy} sandbox of {redact(original_path)}"):
            sandbox = SandboxHost(state.store, state.factory).provision(
                plan_id,
                resource_id,
                original_path,
                strategy,
                sandbox_id=sandbox_id or extra.pop("sandbox_id", None),
                **extra,
            )
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


@main.command("serve-workspace")
@click.option(
    "--port",
    type=int,
    default=None,
    help=f"Listen port (default ${wire.PORT_ENV} or {wire.DEFAULT_PORT}).",
)
@click.option("--host", default=None, help="Listen address (default 0.0.0.0).")
@click.option(
    "--token-file",
    default=None,
    help=f"File holding the bearer token (default ${wire.TOKEN_FILE_ENV}).",
)
@click.pass_obj
def serve_workspace(
    state: CliState, port: int | None, host: str | None, token_file: str | None
) -> None:
    """The workspace Pod's main process: the workspace agent (HTTP, token-authenticated)."""
    # Imported here: aiohttp is loaded by the agent's process only, never by a CLI call.
    from sandbox_core.agent.server import serve

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
