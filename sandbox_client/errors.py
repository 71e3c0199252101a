"""The client's one exception hierarchy: every failure carries a CamelCase reason and a message.

Where the operator reported the failure in a condition, ``reason`` and ``message`` are that
condition's (shared/DESIGN.md, "Conditions"); API-server refusals carry the API status reason
(``NotFound``, ``AlreadyExists``, ``Invalid``, ``Forbidden``); the client's own refusals carry
``PathTraversal`` or ``InvalidState``. Third-party errors (``ApiException`` of either Kubernetes
client, ``OSError``) are converted here and never leak out of the public API.
"""

from __future__ import annotations

import json
from typing import Any

# Condition reasons of the operator (sandbox_operator.errors.classify, journal) by meaning.
_CONFLICT_REASONS = frozenset({"Conflict", "AlreadyExists"})
_REFUSED_REASONS = frozenset(
    {
        "InvalidState",
        "InvalidSpec",
        "SandboxCreationFailed",
        "PathTraversal",
        "Invalid",
        "Forbidden",
        "BadRequest",
        "NoActiveSandboxes",
        "NoFileOperations",
    }
)
_NOT_FOUND_REASONS = frozenset({"NotFound", "ApiError404"})


class SandboxClientError(Exception):
    """Base class of every error the client raises.

    Attributes:
        reason: CamelCase machine-readable reason (a condition's ``reason`` when the operator
            reported the failure).
        message: human-readable details (the condition's ``message``).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class WaitTimeoutError(SandboxClientError, TimeoutError):
    """A wait (ready, checkpoint, restore, commit, deletion) did not end within its timeout.

    ``reason`` is ``Timeout``; ``message`` names what was awaited and the last state seen.
    """


class ConflictError(SandboxClientError):
    """The object already exists, or the operation conflicts (e.g. a git merge conflict)."""


class RefusedError(SandboxClientError, ValueError):
    """The request can never succeed as given: a path leaving the sandbox, a spec the API
    server's schema or CEL rules refuse, an operation in the wrong phase."""


class NotFoundError(SandboxClientError, LookupError):
    """The named Sandbox, Checkpoint, PlanCommit or file does not exist."""


class OperationFailedError(SandboxClientError):
    """The operator tried and failed (a condition with status False and this reason)."""


def error_for(reason: str, message: str) -> SandboxClientError:
    """The typed error for a condition's or API status's ``reason`` (the mapping table above)."""
    if reason in _CONFLICT_REASONS:
        return ConflictError(reason, message)
    if reason in _REFUSED_REASONS:
        return RefusedError(reason, message)
    if reason in _NOT_FOUND_REASONS:
        return NotFoundError(reason, message)
    if reason == "Timeout":
        return WaitTimeoutError(reason, message)
    return OperationFailedError(reason, message)


def from_api_exception(status: int | None, reason: str | None, body: Any) -> SandboxClientError:
    """Convert an ``ApiException`` (sync or async client) from its fields.

    The API server's ``Status`` body gives the reason (``NotFound``, ``AlreadyExists``,
    ``Invalid``, ``Conflict``...) and message; without a body the HTTP status decides.
    """
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    status_reason, message = "", text or str(reason or "")
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        parsed = {}
    if isinstance(parsed, dict):
        status_reason = str(parsed.get("reason") or "")
        message = str(parsed.get("message") or message)
    code = int(status or 0)
    if not status_reason:
        status_reason = {404: "NotFound", 409: "Conflict", 403: "Forbidden", 422: "Invalid"}.get(
            code, f"ApiError{code}"
        )
    if code == 409:
        return ConflictError(status_reason, message)
    if code in (400, 403, 422):
        return RefusedError(status_reason, message)
    if code == 404:
        return NotFoundError("NotFound", message)
    return OperationFailedError(status_reason, message)
