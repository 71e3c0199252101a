"""``kubectl-sandbox``: a kubectl plugin on :mod:`sandbox_client`.

Installed as the console script ``kubectl-sandbox``, so ``kubectl sandbox ...`` finds it on
``PATH``. kubectl's conventions: every command takes ``-n/--namespace``, ``--context``,
``--kubeconfig`` and ``-o/--output`` (``json``, ``yaml``, ``wide``, ``name``) anywhere on the
line; errors go to stderr as ``error: <Reason>: <message>``; durations as ``90s``, ``5m``.

Exit codes (also in ``--help`` and docs/client.md):

====  =====================================================================================
0     success (for ``commit --wait``: every sandbox of the plan committed)
1     the operation failed (the operator's condition reason is printed), or the API server
      could not be reached
2     usage error
3     not found (Sandbox, Checkpoint, plan, file)
4     refused: invalid spec or state, a path leaving the sandbox, no file operations for the
      executor
5     conflict (already exists; a merge conflict outside a plan commit)
6     ``commit --wait``: the commit failed and every sandbox that had landed was compensated
7     ``commit --wait``: the commit failed and a compensation failed too (see the ids)
8     timeout while waiting
====  =====================================================================================
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, ParamSpec, TypeVar

import click
import yaml

from sandbox_client.client import Plan, SandboxClient
from sandbox_client.errors import (
    ConflictError,
    NotFoundError,
    RefusedError,
    SandboxClientError,
    WaitTimeoutError,
)
from sandbox_client.models import PlanCommitPhase, PlanCommitResult, PlanReview, SandboxInfo

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_CONFLICT = 5
EXIT_COMPENSATED = 6
EXIT_COMPENSATION_FAILED = 7
EXIT_TIMEOUT = 8

OUTPUTS = ("json", "yaml", "wide", "name")
P = ParamSpec("P")
R = TypeVar("R")


class Options:
    """The kubectl-style options shared by every command."""

    def __init__(
        self,
        namespace: str | None,
        context: str | None,
        kubeconfig: str | None,
        output: str,
        impersonate: str | None = None,
    ) -> None:
        self.namespace = namespace
        self.context = context
        self.kubeconfig = kubeconfig
        self.output = output
        self.impersonate = impersonate

    def client(self) -> SandboxClient:
        """A client for these options (kubeconfig rules of kubectl; ``--as`` impersonates)."""
        return SandboxClient(
            kubeconfig=self.kubeconfig,
            context=self.context,
            namespace=self.namespace,
            impersonate=self.impersonate,
        )


def _common(func: Callable[..., None]) -> Callable[..., None]:
    """Add ``-n``, ``--context``, ``--kubeconfig`` and ``-o`` to a command, and map the
    client's typed errors to the documented exit codes."""

    @click.option("-n", "--namespace", default=None, help="Namespace (default: the context's).")
    @click.option("--context", default=None, help="kubeconfig context to use.")
    @click.option("--kubeconfig", default=None, help="Path of the kubeconfig file.")
    @click.option("-o", "--output", type=click.Choice(OUTPUTS), default=None, help="Output format.")
    @click.option(
        "--as", "impersonate", default=None, help="Act as this user (kubectl's impersonation)."
    )
    @functools.wraps(func)
    def wrapper(
        namespace: str | None,
        context: str | None,
        kubeconfig: str | None,
        output: str | None,
        impersonate: str | None,
        **kwargs: Any,
    ) -> None:
        options = Options(namespace, context, kubeconfig, output or "", impersonate)
        try:
            func(options, **kwargs)
        except WaitTimeoutError as exc:
            _fail(exc, EXIT_TIMEOUT)
        except NotFoundError as exc:
            _fail(exc, EXIT_NOT_FOUND)
        except RefusedError as exc:
            _fail(exc, EXIT_REFUSED)
        except ConflictError as exc:
            _fail(exc, EXIT_CONFLICT)
        except SandboxClientError as exc:
            _fail(exc, EXIT_FAILED)

    return wrapper


