"""The workspace Pod and its children as pure builder functions (no API calls; unit-tested).

DESIGN.md, "Where the work happens": the Pod mounts the original's volume at
``/workspace/source`` and a strategy-specific scratch claim at ``/workspace/scratch`` (worktree:
small; copy_on_write: sized like the source; overlay: upper/work dirs; transaction_rollback and
none: a small claim for the agent's state, the statement log and the request journal, so that a
re-made Pod re-opens the sandbox instead of losing it). Its main process is the workspace agent
(``sandbox_core.agent``), reached with a per-Sandbox token handed over in a Secret mounted as a
file.

Non-root, read-only root filesystem, all capabilities dropped, seccomp RuntimeDefault (the
restricted Pod Security profile) or, with ``settings.workspace_seccomp_profile``, that
``Localhost`` profile (RuntimeDefault plus what the jail of an actor's commands needs:
docs/security.md, "Commands in a workspace Pod"); an overlay Pod is privileged (real
OverlayFS) only when ``settings.allow_privileged_overlay``, else the core's userspace fallback
runs. A Secret source
(transaction_rollback) reaches the Pod as ``secretKeyRef`` env: the operator never reads it.
``spec.workspace`` shapes the Pod (resources, scheduling, runtime class, pull secrets, scratch
class and size, egress). A NetworkPolicy per Pod admits only the operator.

:func:`pod_is_ready` reads a workspace Pod back: the Sandbox logic and the pod executor both ask
it whether the agent serves.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from sandbox_api.models import MANAGED_BY, MANAGED_BY_LABEL, PLAN_LABEL
from sandbox_api.naming import AGENT_TOKEN_KEY, child_object_name
from sandbox_core.agent import wire
from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.executors.placement import SOURCE_CLAIM_LABEL, Placement, merged_affinity
from sandbox_operator.settings import Settings

SOURCE_MOUNT = "/workspace/source"
SCRATCH_MOUNT = "/workspace/scratch"
STATE_DIR = f"{SCRATCH_MOUNT}/state"
SANDBOX_ROOT = f"{SCRATCH_MOUNT}/sandboxes"
CONTAINER = "workspace"
WORKSPACE_UID = 1000
SANDBOX_NAME_LABEL = "sandbox.cleveragents.io/sandbox"
SANDBOX_UID_LABEL = "sandbox.cleveragents.io/sandbox-uid"
COMPONENT_LABEL = "app.kubernetes.io/component"
WORKSPACE_COMPONENT = "workspace"
# Where the token Secret's volume is mounted: its key (AGENT_TOKEN_KEY) is the agent's token
# file, wire.TOKEN_FILE.
TOKEN_DIR = posixpath.dirname(wire.TOKEN_FILE)
# Strategies whose scratch holds only the agent's state (records, statement log, request
# journal): a small claim, still a claim, so that it outlives the Pod.
STATE_ONLY = frozenset({"none", "transaction_rollback"})
STATE_SCRATCH_SIZE = "256Mi"


def label_value(text: str) -> str:
    """``text`` made a valid label value (<= 63 chars of ``[A-Za-z0-9._-]``, alnum ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63]
    return cleaned.strip("._-") or "x"


def child_name(target: SandboxTarget, suffix: str) -> str:
    """DNS-1123 label naming a new child object of ``target``:
    ``sbx-<readable prefix>-<hash of the Sandbox name and suffix>-<suffix>``
    (:func:`sandbox_api.naming.child_object_name`)."""
    return child_object_name(target.name, suffix)


def labels_for(target: SandboxTarget) -> dict[str, str]:
    """Labels of every child object (CRD contract, "Labels the operator sets")."""
    return {
        PLAN_LABEL: label_value(target.plan_id),
        MANAGED_BY_LABEL: MANAGED_BY,
        SANDBOX_NAME_LABEL: label_value(target.name),
    }


def scratch_size(
    strategy: str, source_size: str | None, default: str, requested: str | None = None
) -> str:
    """PVC size of the scratch claim (Kubernetes quantity).

    copy_on_write copies the whole source, so it gets the source's size when known; else
    ``requested`` (``spec.workspace.scratch.size``) or ``default`` (the chart's). The
    state-only strategies (transaction_rollback, none) get ``requested`` or
    :data:`STATE_SCRATCH_SIZE`: their state must survive the Pod, but it is small.
    """
    if strategy in STATE_ONLY:
        return requested or STATE_SCRATCH_SIZE
    if strategy == "copy_on_write" and source_size:
        return source_size
    return requested or default


