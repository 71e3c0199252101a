"""A warm pool of workspace Pods: pre-started, unclaimed Pods per namespace and workspace shape,
each claimed by one Sandbox at most, refilled, and replaced when they go bad.

Design (docs/operator-design.md, "Warm pool"): a Pod's volumes and environment are fixed at
creation, and what a Sandbox needs there (its source claim, its scratch claim, its token
Secret, a Secret's DSN) is not known before the Sandbox exists. So a pool Pod mounts nothing
of any Sandbox: two emptyDirs (``/tmp`` and the scratch/state directory), no claim, no Secret.
It is keyed by its *shape* (:func:`shape_of`: the workspace image and the Pod-level fields of
``spec.workspace`` that cannot change on a running Pod: resources, scheduling, runtime class,
priority class, pull secrets), labelled ``sandbox.cleveragents.io/pool=<shape>``.

Claiming (:meth:`WarmPool.claim`) is one merge patch of a Ready pool Pod that carries the
``metadata.resourceVersion`` it was listed at: the API server applies it only when nobody
changed the Pod since (409 otherwise), so two Sandboxes never claim one Pod. The patch drops
the pool label, adds the Sandbox's labels (``sandbox-uid`` among them) and makes the Sandbox
its controller (ownerReference): a claimed Pod is never listed as free again and is
garbage-collected with its Sandbox, so no other Sandbox ever reuses it. A Pod that already has
a controller is never claimed.

:meth:`WarmPool.reconcile` keeps ``size`` free Pods: it deletes the bad ones (phase Failed or
Succeeded, or not Ready ``start_grace_seconds`` after creation, or Ready=False after having been
Ready) and creates the missing ones (``generateName``).

Not built yet (docs/operator-design.md, "Warm pool"): handing a claimed Pod its Sandbox (its
agent token and its source, which no running Pod can mount later) and the provisioning that
asks the pool first, so nothing in the operator calls this module yet.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from sandbox_api.models import MANAGED_BY, MANAGED_BY_LABEL, PLAN_LABEL
from sandbox_core.agent import wire
from sandbox_operator.executors.pod_manifests import (
    COMPONENT_LABEL,
    CONTAINER,
    SANDBOX_NAME_LABEL,
    SANDBOX_ROOT,
    SANDBOX_UID_LABEL,
    SCRATCH_MOUNT,
    STATE_DIR,
    WORKSPACE_COMPONENT,
    WORKSPACE_UID,
    label_value,
    pod_is_ready,
    seccomp_profile,
)
from sandbox_operator.kube.api import Api
from sandbox_operator.settings import Settings

POOL_LABEL = "sandbox.cleveragents.io/pool"
# The Pod-level fields of spec.workspace (camelCase, as in a Pod spec) that make a shape.
SHAPE_FIELDS = (
    "resources",
    "nodeSelector",
    "tolerations",
    "affinity",
    "runtimeClassName",
    "priorityClassName",
    "imagePullSecrets",
)


def shape_of(settings: Settings, workspace: Mapping[str, Any] | None = None) -> str:
    """The pool key of a workspace: 16 hex digits of the SHA-256 of the workspace image and
    the :data:`SHAPE_FIELDS` of ``workspace`` (empty values dropped, keys sorted), so equal
    shapes give equal keys whatever the order of the fields; and the ``Localhost`` seccomp
    profile when one is set (a Pod's profile cannot change once it runs)."""
    fields = {k: v for k, v in (workspace or {}).items() if k in SHAPE_FIELDS and v}
    shape: dict[str, Any] = {"image": settings.workspace_image, "workspace": fields}
    if settings.workspace_seccomp_profile:
        shape["seccomp"] = settings.workspace_seccomp_profile
    canonical = json.dumps(shape, sort_keys=True).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


def build_pool_pod(
    namespace: str, settings: Settings, workspace: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A free pool Pod of ``workspace``'s shape in ``namespace`` (pure): the workspace agent of
    the workspace image under the restricted Pod Security profile, like a Sandbox's workspace
    Pod, with two emptyDirs and no claim, no Secret and no source."""
    workspace = workspace or {}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.workspace_image,
        "command": ["sandbox-core", "serve-workspace"],
        "env": [
            {"name": wire.STATE_DIR_ENV, "value": STATE_DIR},
            {"name": wire.ROOT_ENV, "value": SANDBOX_ROOT},
            {"name": wire.PORT_ENV, "value": str(settings.agent_port)},
            {"name": "HOME", "value": "/tmp"},  # noqa: S108 - writable besides scratch
            {"name": wire.ALLOWED_ROOTS_ENV, "value": ""},  # no original until claimed
        ],
        "ports": [{"name": "agent", "containerPort": settings.agent_port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": wire.HEALTHZ.template, "port": settings.agent_port},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108
            {"name": "scratch", "mountPath": SCRATCH_MOUNT},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if workspace.get("resources"):
        container["resources"] = workspace["resources"]
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": WORKSPACE_UID,
            "runAsGroup": WORKSPACE_UID,
            "fsGroup": WORKSPACE_UID,
            "seccompProfile": seccomp_profile(settings),
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}],
    }
    for key in SHAPE_FIELDS[1:]:
        if workspace.get(key):
            spec[key] = workspace[key]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "sbx-pool-",
            "namespace": namespace,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY,
                COMPONENT_LABEL: WORKSPACE_COMPONENT,
                POOL_LABEL: shape_of(settings, workspace),
            },
        },
        "spec": spec,
    }


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def pool_pod_is_bad(pod: Mapping[str, Any], start_grace_seconds: float, now: datetime) -> bool:
    """True when a free pool Pod will never serve and must be replaced: it ended (phase Failed
    or Succeeded), lost readiness after having had it (a Ready condition False whose transition
    is after the Pod started), or is still not Ready ``start_grace_seconds`` after creation."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return True
    if pod_is_ready(dict(pod)):
        return False
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    started = _time(status.get("startTime"))
    changed = _time((ready or {}).get("lastTransitionTime"))
    if ready is not None and started is not None and changed is not None and changed > started:
        return True  # it was Ready once (a probe failing now)
    created = _time((pod.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and (now - created).total_seconds() > start_grace_seconds


@dataclass
class PoolReport:
    """What one :meth:`WarmPool.reconcile` did: Pods created, and bad ones deleted."""

    created: list[str]
    replaced: list[str]


class WarmPool:
    """The pool Pods of the namespaces the operator serves, through the API server.

    Args:
        settings: the workspace image and agent port.
        api: the Kubernetes API.
        start_grace_seconds: how long a new pool Pod may take to become Ready.
    """

    def __init__(self, settings: Settings, api: Api, start_grace_seconds: float = 300.0) -> None:
        self.settings = settings
        self.api = api
        self.start_grace_seconds = start_grace_seconds

    def free(self, namespace: str, shape: str) -> list[dict[str, Any]]:
        """The free (unclaimed, not being deleted) pool Pods of ``shape``, oldest first."""
        found = self.api.core.list_namespaced_pod(
            namespace, label_selector=f"{POOL_LABEL}={shape},!{SANDBOX_UID_LABEL}"
        )
        pods = cast(
            list[dict[str, Any]],
            self.api.api_client.sanitize_for_serialization(found.items),  # type: ignore[no-untyped-call]
        )
        free = [
            p
            for p in pods
            if not (p.get("metadata") or {}).get("deletionTimestamp")
            and not _controller(p.get("metadata") or {})
        ]
        return sorted(free, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))

    def reconcile(
        self,
        namespace: str,
        size: int,
        workspace: Mapping[str, Any] | None = None,
        now: datetime | None = None,
    ) -> PoolReport:
        """Keep ``size`` free pool Pods of ``workspace``'s shape in ``namespace``: delete the bad
        ones (:func:`pool_pod_is_bad`), create what is missing.

        Raises:
            ApiException: a list, delete or create failed (a 404 on delete is fine).
        """
        shape = shape_of(self.settings, workspace)
        moment = now or datetime.now(UTC)
        replaced: list[str] = []
        healthy = 0
        for pod in self.free(namespace, shape):
            name = str(pod["metadata"]["name"])
            if pool_pod_is_bad(pod, self.start_grace_seconds, moment):
                try:
                    self.api.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                replaced.append(name)
            else:
                healthy += 1
        created: list[str] = []
        for _ in range(max(0, size - healthy)):
            manifest = build_pool_pod(namespace, self.settings, workspace)
            made = self.api.core.create_namespaced_pod(namespace, cast(Any, manifest))
            created.append(str(made.metadata.name if made.metadata else ""))
        return PoolReport(created, replaced)

    def claim(
        self,
        namespace: str,
        owner: Mapping[str, Any],
        plan_id: str,
        workspace: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Claim a Ready free pool Pod of ``workspace``'s shape for the Sandbox ``owner`` (its
        body); the Pod's name, or None when no Ready Pod is free (make a Pod of its own).

        Each attempt is a merge patch carrying the resourceVersion the Pod was listed at: a
        Pod claimed (or changed) by anyone since answers 409 and the next one is tried.

        Raises:
            ApiException: any error but 404 and 409.
        """
        metadata = owner.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid:
            raise ValueError("the owner has no uid")
        shape = shape_of(self.settings, workspace)
        for pod in self.free(namespace, shape):
            if not pod_is_ready(pod):
                continue
            name = str(pod["metadata"]["name"])
            patch = {
                "metadata": {
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                    "labels": {
                        POOL_LABEL: None,
                        SANDBOX_UID_LABEL: uid,
                        SANDBOX_NAME_LABEL: label_value(str(metadata.get("name") or "")),
                        PLAN_LABEL: label_value(plan_id),
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": str(owner.get("apiVersion") or ""),
                            "kind": str(owner.get("kind") or ""),
                            "name": str(metadata.get("name") or ""),
                            "uid": uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                }
            }
            try:
                self.api.core.patch_namespaced_pod(name, namespace, patch)
            except ApiException as exc:
                if exc.status in (404, 409):
                    continue  # claimed, changed or deleted since it was listed
                raise
            return name
        return None


def _controller(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in metadata.get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None
