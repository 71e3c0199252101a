"""Checkpoint logic: snapshot a Sandbox through the core's CheckpointManager (seed 004).

Create: take the snapshot (idempotent per Checkpoint uid, case 18) and record it in the status.
Delete (finalizer): remove the snapshot. Restores are served by the Sandbox's
``spec.restoreRequest`` (:mod:`sandbox_operator.resources.sandbox`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from sandbox_api.models import SANDBOX_PLURAL, CheckpointSpec
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
    SandboxTarget,
    WorkspaceNotReady,
)
from sandbox_operator.kube import metrics
from sandbox_operator.kube.api import Api
from sandbox_operator.kube.claims import CLAIMS, BeingDeletedError, deletion_began
from sandbox_operator.kube.conditions import set_condition
from sandbox_operator.kube.events import EventSink
from sandbox_operator.resources.targets import target_from_body
from sandbox_operator.settings import Settings

logger = logging.getLogger("sandbox_operator.checkpoint")


class CheckpointLogic:
    """The Checkpoint handlers' logic; one instance per operator process."""

    def __init__(self, settings: Settings, executor: Executor, api: Api, events: EventSink) -> None:
        self.settings = settings
        self.executor = executor
        self.api = api
        self.events = events
        self.claims = CLAIMS

    def _sandbox_target(self, body: Mapping[str, Any]) -> SandboxTarget:
        spec = CheckpointSpec.model_validate(dict(body.get("spec") or {}))
        namespace = str(body["metadata"]["namespace"])
        sandbox = self.api.get(SANDBOX_PLURAL, namespace, spec.sandbox_name)
        if deletion_began(sandbox):
            raise BeingDeletedError(f"sandbox {spec.sandbox_name} is being deleted")
        if (sandbox.get("status") or {}).get("phase") in (None, "Pending"):
            raise TemporaryError(
                f"sandbox {spec.sandbox_name} is not provisioned yet",
                delay=self.settings.retry_delay_seconds,
            )
        return target_from_body(sandbox, self.settings, self.api)

    def create(self, body: Mapping[str, Any], patch: MutableMapping[str, Any]) -> None:
        """Create handler: snapshot the Sandbox and record it as Ready.

        Raises:
            TemporaryError: the Sandbox is not provisioned yet, or a transient error.
            PermanentError: the Sandbox does not exist, is being deleted (case 17: no
                snapshot of it is taken), or the snapshot failed (condition Ready=False and a
                Warning Event first).
        """
        spec = CheckpointSpec.model_validate(dict(body.get("spec") or {}))
        generation = body["metadata"].get("generation")
        conditions = (body.get("status") or {}).get("conditions")
        out = patch.setdefault("status", {})
        with metrics.reconcile_timer("Checkpoint", "create"):
            try:
                target = self._sandbox_target(body)
                holder = f"Checkpoint {body['metadata']['namespace']}/{body['metadata']['name']}"
                with self.claims.holding(target.uid, holder, f"sandbox {spec.sandbox_name}"):
                    info = self.executor.create_checkpoint(
                        target, spec.phase, dict(spec.metadata), uid=str(body["metadata"]["uid"])
                    )
            except TemporaryError:
                raise
            except WorkspaceNotReady as exc:
                # The workspace Pod is starting, re-made or suspended: a wait, not a failure.
                raise TemporaryError(str(exc), delay=self.settings.retry_delay_seconds) from exc
            except Exception as exc:
                failure = classify(exc)
                if is_not_found(exc):
                    failure = failure.__class__(
                        "SandboxNotFound", f"sandbox {spec.sandbox_name} does not exist", False
                    )
                out["conditions"] = set_condition(
                    conditions, "Ready", "False", failure.reason, failure.message, generation
                )
                if not failure.retryable:
                    out["phase"] = "Failed"
                self.events(
                    body, "Warning", "CheckpointFailed", f"{failure.reason}: {failure.message}"
                )
                if is_not_found(exc) or isinstance(exc, BeingDeletedError):
                    raise PermanentError(failure.message) from exc
                raise to_kopf(exc, self.settings.retry_delay_seconds) from exc
        out.update(
            {
                "phase": "Ready",
                "checkpointId": info.checkpoint_id,
                "sandboxId": info.sandbox_id,
                "snapshotLocation": info.snapshot_location,
                "kind": info.kind,
                "createdAt": info.created_at,
                "observedGeneration": generation,
                "conditions": set_condition(
                    conditions,
                    "Ready",
                    "True",
                    "SnapshotTaken",
                    f"{info.kind} checkpoint {info.checkpoint_id} of sandbox {spec.sandbox_name}",
                    generation,
                ),
            }
        )
        self.events(
            body,
            "Normal",
            "CheckpointCreated",
            f"{info.kind} checkpoint {info.checkpoint_id} at {info.snapshot_location}",
        )

    def finalize(self, body: Mapping[str, Any], retry: int = 0) -> None:
        """Deletion handler: remove the snapshot this Checkpoint took, found by its uid as well
        as by ``status.checkpointId`` (nothing made is fine); waits while a restore reads it
        (case 17, :mod:`sandbox_operator.kube.claims`).

        Raises:
            TemporaryError: a restore holds it, or the deletion failed (retried).
        """
        holders = self.claims.begin_finalizing(str(body["metadata"]["uid"]))
        if holders:
            raise waiting(
                "snapshot deletion waits: ",
                f"in use by {', '.join(holders)}",
                self.settings.retry_delay_seconds,
                retry,
            )
        status = dict(body.get("status") or {})
        # The executor finds the snapshot by this uid too: a status that lost the id (or names
        # another Checkpoint's snapshot) neither leaks this snapshot nor deletes that one.
        info = CheckpointInfo(
            checkpoint_id=str(status.get("checkpointId") or ""),
            sandbox_id=str(status.get("sandboxId") or ""),
            snapshot_location=str(status.get("snapshotLocation") or ""),
            kind=str(status.get("kind") or ""),
            created_at=str(status.get("createdAt") or ""),
            extra={"uid": str(body["metadata"]["uid"])},
        )
        try:
            self.executor.delete_checkpoint(info)
        except Exception as exc:
            failure = classify(exc)
            self.events(
                body, "Warning", "CheckpointDeleteFailed", f"{failure.reason}: {failure.message}"
            )
            raise TemporaryError(failure.message, delay=self.settings.retry_delay_seconds) from exc
