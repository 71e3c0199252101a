"""Pod executor: one workspace Pod per Sandbox, driven through its workspace agent.

DESIGN.md, "Where the work happens": the Pod mounts the original's volume at
``/workspace/source`` and a strategy-specific scratch claim at ``/workspace/scratch`` (worktree:
small; copy_on_write: sized like the source; overlay: upper/work dirs; transaction_rollback and
none: a small claim for the agent's state, the statement log and the request journal, so that a
re-made Pod re-opens the sandbox instead of losing it). Its main process is the
workspace agent (``sandbox_core.agent``, issue 8): the operator calls it over the pod network
with a per-Sandbox token (HMAC of the Sandbox uid; handed over in a Secret mounted as a file),
one HTTP round trip per operation, idempotent by request id. There is no exec path.

Non-root, read-only root filesystem, all capabilities dropped, seccomp RuntimeDefault (the
restricted Pod Security profile); an overlay Pod is privileged (real OverlayFS) only when
``settings.allow_privileged_overlay``, else the core's userspace fallback runs. A Secret source
(transaction_rollback) reaches the Pod as ``secretKeyRef`` env: the operator never reads it.
``spec.workspace`` shapes the Pod (resources, scheduling, runtime class, pull secrets, scratch
class and size, egress). A NetworkPolicy per Pod admits only the operator.

The builders are pure functions (unit-tested); every child (token Secret, NetworkPolicy, scratch
claim, Pod) is adopted by the Sandbox with ``kopf.adopt`` (ownerReferences) and created only
when absent (409 means an earlier attempt made them: case 18).
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from sandbox_api.models import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLAN_LABEL,
    ROLLBACKABLE_STRATEGIES,
)
from sandbox_api.naming import child_object_name
from sandbox_core import CommitResult, SandboxStateError, SandboxStatus
from sandbox_core.protocol import ChangeSummary, PreparedCommit
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.agent_client import (
    AgentClient,
    AgentNotFound,
    AgentRefused,
    core_error,
    derive_token,
    read_key,
    request_id,
)
from sandbox_operator.executors.base import (
    CheckpointInfo,
    SandboxState,
    SandboxTarget,
    WorkspaceNotReady,
)
from sandbox_operator.k8s import Api
from sandbox_operator.settings import Settings

SOURCE_DSN_ENV = "SANDBOX_SOURCE_DSN"  # filled by the kubelet from the Sandbox's secretRef

logger = logging.getLogger(__name__)

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
TOKEN_DIR = "/var/run/sandbox-agent"  # noqa: S105 - a directory, not a token
# Strategies whose scratch holds only the agent's state (records, statement log, request
# journal): a small claim, still a claim, so that it outlives the Pod (issue 8).
STATE_ONLY = frozenset({"none", "transaction_rollback"})
STATE_SCRATCH_SIZE = "256Mi"


def label_value(text: str) -> str:
    """``text`` made a valid label value (<= 63 chars of ``[A-Za-z0-9._-]``, alnum ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63]
    return cleaned.strip("._-") or "x"


def child_name(target: SandboxTarget, suffix: str) -> str:
    """DNS-1123 name of a child object: ``sbx-<sandbox name>-<suffix>`` cut to 63 chars."""
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
        "stringData": {"token": token},
    }


def _operator_labels(settings: Settings) -> dict[str, str]:
    pairs = (p.partition("=") for p in settings.operator_pod_labels.split(",") if "=" in p)
    return {key.strip(): value.strip() for key, _, value in pairs}


