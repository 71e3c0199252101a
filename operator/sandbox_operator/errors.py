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


# ``exception class -> (reason, retryable)``, first match wins. The classified core failures come
# before the phase errors: a busy database, a lost connection and a leftover lock may go away
# (retry); a permission problem needs a person (issue 7). A commit error with conflicts is
# reported as ``Conflict``.
_FAILURE_KINDS: tuple[tuple[type[BaseException], str, bool], ...] = (
    (BeingDeletedError, "BeingDeleted", False),
    (SandboxBusyError, "DatabaseBusy", True),
    (SandboxConnectionError, "DatabaseUnreachable", True),
    (SandboxRetryableError, "Retryable", True),
    (SandboxLockedError, "Locked", True),
    (SandboxPermissionError, "PermissionDenied", False),
    (SandboxCreationError, "SandboxCreationFailed", False),
    (SandboxCommitError, "SandboxCommitFailed", False),
    (SandboxRollbackError, "RollbackFailed", False),
    (SandboxStateError, "InvalidState", False),
    (SandboxError, "SandboxError", False),
    (ValueError, "InvalidSpec", False),
    (OSError, "IOError", True),
)


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
    for kind, reason, retryable in _FAILURE_KINDS:
        if isinstance(exc, kind):
            if kind is SandboxCommitError and getattr(exc, "conflicts", None):
                reason = "Conflict"
            return Failure(reason, message, retryable)
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
