"""Review of a whole plan before it is committed (docs/two-phase-commit.md, "Review and approval").

:func:`review_plan` asks every sandbox of a plan for its
:class:`~sandbox_core.protocol.ChangeSummary` (files added, changed and deleted, lines, bytes,
statements, conflicts) without taking locks, and binds them together with
:func:`plan_digest`: one ``"sha256:<hex>"`` over the exact changes of the plan. An approval
names that digest; the two-phase commit (:mod:`sandbox_core.plan.two_phase`) recomputes it over what
it prepared and refuses with ``ChangedSinceApproval`` when they differ, before any original is
touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandbox_core.plan.participants import ReviewedParticipant, commit_order
from sandbox_core.plan.validation import CheckResult
from sandbox_core.protocol import ChangeSummary

__all__ = [
    "DEFAULT_MAX_PATHS",
    "PlanReview",
    "plan_digest",
    "review_plan",
]

DEFAULT_MAX_PATHS = 20
"""How many paths (and conflicts) per sandbox :meth:`PlanReview.to_dict` keeps by default."""


class _Digested(Protocol):
    """Anything with a sandbox id and a change digest (ChangeSummary, PreparedCommit)."""

    @property
    def sandbox_id(self) -> str: ...

    @property
    def digest(self) -> str: ...


def plan_digest(summaries: Iterable[_Digested], checks: Iterable[CheckResult] = ()) -> str:
    """The digest of a plan's exact changes and of the checks they passed.

    Args:
        summaries: one item per sandbox with ``sandbox_id`` and ``digest`` (a
            :class:`ChangeSummary` from review, or a ``PreparedCommit`` from prepare: both carry
            the same digest when nothing changed in between).
        checks: the plan's pre-commit validation results
            (:meth:`~sandbox_core.plan.validation.CheckResult.digest_line`: sandbox, name,
            command, exit code, verdict); none leaves the digest as it was without checks.

    Returns:
        ``"sha256:<64 hex>"`` over the sorted lines ``"<sandbox_id>:<digest>"`` (and one line per
        check) joined by newlines; independent of the order the sandboxes are given in.
    """
    lines = sorted(
        [f"{item.sandbox_id}:{item.digest}" for item in summaries]
        + [check.digest_line() for check in checks]
    )
    return "sha256:" + hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PlanReview:
    """What committing a plan would change now.

    Attributes:
        plan_id: the plan.
        digest: :func:`plan_digest` of ``sandboxes``; what an approval names.
        sandboxes: one :class:`ChangeSummary` per sandbox, in commit order (seed 002).
    """

    plan_id: str
    digest: str
    sandboxes: list[ChangeSummary] = field(default_factory=list)
    activity: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What the actors did in each sandbox, by sandbox id: the bounded view of its audit log
    (``{"total", "entries", "truncated"}``, docs/actor.md). Shown, never digested: the digest
    binds the changes, and the changes already hold what every command wrote."""
    checks: list[CheckResult] = field(default_factory=list)
    """The pre-commit validation results (:mod:`sandbox_core.plan.validation`): shown and
    digested."""

    def with_checks(self, checks: Iterable[CheckResult]) -> PlanReview:
        """This review with ``checks`` attached and the digest taken over them too."""
        kept = list(checks)
        return dataclasses.replace(self, checks=kept, digest=plan_digest(self.sandboxes, kept))

    @property
    def checks_passed(self) -> bool:
        """True when every attached check passed (and when there are none)."""
        return all(check.passed for check in self.checks)

    def with_activity(self, activity: dict[str, dict[str, Any]]) -> PlanReview:
        """This review with ``activity`` (sandbox id -> audit summary) attached."""
        return dataclasses.replace(self, activity=dict(activity))

    @property
    def has_conflicts(self) -> bool:
        """True when a sandbox's commit would be refused now (its ``conflicts`` is non-empty)."""
        return any(summary.conflicts for summary in self.sandboxes)

    def to_dict(self, max_paths: int = DEFAULT_MAX_PATHS) -> dict[str, Any]:
        """A bounded JSON-ready dict (for ``sandbox-core review --json`` and status fields).

        Per sandbox: ``sandbox_id``, ``resource_id``, ``strategy``, ``digest``; the counts
        ``added``, ``changed``, ``deleted``; ``paths``: the first ``max_paths`` paths as
        ``"A path"`` / ``"M path"`` / ``"D path"`` (added, then changed, then deleted);
        ``lines_added``, ``lines_removed``, ``bytes_changed``, ``statements``; ``conflicts``
        (the first ``max_paths``); ``truncated``: whether paths or conflicts were cut; and,
        when :attr:`activity` names the sandbox, ``activity``: ``{"total", "entries" (the
        latest ``max_paths``), "truncated"}`` (its ``truncated`` is not the row's).
        Top level: ``plan_id``, ``digest``, ``has_conflicts``, ``truncated`` (any sandbox cut),
        ``sandboxes`` and ``checks`` (each :meth:`CheckResult.to_dict
        <sandbox_core.plan.validation.CheckResult.to_dict>`, its output tail already bounded).

        Raises:
            ValueError: ``max_paths`` is negative.
        """
        if max_paths < 0:
            raise ValueError("max_paths cannot be negative")
        rows = [_bounded(summary, max_paths) for summary in self.sandboxes]
        for row in rows:
            seen = self.activity.get(row["sandbox_id"])
            if seen is not None:  # the latest max_paths entries of the sandbox's audit log
                entries = list(seen.get("entries") or [])
                shown = entries[-max_paths:] if max_paths else []
                total = int(seen.get("total") or len(entries))
                row["activity"] = {
                    "total": total,
                    "entries": shown,
                    "truncated": len(shown) < total,
                }
        return {
            "plan_id": self.plan_id,
            "digest": self.digest,
            "has_conflicts": self.has_conflicts,
            "truncated": any(row["truncated"] for row in rows),
            "sandboxes": rows,
            "checks": [check.to_dict() for check in self.checks],
        }


def review_plan(plan_id: str, sandboxes: Iterable[ReviewedParticipant]) -> PlanReview:
    """Review every sandbox of a plan; takes no locks, touches nothing.

    Args:
        plan_id: the plan.
        sandboxes: the plan's CREATED/ACTIVE sandboxes (anything with ``review()``).

    Returns:
        The :class:`PlanReview`, sandboxes in commit order.

    Raises:
        SandboxStateError: a sandbox is not CREATED or ACTIVE.
        SandboxError: a sandbox's changes could not be read.
    """
    summaries = [sandbox.review() for sandbox in commit_order(sandboxes)]
    return PlanReview(plan_id=plan_id, digest=plan_digest(summaries), sandboxes=summaries)


def _bounded(summary: ChangeSummary, max_paths: int) -> dict[str, Any]:
    tagged = (
        [f"A {path}" for path in summary.added]
        + [f"M {path}" for path in summary.changed]
        + [f"D {path}" for path in summary.deleted]
    )
    return {
        "sandbox_id": summary.sandbox_id,
        "resource_id": summary.resource_id,
        "strategy": summary.strategy,
        "digest": summary.digest,
        "added": len(summary.added),
        "changed": len(summary.changed),
        "deleted": len(summary.deleted),
        "paths": tagged[:max_paths],
        "lines_added": summary.lines_added,
        "lines_removed": summary.lines_removed,
        "bytes_changed": summary.bytes_changed,
        "statements": summary.statements,
        "conflicts": list(summary.conflicts[:max_paths]),
        "truncated": len(tagged) > max_paths or len(summary.conflicts) > max_paths,
    }