def _fail(exc: SandboxClientError, code: int) -> NoReturn:
    click.echo(f"error: {exc.reason}: {exc.message}", err=True)
    sys.exit(code)


def parse_duration(text: str) -> float:
    """Seconds of a kubectl-style duration (``90``, ``90s``, ``5m``, ``1h``, ``1m30s``).

    Raises:
        click.BadParameter: not a duration.
    """
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise click.BadParameter(f"{text!r} is not a duration such as 90s, 5m or 1h")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * scale[u] for n, u in parts)


def _timeout_option(default: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    return click.option(
        "--timeout",
        default=default,
        show_default=True,
        help="How long to wait (90s, 5m, ...).",
    )


def _age(timestamp: str) -> str:
    if not timestamp:
        return "<unknown>"
    created = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    seconds = int((datetime.now(UTC) - created).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    lines = [
        "   ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
        for row in [headers, *rows]
    ]
    return "\n".join(lines)


def _emit(options: Options, data: Any, text: str) -> None:
    """Print ``data`` as JSON/YAML when ``-o json|yaml``, else ``text``."""
    if options.output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    elif options.output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip("\n"))
    else:
        click.echo(text)


def _as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 success; 1 operation failed; 2 usage; 3 not found; 4 refused; "
    "5 conflict; 6 commit failed, landed sandboxes compensated; 7 commit failed and a "
    "compensation failed; 8 timeout.",
)
def cli() -> None:
    """Work with the sandboxes of AI plan executions (Sandbox, Checkpoint, PlanCommit)."""


@cli.command("list")
@click.option("--plan", "plan_id", default=None, help="Only the Sandboxes of this plan.")
@_common
def list_command(options: Options, plan_id: str | None) -> None:
    """List Sandboxes (NAME, PLAN, RESOURCE, STRATEGY, PHASE, READY, AGE)."""
    with options.client() as client:
        found = client.list_sandboxes(options.namespace, plan_id)
    if options.output == "name":
        click.echo("\n".join(f"sandbox/{s.name}" for s in found))
        return
    headers = ["NAME", "PLAN", "RESOURCE", "STRATEGY", "PHASE", "READY", "AGE"]
    wide = options.output == "wide"
    if wide:
        headers += ["EXECUTOR", "SANDBOX-ID", "PATH"]

    def row(s: SandboxInfo) -> list[str]:
        cells = [
            s.name,
            s.spec.plan_id,
            s.spec.resource_id,
            s.spec.strategy,
            s.phase.value if s.phase else "",
            "True" if s.ready else "False",
            _age(s.created),
        ]
        return [*cells, s.executor, s.sandbox_id, s.sandbox_path] if wide else cells

    text = _table(headers, [row(s) for s in found]) if found else "No resources found."
    _emit(options, _as_list([s.raw for s in found]), text)


@cli.command()
@click.argument("sandbox")
@_common
def diff(options: Options, sandbox: str) -> None:
    """Show the unified diff of SANDBOX against its original."""
    with options.client() as client:
        text = client.sandbox(sandbox, options.namespace).diff()
    _emit(options, {"sandbox": sandbox, "diff": text}, text.rstrip("\n") or "(no changes)")


@cli.command()
@click.argument("sandbox")
@_common
def log(options: Options, sandbox: str) -> None:
    """Commits, checkpoints, restores and rollbacks of SANDBOX, newest first."""
    with options.client() as client:
        entries = client.history(sandbox, options.namespace)
    rows = [[e.time, e.kind, e.outcome, e.source, e.message] for e in entries]
    text = (
        _table(["TIME", "KIND", "OUTCOME", "SOURCE", "MESSAGE"], rows) if rows else ("No history.")
    )
    _emit(options, [e.model_dump(mode="json") for e in entries], text)


