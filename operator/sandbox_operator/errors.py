"""The one place where core and API exceptions become kopf's retry decisions (STYLE.md).

- A spec that can never work (missing source, unknown strategy, bad request): ``PermanentError``;
  the handler sets a condition with a reason and posts an Event first, so there is no silent
  retry loop (issue 3, "Errors").
- Something that may pass later (API conflict, transient API error, I/O hiccup, an executor
  that is not ready): ``TemporaryError`` with a delay. Handlers never sleep.
"""

from __future__ import annotations

from dataclasses import dataclass

import kopf
from kubernetes.client.exceptions import ApiException

from sandbox_core import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxRollbackError,
    SandboxStateError,
)
from sandbox_core.errors import (
    SandboxBusyError,
    SandboxConnectionError,
    SandboxLockedError,
    SandboxPermissionError,
    SandboxRetryableError,
)
from sandbox_operator.deletion import BeingDeletedError


class ExecutorError(Exception):
    """An executor could not run a core operation (exec failed, pod not ready, bad JSON).

    ``retryable`` says whether trying again later may succeed.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class FaultInjected(SandboxError):  # noqa: N818 - it names the event, as the tests read it
    """Raised by the local executor's test fault hooks (settings ``fault_fail_*``)."""


@dataclass(frozen=True)
class Failure:
    """How a failure shows up: condition reason, message, and whether to retry."""

    reason: str
    message: str
    retryable: bool


def classify(exc: BaseException) -> Failure:
    """Reason/message/retryability of ``exc`` (the mapping table of this module).

    Shapes: ``reason`` is CamelCase (for conditions and Events); ``message`` is ``str(exc)``.
    """
    message = str(exc) or type(exc).__name__
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        retryable = status in (0, 409, 429) or status >= 500
        return Failure(f"ApiError{status}", f"{exc.reason}: {exc.body}", retryable)
    if isinstance(exc, ExecutorError):
        return Failure("ExecutorError", message, exc.retryable)
    if isinstance(exc, BeingDeletedError):
        return Failure("BeingDeleted", message, False)
    # Classified before the phase errors: a busy database, a lost connection and a leftover lock
    # may go away (retry); a permission problem needs a person (issue 7: classified failures).
    if isinstance(exc, SandboxBusyError):
        return Failure("DatabaseBusy", message, True)
    if isinstance(exc, SandboxConnectionError):
        return Failure("DatabaseUnreachable", message, True)
    if isinstance(exc, SandboxRetryableError):
        return Failure("Retryable", message, True)
    if isinstance(exc, SandboxLockedError):
        return Failure("Locked", message, True)
    if isinstance(exc, SandboxPermissionError):
        return Failure("PermissionDenied", message, False)
    if isinstance(exc, SandboxCreationError):
        return Failure("SandboxCreationFailed", message, False)
    if isinstance(exc, SandboxCommitError):
        reason = "Conflict" if exc.conflicts else "SandboxCommitFailed"
        return Failure(reason, message, False)
    if isinstance(exc, SandboxRollbackError):
        return Failure("RollbackFailed", message, False)
    if isinstance(exc, SandboxStateError):
        return Failure("InvalidState", message, False)
    if isinstance(exc, SandboxError):
        return Failure("SandboxError", message, False)
    if isinstance(exc, ValueError):
        return Failure("InvalidSpec", message, False)
    if isinstance(exc, OSError):
        return Failure("IOError", message, True)
    return Failure("InternalError", f"{type(exc).__name__}: {message}", True)


def to_kopf(exc: BaseException, delay_seconds: float) -> kopf.TemporaryError | kopf.PermanentError:
    """The kopf error to raise for ``exc``: Temporary (with ``delay_seconds``) or Permanent."""
    failure = classify(exc)
    if failure.retryable:
        return kopf.TemporaryError(f"{failure.reason}: {failure.message}", delay=delay_seconds)
    return kopf.PermanentError(f"{failure.reason}: {failure.message}")


def is_not_found(exc: BaseException) -> bool:
    """True for an API 404 (the object is gone: case 16 tolerates it once, never loops)."""
    return isinstance(exc, ApiException) and exc.status == 404


def is_conflict(exc: BaseException) -> bool:
    """True for an API 409 (already exists / resourceVersion conflict; case 18)."""
    return isinstance(exc, ApiException) and exc.status == 409
