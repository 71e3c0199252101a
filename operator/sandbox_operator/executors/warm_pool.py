"""A warm pool of workspace Pods: pre-started, unclaimed Pods per namespace and workspace shape,
each claimed by one Sandbox at most, refilled, and replaced when they go bad.

Design (docs/operator-design.md, "Warm pool"): a Pod's volumes and environment are fixed at
creation, and what a Sandbox needs there (its scratch claim, its token Secret, a Secret's DSN)
is not known before the Sandbox exists. So a pool Pod mounts nothing of any Sandbox: two
emptyDirs (``/tmp`` and the scratch/state directory), its pool's bootstrap-token Secret
(:func:`bootstrap_secret`) and, for a pool of a ReadWriteMany source claim, that claim at
``/workspace/source``. It is keyed by its *shape* (:func:`shape_of`: the workspace image, the
Pod-level fields of ``spec.workspace`` that cannot change on a running Pod: resources,
scheduling, runtime class, priority class, pull secrets, and the source claim when there is
one), labelled ``sandbox.cleveragents.io/pool=<shape>``.

Claiming (:meth:`WarmPool.claim`) is one merge patch of a Ready pool Pod that carries the
``metadata.resourceVersion`` it was listed at: the API server applies it only when nobody
changed the Pod since (409 otherwise), so two Sandboxes never claim one Pod. The patch drops
the pool label, adds the Sandbox's labels (``sandbox-uid`` among them, and
``sandbox.cleveragents.io/pooled``) and makes the Sandbox its controller (ownerReference): a
claimed Pod is never listed as free again and is garbage-collected with its Sandbox, so no
other Sandbox ever reuses it. A Pod that already has a controller is never claimed. The pod
executor then hands the Pod's agent the Sandbox's token (``wire.HANDOVER``, authenticated with
the bootstrap token, which the agent refuses from then on).

:meth:`WarmPool.reconcile` keeps ``size`` free Pods: it makes the bootstrap Secret when absent,
deletes the bad Pods (phase Failed or Succeeded, or not Ready ``start_grace_seconds`` after
creation, or Ready=False after having been Ready) and creates the missing ones
(``generateName``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from sandbox_api.models import MANAGED_BY, MANAGED_BY_LABEL, PLAN_LABEL
from sandbox_api.naming import AGENT_TOKEN_KEY
from sandbox_core.agent import wire
from sandbox_operator.executors.agent_keys import AgentKeys
from sandbox_operator.executors.placement import SOURCE_CLAIM_LABEL
from sandbox_operator.executors.pod_manifests import (
    COMPONENT_LABEL,
    CONTAINER,
    SANDBOX_NAME_LABEL,
    SANDBOX_ROOT,
    SANDBOX_UID_LABEL,
    SCRATCH_MOUNT,
    SOURCE_MOUNT,
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
# Set on a Pod when a Sandbox claims it (its state lives on the Pod's emptyDir).
POOLED_LABEL = "sandbox.cleveragents.io/pooled"
BOOTSTRAP_DIR = posixpath.dirname(wire.BOOTSTRAP_TOKEN_FILE)
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


def shape_of(
    settings: Settings, workspace: Mapping[str, Any] | None = None, claim: str = ""
) -> str:
    """The pool key of a workspace: 16 hex digits of the SHA-256 of the workspace image, the
    :data:`SHAPE_FIELDS` of ``workspace`` (empty values dropped, keys sorted), the source
    ``claim`` (a ReadWriteMany claim the pool's Pods mount; ``""``: none) and the ``Localhost``
    seccomp profile when one is set (a Pod's profile cannot change once it runs), so equal
    shapes give equal keys whatever the order of the fields."""
    fields = {k: v for k, v in (workspace or {}).items() if k in SHAPE_FIELDS and v}
    described: dict[str, Any] = {"image": settings.workspace_image, "workspace": fields}
    if claim:
        described["claim"] = claim
    if settings.workspace_seccomp_profile:
        described["seccomp"] = settings.workspace_seccomp_profile
    canonical = json.dumps(described, sort_keys=True).encode()
    return hashlib.sha256(canonical).hexdigest()[:16]


def bootstrap_token(key: bytes, namespace: str, shape: str) -> str:
    """The bootstrap token of pool ``shape`` in ``namespace``: hex HMAC-SHA256 over
    ``<namespace>|<shape>`` with a key of its own, HMAC-SHA256 of the agent key over
    ``warm-pool``, so no text a Sandbox's token is derived from gives it. The operator derives
    it again instead of reading its Secret (it may not)."""
    pool_key = hmac.new(key, b"warm-pool", hashlib.sha256).digest()
    return hmac.new(pool_key, f"{namespace}|{shape}".encode(), hashlib.sha256).hexdigest()


def bootstrap_secret_name(key: bytes, shape: str) -> str:
    """``sbx-pool-<shape>-<key fingerprint>-boot``: a rotated agent key gives new pool Pods a
    new Secret (the operator may not update Secrets other than Sandbox tokens)."""
    fingerprint = hashlib.sha256(b"fingerprint|" + key).hexdigest()[:8]
    return f"sbx-pool-{shape}-{fingerprint}-boot"


def bootstrap_secret(key: bytes, namespace: str, shape: str) -> dict[str, Any]:
    """The bootstrap-token Secret of pool ``shape`` (pure): Opaque, key ``token``, labelled
    with the pool, no owner (it serves every Pod of the pool)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": bootstrap_secret_name(key, shape),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, POOL_LABEL: shape},
        },
        "type": "Opaque",
        "stringData": {AGENT_TOKEN_KEY: bootstrap_token(key, namespace, shape)},
    }