class _Progress:
    """One progress line on stderr: rewritten in place on a terminal, else one line per
    change."""

    def __init__(self) -> None:
        self.last = ""
        self.tty = sys.stderr.isatty()

    def __call__(self, result: PlanCommitResult) -> None:
        total = len(result.steps)
        landed = sum(1 for s in result.steps if s.state.value == "Committed")
        line = f"plancommit/{result.name}: {result.phase.value}"
        if total:
            line += f" ({landed}/{total} committed)"
        if line == self.last:
            return
        self.last = line
        if self.tty:
            click.echo(f"\r{line}\033[K", err=True, nl=False)
        else:
            click.echo(line, err=True)

    def done(self) -> None:
        if self.tty and self.last:
            click.echo("", err=True)


def _result_exit(result: PlanCommitResult) -> int:
    if result.phase in (PlanCommitPhase.COMMITTED, PlanCommitPhase.ROLLED_BACK):
        return (
            EXIT_OK if result.committed or result.action.value == "Rollback" else (EXIT_COMPENSATED)
        )
    if result.phase is PlanCommitPhase.FAILED:
        return EXIT_COMPENSATION_FAILED if result.failed_rollback_ids else EXIT_COMPENSATED
    return EXIT_OK


def _result_text(result: PlanCommitResult) -> str:
    rows = [
        [
            result.name,
            result.plan_id,
            result.action.value,
            result.phase.value,
            ",".join(result.rolled_back_ids) or "-",
            ",".join(result.failed_rollback_ids) or "-",
        ]
    ]
    text = _table(["NAME", "PLAN", "ACTION", "PHASE", "ROLLED-BACK", "FAILED-ROLLBACK"], rows)
    for condition in result.conditions:
        text += f"\n{condition.type}={condition.status} {condition.reason}: {condition.message}"
    return text


@cli.command()
@click.argument("plan_id", metavar="PLAN")
@click.option("--wait/--no-wait", default=False, help="Wait for the outcome (progress on stderr).")
@click.option("-m", "--message", default=None, help="Commit message (git_worktree commits).")
@click.option(
    "--mode",
    type=click.Choice(["TwoPhase", "Saga"]),
    default=None,
    help="Commit protocol (default: the operator's, TwoPhase).",
)
@_timeout_option("5m")
@_common
def commit(
    options: Options, plan_id: str, wait: bool, message: str | None, mode: str | None, timeout: str
) -> None:
    """Commit every Sandbox of PLAN, all or nothing (creates a PlanCommit)."""
    seconds = parse_duration(timeout)
    progress = _Progress()
    with options.client() as client:
        plan = Plan(client, plan_id, options.namespace)
        if not plan.sandboxes():
            raise NotFoundError("NotFound", f"plan {plan_id} has no sandboxes")
        try:
            result = plan.commit(
                wait=wait, message=message, timeout=seconds, on_progress=progress, mode=mode
            )
        finally:
            progress.done()
    if options.output == "name":
        click.echo(f"plancommit/{result.name}")
    elif not wait and options.output not in ("json", "yaml"):
        click.echo(f"plancommit.sandbox.cleveragents.io/{result.name} created")
    else:
        _emit(options, result.raw, _result_text(result))
    sys.exit(_result_exit(result) if wait else EXIT_OK)


