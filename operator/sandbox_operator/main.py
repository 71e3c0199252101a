"""kopf entry point: thin decorated handlers with explicit ids; the logic lives elsewhere.

Run: ``kopf run --standalone -A -m sandbox_operator.main`` (or ``--namespace NS``). Handlers
return nothing (case 15); progress lives in annotations, kopf's diff-base in the declared
``status.lastHandledConfiguration`` (:mod:`sandbox_operator.diffbase`), nothing else of kopf's
in ``.status``.
With ``SANDBOX_OPERATOR_LEADER_ELECTION=true`` (the chart's default) the startup handler first
waits for the leader-election Lease (:mod:`sandbox_operator.leader`): of several replicas only
the holder ever starts watching (issue 11, "High availability").
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from sandbox_api.models import (
    CHECKPOINT_PLURAL,
    FINALIZER,
    GROUP,
    PLANCOMMIT_PLURAL,
    SANDBOX_PLURAL,
    VERSION,
)
from sandbox_operator import k8s, metrics
from sandbox_operator.diffbase import StatusDiffBase
from sandbox_operator.errors import install_quiet_waits
from sandbox_operator.events import EventRecorder, NamespaceGate, install_kopf_filter
from sandbox_operator.executors.pod import COMPONENT_LABEL, WORKSPACE_COMPONENT
from sandbox_operator.leader import LeaderElector
from sandbox_operator.logging_setup import configure_logging
from sandbox_operator.runtime import Runtime, build_runtime
from sandbox_operator.sandbox_handlers import WORKSPACE_ANNOTATION, plan_label_patch, ttl_expired
from sandbox_operator.settings import Settings

SETTINGS = Settings.from_env()
_RUNTIME: list[Runtime] = []
_EVENTS: list[EventRecorder] = []


def runtime() -> Runtime:
    """The runtime built by the startup handler."""
    return _RUNTIME[0]


def tune(settings: kopf.OperatorSettings) -> None:
    """All kopf tuning in one place (STYLE.md): storage, finalizer, posting, watching, workers."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = StatusDiffBase()
    # Only warnings become Events: no "Handler succeeded" spam on every restart (case 22).
    # Our Events go through EventRecorder (one post, none in terminating namespaces, case 17);
    # kopf's own log-derived Events stay off, and are filtered the same way if turned on.
    settings.posting.level = logging.WARNING
    settings.posting.loggers = False
    settings.watching.server_timeout = int(SETTINGS.watch_server_timeout_seconds)
    settings.watching.client_timeout = SETTINGS.watch_client_timeout_seconds
    # A deleted Sandbox waits for its TTL timer to stop before the finalizer goes; poll often
    # (kopf's default is 60 s, which would hold every deletion for a minute).
    settings.background.cancellation_polling = 1.0
    # Handlers are synchronous (git, rsync, exec): they run in this many threads at once.
    if SETTINGS.max_workers is not None:
        settings.execution.max_workers = SETTINGS.max_workers


