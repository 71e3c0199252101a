"""The per-phase gauge's source: every watch event of a Sandbox or PlanCommit updates
:data:`~sandbox_operator.kube.lifecycle_metrics.PHASES` (``sandbox_operator_objects``).

An ``async`` event handler with no ``patch``: a dictionary update needs no worker thread and
writes nothing to the API.
"""

from __future__ import annotations

from typing import Any

import kopf

from sandbox_api.models import GROUP, PLANCOMMIT_PLURAL, SANDBOX_PLURAL, VERSION
from sandbox_operator.kube.lifecycle_metrics import PHASES


@kopf.on.event(GROUP, VERSION, SANDBOX_PLURAL, id="phase-gauge")
async def sandbox_phase(event: kopf.RawEvent, **_: Any) -> None:
    """Count the Sandbox in its current phase (removed at DELETED)."""
    PHASES.event("Sandbox", event)


@kopf.on.event(GROUP, VERSION, PLANCOMMIT_PLURAL, id="phase-gauge")
async def plancommit_phase(event: kopf.RawEvent, **_: Any) -> None:
    """Count the PlanCommit in its current phase (removed at DELETED)."""
    PHASES.event("PlanCommit", event)
