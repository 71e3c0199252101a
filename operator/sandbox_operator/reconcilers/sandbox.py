"""The Sandbox's kopf handlers: thin, with explicit ids; the logic is
:class:`~sandbox_operator.resources.sandbox.SandboxLogic`.

Provision (and, after a restart, repair a handled Sandbox without a status),
serve ``spec.rollbackRequest`` / ``spec.restoreRequest``, follow the workspace Pod's readiness
and ``spec.suspend``, clean up on deletion, and delete a finished Sandbox after its TTL.
"""

from __future__ import annotations

from typing import Any

import kopf

from sandbox_api.models import GROUP, SANDBOX_PLURAL, VERSION
from sandbox_operator.executors.pod_manifests import COMPONENT_LABEL, WORKSPACE_COMPONENT
from sandbox_operator.resources.sandbox import WORKSPACE_ANNOTATION
from sandbox_operator.resources.ttl import TTL
from sandbox_operator.runtime import SETTINGS, TIMEOUT, runtime


@kopf.on.create(GROUP, VERSION, SANDBOX_PLURAL, id="provision", timeout=TIMEOUT)
def sandbox_provision(body: kopf.Body, patch: kopf.Patch, retry: int, **_: Any) -> None:
    """Provision through the executor and drive the core to ACTIVE."""
    runtime().sandboxes.provision(body, patch, retry)


@kopf.on.resume(
    GROUP,
    VERSION,
    SANDBOX_PLURAL,
    id="provision-resume",
    when=lambda status, **_: not status.get("phase"),
    timeout=TIMEOUT,
)
def sandbox_provision_resume(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """A handled Sandbox without a status: provision again (idempotent) to write it.

    Operators that kept kopf's diff-base in an annotation wrote a handler's outcome in two
    requests, the object and then its ``/status``; one killed between them left a Sandbox that
    kopf considers handled and that never gets a phase (found by benchmarks/soak.py). Now both
    land in one ``/status`` request (:mod:`sandbox_operator.kube.diffbase`). Resume handlers run
    once per operator start for every object that kopf has a diff-base of, so such a Sandbox
    left by an earlier operator is repaired by this one (one with no diff-base at all is new to
    kopf, and its create handler runs).
    """
    runtime().sandboxes.provision(body, patch)


@kopf.on.update(GROUP, VERSION, SANDBOX_PLURAL, id="requests", field="spec", timeout=TIMEOUT)
def sandbox_requests(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Serve a new rollbackRequest / restoreRequest id."""
    runtime().sandboxes.serve_requests(body, patch)


@kopf.on.field(
    GROUP,
    VERSION,
    SANDBOX_PLURAL,
    id="workspace-pod",
    field=("metadata", "annotations", WORKSPACE_ANNOTATION),
    timeout=TIMEOUT,
)
def sandbox_workspace_pod(
    body: kopf.Body, patch: kopf.Patch, new: Any, retry: int, **_: Any
) -> None:
    """The workspace Pod became Ready / not Ready / was deleted: provision, mirror, recreate."""
    if new:
        runtime().sandboxes.workspace_pod_changed(body, patch, str(new), retry)


@kopf.on.field(GROUP, VERSION, SANDBOX_PLURAL, id="suspend", field="spec.suspend", timeout=TIMEOUT)
def sandbox_suspend(body: kopf.Body, patch: kopf.Patch, new: Any, retry: int, **_: Any) -> None:
    """spec.suspend: delete the workspace Pod (claim kept) or bring it back."""
    runtime().sandboxes.suspend_changed(body, patch, bool(new), retry)


@kopf.on.event("", "v1", "pods", labels={COMPONENT_LABEL: WORKSPACE_COMPONENT})
def workspace_pod_event(event: kopf.RawEvent, **_: Any) -> None:
    """Workspace Pods are watched: their readiness wakes the Sandbox (no fixed sleep)."""
    runtime().sandboxes.workspace_pod_event(event)


@kopf.on.delete(GROUP, VERSION, SANDBOX_PLURAL, id="cleanup", timeout=TIMEOUT)
def sandbox_cleanup(body: kopf.Body, retry: int, **_: Any) -> None:
    """Finalizer: remove everything the sandbox made; never the original."""
    runtime().sandboxes.finalize(body, retry)


@kopf.on.event(GROUP, VERSION, SANDBOX_PLURAL, id="ttl")
async def sandbox_ttl(event: kopf.RawEvent, **_: Any) -> None:
    """Schedule a terminal Sandbox's deletion ``ttlSecondsAfterFinished`` after it finished
    (the startup handler's sweeper deletes it then; :mod:`sandbox_operator.resources.ttl`).

    Not a kopf timer: a timer on Sandboxes makes kopf keep every Sandbox's last body in memory.
    """
    TTL.event(event)


def sandbox_agent_token(body: kopf.Body, **_: Any) -> None:
    """Renew the workspace agent's token before it runs out (pod executor)."""
    runtime().sandboxes.renew_agent_token(body)


# Registered only where it runs: any timer on Sandboxes makes kopf keep every Sandbox's last
# body in memory, whatever its filter says (the local executor has no agent token).
if SETTINGS.executor == "pod" and SETTINGS.agent_token_lifetime_seconds > 0:
    kopf.timer(
        GROUP,
        VERSION,
        SANDBOX_PLURAL,
        id="agent-token",
        interval=SETTINGS.agent_token_renew_interval_seconds,
    )(sandbox_agent_token)
