"""The PlanCommit's kopf handlers: thin, with explicit ids; the logic is
:class:`~sandbox_operator.resources.plancommit.PlanCommitLogic`.

Every handler but the finalizer asks the logic to reconcile the PlanCommit: on create, when
``spec.approvals`` or ``spec.approvedDigest`` changes, and on a timer while it awaits approval.
"""

from __future__ import annotations

from typing import Any

import kopf

from sandbox_api.models import GROUP, PLANCOMMIT_PLURAL, VERSION
from sandbox_operator.runtime import SETTINGS, TIMEOUT, runtime


@kopf.on.create(GROUP, VERSION, PLANCOMMIT_PLURAL, id="saga", timeout=TIMEOUT)
def plancommit_saga(namespace: str | None, name: str, **_: Any) -> None:
    """Run (or, after a restart, resume) the plan's atomic commit / rollback."""
    runtime().plancommits.reconcile(str(namespace), name)


@kopf.on.field(
    GROUP, VERSION, PLANCOMMIT_PLURAL, id="approval", field="spec.approvedDigest", timeout=TIMEOUT
)
def plancommit_approval(namespace: str | None, name: str, **_: Any) -> None:
    """spec.approvedDigest changed: decide on the approval now."""
    runtime().plancommits.reconcile(str(namespace), name)


@kopf.on.field(
    GROUP, VERSION, PLANCOMMIT_PLURAL, id="approvals", field="spec.approvals", timeout=TIMEOUT
)
def plancommit_approvals(namespace: str | None, name: str, **_: Any) -> None:
    """A decision was added to spec.approvals: decide on the approval now."""
    runtime().plancommits.reconcile(str(namespace), name)


@kopf.timer(
    GROUP,
    VERSION,
    PLANCOMMIT_PLURAL,
    id="approval-wait",
    interval=SETTINGS.ttl_check_interval_seconds,
    when=lambda status, **_: status.get("phase") == "AwaitingApproval",
)
def plancommit_approval_wait(namespace: str | None, name: str, **_: Any) -> None:
    """A PlanCommit awaiting approval: expire it after approvalTimeoutSeconds."""
    runtime().plancommits.reconcile(str(namespace), name)


@kopf.on.delete(GROUP, VERSION, PLANCOMMIT_PLURAL, id="plan-cleanup", timeout=TIMEOUT)
def plancommit_delete(body: kopf.Body, **_: Any) -> None:
    """Finalizer: with cleanupPolicy Delete, delete the plan's Sandboxes."""
    runtime().plancommits.finalize(body)