def build_network_policy(target: SandboxTarget, settings: Settings) -> dict[str, Any]:
    """The NetworkPolicy of the workspace Pod (pure; issue 8).

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


def build_workspace_pod(
    target: SandboxTarget, settings: Settings, scratch_claim: str | None
) -> dict[str, Any]:
    """The workspace Pod manifest of ``target`` (pure; adopt it before creating).

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
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if privileged:
        # Mounting OverlayFS needs root and CAP_SYS_ADMIN; only when the chart allows it.
        security.update(privileged=True, capabilities={"add": ["SYS_ADMIN"]})
        pod_security.update(runAsNonRoot=False, runAsUser=0, runAsGroup=0)
    pod_security["fsGroupChangePolicy"] = "OnRootMismatch"  # no chown walk of a big volume
    # The agent token, as a file only the workspace user's group can read (issue 8).
    volumes.append(
        {
            "name": "agent-token",
            "secret": {"secretName": child_name(target, "agent"), "defaultMode": 0o440},
        }
    )
    mounts.append({"name": "agent-token", "mountPath": TOKEN_DIR, "readOnly": True})
    env: list[dict[str, Any]] = [
        {"name": "SANDBOX_CORE_STATE_DIR", "value": STATE_DIR},
        {"name": "SANDBOX_CORE_ROOT", "value": SANDBOX_ROOT},
        {"name": "SANDBOX_AGENT_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},
        {"name": "SANDBOX_AGENT_PORT", "value": str(settings.agent_port)},
        {"name": "HOME", "value": "/tmp"},  # noqa: S108 - the only writable dir besides scratch
    ]
    secret = target.source.secret_ref
    if secret is not None:
        # The kubelet reads the Secret; the operator never sees the DSN (issue 8).
        env.append(
            {
                "name": SOURCE_DSN_ENV,
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
            "httpGet": {"path": "/healthz", "port": settings.agent_port},
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
        "affinity": workspace.affinity,
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


def create_body(target: SandboxTarget, settings: Settings) -> dict[str, Any]:
    """The agent's ``create`` request: deterministic sandbox id (case 18), strategy options.

    ``original`` is a mount path, or ``env:SANDBOX_SOURCE_DSN`` for a Secret (the agent reads
    its own environment; the DSN never crosses the wire).
    """
    options: dict[str, str] = {}
    if target.strategy == "overlay":
        mode = target.options.overlay_mode
        if not overlay_privileged(target, settings):
            mode = "fallback"
        if mode != "auto":
            options["mode"] = mode
    return {
        "plan_id": target.plan_id,
        "resource_id": target.resource_id,
        "strategy": target.strategy,
        "sandbox_id": target.sandbox_id,
        "original": target.original,
        "options": options,
    }


def _state_key(reply: dict[str, Any]) -> str:
    """What a changing call depends on: the sandbox revision and status the operator saw (the
    agent counts its changes per sandbox), so a retry of one call has the same request id and
    any later call, even from an equal-looking state, a new one."""
    record = reply.get("record") or {}
    return f"{reply.get('revision', 0)}:{record.get('status')}"


class RemoteSandbox:
    """A sandbox behind a workspace agent, shaped like the core's ``Sandbox`` for the saga."""

    def __init__(self, executor: PodExecutor, target: SandboxTarget, reply: dict[str, Any]):
        self._executor = executor
        self._target = target
        self.reply = reply
        self.resource_id = target.resource_id
        self.strategy = target.strategy
        self.context = None

    @property
    def sandbox_id(self) -> str:
        """The core sandbox id."""
        return self._target.sandbox_id

    @property
    def record(self) -> dict[str, Any]:
        """The core record as last reported by the agent."""
        return dict(self.reply.get("record") or {})

    @property
    def status(self) -> SandboxStatus:
        """Status as last reported by the agent."""
        return SandboxStatus(str(self.record.get("status") or "pending"))

    @property
    def rollbackable(self) -> bool:
        """Whether a commit can be undone (seed 002)."""
        return self._target.strategy in ROLLBACKABLE_STRATEGIES

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{self.sandbox_id}{suffix}"

    def _refresh(self) -> None:
        self.reply = self._executor.call(self._target, "GET", self._path())

    def commit(self, message: str | None = None) -> CommitResult:
        """``POST .../commit``; the request id repeats for the same commit from the same state."""
        rid = request_id("commit", self.sandbox_id, message or "", _state_key(self.reply))
        try:
            payload = self._executor.call(
                self._target, "POST", self._path("/commit"), {"message": message}, request_id=rid
            )
        except ExecutorError:
            self._refresh()
            raise
        self.reply = payload["sandbox"]
        return CommitResult.from_dict(payload["result"])

    def rollback(self) -> None:
        """``POST .../rollback`` (no re-activation: the saga's compensation)."""
        rid = request_id("rollback", self.sandbox_id, _state_key(self.reply))
        self.reply = self._executor.call(
            self._target, "POST", self._path("/rollback"), {"reactivate": False}, request_id=rid
        )

    # -- two-phase plan commit (issue 9) -------------------------------------------------------

    @property
    def prepares_durably(self) -> bool:
        """Whether the agent's sandbox survives a crash between prepare and apply (SQLite does
        not: it can only be the plan's last resource)."""
        return bool(self.reply.get("prepares_durably", True))

    def _two_phase(self, path: str, body: dict[str, Any], rid: str) -> dict[str, Any]:
        """One two-phase call; the agent's refusal raised as the core error it stands for
        (transport failures stay retryable ``ExecutorError``s)."""
        try:
            payload = self._executor.call(
                self._target, "POST", self._path(path), body, request_id=rid
            )
        except AgentRefused as exc:
            raise core_error(exc) from None
        self.reply = payload["sandbox"]
        return payload

    def review(self) -> ChangeSummary:
        """``GET .../review``: what a commit would change now (no locks, nothing changes).

        Raises:
            SandboxStateError: not CREATED/ACTIVE. SandboxError: the changes could not be read.
        """
        try:
            payload = self._executor.call(self._target, "GET", self._path("/review"))
        except AgentRefused as exc:
            raise core_error(exc) from None
        self.reply = payload["sandbox"]
        return ChangeSummary.from_dict(payload["summary"])

    def prepare(self, txid: str, message: str | None = None) -> PreparedCommit:
        """``POST .../prepare``; a retry after a lost reply (same state seen) is a replay.

        Raises:
            SandboxCommitError: would fail (``conflicts`` set for a conflict).
            TwoPhaseUnavailableError: this sandbox cannot prepare.
            SandboxStateError: not CREATED/ACTIVE.
            ExecutorError: the agent could not be reached (retryable).
        """
        rid = request_id("prepare", self.sandbox_id, txid, message or "", _state_key(self.reply))
        payload = self._two_phase("/prepare", {"txid": txid, "message": message}, rid)
        return PreparedCommit.from_dict(payload["prepared"])

    def apply_prepared(self, txid: str) -> CommitResult:
        """``POST .../apply-prepared``: idempotent per ``txid`` (the agent answers a repeat with
        the recorded result), so the request id is the txid's alone.

        Raises:
            SandboxCommitError: the apply failed; the status is unchanged (retry).
            SandboxStateError: neither CREATED/ACTIVE nor COMMITTED by ``txid``.
            ExecutorError: the agent could not be reached (retryable).
        """
        rid = request_id("apply-prepared", self.sandbox_id, txid)
        payload = self._two_phase("/apply-prepared", {"txid": txid}, rid)
        return CommitResult.from_dict(payload["result"])

    def abort_prepared(self, txid: str) -> None:
        """``POST .../abort-prepared``: idempotent, fine when nothing was prepared.

        Raises:
            SandboxError: the staged state could not be removed (retry).
            ExecutorError: the agent could not be reached (retryable).
        """
        rid = request_id("abort-prepared", self.sandbox_id, txid, _state_key(self.reply))
        self._two_phase("/abort-prepared", {"txid": txid}, rid)

    def commit_landed(self) -> bool | None:
        """``GET .../commit-landed``: did a commit whose outcome was lost reach the original?
        None when the strategy cannot tell or the agent cannot be asked (recovery then treats
        the outcome as unknown, as ``sandbox_core.saga.probe_commit_landed`` does)."""
        try:
            payload = self._executor.call(self._target, "GET", self._path("/commit-landed"))
        except (ExecutorError, WorkspaceNotReady):
            return None
        answer = payload.get("landed")
        return answer if isinstance(answer, bool) else None

    def activate(self) -> None:
        """``POST .../activate`` (CREATED/ROLLED_BACK -> ACTIVE)."""
        rid = request_id("activate", self.sandbox_id, _state_key(self.reply))
        self.reply = self._executor.call(
            self._target, "POST", self._path("/activate"), request_id=rid
        )


class PodExecutor:
    """Executor calling the workspace agent of one workspace Pod per Sandbox (issue 8)."""

    kind = "pod"

    def __init__(self, settings: Settings, api: Api) -> None:
        self.settings = settings
        self.api = api
        self._key: bytes | None = None

    # -- children -----------------------------------------------------------------------------

    def _create_if_absent(self, manifest: dict[str, Any], owner: dict[str, Any]) -> None:
        kopf.adopt(manifest, owner=cast(kopf.Body, owner))
        namespace = manifest["metadata"]["namespace"]
        kind = manifest["kind"]
        try:
            if kind == "Pod":
                self.api.core.create_namespaced_pod(namespace, cast(Any, manifest))
            elif kind == "Secret":
                self.api.core.create_namespaced_secret(namespace, cast(Any, manifest))
            elif kind == "NetworkPolicy":
                self._networking().create_namespaced_network_policy(namespace, cast(Any, manifest))
            else:
                self.api.core.create_namespaced_persistent_volume_claim(
                    namespace, cast(Any, manifest)
                )
        except ApiException as exc:
            if exc.status != 409:  # 409: made by an earlier attempt (case 18)
                raise

    def source_size(self, target: SandboxTarget) -> str | None:
        """Requested storage of the source PVC (copy_on_write scratch is sized like it)."""
        pvc = target.source.persistent_volume_claim
        if pvc is None or target.strategy != "copy_on_write":
            return None
        claim = self.api.core.read_namespaced_persistent_volume_claim(
            pvc.claim_name, target.namespace
        )
        requests = (
            claim.spec.resources.requests if claim.spec and claim.spec.resources else None
        ) or {}
        size = requests.get("storage")
        return str(size) if size else None

    def token(self, target: SandboxTarget) -> str:
        """The agent token of ``target`` (HMAC of its uid with the operator's key)."""
        if self._key is None:
            self._key = read_key(self.settings.agent_key_file)
        return derive_token(self._key, target.uid)

    def ensure_children(self, target: SandboxTarget, owner: dict[str, Any]) -> str:
        """Create the token Secret, NetworkPolicy, scratch claim and Pod when absent.

        All are owned by the Sandbox (``kopf.adopt``: ownerReferences, garbage-collected with
        it). Returns the Pod name.
        """
        scratch = target.workspace.scratch
        size = scratch_size(
            target.strategy,
            self.source_size(target),
            self.settings.scratch_volume_size,
            scratch.size if scratch else None,
        )
        self._create_if_absent(build_token_secret(target, self.token(target)), owner)
        if self.settings.network_policy:
            self._create_if_absent(build_network_policy(target, self.settings), owner)
        pvc = build_scratch_pvc(target, size, scratch.storage_class_name if scratch else None)
        claim = pvc["metadata"]["name"]
        self._create_if_absent(pvc, owner)
        pod = build_workspace_pod(target, self.settings, claim)
        self._create_if_absent(pod, owner)
        return str(pod["metadata"]["name"])

    def _ready_pod_ip(self, target: SandboxTarget) -> str:
        """IP of the workspace Pod when it is Ready.

        Raises:
            WorkspaceNotReady: absent, being deleted, or not Ready yet.
        """
        name = target.workspace_pod or child_name(target, "ws")
        try:
            pod = self.api.core.read_namespaced_pod(name, target.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise WorkspaceNotReady(f"workspace pod {name} does not exist") from None
            raise
        if not pod_is_ready(pod.to_dict()):
            phase = pod.status.phase if pod.status is not None else "Unknown"
            raise WorkspaceNotReady(f"workspace pod {name} is {phase}, not Ready yet")
        return str(pod.status.pod_ip)  # type: ignore[union-attr]  # Ready implies a status

    def call(
        self,
        target: SandboxTarget,
        method: str,
        path: str,
        body: dict[str, Any] | bytes | None = None,
        *,
        query: dict[str, str] | None = None,
        request_id: str = "",
    ) -> dict[str, Any]:
        """One agent call in ``target``'s workspace Pod.

        Raises:
            WorkspaceNotReady: the Pod is not Ready.
            AgentNotFound: the agent has no such sandbox or checkpoint.
            ExecutorError: the agent refused or could not be reached.
        """
        address = self._ready_pod_ip(target)
        host = f"[{address}]" if ":" in address else address
        client = AgentClient(
            f"http://{host}:{self.settings.agent_port}",
            self.token(target),
            self.settings.exec_timeout_seconds,
        )
        return client.call(method, path, body, query=query, request_id=request_id)

    # -- Executor -----------------------------------------------------------------------------

    def provision(self, target: SandboxTarget) -> SandboxState:
        """Children when absent, then ``create`` (re-opens what exists) and activate.

        Raises:
            WorkspaceNotReady: the Pod is starting (the Pod's events resume; not an error).
        """
        owner = self.api.get("sandboxes", target.namespace, target.name)
        pod = self.ensure_children(target, owner)
        target = replace(target, workspace_pod=pod)
        self.call(
            target,
            "POST",
            "/v1/sandboxes",
            create_body(target, self.settings),
            request_id=request_id("create", target.uid),
        )
        # The create reply may be a replay from long ago (a re-made Pod on the same claim):
        # read the current state.
        handle = self.open(target)
        if handle.status.can_activate:
            handle.activate()
        return SandboxState.from_record(handle.record, workspace_pod=pod)

    def describe(self, target: SandboxTarget) -> SandboxState | None:
        """The agent's ``status``; None when it has no such sandbox."""
        try:
            payload = self.call(target, "GET", f"/v1/sandboxes/{target.sandbox_id}")
        except AgentNotFound:
            return None
        return SandboxState.from_record(payload["record"], workspace_pod=target.workspace_pod)

    def open(self, target: SandboxTarget) -> RemoteSandbox:
        """A saga handle (status fetched now)."""
        payload = self.call(target, "GET", f"/v1/sandboxes/{target.sandbox_id}")
        return RemoteSandbox(self, target, payload)

    def revision(self, target: SandboxTarget) -> int:
        """The agent's change counter of ``target``'s sandbox (part of request ids)."""
        return int(self.open(target).reply.get("revision") or 0)

    def persist(self, target: SandboxTarget, handle: Any) -> SandboxState:
        """The agent saves after every call; return the handle's last state."""
        return SandboxState.from_record(handle.record, workspace_pod=target.workspace_pod)

    def rollback(self, target: SandboxTarget, reactivate: bool = True) -> SandboxState:
        """Discard all changes; re-activate for reuse when ``reactivate``."""
        handle = self.open(target)
        if handle.status not in (
            SandboxStatus.CREATED,
            SandboxStatus.ACTIVE,
            SandboxStatus.ROLLED_BACK,
        ):
            raise SandboxStateError(
                f"cannot discard the changes of sandbox {target.sandbox_id} in status "
                f"{handle.status.value}"
            )
        rid = request_id("discard", target.sandbox_id, reactivate, _state_key(handle.reply))
        payload = self.call(
            target,
            "POST",
            f"/v1/sandboxes/{target.sandbox_id}/rollback",
            {"reactivate": reactivate},
            request_id=rid,
        )
        return SandboxState.from_record(payload["record"], workspace_pod=target.workspace_pod)

    def cleanup(self, target: SandboxTarget) -> None:
        """``cleanup`` through the agent, then delete the children (owner references would too).

        When the workspace Pod is gone, not Ready or terminating (its namespace is being
        deleted, or the Sandbox is suspended), there is nobody to ask: the scratch volume goes
        with its claim, and a git worktree's registration left in the original repository is
        pruned by the next git_worktree create on that repository. Waiting would only hold the
        finalizer, and the namespace, forever (found by the e2e tier).
        """
        try:
            self.call(
                target,
                "DELETE",
                f"/v1/sandboxes/{target.sandbox_id}",
                request_id=request_id("cleanup", target.uid),
            )
        except WorkspaceNotReady:
            logger.warning(
                "workspace pod of sandbox %s/%s is not serving; skipping in-pod cleanup",
                target.namespace,
                target.name,
            )
        except ExecutorError as exc:
            if exc.retryable:
                raise
        self._delete_children(target, pod_only=False)

    def _networking(self) -> Any:
        from kubernetes import client as k8s_client

        return k8s_client.NetworkingV1Api(self.api.api_client)

    def _delete_children(self, target: SandboxTarget, *, pod_only: bool) -> None:
        deletes: list[tuple[Any, str]] = [
            (self.api.core.delete_namespaced_pod, child_name(target, "ws"))
        ]
        if not pod_only:
            networking = self._networking()
            deletes += [
                (
                    self.api.core.delete_namespaced_persistent_volume_claim,
                    child_name(target, "scratch"),
                ),
                (self.api.core.delete_namespaced_secret, child_name(target, "agent")),
                (networking.delete_namespaced_network_policy, child_name(target, "ws")),
            ]
        for delete, name in deletes:
            try:
                delete(name, target.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def create_checkpoint(
        self, target: SandboxTarget, phase: str, metadata: dict[str, str], uid: str = ""
    ) -> CheckpointInfo:
        """``POST .../checkpoints``; the Checkpoint's uid makes a retry return the first one."""
        values = dict(metadata)
        if uid:
            values["k8s_checkpoint_uid"] = uid
        data = self.call(
            target,
            "POST",
            f"/v1/sandboxes/{target.sandbox_id}/checkpoints",
            {"phase": phase, "metadata": values},
            request_id=request_id(
                "checkpoint", target.sandbox_id, uid or phase, self.revision(target)
            ),
        )
        kinds = {
            "git_ref": "git-tag",
            "overlay_snapshot": "upper-snapshot",
            "directory": "directory-snapshot",
        }
        kind = kinds.get(str((data.get("metadata") or {}).get("checkpoint_kind")), "metadata-only")
        return CheckpointInfo(
            checkpoint_id=str(data["checkpoint_id"]),
            sandbox_id=target.sandbox_id,
            snapshot_location=str(data.get("snapshot_path") or ""),
            kind=kind,
            created_at=str(data.get("created_at") or ""),
            extra=data,
        )

    def restore_checkpoint(self, target: SandboxTarget, checkpoint: CheckpointInfo) -> SandboxState:
        """``POST /v1/checkpoints/{id}/restore``."""
        payload = self.call(
            target,
            "POST",
            f"/v1/checkpoints/{checkpoint.checkpoint_id}/restore",
            request_id=request_id(
                "restore", checkpoint.checkpoint_id, target.sandbox_id, self.revision(target)
            ),
        )
        return SandboxState.from_record(payload["record"], workspace_pod=target.workspace_pod)

    def delete_checkpoint(self, checkpoint: CheckpointInfo) -> None:
        """Snapshots live on the scratch volume; they go with the Sandbox's cleanup."""

    # -- suspend (issue 8) ---------------------------------------------------------------------

    def suspend(self, target: SandboxTarget) -> None:
        """Delete the workspace Pod only; the scratch claim keeps every change and the state."""
        self._delete_children(target, pod_only=True)

    def resume(self, target: SandboxTarget) -> None:
        """Make the Pod again (the agent re-opens the sandbox from the scratch claim)."""
        owner = self.api.get("sandboxes", target.namespace, target.name)
        self.ensure_children(target, owner)


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