def build_pool_pod(
    namespace: str,
    settings: Settings,
    workspace: Mapping[str, Any] | None = None,
    *,
    bootstrap: str,
    claim: str = "",
) -> dict[str, Any]:
    """A free pool Pod of ``workspace``'s shape in ``namespace`` (pure): the workspace agent of
    the workspace image under the restricted Pod Security profile, like a Sandbox's workspace
    Pod, with two emptyDirs, the bootstrap-token Secret ``bootstrap`` as a file, and, for a
    pool of source ``claim``, that claim at ``/workspace/source`` (the agent's allowed root;
    none without a claim). No token file, no scratch claim, no Secret source."""
    workspace = workspace or {}
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "bootstrap", "secret": {"secretName": bootstrap, "defaultMode": 0o440}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108
        {"name": "scratch", "mountPath": SCRATCH_MOUNT},
        {"name": "bootstrap", "mountPath": BOOTSTRAP_DIR, "readOnly": True},
    ]
    if claim:
        volumes.append({"name": "source", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "source", "mountPath": SOURCE_MOUNT})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.workspace_image,
        "command": ["sandbox-core", "serve-workspace"],
        "env": [
            {"name": wire.STATE_DIR_ENV, "value": STATE_DIR},
            {"name": wire.ROOT_ENV, "value": SANDBOX_ROOT},
            {"name": wire.PORT_ENV, "value": str(settings.agent_port)},
            {"name": "HOME", "value": "/tmp"},  # noqa: S108 - writable besides scratch
            {"name": wire.BOOTSTRAP_TOKEN_FILE_ENV, "value": wire.BOOTSTRAP_TOKEN_FILE},
            # The hand-over narrows it to the Sandbox's subPath.
            {"name": wire.ALLOWED_ROOTS_ENV, "value": SOURCE_MOUNT if claim else ""},
        ],
        "ports": [{"name": "agent", "containerPort": settings.agent_port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": wire.HEALTHZ.template, "port": settings.agent_port},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "volumeMounts": mounts,
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
        "volumes": volumes,
    }
    for key in SHAPE_FIELDS[1:]:
        if workspace.get(key):
            spec[key] = workspace[key]
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        COMPONENT_LABEL: WORKSPACE_COMPONENT,
        POOL_LABEL: shape_of(settings, workspace, claim),
    }
    if claim:
        labels[SOURCE_CLAIM_LABEL] = label_value(claim)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "sbx-pool-", "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


# The kubelet stamps a Pod's startTime and its first Ready=False in one status update, but from
# two readings of its clock: they may fall in consecutive seconds. Only a transition later than
# this after the start is taken for a Pod that lost a readiness it had.
READY_LOST_SLACK_SECONDS = 2.0