@kopf.on.startup(id="configure")
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Tune kopf, serve metrics, wait for the lead (leader election), build the runtime."""
    configure_logging(SETTINGS.log_format)
    install_quiet_waits()  # a finalizer waiting for a saga is not an error (issue 11)
    tune(settings)
    k8s.load_config()
    # Metrics first: a standby's endpoint answers too (sandbox_operator_leader is 0 there).
    metrics.serve(SETTINGS.metrics_port)
    if SETTINGS.leader_election:
        elector = LeaderElector(SETTINGS)
        try:
            leading = await asyncio.to_thread(elector.acquire)
        except asyncio.CancelledError:
            elector.stop()  # the operator stops while still a standby
            raise
        if not leading:
            raise asyncio.CancelledError
    api = k8s.Api()
    gate = NamespaceGate(api.namespace)
    install_kopf_filter(gate)
    _EVENTS[:] = [EventRecorder(api.post_event, gate, background=True)]
    _RUNTIME[:] = [build_runtime(SETTINGS, api, _EVENTS[0])]
    freeze_startup_heap()


def freeze_startup_heap() -> int:
    """Move every object alive after startup out of the garbage collector's reach; return
    how many objects are frozen (``gc.get_freeze_count()``).

    The modules the operator imports (kopf, the kubernetes client's models, pydantic) leave
    objects that live as long as the process, and every full collection walked them all: about
    140 ms of a held event loop each. Frozen, kopf's loop took 0.50-0.54 s of CPU for 100 new
    Sandboxes instead of 0.57-0.65 s (issue 11, throughput; docs/benchmarks.md). Garbage made
    so far is collected first, so nothing that could be freed is frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


# -- Sandbox ------------------------------------------------------------------------------------


TIMEOUT = SETTINGS.handler_timeout_seconds  # every handler has one (issue 8)


@kopf.on.create(GROUP, VERSION, SANDBOX_PLURAL, id="provision", timeout=TIMEOUT)
def sandbox_provision(body: kopf.Body, patch: kopf.Patch, retry: int, **_: Any) -> None:
    """Provision through the executor and drive the core to ACTIVE."""
    runtime().sandboxes.provision(body, patch, retry)


# kopf's own mark on an object whose annotations hold this operator's kopf records: its
# progress storage writes it, in a PATCH of its own, the first time it stores anything.
KOPF_MARKER = f"{GROUP}/kopf-managed"


def missing_metadata(body: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The labels and annotations the operator puts on every new object that it lacks
    (``{}`` when none is missing): the plan-id label of a Sandbox, kopf's marker."""
    metadata = body.get("metadata") or {}
    missing: dict[str, dict[str, str]] = {}
    if body.get("kind") == "Sandbox" and (labels := plan_label_patch(body)):
        missing["labels"] = labels
    if KOPF_MARKER not in (metadata.get("annotations") or {}):
        missing["annotations"] = {KOPF_MARKER: "yes"}
    return missing


def _metadata_missing(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> bool:
    deleting = event["type"] == "DELETED" or body.metadata.get("deletionTimestamp")
    return not deleting and bool(missing_metadata(body))


@kopf.on.event(GROUP, VERSION, SANDBOX_PLURAL, id="metadata", when=_metadata_missing)
@kopf.on.event(GROUP, VERSION, CHECKPOINT_PLURAL, id="metadata", when=_metadata_missing)
@kopf.on.event(GROUP, VERSION, PLANCOMMIT_PLURAL, id="metadata", when=_metadata_missing)
async def set_metadata(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Set :func:`missing_metadata` in the PATCH that adds kopf's finalizer (issue 11).

    kopf runs event handlers in every processing cycle, also in the one that only adds the
    finalizer. The change is a transformation function, as kopf's finalizer is: both become one
    JSON patch guarded by the object's resourceVersion (a merge patch beside it would be a
    second request). So a new object gets its plan-id label (issue 11 §6) and kopf's marker
    without a write of their own (issue 11, throughput), and one made before gets them on its
    first event. ``async``: a dictionary lookup needs no worker thread.
    """
    patch.fns.append(functools.partial(_merge_metadata, missing=missing_metadata(body)))


def _merge_metadata(body: dict[str, Any], missing: dict[str, dict[str, str]]) -> None:
    metadata = body.setdefault("metadata", {})
    for field, values in missing.items():
        metadata.setdefault(field, {}).update(values)


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
    land in one ``/status`` request (:mod:`sandbox_operator.diffbase`). Resume handlers run
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


@kopf.timer(
    GROUP,
    VERSION,
    SANDBOX_PLURAL,
    id="ttl",
    interval=SETTINGS.ttl_check_interval_seconds,
    when=lambda spec, **_: spec.get("ttlSecondsAfterFinished") is not None,
)
def sandbox_ttl(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> None:
    """Delete a terminal Sandbox ``ttlSecondsAfterFinished`` after it finished."""
    if ttl_expired(body):
        runtime().api.delete(SANDBOX_PLURAL, str(namespace), name)


# -- Checkpoint ---------------------------------------------------------------------------------


@kopf.on.create(GROUP, VERSION, CHECKPOINT_PLURAL, id="snapshot", timeout=TIMEOUT)
def checkpoint_create(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Take the snapshot."""
    runtime().checkpoints.create(body, patch)


@kopf.on.resume(
    GROUP,
    VERSION,
    CHECKPOINT_PLURAL,
    id="snapshot-resume",
    when=lambda status, **_: not status.get("phase"),
    timeout=TIMEOUT,
)
def checkpoint_create_resume(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """A handled Checkpoint without a status: take the snapshot again to write it (issue 11).

    As for Sandboxes (``sandbox_provision_resume``): an earlier operator killed between kopf's
    two writes left a Checkpoint marked handled with no phase. Snapshots are idempotent per
    Checkpoint uid (case 18), so the next operator records the same snapshot, not a second one.
    """
    runtime().checkpoints.create(body, patch)


@kopf.on.delete(GROUP, VERSION, CHECKPOINT_PLURAL, id="delete-snapshot", timeout=TIMEOUT)
def checkpoint_delete(body: kopf.Body, retry: int, **_: Any) -> None:
    """Finalizer: delete the snapshot."""
    runtime().checkpoints.finalize(body, retry)


# -- PlanCommit ---------------------------------------------------------------------------------


@kopf.on.create(GROUP, VERSION, PLANCOMMIT_PLURAL, id="saga", timeout=TIMEOUT)
def plancommit_saga(namespace: str | None, name: str, **_: Any) -> None:
    """Run (or, after a restart, resume) the plan's atomic commit / rollback."""
    runtime().plancommits.reconcile(str(namespace), name)


@kopf.on.field(
    GROUP, VERSION, PLANCOMMIT_PLURAL, id="approval", field="spec.approvedDigest", timeout=TIMEOUT
)
def plancommit_approval(namespace: str | None, name: str, **_: Any) -> None:
    """spec.approvedDigest changed: decide on the approval now (issue 9, §2)."""
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
    """A PlanCommit awaiting approval: expire it after approvalTimeoutSeconds (issue 9, §2)."""
    runtime().plancommits.reconcile(str(namespace), name)


@kopf.on.delete(GROUP, VERSION, PLANCOMMIT_PLURAL, id="plan-cleanup", timeout=TIMEOUT)
def plancommit_delete(body: kopf.Body, **_: Any) -> None:
    """Finalizer: with cleanupPolicy Delete, delete the plan's Sandboxes."""
    runtime().plancommits.finalize(body)