def _review_text(review: PlanReview, wide: bool) -> str:
    rows = [
        [
            row.name or row.sandbox_id,
            row.strategy,
            f"+{row.added} ~{row.changed} -{row.deleted}",
            f"+{row.lines_added} -{row.lines_removed}",
            str(row.bytes),
            str(row.statements),
            str(len(row.conflicts)),
            row.digest if wide else row.digest[:19],
        ]
        for row in review.sandboxes
    ]
    headers = ["SANDBOX", "STRATEGY", "FILES", "LINES", "BYTES", "STATEMENTS", "CONFLICTS"]
    text = _table([*headers, "DIGEST"], rows)
    if wide:
        for row in review.sandboxes:
            for line in [*row.paths, *(f"! {c}" for c in row.conflicts)]:
                text += f"\n  {row.name or row.sandbox_id}: {line}"
    for check in review.checks:  # the pre-commit checks the digest binds (docs/forks.md)
        verdict = "passed" if check.get("passed") else f"FAILED (exit {check.get('exitCode')})"
        text += f"\ncheck {check.get('name')} in {check.get('sandbox')}: {verdict}"
    return (
        f"{text}\nplancommit/{review.plancommit} {review.phase.value}"
        f"{' (truncated)' if review.truncated else ''}\ndigest: {review.digest}"
    )


@cli.command()
@click.argument("plan_id", metavar="PLAN")
@click.option("-m", "--message", default=None, help="Commit message of the reviewed commit.")
@click.option(
    "--web",
    is_flag=True,
    help="Serve a local review page (127.0.0.1, random port, a token for this run in the URL) with "
    "every diff and Approve / Reject buttons acting as you; until Ctrl-C.",
)
@_timeout_option("5m")
@_common
def review(options: Options, plan_id: str, message: str | None, web: bool, timeout: str) -> None:
    """Review PLAN's changes before they land: a PlanCommit with approval Required
    is made (or the waiting one reused) and its review printed; approve it with
    ``approve PLAN --digest D``, or on the page of ``--web``. Nothing is applied."""
    with options.client() as client:
        plan = Plan(client, plan_id, options.namespace)
        if web:
            from sandbox_client.review_page import ReviewPage, serve

            page = ReviewPage(client, plan_id, options.namespace)
            page.review()  # NotFound (exit 3) before serving when nothing is reviewed
            serve(page, lambda url: click.echo(f"Review page (Ctrl-C to stop): {url}"))
            return
        if not plan.sandboxes():
            raise NotFoundError("NotFound", f"plan {plan_id} has no sandboxes")
        found = plan.review(message=message, timeout=parse_duration(timeout))
    data = found.model_dump(mode="json", by_alias=True)
    _emit(options, data, _review_text(found, options.output == "wide"))


@cli.command()
@click.option("--plan", "plan_id", default=None, help="Only the PlanCommits of this plan.")
@_common
def pending(options: Options, plan_id: str | None) -> None:
    """Plans waiting for approvals: PlanCommit, plan, digest, creator, who approved so far."""
    with options.client() as client:
        found = client.pending_approvals(options.namespace, plan_id)
    rows = [
        [
            r.plancommit,
            r.plan_id,
            r.digest if options.output == "wide" else r.digest[:19],
            r.created_by or "-",
            ",".join(r.approved_by) or "-",
            ",".join(f"{d.user}:{d.decision}" for d in r.approvals) or "-",
        ]
        for r in found
    ]
    headers = ["PLANCOMMIT", "PLAN", "DIGEST", "CREATED-BY", "APPROVED-BY", "DECISIONS"]
    text = _table(headers, rows) if rows else "Nothing waits for an approval."
    _emit(options, [r.model_dump(mode="json", by_alias=True) for r in found], text)


@cli.command()
@click.argument("plan_id", metavar="PLAN")
@click.option(
    "--digest",
    required=True,
    help="The reviewed plan digest you approve (sha256:...; from `kubectl sandbox review`).",
)
@click.option("--wait/--no-wait", default=True, help="Wait for the commit's outcome.")
@click.option("--comment", default=None, help="A comment recorded with your approval.")
@_timeout_option("5m")
@_common
def approve(
    options: Options, plan_id: str, digest: str, wait: bool, comment: str | None, timeout: str
) -> None:
    """Approve the reviewed PLAN by its digest, as yourself: an entry naming the user the API
    server authenticates is appended to the waiting PlanCommit's spec.approvals. With enough
    approvals it commits exactly the reviewed changes (exit codes as ``commit --wait``; 0 and
    the PlanCommit still AwaitingApproval when more approvals are needed)."""
    progress = _Progress()
    with options.client() as client:
        plan = Plan(client, plan_id, options.namespace)
        try:
            result = plan.approve(
                digest,
                wait=wait,
                timeout=parse_duration(timeout),
                on_progress=progress,
                comment=comment,
            )
        finally:
            progress.done()
    _emit(options, result.raw, _result_text(result))
    sys.exit(_result_exit(result) if wait else EXIT_OK)


