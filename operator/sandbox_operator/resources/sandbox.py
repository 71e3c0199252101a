"""Sandbox reconciliation logic, callable without a cluster (the kopf wiring is in
:mod:`sandbox_operator.reconcilers.sandbox`).

Provision through the executor and drive the core to ACTIVE, mirror the
core's status into ``status.phase``, serve ``spec.rollbackRequest`` / ``spec.restoreRequest``
once per distinct id, and clean up everything on deletion without touching the original.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from sandbox_api import core_record
from sandbox_api.models import (
    CHECKPOINT_PLURAL,
    GROUP,
    PLAN_LABEL,
    SANDBOX_PLURAL,
    VERSION,
    SandboxPhase,
)
from sandbox_core import CommitResult, SandboxForkError, SandboxStatus
from sandbox_operator.errors import (
    PermanentError,
    TemporaryError,
    classify,
    is_not_found,
    to_kopf,
    waiting,
)
from sandbox_operator.executors.base import (
    CheckpointInfo,
    Executor,
    SandboxState,
    SandboxTarget,
    WorkspaceNotReady,
)
from sandbox_operator.executors.placement import unschedulable_reason
from sandbox_operator.executors.pod_manifests import pod_is_ready
from sandbox_operator.kube import clock, lifecycle_metrics, metrics, redaction, tracing
from sandbox_operator.kube.api import Api
from sandbox_operator.kube.claims import CLAIMS, deletion_began
from sandbox_operator.kube.conditions import find_condition, set_condition, set_finished
from sandbox_operator.kube.events import EventSink
from sandbox_operator.kube.ownership import is_controlled_by
from sandbox_operator.resources.targets import (
    ForkRefusedError,
    checkpoint_info_from_body,
    refused_spec_target,
    target_from_body,
)
from sandbox_operator.resources.ttl import ttl_deadline
from sandbox_operator.settings import Settings, backoff_seconds

logger = logging.getLogger("sandbox_operator.sandbox")

LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
# Where a workspace Pod's readiness is mirrored onto its Sandbox (wakes the Sandbox's handler).
# Not under sandbox.cleveragents.io/: kopf keeps its progress there and ignores those keys.
WORKSPACE_ANNOTATION = "workspace.sandbox.cleveragents.io/pod"


def pod_event_annotation(event: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """``(namespace, sandbox name, annotation value)`` for a workspace Pod's watch event.

    The value is ``<pod uid>:<Ready|NotReady|Terminating|Failed|Deleted>``, or
    ``<pod uid>:<digest of the scheduler's reason>:Unschedulable``; None for a Pod no Sandbox
    owns.
    """
    pod = event.get("object") or {}
    metadata = pod.get("metadata") or {}
    owner = next(
        (o for o in metadata.get("ownerReferences") or [] if o.get("kind") == "Sandbox"), None
    )
    if owner is None:
        return None
    phase = (pod.get("status") or {}).get("phase")
    if event.get("type") == "DELETED":
        state = "Deleted"  # gone: a new Pod of the same name can be made now
    elif metadata.get("deletionTimestamp"):
        state = "Terminating"
    elif phase in ("Failed", "Succeeded"):
        state = "Failed"  # evicted by the kubelet: the object stays until someone deletes it
    elif unplaced := unschedulable_reason(pod):
        # The scheduler found no node: the Sandbox says why at once. A digest of the reason
        # changes the value when the scheduler's reason changes, so the Sandbox's follows.
        digest = hashlib.sha256(unplaced.encode()).hexdigest()[:8]
        state = f"{digest}:Unschedulable"
    else:
        state = "Ready" if pod_is_ready(pod) else "NotReady"
    return str(metadata.get("namespace")), str(owner["name"]), f"{metadata.get('uid')}:{state}"


def commit_to_status(result: CommitResult, plan_commit: str = "") -> dict[str, Any]:
    """``status.lastCommit`` of a core CommitResult (declared fields only, case 15)."""
    out: dict[str, Any] = {
        "success": result.success,
        "changedFiles": list(result.changed_files),
        "addedFiles": list(result.added_files),
        "deletedFiles": list(result.deleted_files),
        "timestamp": result.timestamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if result.commit_ref:
        out["commitRef"] = result.commit_ref
    if result.error:
        out["error"] = result.error
    if plan_commit:
        out["planCommit"] = plan_commit
    return out


def ready_condition(phase: SandboxPhase) -> tuple[str, str, str]:
    """``(status, reason, message)`` of the Ready condition in ``phase``."""
    if phase is SandboxPhase.ACTIVE:
        return "True", "Active", "sandbox is active; writes go to the sandbox"
    messages = {
        SandboxPhase.PENDING: "sandbox is being provisioned",
        SandboxPhase.CREATED: "sandbox exists but is not active yet",
        SandboxPhase.COMMITTED: "changes were committed to the original",
        SandboxPhase.ROLLED_BACK: "changes were discarded",
        SandboxPhase.CLEANED_UP: "sandbox artefacts were removed",
        SandboxPhase.ERRORED: "the sandbox hit an unrecoverable error",
        SandboxPhase.SUSPENDED: "suspended: no workspace Pod; the changes are kept",
    }
    return "False", phase.value, messages[phase]


def status_of_state(
    state: SandboxState,
    executor_kind: str,
    conditions: list[dict[str, Any]] | None,
    generation: int | None,
    plan_commit: str = "",
) -> dict[str, Any]:
    """The ``Sandbox.status`` patch mirroring ``state`` (declared fields only, case 15)."""
    phase = SandboxPhase.from_core(state.status)
    ready, reason, message = ready_condition(phase)
    conditions = set_condition(conditions, "Ready", ready, reason, message, generation)  # type: ignore[arg-type]
    conditions = set_finished(
        conditions,
        phase.is_terminal,
        phase.value,
        f"the sandbox's work ended: {phase.value}"
        if phase.is_terminal
        else "the sandbox is in use",
        generation,
    )
    if phase is not SandboxPhase.ERRORED and find_condition(conditions, "Degraded"):
        conditions = set_condition(
            conditions, "Degraded", "False", "Healthy", "no errors", generation
        )
    status: dict[str, Any] = {
        "phase": phase.value,
        "sandboxId": state.sandbox_id,
        "sandboxPath": state.sandbox_path,
        "effectiveStrategy": state.effective_strategy,
        "strategyMode": state.strategy_mode,
        "executor": executor_kind,
        "workspacePod": state.workspace_pod,
        "coreRecord": core_record.encode(redaction.redact_record(state.record)),
        "conditions": conditions,
    }
    if generation is not None:
        status["observedGeneration"] = generation
    if state.last_commit is not None:
        status["lastCommit"] = commit_to_status(state.last_commit, plan_commit)
    return status


def plan_label_value(plan_id: str) -> str | None:
    """``spec.planId`` as the value of label ``sandbox.cleveragents.io/plan-id``, or None when it
    cannot be one (over 63 characters or other characters than alphanumerics, ``-_.``; the CRD
    description says so). For ``kubectl get sbx -l sandbox.cleveragents.io/plan-id=P``."""
    if LABEL_VALUE.fullmatch(plan_id):
        return plan_id
    return None


def plan_label_patch(body: Mapping[str, Any]) -> dict[str, str]:
    """The label patch a Sandbox needs so that it carries its plan id ({} when it already
    does or cannot)."""
    plan_id = str((body.get("spec") or {}).get("planId") or "")
    value = plan_label_value(plan_id)
    labels = (body.get("metadata") or {}).get("labels") or {}
    if value is None or labels.get(PLAN_LABEL) == value:
        return {}
    return {PLAN_LABEL: value}


def failure_status(
    exc: BaseException, conditions: list[dict[str, Any]] | None, generation: int | None
) -> dict[str, Any]:
    """Status patch for a failed operation: Degraded=True (and Ready=False unless retrying)."""
    failure = classify(exc)
    failure = failure.__class__(
        failure.reason, redaction.scrub_text(failure.message), failure.retryable
    )
    conditions = set_condition(
        conditions, "Degraded", "True", failure.reason, failure.message, generation
    )
    status: dict[str, Any] = {"conditions": conditions}
    if not failure.retryable:
        conditions[:] = set_condition(
            conditions, "Ready", "False", failure.reason, failure.message, generation
        )
    if generation is not None:
        status["observedGeneration"] = generation
    return status


class SandboxLogic:
    """The Sandbox handlers' logic; one instance per operator process.

    Args:
        settings: the operator settings.
        executor: where the core runs.
        api: API access (None in unit tests that need none).
        events: where Events go.
    """

    def __init__(
        self, settings: Settings, executor: Executor, api: Api | None, events: EventSink
    ) -> None:
        self.settings = settings
        self.executor = executor
        self.api = api
        self.events = events
        self.claims = CLAIMS

    def _fail(
        self,
        body: Mapping[str, Any],
        patch: MutableMapping[str, Any],
        exc: BaseException,
        action: str,
        retry: int = 0,
    ) -> TemporaryError | PermanentError:
        failure = classify(exc)
        conditions = (body.get("status") or {}).get("conditions")
        generation = body["metadata"].get("generation")
        patch.setdefault("status", {}).update(failure_status(exc, conditions, generation))
        # A lost warm-pool Pod took the Sandbox's changes with it: Errored, whatever found it.
        if not failure.retryable and (action == "provision" or failure.reason == "PoolPodLost"):
            patch["status"]["phase"] = SandboxPhase.ERRORED.value
            patch["status"]["conditions"] = set_finished(
                patch["status"]["conditions"],
                True,
                SandboxPhase.ERRORED.value,
                f"provisioning failed: {failure.reason}",
                generation,
            )
        self.events(
            body,
            "Warning",
            f"{action.capitalize()}Failed",
            f"{action} failed: {failure.reason}: {failure.message}",
        )
        logger.warning(
            "sandbox %s: %s failed: %s",
            body["metadata"]["name"],
            action,
            redaction.scrub_text(str(exc)),
        )
        error = to_kopf(exc, backoff_seconds(self.settings, retry))
        error.args = (redaction.scrub_text(str(error)), *error.args[1:])
        return error

    def provision(
        self, body: Mapping[str, Any], patch: MutableMapping[str, Any], retry: int = 0
    ) -> None:
        """Create handler: provision (idempotently) and drive to ACTIVE, then serve requests.

        A workspace Pod that is still starting is a normal wait, not a failure:
        ``phase: Pending``, ``Ready=False`` reason ``WorkspacePodStarting``, no Warning, no
        retry; the Pod's own Ready event resumes (:meth:`workspace_pod_changed`). A Sandbox
        created with ``spec.suspend: true`` starts ``Suspended``.

        Raises:
            PermanentError: the spec can never work (condition and Event set first).
            TemporaryError: retry later (transient API or I/O trouble), with exponential
                backoff by ``retry``.
        """
        try:
            target = target_from_body(body, self.settings, self.api)
        except PermanentError as exc:
            cause: Exception = (
                SandboxForkError(str(exc))
                if isinstance(exc, ForkRefusedError)
                else ValueError(str(exc))
            )
            raise self._fail(body, patch, cause, "provision") from exc
        if (body.get("spec") or {}).get("suspend"):
            self._set_suspended(body, patch)
            return
        lifecycle_metrics.SANDBOX_STARTUP.reconcile_started(body)
        self._provision(body, patch, target, retry)

    def _provision(
        self,
        body: Mapping[str, Any],
        patch: MutableMapping[str, Any],
        target: SandboxTarget,
        retry: int,
    ) -> None:
        with (
            tracing.span(
                "sandbox.provision",
                namespace=target.namespace,
                name=target.name,
                strategy=target.strategy,
                executor=self.executor.kind,
            ),
            metrics.reconcile_timer("Sandbox", "provision") as outcome,
        ):
            try:
                state = self.executor.provision(target)
            except WorkspaceNotReady as waiting:
                self._set_waiting(body, patch, waiting.reason, str(waiting))
                return
            except Exception as exc:
                outcome.set("error")
                raise self._fail(body, patch, exc, "provision", retry) from exc
        status = status_of_state(
            state,
            self.executor.kind,
            (body.get("status") or {}).get("conditions"),
            body["metadata"].get("generation"),
        )
        patch.setdefault("status", {}).update(status)
        if status["phase"] == SandboxPhase.ACTIVE.value:
            lifecycle_metrics.SANDBOX_STARTUP.active(body)
        if target.strategy == "none":
            self.events(
                body,
                "Warning",
                "NoSandbox",
                f"strategy none: writes to {target.original} are immediate and cannot be "
                "rolled back; the Apply-phase diff review is skipped",
            )
        self.events(
            body,
            "Normal",
            "Provisioned",
            f"sandbox {state.sandbox_id} is {state.status.value} at {state.sandbox_path}",
        )
        merged = dict(body)
        merged["status"] = {**dict(body.get("status") or {}), **patch["status"]}
        self.serve_requests(merged, patch)

    def _set_waiting(
        self, body: Mapping[str, Any], patch: MutableMapping[str, Any], reason: str, message: str
    ) -> None:
        """Ready=False with ``reason`` while the workspace Pod is not serving (no Warning)."""
        status = dict(body.get("status") or {})
        generation = body["metadata"].get("generation")
        out = patch.setdefault("status", {})
        conditions = set_condition(
            out.get("conditions") or status.get("conditions"),
            "Ready",
            "False",
            reason,
            message,
            generation,
        )
        out["conditions"] = set_finished(
            conditions, False, "", "the sandbox is starting", generation
        )
        out["executor"] = self.executor.kind
        if status.get("phase") in (None, SandboxPhase.SUSPENDED.value):
            out["phase"] = SandboxPhase.PENDING.value

    def _set_suspended(self, body: Mapping[str, Any], patch: MutableMapping[str, Any]) -> None:
        generation = body["metadata"].get("generation")
        out = patch.setdefault("status", {})
        conditions = set_condition(
            (body.get("status") or {}).get("conditions"),
            "Ready",
            "False",
            "Suspended",
            "spec.suspend is true: no workspace Pod; every change is kept on the scratch claim",
            generation,
        )
        out["conditions"] = set_finished(
            conditions, False, "", "the sandbox is suspended", generation
        )
        out["phase"] = SandboxPhase.SUSPENDED.value
        out["executor"] = self.executor.kind

    def workspace_pod_changed(
        self, body: Mapping[str, Any], patch: MutableMapping[str, Any], value: str, retry: int = 0
    ) -> None:
        """The workspace Pod's readiness changed (annotation ``WORKSPACE_ANNOTATION``).

        ``Ready``: provision (re-opens the sandbox from its scratch claim after a recreated
        Pod) and mirror. ``Unschedulable``: ``Ready=False`` reason
        ``WorkspacePodUnschedulable`` with the scheduler's message. ``NotReady``:
        ``Ready=False`` (reason ``WorkspacePodNotReady``).
        ``Terminating``: ``Ready=False``. ``Failed`` (evicted): delete the Pod object.
        ``Deleted``: make the Pod again; ``Ready=False`` meanwhile.
        Nothing happens for a suspended or deleted Sandbox.

        Raises:
            TemporaryError: provisioning failed for now; backs off exponentially.
        """
        if body["metadata"].get("deletionTimestamp") or (body.get("spec") or {}).get("suspend"):
            return
        phase = (body.get("status") or {}).get("phase")
        if phase in {p.value for p in SandboxPhase if p.is_terminal} | {"CleanedUp"}:
            return
        state = value.rpartition(":")[2]
        try:
            target = target_from_body(body, self.settings, self.api)
        except PermanentError:
            return
        if state in ("Ready", "Unschedulable"):
            # Unschedulable: provisioning reads the Pod and records the scheduler's reason.
            if state == "Ready":
                uid = str(body["metadata"].get("uid") or "")
                lifecycle_metrics.SANDBOX_STARTUP.pod_ready(uid)
            self._provision(body, patch, target, retry)
        elif state in ("NotReady", "Terminating"):
            starting = phase in (None, SandboxPhase.PENDING.value) and state == "NotReady"
            reason = "WorkspacePodStarting" if starting else "WorkspacePodNotReady"
            self._set_waiting(body, patch, reason, f"the workspace Pod is {state}")
        elif state == "Failed":
            # Evicted (or ended): delete it; its Deleted event then makes a new one.
            self._set_waiting(
                body, patch, "WorkspacePodFailed", "the workspace Pod failed or was evicted"
            )
            try:
                self.executor.suspend(target)
            except Exception as exc:
                raise self._fail(body, patch, exc, "recreate", retry) from exc
        elif state == "Deleted":
            self._set_waiting(
                body,
                patch,
                "WorkspacePodRecreated",
                "the workspace Pod was deleted or evicted; a new one is starting",
            )
            try:
                self.executor.resume(target)
            except Exception as exc:
                raise self._fail(body, patch, exc, "recreate", retry) from exc
            self.events(body, "Normal", "WorkspacePodRecreated", "the workspace Pod was made again")

    def suspend_changed(
        self,
        body: Mapping[str, Any],
        patch: MutableMapping[str, Any],
        suspend: bool,
        retry: int = 0,
    ) -> None:
        """``spec.suspend`` changed: delete the Pod (claim kept) or bring it back.

        Raises:
            TemporaryError: the Pod could not be deleted or made; backs off.
        """
        if body["metadata"].get("deletionTimestamp"):
            return
        phase = (body.get("status") or {}).get("phase")
        if phase in {p.value for p in SandboxPhase if p.is_terminal} | {"CleanedUp"}:
            return
        try:
            target = target_from_body(body, self.settings, self.api)
        except PermanentError:
            return
        if suspend:
            try:
                self.executor.suspend(target)
            except Exception as exc:
                raise self._fail(body, patch, exc, "suspend", retry) from exc
            self._set_suspended(body, patch)
            self.events(body, "Normal", "Suspended", "workspace Pod deleted; changes kept")
            return
        if phase != SandboxPhase.SUSPENDED.value:
            return
        self.events(body, "Normal", "Resumed", "workspace Pod is being made again")
        self._provision(body, patch, target, retry)

    def workspace_pod_event(self, event: Mapping[str, Any]) -> None:
        """A workspace Pod's watch event: mirror its readiness onto the owning Sandbox's
        annotation, only when it changed (that wakes :meth:`workspace_pod_changed`), and only
        when the Sandbox's uid is the Pod's controller (a Pod naming a Sandbox as owner
        without being its child is ignored)."""
        found = pod_event_annotation(event)
        if found is None or self.api is None:
            return
        namespace, name, value = found
        try:
            sandbox = self.api.get(SANDBOX_PLURAL, namespace, name)
        except Exception as exc:
            if is_not_found(exc):
                return
            raise
        pod_metadata = (event.get("object") or {}).get("metadata") or {}
        if not is_controlled_by(pod_metadata, str(sandbox["metadata"].get("uid") or "")):
            return  # a Pod this Sandbox does not control says nothing about it
        annotations = sandbox["metadata"].get("annotations") or {}
        if annotations.get(WORKSPACE_ANNOTATION) == value:
            return
        if value.endswith(":Deleted") and sandbox["metadata"].get("deletionTimestamp"):
            return
        self.api.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            SANDBOX_PLURAL,
            name,
            {"metadata": {"annotations": {WORKSPACE_ANNOTATION: value}}},
        )

    def serve_requests(self, body: Mapping[str, Any], patch: MutableMapping[str, Any]) -> None:
        """Act on a new ``rollbackRequest`` / ``restoreRequest`` id; old ids are ignored.

        The id is recorded even when the action fails (a condition and an Event say why), so a
        request is never acted on twice and never loops.
        """
        spec = dict(body.get("spec") or {})
        status = dict(body.get("status") or {})
        if status.get("phase") in (None, SandboxPhase.PENDING.value):
            return  # not provisioned yet: the create handler serves requests when done
        rollback = spec.get("rollbackRequest") or {}
        if rollback.get("id") and rollback["id"] != status.get("lastRollbackRequestId"):
            self._rollback(body, patch, str(rollback["id"]))
            status = {**status, **patch.get("status", {})}
            body = {**body, "status": status}
        restore = spec.get("restoreRequest") or {}
        if restore.get("id") and restore["id"] != status.get("lastRestoreRequestId"):
            self._restore(body, patch, str(restore["id"]), str(restore.get("checkpointName")))

    def _rollback(
        self, body: Mapping[str, Any], patch: MutableMapping[str, Any], request_id: str
    ) -> None:
        target = target_from_body(body, self.settings, self.api)
        generation = body["metadata"].get("generation")
        conditions = (patch.get("status") or {}).get("conditions") or (
            body.get("status") or {}
        ).get("conditions")
        out = patch.setdefault("status", {})
        try:
            state = self.executor.rollback(target)
        except WorkspaceNotReady as exc:
            # Served once the workspace Pod serves again (the id is not recorded yet).
            raise TemporaryError(str(exc), delay=self.settings.retry_delay_seconds) from exc
        except Exception as exc:
            out["lastRollbackRequestId"] = request_id
            failure = classify(exc)
            out["conditions"] = set_condition(
                conditions,
                "RollbackRequested",
                "False",
                failure.reason,
                f"rollback request {request_id} failed: {failure.message}",
                generation,
            )
            self.events(
                body,
                "Warning",
                "RollbackFailed",
                f"rollback request {request_id} failed: {failure.message}",
            )
            return
        out["lastRollbackRequestId"] = request_id
        out.update(status_of_state(state, self.executor.kind, conditions, generation))
        out["conditions"] = set_condition(
            out["conditions"],
            "RollbackRequested",
            "True",
            "RolledBack",
            f"rollback request {request_id}: changes discarded",
            generation,
        )
        self.events(body, "Normal", "RolledBack", f"rollback request {request_id} served")

    def _restore(
        self,
        body: Mapping[str, Any],
        patch: MutableMapping[str, Any],
        request_id: str,
        checkpoint_name: str,
    ) -> None:
        target = target_from_body(body, self.settings, self.api)
        generation = body["metadata"].get("generation")
        out = patch.setdefault("status", {})
        conditions = out.get("conditions") or (body.get("status") or {}).get("conditions")
        try:
            checkpoint, checkpoint_uid = self._checkpoint_info(target, checkpoint_name)
            holder = f"Sandbox {target.namespace}/{target.name}"
            with self.claims.holding(checkpoint_uid, holder, f"checkpoint {checkpoint_name}"):
                state = self.executor.restore_checkpoint(target, checkpoint)
        except TemporaryError:
            raise
        except WorkspaceNotReady as exc:
            raise TemporaryError(str(exc), delay=self.settings.retry_delay_seconds) from exc
        except Exception as exc:
            failure = classify(exc)
            out["lastRestoreRequestId"] = request_id
            out["conditions"] = set_condition(
                conditions,
                "Restored",
                "False",
                failure.reason,
                f"restore request {request_id} to {checkpoint_name} failed: {failure.message}",
                generation,
            )
            self.events(
                body,
                "Warning",
                "RestoreFailed",
                f"restore request {request_id} failed: {failure.message}",
            )
            return
        out["lastRestoreRequestId"] = request_id
        out.update(status_of_state(state, self.executor.kind, conditions, generation))
        out["conditions"] = set_condition(
            out["conditions"],
            "Restored",
            "True",
            "Restored",
            f"restore request {request_id}: restored to checkpoint {checkpoint_name}",
            generation,
        )
        self.events(
            body,
            "Normal",
            "Restored",
            f"restore request {request_id}: restored to checkpoint {checkpoint_name}",
        )

    def _checkpoint_info(self, target: SandboxTarget, name: str) -> tuple[CheckpointInfo, str]:
        """The Ready Checkpoint ``name`` of this sandbox, and its uid.

        Raises:
            TemporaryError: it is not Ready yet.
            ValueError: it belongs to another Sandbox, failed, or is being deleted.
            ApiException: 404 when it does not exist.
        """
        if self.api is None:
            raise ValueError("restore needs API access")
        body = self.api.get(CHECKPOINT_PLURAL, target.namespace, name)
        if (body.get("spec") or {}).get("sandboxName") != target.name:
            raise ValueError(f"checkpoint {name} belongs to another sandbox")
        if deletion_began(body):
            raise ValueError(f"checkpoint {name} is being deleted and cannot be restored")
        phase = (body.get("status") or {}).get("phase")
        if phase == "Failed":
            raise ValueError(f"checkpoint {name} failed and cannot be restored")
        if phase != "Ready":
            raise TemporaryError(
                f"checkpoint {name} is not Ready yet", delay=self.settings.retry_delay_seconds
            )
        return checkpoint_info_from_body(body, target), str(body["metadata"]["uid"])

    def renew_agent_token(self, body: Mapping[str, Any]) -> None:
        """Renew the Sandbox's workspace-agent token when its window changed (a timer; the
        pod executor writes its token Secret). Nothing for a Sandbox being deleted or with an
        invalid spec."""
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        try:
            target = target_from_body(body, self.settings, self.api)
        except PermanentError:
            return
        self.executor.renew_token(target)

    def finalize(self, body: Mapping[str, Any], retry: int = 0) -> None:
        """Deletion handler: remove everything the sandbox made; the original is never touched.

        Works whether or not provisioning finished (case 16): cleanup of nothing is fine. A spec
        this operator now refuses (other ``NODE_PATH_ROOTS`` since a restart, a spec that no
        longer validates) is cleaned up by the sandbox id alone
        (:func:`~sandbox_operator.resources.targets.refused_spec_target`): what it made while
        its spec was accepted does not leak under the sandbox root. Waits
        while a PlanCommit or Checkpoint holds the sandbox (case 17, module ``kube.claims``); from
        then on nothing else acts on it, so no record outlives the object.

        Raises:
            TemporaryError: cleanup failed (retried; an Event names the failure), or the
                sandbox is still in use (:func:`errors.waiting`: backs off by ``retry``, logged
                at INFO, no Event).
        """
        lifecycle_metrics.SANDBOX_STARTUP.forget(str(body["metadata"]["uid"]))
        holders = self.claims.begin_finalizing(str(body["metadata"]["uid"]))
        if holders:
            raise waiting(
                "cleanup waits: ",
                f"the sandbox is in use by {', '.join(holders)}",
                self.settings.retry_delay_seconds,
                retry,
            )
        try:
            target = target_from_body(body, self.settings, self.api, for_deletion=True)
        except (PermanentError, ApiException) as exc:
            # What it made while its spec was accepted is still ours to remove, whatever became
            # of its source (a Secret deleted first by a namespace's deletion answers 404).
            logger.warning(
                "sandbox %s: spec or source refused (%s); cleaning up by the operator's own record",
                body["metadata"]["name"],
                exc,
            )
            target = refused_spec_target(body)
        try:
            self.executor.cleanup(target)
        except Exception as exc:
            failure = classify(exc)
            self.events(body, "Warning", "CleanupFailed", f"{failure.reason}: {failure.message}")
            raise TemporaryError(
                f"cleanup failed: {failure.message}", delay=self.settings.retry_delay_seconds
            ) from exc
        self.events(body, "Normal", "CleanedUp", f"sandbox {target.sandbox_id} cleaned up")


def mirror_to_object(
    api: Api,
    namespace: str,
    name: str,
    state: SandboxState,
    executor_kind: str,
    plan_commit: str = "",
) -> None:
    """Patch a Sandbox object's status to mirror ``state`` (used by the PlanCommit saga).

    A Sandbox deleted meanwhile is tolerated (404 logged once, never retried: case 16).
    """
    try:
        current = api.get(SANDBOX_PLURAL, namespace, name)
        status = status_of_state(
            state,
            executor_kind,
            (current.get("status") or {}).get("conditions"),
            current["metadata"].get("generation"),
            plan_commit,
        )
        api.patch_status(SANDBOX_PLURAL, namespace, name, status)
    except Exception as exc:
        if is_not_found(exc):
            logger.warning("sandbox %s/%s is gone; status not mirrored", namespace, name)
            return
        raise


def ttl_expired(body: Mapping[str, Any], now: datetime | None = None) -> bool:
    """True when a terminal Sandbox's ``ttlSecondsAfterFinished`` has passed.

    The finish time is the Ready condition's ``lastTransitionTime`` (it moved when the phase
    became terminal); both it and ``now`` (default) are on the API server's clock
    (:mod:`~sandbox_operator.kube.clock`), so replicas whose clocks differ agree
    (:func:`~sandbox_operator.resources.ttl.ttl_deadline`).
    """
    deadline = ttl_deadline(body)
    return deadline is not None and (now or clock.now()) >= deadline


def is_usable(status: SandboxStatus) -> bool:
    """Whether the core status can be committed (seed 002; the core's guard)."""
    return status.can_commit
