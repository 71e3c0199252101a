"""Prometheus metrics (prometheus-client), served by :func:`serve` from the startup handler.

Reconciles, commits, compensations, failed compensations, durations; plan reviews, approvals
(matched / mismatched), expiries, two-phase outcomes and fallbacks to the saga.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram, start_http_server

RECONCILES = Counter(
    "sandbox_operator_reconciles_total",
    "Handler runs, by kind, handler and outcome (ok|error).",
    ["kind", "handler", "outcome"],
)
RECONCILE_SECONDS = Histogram(
    "sandbox_operator_reconcile_duration_seconds",
    "Duration of handler runs in seconds, by kind and handler.",
    ["kind", "handler"],
)
COMMITS = Counter(
    "sandbox_operator_plan_commits_total",
    "Finished PlanCommits, by action and terminal phase.",
    ["action", "phase"],
)
SANDBOX_COMMITS = Counter(
    "sandbox_operator_sandbox_commits_total",
    "Sandbox commits made by PlanCommits, by strategy and outcome (ok|error).",
    ["strategy", "outcome"],
)
COMPENSATIONS = Counter(
    "sandbox_operator_compensations_total",
    "Compensations (rollbacks of committed sandboxes) that succeeded.",
)
FAILED_COMPENSATIONS = Counter(
    "sandbox_operator_failed_compensations_total",
    "Compensations that failed (the original may still hold the committed change).",
)
PLAN_COMMIT_SECONDS = Histogram(
    "sandbox_operator_plan_commit_duration_seconds",
    "Duration of a PlanCommit from start to terminal phase in seconds.",
    ["action"],
)

PLAN_REVIEWS = Counter(
    "sandbox_operator_plan_reviews_total",
    "PlanCommit reviews computed, by outcome (ok|error).",
    ["outcome"],
)
PLAN_APPROVALS = Counter(
    "sandbox_operator_plan_approvals_total",
    "Approved digests seen on PlanCommits, by result (matched|mismatched).",
    ["result"],
)
PLAN_EXPIRIES = Counter(
    "sandbox_operator_plan_expiries_total",
    "PlanCommits that ended Expired (approvalTimeoutSeconds elapsed without an approval).",
)
TWO_PHASE_OUTCOMES = Counter(
    "sandbox_operator_two_phase_commits_total",
    "Finished two-phase plan commits, by outcome (committed|failed|changed_since_approval|"
    "interrupted).",
    ["outcome"],
)
TWO_PHASE_FALLBACKS = Counter(
    "sandbox_operator_two_phase_fallbacks_total",
    "TwoPhase PlanCommits that ran as a saga because two phases could not be used.",
)


class Outcome:
    """Mutable outcome label of one :func:`reconcile_timer` block (default ``ok``)."""

    def __init__(self) -> None:
        self.value = "ok"

    def set(self, value: str) -> None:
        """Set the outcome label (``ok`` | ``error``)."""
        self.value = value


@contextmanager
def reconcile_timer(kind: str, handler: str) -> Iterator[Outcome]:
    """Count and time one handler run; an exception marks it ``error``."""
    outcome = Outcome()
    started = time.monotonic()
    try:
        yield outcome
    except BaseException:
        outcome.set("error")
        raise
    finally:
        RECONCILE_SECONDS.labels(kind, handler).observe(time.monotonic() - started)
        RECONCILES.labels(kind, handler, outcome.value).inc()


def serve(port: int) -> None:
    """Serve ``/metrics`` on ``port`` (0 disables it)."""
    if port:
        start_http_server(port)