def build_scratch_pvc(
    target: SandboxTarget, size: str, storage_class: str | None = None
) -> dict[str, Any]:
    """The scratch PersistentVolumeClaim manifest of ``target`` (pure)."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": child_name(target, "scratch"),
            "namespace": target.namespace,
            "labels": labels_for(target),
        },
        "spec": spec,
    }


def build_token_secret(target: SandboxTarget, token: str) -> dict[str, Any]:
    """The Secret handing the agent token to the workspace Pod (mounted as a file; pure)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": child_name(target, "agent"),
            "namespace": target.namespace,
            "labels": labels_for(target),
        },
        "type": "Opaque",
        "stringData": {AGENT_TOKEN_KEY: token},
    }


def _operator_labels(settings: Settings) -> dict[str, str]:
    pairs = (p.partition("=") for p in settings.operator_pod_labels.split(",") if "=" in p)
    return {key.strip(): value.strip() for key, _, value in pairs}


def build_network_policy(target: SandboxTarget, settings: Settings) -> dict[str, Any]:
    """The NetworkPolicy of the workspace Pod (pure).

    Ingress: only the agent port, only from the operator's Pods (labels
    ``settings.operator_pod_labels`` in ``settings.operator_namespace``). Egress: denied except
    DNS (port 53, so host names in a DSN resolve) and the rules of ``spec.workspace.egress``.
    """
    peer: dict[str, Any] = {"podSelector": {"matchLabels": _operator_labels(settings)}}
    if settings.operator_namespace:
        peer["namespaceSelector"] = {
            "matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}
        }
    egress: list[dict[str, Any]] = [
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    ]
    for rule in target.workspace.egress or []:
        entry: dict[str, Any] = {"to": [{"ipBlock": {"cidr": rule.cidr}}]}
        if rule.ports:
            entry["ports"] = [{"port": p.port, "protocol": p.protocol} for p in rule.ports]
        egress.append(entry)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": child_name(target, "ws"),
            "namespace": target.namespace,
            "labels": labels_for(target),
        },
        "spec": {
            "podSelector": {"matchLabels": {SANDBOX_UID_LABEL: target.uid}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [peer], "ports": [{"port": settings.agent_port, "protocol": "TCP"}]}
            ],
            "egress": egress,
        },
    }


def overlay_privileged(target: SandboxTarget, settings: Settings) -> bool:
    """Whether the workspace container runs privileged (real OverlayFS mounts)."""
    return (
        target.strategy == "overlay"
        and settings.allow_privileged_overlay
        and target.options.overlay_mode != "fallback"
    )


def allowed_root(target: SandboxTarget) -> str:
    """Where the workspace agent may find the original of ``target``: the claim's mount path
    plus ``subPath`` (normalised; a ``subPath`` leaving the claim admits nothing), ``""``
    (nothing) for a Secret's DSN."""
    pvc = target.source.persistent_volume_claim
    if pvc is None:
        return ""
    root = posixpath.normpath(posixpath.join(SOURCE_MOUNT, pvc.sub_path.strip("/")))
    inside = root == SOURCE_MOUNT or root.startswith(SOURCE_MOUNT + "/")
    return root if inside else ""


def seccomp_profile(settings: Settings) -> dict[str, str]:
    """The workspace Pod's seccomp profile: ``settings.workspace_seccomp_profile`` as a
    ``Localhost`` profile, else ``RuntimeDefault``."""
    if settings.workspace_seccomp_profile:
        return {"type": "Localhost", "localhostProfile": settings.workspace_seccomp_profile}
    return {"type": "RuntimeDefault"}


