"""Pre-commit checks run through the local door (:class:`~sandbox_core.actor.local.LocalActor`):
the :data:`~sandbox_core.plan.validation.CheckRunner` of sandboxes on local paths (the CLI, a
library user, the operator's local executor). Each command runs in the sandbox's jail like any
actor's command, is audited, and is killed at its timeout.
"""

from __future__ import annotations

from sandbox_core.actor.exec import ExecRequest
from sandbox_core.actor.local import LocalActor
from sandbox_core.plan.validation import Check, CheckOutcome, CheckRunner

__all__ = ["OUTPUT_BYTES_KEPT", "local_check_runner"]

OUTPUT_BYTES_KEPT = 64 * 1024
"""Bytes of each stream a check keeps while it runs (only the tail is shown afterwards)."""


def local_check_runner(actor: LocalActor) -> CheckRunner:
    """A runner that runs each check as a command of ``actor`` in the check's sandbox.

    The outcome's output is stdout then stderr. ``SandboxError`` (no such sandbox, a refused
    request, no jail) propagates: the check fails with it.
    """

    def run(check: Check) -> CheckOutcome:
        request = ExecRequest(
            argv=tuple(check.command),
            timeout_seconds=check.timeout_seconds,
            max_output_bytes=OUTPUT_BYTES_KEPT,
        )
        stdout, stderr, result = actor.exec(check.sandbox_id, request).collect()
        return CheckOutcome(
            exit_code=result.exit_code, timed_out=result.timed_out, output=stdout + stderr
        )

    return run