@cli.command()
@click.argument("plan_id", metavar="PLAN")
@click.option("--digest", required=True, help="The reviewed plan digest you reject (sha256:...).")
@click.option("--comment", default=None, help="Why (shown with the rejection).")
@_timeout_option("2m")
@_common
def reject(options: Options, plan_id: str, digest: str, comment: str | None, timeout: str) -> None:
    """Reject the reviewed PLAN by its digest, as yourself: a counted rejection ends the
    PlanCommit Failed with nothing touched."""
    with options.client() as client:
        plan = Plan(client, plan_id, options.namespace)
        result = plan.reject(digest, comment=comment, timeout=parse_duration(timeout))
    _emit(options, result.raw, _result_text(result))


def _rollback_target(client: SandboxClient, target: str, namespace: str | None) -> tuple[str, str]:
    kind, _, name = target.rpartition("/")
    if kind in ("plan", "plans"):
        return "plan", name
    if kind in ("sandbox", "sandboxes", "sbx"):
        return "sandbox", name
    if kind:
        raise RefusedError("InvalidSpec", f"{target}: use plan/NAME or sandbox/NAME")
    try:
        client.get_sandbox(name, namespace)
    except NotFoundError:
        if client.list_sandboxes(namespace, name):
            return "plan", name
        raise NotFoundError("NotFound", f"no sandbox and no plan named {name}") from None
    return "sandbox", name


@cli.command()
@click.argument("target", metavar="PLAN|SANDBOX")
@_timeout_option("5m")
@_common
def rollback(options: Options, target: str, timeout: str) -> None:
    """Discard the changes of a Sandbox, or of every Sandbox of a plan.

    TARGET is ``sandbox/NAME``, ``plan/ID``, or a bare name: a Sandbox of that name, else the
    plan of that id. Waits for the outcome.
    """
    seconds = parse_duration(timeout)
    with options.client() as client:
        kind, name = _rollback_target(client, target, options.namespace)
        if kind == "sandbox":
            info = client.sandbox(name, options.namespace).rollback(timeout=seconds)
            _emit(options, info.raw, f"sandbox/{name} rolled back")
            return
        progress = _Progress()
        try:
            result = Plan(client, name, options.namespace).rollback(
                timeout=seconds, on_progress=progress
            )
        finally:
            progress.done()
    _emit(options, result.raw, _result_text(result))
    sys.exit(_result_exit(result))


@cli.command()
@click.argument("sandbox")
@click.option("--phase", default="manual", show_default=True, help="Label (snake_case).")
@click.option("--name", default=None, help="Checkpoint name (default: SANDBOX-<random>).")
@click.option("--meta", multiple=True, help="KEY=VALUE stored with the checkpoint.")
@_timeout_option("2m")
@_common
def checkpoint(
    options: Options,
    sandbox: str,
    phase: str,
    name: str | None,
    meta: tuple[str, ...],
    timeout: str,
) -> None:
    """Snapshot SANDBOX now (creates a Checkpoint and waits until it is Ready)."""
    metadata = {}
    for item in meta:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--meta")
        metadata[key] = value
    with options.client() as client:
        info = client.sandbox(sandbox, options.namespace).checkpoint(
            phase, metadata, name=name, timeout=parse_duration(timeout)
        )
    if options.output == "name":
        click.echo(f"checkpoint/{info.name}")
        return
    _emit(
        options, info.raw, f"checkpoint.sandbox.cleveragents.io/{info.name} created ({info.kind})"
    )


