"""The one place where core and API exceptions become kopf's retry decisions (STYLE.md).

- A spec that can never work (missing source, unknown strategy, bad request): ``PermanentError``;
  the handler sets a condition with a reason and posts an Event first, so there is no silent
  retry loop.
- Something that may pass later (API conflict, transient API error, I/O hiccup, an executor
  that is not ready): ``TemporaryError`` with a delay. Handlers never sleep.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import kopf
from kubernetes.client.exceptions import ApiException

from sandbox_core import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxError,
    SandboxForkError,
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
from sandbox_operator.kube.claims import BeingDeletedError

# kopf's two retry decisions, named here so that the logic below the reconcilers (resources/)
# raises and catches them without importing kopf: kopf stays in the wiring, the reconcilers,
# this module and kube/. The same classes, not wrappers: kopf sees exactly what it saw before.
TemporaryError = kopf.TemporaryError
PermanentError = kopf.PermanentError


class ExecutorError(Exception):
    """An executor could not run a core operation (exec failed, pod not ready, bad JSON).

    ``retryable`` says whether trying again later may succeed.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class PoolPodLost(ExecutorError):  # noqa: N818 - it names the state, as conditions read it
    """The warm-pool Pod that held a Sandbox's changes (on its emptyDir) is gone: they are
    lost, and a new Pod would start the sandbox empty. Not retryable; the condition reason
    ``PoolPodLost`` says so (docs/operations.md, "Warm pool")."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class ChildNameTaken(ExecutorError):  # noqa: N818 - it names the state, as conditions read it
    """A child object's name (Pod, Secret, claim, NetworkPolicy) is held by an object that this
    Sandbox does not control (its controller ownerReference names another uid, or none).

    Nothing is adopted nor deleted; retried with back-off (the other object may go away), the
    condition reason ``ChildNameTaken`` and a Warning Event say which object holds the name.
    """


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
# (retry); a permission problem needs a person. A commit error with conflicts is
# reported as ``Conflict``.
_FAILURE_KINDS: tuple[tuple[type[BaseException], str, bool], ...] = (
    (BeingDeletedError, "BeingDeleted", False),
    (SandboxBusyError, "DatabaseBusy", True),
    (SandboxConnectionError, "DatabaseUnreachable", True),
    (SandboxRetryableError, "Retryable", True),
    (SandboxLockedError, "Locked", True),
    (SandboxPermissionError, "PermissionDenied", False),
    (SandboxForkError, "ForkRefused", False),
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
    if isinstance(exc, ChildNameTaken):
        return Failure("ChildNameTaken", message, True)
    if isinstance(exc, PoolPodLost):
        return Failure("PoolPodLost", message, False)
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


# -- waiting is not failing ----------------------------------------------------------------------

WAIT_PREFIXES = ("cleanup waits: ", "snapshot deletion waits: ")
"""How the messages of :func:`waiting` begin; :class:`QuietWaits` knows kopf's lines by them."""
WAIT_BACKOFF_MAX_SECONDS = 10.0
"""Cap of a wait's back-off: a deletion goes on at most this long after its holder let go."""
_KOPF_TEMPORARY = "failed temporarily: "


def waiting(prefix: str, reason: str, base_seconds: float, retry: int) -> kopf.TemporaryError:
    """The retry of a handler that waits for another one to let go (a saga holds the Sandbox).

    Not an error: the delay backs off (``base_seconds * 2**retry``, capped at
    ``WAIT_BACKOFF_MAX_SECONDS``) and kopf's "failed temporarily" line about it is logged at INFO,
    with the reason, by :class:`QuietWaits` (else a Sandbox cleanup held by a saga would log an
    ERROR once a second).

    Args:
        prefix: one of ``WAIT_PREFIXES``.
        reason: what it waits for (e.g. ``the sandbox is in use by PlanCommit ns/pc``).
        base_seconds: the first delay (``retry_delay_seconds``).
        retry: kopf's retry number of the handler (0 on the first call).
    """
    if prefix not in WAIT_PREFIXES:
        raise ValueError(f"unknown wait prefix {prefix!r}")
    cap = max(base_seconds, WAIT_BACKOFF_MAX_SECONDS)
    delay = min(base_seconds * 2 ** min(max(retry, 0), 16), cap)
    return kopf.TemporaryError(f"{prefix}{reason}; next check in {delay:g}s", delay=delay)


class QuietWaits(logging.Filter):
    """On logger ``kopf.objects``: kopf's ERROR "<handler> failed temporarily: <wait>" line of a
    :func:`waiting` retry becomes INFO, so it is neither an error in the logs nor a Warning
    Event (kopf posts Events from WARNING up)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.levelno < logging.CRITICAL:
            message = record.getMessage()
            _, found, rest = message.partition(_KOPF_TEMPORARY)
            if found and rest.startswith(WAIT_PREFIXES):
                record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def install_quiet_waits() -> None:
    """Attach :class:`QuietWaits` to kopf's per-object logger (idempotent)."""
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, QuietWaits) for f in objects.filters):
        objects.addFilter(QuietWaits())
