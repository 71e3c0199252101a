"""Kubernetes-style status conditions (API conventions; Go's ``meta.SetStatusCondition``).

A condition is a dict ``{type, status, reason, message, lastTransitionTime, observedGeneration}``
kept in a list keyed by ``type``. :func:`set_condition` moves ``lastTransitionTime`` only when
``status`` changes, so re-applying the same outcome never rewrites timestamps (case 22).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal

from sandbox_operator.kube import clock

ConditionStatus = Literal["True", "False", "Unknown"]

MAX_MESSAGE = 32768
"""The CRDs' ``maxLength`` of a condition message (characters): a longer one would make the API
server refuse the whole status write, kopf's diff-base with it (then the handler runs again)."""
_CUT = " ... (truncated)"


def fit_message(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE` characters, the cut marked at its end."""
    if len(message) <= MAX_MESSAGE:
        return message
    return message[: MAX_MESSAGE - len(_CUT)] + _CUT


def now_rfc3339() -> str:
    """Current UTC time as RFC 3339 with second precision (``2026-01-02T03:04:05Z``), on the
    API server's clock (:mod:`~sandbox_operator.kube.clock`): another replica compares it."""
    return clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[dict[str, Any]] | None,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """Return a new list with condition ``type_`` set; the input is not modified.

    ``lastTransitionTime`` is kept when ``status`` is unchanged and set to ``now`` (default:
    the current time) when it changes or the condition is new. ``reason`` must be CamelCase;
    ``message`` is cut to the schema's length (:func:`fit_message`).
    """
    message = fit_message(message)
    result = [copy.deepcopy(dict(c)) for c in conditions or []]
    for condition in result:
        if condition.get("type") == type_:
            if condition.get("status") != status:
                condition["lastTransitionTime"] = now or now_rfc3339()
            condition["status"] = status
            condition["reason"] = reason
            condition["message"] = message
            if observed_generation is not None:
                condition["observedGeneration"] = observed_generation
            return result
    new: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now or now_rfc3339(),
    }
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    result.append(new)
    return result


def find_condition(
    conditions: Sequence[dict[str, Any]] | None, type_: str
) -> dict[str, Any] | None:
    """The condition of ``type_``, or None."""
    for condition in conditions or []:
        if condition.get("type") == type_:
            return dict(condition)
    return None


def is_true(conditions: Sequence[dict[str, Any]] | None, type_: str) -> bool:
    """True when condition ``type_`` exists with status ``"True"``."""
    found = find_condition(conditions, type_)
    return found is not None and found.get("status") == "True"


FINISHED = "Finished"
"""The terminal condition: True once the work ended, whatever the outcome, so that one
``kubectl wait --for=condition=Finished`` returns on success and on failure alike. The reason
names the outcome (``Committed``, ``RolledBack``, ``Failed``, ``Errored``...)."""


def set_finished(
    conditions: Sequence[dict[str, Any]] | None,
    finished: bool,
    reason: str,
    message: str,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """Set the :data:`FINISHED` condition: True with the outcome as ``reason`` once terminal,
    else False with reason ``InProgress``."""
    if finished:
        return set_condition(conditions, FINISHED, "True", reason, message, observed_generation)
    return set_condition(conditions, FINISHED, "False", "InProgress", message, observed_generation)