@cli.command()
@click.argument("sandbox")
@click.argument("checkpoint_name", metavar="CHECKPOINT")
@_timeout_option("2m")
@_common
def restore(options: Options, sandbox: str, checkpoint_name: str, timeout: str) -> None:
    """Put SANDBOX back to CHECKPOINT (waits until restored)."""
    with options.client() as client:
        info = client.sandbox(sandbox, options.namespace).restore(
            checkpoint_name, timeout=parse_duration(timeout)
        )
    _emit(options, info.raw, f"sandbox/{sandbox} restored to {checkpoint_name}")


@cli.command()
@click.argument("sandbox")
@click.argument("checkpoint_name", metavar="CHECKPOINT")
@click.option("--name", required=True, help="Name of the new Sandbox (the fork).")
@click.option("--resource-id", default=None, help="Its spec.resourceId (default: --name).")
@click.option("--wait/--no-wait", default=True, help="Wait until the fork is Ready.")
@_timeout_option("2m")
@_common
def fork(
    options: Options,
    sandbox: str,
    checkpoint_name: str,
    name: str,
    resource_id: str | None,
    wait: bool,
    timeout: str,
) -> None:
    """Start a new Sandbox from CHECKPOINT of SANDBOX (same plan, strategy and original; its
    change up to the checkpoint becomes the fork's own; docs/forks.md)."""
    with options.client() as client:
        made = client.sandbox(sandbox, options.namespace).fork(
            checkpoint_name, name=name, resource_id=resource_id
        )
        info = made.wait_ready(timeout=parse_duration(timeout)) if wait else made.info()
    _emit(options, info.raw, f"sandbox/{name} forked from {sandbox} at {checkpoint_name}")


def _parse_check(text: str, timeout_seconds: int) -> dict[str, Any]:
    """``NAME=SANDBOX:COMMAND`` -> a ``spec.checks`` item; COMMAND is split like a shell
    line (``shlex``) into argv and never run through a shell."""
    name, sep, rest = text.partition("=")
    sandbox, sep2, command = rest.partition(":")
    argv = shlex.split(command) if sep2 else []
    if not sep or not name or not sandbox or not argv:
        raise click.BadParameter(f"{text!r} is not NAME=SANDBOX:COMMAND", param_hint="--check")
    return {"name": name, "sandbox": sandbox, "command": argv, "timeoutSeconds": timeout_seconds}


@cli.command()
@click.argument("plan_id", metavar="PLAN")
@click.option(
    "--check",
    "checks",
    multiple=True,
    required=True,
    help="NAME=SANDBOX:COMMAND, e.g. unit=attempt-2:'pytest -q' (repeatable).",
)
@click.option(
    "--sandbox", "sandboxes", multiple=True, help="A Sandbox to commit (repeatable; default all)."
)
@click.option("--check-timeout", default=300, show_default=True, help="Seconds per check.")
@_timeout_option("10m")
@_common
def validate(
    options: Options,
    plan_id: str,
    checks: tuple[str, ...],
    sandboxes: tuple[str, ...],
    check_timeout: int,
    timeout: str,
) -> None:
    """Run pre-commit checks in PLAN's Sandboxes before anything is prepared (docs/forks.md).
    When all pass the PlanCommit waits for its approval (``review``, then ``approve``); when
    one fails it ends Failed with nothing touched (exit 1)."""
    wanted = [_parse_check(text, check_timeout) for text in checks]
    with options.client() as client:
        plan = Plan(client, plan_id, options.namespace)
        results = plan.validate(
            wanted, sandboxes=list(sandboxes) or None, timeout=parse_duration(timeout)
        )
    rows = [
        [
            str(r.get("name")),
            str(r.get("sandbox")),
            "passed" if r.get("passed") else "FAILED",
            "timeout" if r.get("timedOut") else str(r.get("exitCode")),
            " ".join(r.get("command") or []),
        ]
        for r in results
    ]
    text = _table(["CHECK", "SANDBOX", "RESULT", "EXIT", "COMMAND"], rows)
    failed = [r for r in results if not r.get("passed")]
    for r in failed:
        text += f"\n--- {r.get('name')} (last lines)\n{r.get('outputTail') or ''}"
    _emit(options, {"checks": results}, text)
    if failed:
        sys.exit(EXIT_FAILED)


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--env")
        env[name] = value
    return env