def pool_pod_is_bad(
    pod: Mapping[str, Any], start_grace_seconds: float, now: datetime, seen_ready: bool = False
) -> bool:
    """True when a free pool Pod will never serve and must be replaced: it ended (phase Failed
    or Succeeded), lost readiness after having had it (``seen_ready``: this operator saw it
    Ready; or a Ready condition False whose transition is more than
    :data:`READY_LOST_SLACK_SECONDS` after the Pod started), or is still not Ready
    ``start_grace_seconds`` after creation. ``now`` is aware UTC."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return True
    if pod_is_ready(dict(pod)):
        return False
    if seen_ready:
        return True
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    started = _time(status.get("startTime"))
    changed = _time((ready or {}).get("lastTransitionTime"))
    if (
        ready is not None
        and started is not None
        and changed is not None
        and (changed - started).total_seconds() > READY_LOST_SLACK_SECONDS
    ):
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
        keys: the agent keys (bootstrap tokens are derived from the current one).
        start_grace_seconds: how long a new pool Pod may take to become Ready.
    """

    def __init__(
        self,
        settings: Settings,
        api: Api,
        keys: Callable[[], AgentKeys],
        start_grace_seconds: float = 300.0,
    ) -> None:
        self.settings = settings
        self.api = api
        self.keys = keys
        self.start_grace_seconds = start_grace_seconds
        # (namespace, shape) -> uids of its free Pods seen Ready (pruned to the free ones).
        self._seen_ready: dict[tuple[str, str], set[str]] = {}

    def ensure_bootstrap(self, namespace: str, shape: str) -> str:
        """The name of pool ``shape``'s bootstrap Secret, made when absent (a 409 is the one
        made before; the operator cannot read it: a Secret planted under the name gives the
        Pods a token the operator does not hold, and their hand-over fails, so they are
        never used).

        Raises:
            ApiException: the create failed (other than 409).
        """
        key = self.keys().current
        manifest = bootstrap_secret(key, namespace, shape)
        try:
            self.api.core.create_namespaced_secret(namespace, cast(Any, manifest))
        except ApiException as exc:
            if exc.status != 409:
                raise
        return str(manifest["metadata"]["name"])

    def bootstrap_tokens(self, namespace: str, shape: str) -> list[str]:
        """The bootstrap tokens a Pod of pool ``shape`` may hold: of the current key, then of
        the previous one (a Pod made before a rotation)."""
        return [bootstrap_token(key, namespace, shape) for key in self.keys().all()]

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
        claim: str = "",
    ) -> PoolReport:
        """Keep ``size`` free pool Pods of ``workspace``'s shape (and source ``claim``) in
        ``namespace``: make the bootstrap Secret when absent, delete the bad Pods
        (:func:`pool_pod_is_bad`), create what is missing.

        Raises:
            ApiException: a list, delete or create failed (a 404 on delete is fine).
        """
        shape = shape_of(self.settings, workspace, claim)
        moment = now or datetime.now(UTC)
        replaced: list[str] = []
        healthy = 0
        free = self.free(namespace, shape)
        seen = self._seen_ready.setdefault((namespace, shape), set())
        seen.intersection_update(str(pod["metadata"].get("uid")) for pod in free)
        for pod in free:
            name = str(pod["metadata"]["name"])
            uid = str(pod["metadata"].get("uid"))
            if pod_is_ready(pod):
                seen.add(uid)
            if pool_pod_is_bad(pod, self.start_grace_seconds, moment, uid in seen):
                try:
                    self.api.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                replaced.append(name)
            else:
                healthy += 1
        created: list[str] = []
        missing = max(0, size - healthy)
        bootstrap = self.ensure_bootstrap(namespace, shape) if missing else ""
        for _ in range(missing):
            manifest = build_pool_pod(
                namespace, self.settings, workspace, bootstrap=bootstrap, claim=claim
            )
            made = self.api.core.create_namespaced_pod(namespace, cast(Any, manifest))
            created.append(str(made.metadata.name if made.metadata else ""))
        return PoolReport(created, replaced)

    def claim(
        self,
        namespace: str,
        owner: Mapping[str, Any],
        plan_id: str,
        workspace: Mapping[str, Any] | None = None,
        claim: str = "",
    ) -> dict[str, Any] | None:
        """Claim a Ready free pool Pod of ``workspace``'s shape (and source ``claim``) for the
        Sandbox ``owner`` (its body); the claimed Pod (as patched), or None when no Ready Pod is
        free (make a Pod of its own).

        Each attempt is a merge patch carrying the resourceVersion the Pod was listed at: a
        Pod claimed (or changed) by anyone since answers 409 and the next one is tried.

        Raises:
            ApiException: any error but 404 and 409.
        """
        metadata = owner.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid:
            raise ValueError("the owner has no uid")
        shape = shape_of(self.settings, workspace, claim)
        for pod in self.free(namespace, shape):
            if not pod_is_ready(pod):
                continue
            name = str(pod["metadata"]["name"])
            patch = {
                "metadata": {
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                    "labels": {
                        POOL_LABEL: None,
                        POOLED_LABEL: shape,
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
                patched = self.api.core.patch_namespaced_pod(name, namespace, patch)
            except ApiException as exc:
                if exc.status in (404, 409):
                    continue  # claimed, changed or deleted since it was listed
                raise
            return cast(
                dict[str, Any],
                self.api.api_client.sanitize_for_serialization(patched),  # type: ignore[no-untyped-call]
            )
        return None


def _controller(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in metadata.get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None