def build_workspace_pod(
    target: SandboxTarget,
    settings: Settings,
    scratch_claim: str | None,
    token_secret: str | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """The workspace Pod manifest of ``target`` (pure; adopt it before creating).

    ``scratch_claim`` and ``token_secret`` name the claim and Secret the Pod mounts (the ones
    the Sandbox controls; ``token_secret`` defaults to the current name of its token Secret).
    ``placement`` (:func:`~sandbox_operator.executors.placement.plan_placement`) labels the Pod
    with its source claim and adds the affinity that keeps it where the claim can attach,
    merged with ``spec.workspace.affinity``.

    Raises:
        ValueError: the Sandbox's source is not a PersistentVolumeClaim and not a Secret.
    """
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]  # noqa: S108
    pvc = target.source.persistent_volume_claim
    if pvc is not None:
        volumes.append({"name": "source", "persistentVolumeClaim": {"claimName": pvc.claim_name}})
        mounts.append({"name": "source", "mountPath": SOURCE_MOUNT})
    elif target.source.secret_ref is None:
        raise ValueError("the pod executor needs source.persistentVolumeClaim or secretRef")
    if scratch_claim:
        volumes.append({"name": "scratch", "persistentVolumeClaim": {"claimName": scratch_claim}})
    else:
        volumes.append({"name": "scratch", "emptyDir": {}})
    mounts.append({"name": "scratch", "mountPath": SCRATCH_MOUNT})
    privileged = overlay_privileged(target, settings)
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": privileged,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    pod_security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": WORKSPACE_UID,
        "runAsGroup": WORKSPACE_UID,
        "fsGroup": WORKSPACE_UID,
        "seccompProfile": seccomp_profile(settings),
    }
    if privileged:
        # Mounting OverlayFS needs root and CAP_SYS_ADMIN; only when the chart allows it.
        security.update(privileged=True, capabilities={"add": ["SYS_ADMIN"]})
        pod_security.update(runAsNonRoot=False, runAsUser=0, runAsGroup=0)
    pod_security["fsGroupChangePolicy"] = "OnRootMismatch"  # no chown walk of a big volume
    # The agent token, as a file only the workspace user's group can read.
    volumes.append(
        {
            "name": "agent-token",
            "secret": {
                "secretName": token_secret or child_name(target, "agent"),
                "defaultMode": 0o440,
            },
        }
    )
    mounts.append({"name": "agent-token", "mountPath": TOKEN_DIR, "readOnly": True})
    env: list[dict[str, Any]] = [
        {"name": wire.STATE_DIR_ENV, "value": STATE_DIR},
        {"name": wire.ROOT_ENV, "value": SANDBOX_ROOT},
        {"name": wire.TOKEN_FILE_ENV, "value": wire.TOKEN_FILE},
        {"name": wire.PORT_ENV, "value": str(settings.agent_port)},
        {"name": "HOME", "value": "/tmp"},  # noqa: S108 - the only writable dir besides scratch
        # The agent's create admits only the original the spec names (docs/security.md).
        {"name": wire.ALLOWED_ROOTS_ENV, "value": allowed_root(target)},
    ]
    secret = target.source.secret_ref
    if secret is not None:
        # The kubelet reads the Secret; the operator never sees the DSN.
        env.append(
            {
                "name": wire.SOURCE_DSN_ENV,
                "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}},
            }
        )
    workspace = target.workspace
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.workspace_image,
        "command": ["sandbox-core", "serve-workspace"],
        "env": env,
        "ports": [{"name": "agent", "containerPort": settings.agent_port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": wire.HEALTHZ.template, "port": settings.agent_port},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "volumeMounts": mounts,
        "securityContext": security,
    }
    if workspace.resources:
        container["resources"] = workspace.resources
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": volumes,
    }
    optional = {
        "nodeSelector": workspace.node_selector,
        "tolerations": workspace.tolerations,
        "affinity": merged_affinity(workspace.affinity, placement)
        if placement
        else workspace.affinity,
        "runtimeClassName": workspace.runtime_class_name,
        "priorityClassName": workspace.priority_class_name,
        "imagePullSecrets": workspace.image_pull_secrets,
    }
    spec.update({key: value for key, value in optional.items() if value})
    labels = {
        **labels_for(target),
        COMPONENT_LABEL: WORKSPACE_COMPONENT,
        SANDBOX_UID_LABEL: target.uid,
    }
    if placement and placement.claim_label:
        labels[SOURCE_CLAIM_LABEL] = placement.claim_label
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": child_name(target, "ws"),
            "namespace": target.namespace,
            "labels": labels,
        },
        "spec": spec,
    }


def pod_is_ready(pod: dict[str, Any]) -> bool:
    """True when the Pod (API dict, camelCase or snake_case) is Running, not being deleted, and
    its ``Ready`` condition is True."""
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp") or metadata.get("deletion_timestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("status")) == "True"
    return False