@cli.command(
    "exec",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("sandbox")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
@click.option("--cwd", default=".", show_default=True, help="Directory, relative to the root.")
@click.option("--env", "env_pairs", multiple=True, help="NAME=VALUE for the command (repeat).")
@click.option("-i", "--stdin", "pass_stdin", is_flag=True, help="Pass this process's stdin on.")
@click.option("--timeout", default="10m", show_default=True, help="Kill it after (90s, 5m...).")
@_common
def exec_command(
    options: Options,
    sandbox: str,
    command: tuple[str, ...],
    cwd: str,
    env_pairs: tuple[str, ...],
    pass_stdin: bool,
    timeout: str,
) -> None:
    """Run CMD (an argv; ``sh -c '...'`` for a shell line) inside SANDBOX's jail, streaming
    its output as it comes, and exit with the command's own exit code (128+N when killed by
    signal N; 137 at the timeout). The plugin's exit codes apply when it cannot start."""
    argv = list(command[1:] if command[:1] == ("--",) else command)
    if not argv:
        raise click.UsageError("give the command after --")
    stdin = sys.stdin.buffer.read() if pass_stdin else b""
    env = _parse_env(env_pairs)
    result = None
    with options.client() as client:
        handle = client.sandbox(sandbox, options.namespace)
        for chunk in handle.exec_stream(
            argv, cwd=cwd, env=env, stdin=stdin, timeout=parse_duration(timeout)
        ):
            if chunk.kind in ("stdout", "stderr"):
                stream = sys.stdout if chunk.kind == "stdout" else sys.stderr
                stream.buffer.write(chunk.data)
                stream.flush()
            elif chunk.result is not None:
                result = chunk.result
    assert result is not None  # the stream raises StreamCut otherwise
    if result.timed_out:
        click.echo(f"error: Timeout: the command ran past {timeout} and was killed", err=True)
    if result.truncated:
        click.echo("warning: the output was cut at the per-stream limit", err=True)
    sys.exit(result.exit_code)


def _sql_value(text: str) -> Any:
    """A ``--param``: JSON when it parses (``1``, ``null``, ``"text"``), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


@cli.command()
@click.argument("sandbox")
@click.argument("statement")
@click.option("--param", "params", multiple=True, help="A parameter, in order (JSON or text).")
@click.option("--max-rows", default=1000, show_default=True, type=int, help="Rows at most.")
@_common
def sql(
    options: Options, sandbox: str, statement: str, params: tuple[str, ...], max_rows: int
) -> None:
    """Run STATEMENT in SANDBOX's transaction (transaction_rollback): a query's rows as a table
    (``-o json`` for columns, rows, rowcount), another statement's kind and row count."""
    values = [_sql_value(p) for p in params]
    with options.client() as client:
        result = client.sandbox(sandbox, options.namespace).sql(
            statement, values or None, max_rows=max_rows
        )
    if result.columns:
        rows = [[_cell(v) for v in row] for row in result.rows]
        text = _table(result.columns, rows) if rows else "(no rows)"
        if result.truncated:
            text += f"\n(first {len(rows)} rows)"
    else:
        text = f"{result.kind} {result.rowcount}"
    _emit(options, result.model_dump(mode="json"), text)


def main() -> None:
    """Console entry point ``kubectl-sandbox``."""
    cli(prog_name="kubectl sandbox")
