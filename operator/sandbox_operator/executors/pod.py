"""Pod executor: one workspace Pod per Sandbox, driven through the exec API.

DESIGN.md, "Where the work happens": the Pod mounts the original's volume at
``/workspace/source`` and a strategy-specific scratch volume at ``/workspace/scratch`` (worktree:
small; copy_on_write: sized like the source; overlay: upper/work dirs). The operator runs the
core's CLI in it (``sandbox-core --json ...``) and reads one JSON document from stdout.
Non-root, read-only root filesystem, all capabilities dropped; an overlay Pod is privileged
(real OverlayFS) only when ``settings.allow_privileged_overlay``, else the core's userspace
fallback runs.

The builders are pure functions (unit-tested); the Pod and PVC are adopted by the Sandbox with
``kopf.adopt`` and created only when absent (409 means an earlier attempt made them: case 18).
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from sandbox_core import CommitResult, SandboxStatus
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.base import CheckpointInfo, SandboxState, SandboxTarget
from sandbox_operator.k8s import Api
from sandbox_operator.models import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLAN_LABEL,
    ROLLBACKABLE_STRATEGIES,
)
from sandbox_operator.settings import Settings

logger = logging.getLogger(__name__)

SOURCE_MOUNT = "/workspace/source"
SCRATCH_MOUNT = "/workspace/scratch"
STATE_DIR = f"{SCRATCH_MOUNT}/state"
SANDBOX_ROOT = f"{SCRATCH_MOUNT}/sandboxes"
CONTAINER = "workspace"
WORKSPACE_UID = 1000
SANDBOX_NAME_LABEL = "sandbox.cleveragents.io/sandbox"
NO_SCRATCH = frozenset({"none", "transaction_rollback"})


def label_value(text: str) -> str:
    """``text`` made a valid label value (<= 63 chars of ``[A-Za-z0-9._-]``, alnum ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63]
    return cleaned.strip("._-") or "x"


def child_name(target: SandboxTarget, suffix: str) -> str:
    """DNS-1123 name of a child object: ``sbx-<sandbox name>-<suffix>`` cut to 63 chars."""
    base = re.sub(r"[^a-z0-9-]", "-", target.name.lower())
    return f"sbx-{base}"[: 62 - len(suffix)].rstrip("-") + f"-{suffix}"


def labels_for(target: SandboxTarget) -> dict[str, str]:
    """Labels of every child object (CRD contract, "Labels the operator sets")."""
    return {
        PLAN_LABEL: label_value(target.plan_id),
        MANAGED_BY_LABEL: MANAGED_BY,
        SANDBOX_NAME_LABEL: label_value(target.name),
    }


def scratch_size(strategy: str, source_size: str | None, default: str) -> str | None:
    """PVC size of the scratch volume; None when the strategy needs none.

    copy_on_write copies the whole source, so it gets the source's size when known.
    """
    if strategy in NO_SCRATCH:
        return None
    if strategy == "copy_on_write" and source_size:
        return source_size
    return default


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
    env = [
        {"name": "SANDBOX_CORE_STATE_DIR", "value": STATE_DIR},
        {"name": "SANDBOX_CORE_ROOT", "value": SANDBOX_ROOT},
        {"name": "HOME", "value": "/tmp"},  # noqa: S108 - the only writable dir besides scratch
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": child_name(target, "ws"),
            "namespace": target.namespace,
            "labels": labels_for(target),
        },
        "spec": {
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "securityContext": pod_security,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": settings.workspace_image,
                    "command": ["sandbox-core", "serve-workspace"],
                    "env": env,
                    "volumeMounts": mounts,
                    "securityContext": security,
                }
            ],
            "volumes": volumes,
        },
    }


def core_command(operation: str, *args: str) -> list[str]:
    """The CLI call for one core operation inside the workspace Pod.

    ``sandbox-core --json --state-dir DIR --sandbox-root ROOT <operation> <args...>``; the one
    place to adapt when the CLI changes.
    """
    return [
        "sandbox-core",
        "--json",
        "--state-dir",
        STATE_DIR,
        "--sandbox-root",
        SANDBOX_ROOT,
        operation,
        *args,
    ]


def create_command(target: SandboxTarget, settings: Settings) -> list[str]:
    """``create`` with the deterministic sandbox id (case 18) and strategy options."""
    args = [
        "--plan",
        target.plan_id,
        "--resource",
        target.resource_id,
        "--strategy",
        target.strategy,
        "--sandbox-id",
        target.sandbox_id,
    ]
    if target.strategy == "overlay":
        mode = target.options.overlay_mode
        if not overlay_privileged(target, settings):
            mode = "fallback"
        if mode != "auto":
            args += ["--option", f"mode={mode}"]
    return core_command("create", *args, target.original)


def parse_output(command: list[str], stdout: str) -> dict[str, Any]:
    """The JSON document a ``--json`` call printed.

    Raises:
        ExecutorError: not JSON (retryable), or a JSON ``error`` (the core's message, permanent).
    """
    try:
        payload = json.loads(stdout)
    except ValueError as exc:
        raise ExecutorError(
            f"{shlex.join(command)} printed no JSON: {stdout[-500:]!r}", retryable=True
        ) from exc
    # The CLI reports a failure as {"error": {"type", "message"}}; a CommitResult's own
    # "error": null is not one (found by the e2e tier: successful commits read as failures).
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        raise ExecutorError(
            f"{error.get('type', 'Error')}: {error.get('message', '')}", retryable=False
        )
    return cast(dict[str, Any], payload)


class RemoteSandbox:
    """A sandbox in a workspace Pod, shaped like the core's ``Sandbox`` for the saga."""

    def __init__(self, executor: PodExecutor, target: SandboxTarget, record: dict[str, Any]):
        self._executor = executor
        self._target = target
        self.record = record
        self.resource_id = target.resource_id
        self.strategy = target.strategy
        self.context = None

    @property
    def sandbox_id(self) -> str:
        """The core sandbox id."""
        return self._target.sandbox_id

    @property
    def status(self) -> SandboxStatus:
        """Status as last reported by the Pod."""
        return SandboxStatus(str(self.record.get("status") or "pending"))

    @property
    def rollbackable(self) -> bool:
        """Whether a commit can be undone (seed 002)."""
        return self._target.strategy in ROLLBACKABLE_STRATEGIES

    def _refresh(self) -> None:
        self.record = self._executor.run(self._target, core_command("status", self.sandbox_id))[
            "record"
        ]

    def commit(self, message: str | None = None) -> CommitResult:
        """``sandbox-core commit``."""
        args = [self.sandbox_id] + (["-m", message] if message else [])
        try:
            payload = self._executor.run(self._target, core_command("commit", *args))
        finally:
            self._refresh()
        return CommitResult.from_dict(payload)

    def rollback(self) -> None:
        """``sandbox-core rollback``."""
        payload = self._executor.run(self._target, core_command("rollback", self.sandbox_id))
        self.record = payload.get("record") or self.record
        self._refresh()

    def activate(self) -> None:
        """``sandbox-core path ID .`` (resolving a path activates the sandbox)."""
        self._executor.run(self._target, core_command("path", self.sandbox_id, "."))
        self._refresh()


class PodExecutor:
    """Executor running the core's CLI in one workspace Pod per Sandbox."""

    kind = "pod"

    def __init__(self, settings: Settings, api: Api) -> None:
        self.settings = settings
        self.api = api

    # -- children -----------------------------------------------------------------------------

    def _create_if_absent(self, manifest: dict[str, Any], owner: dict[str, Any]) -> None:
        kopf.adopt(manifest, owner=cast(kopf.Body, owner))
        namespace = manifest["metadata"]["namespace"]
        try:
            if manifest["kind"] == "Pod":
                self.api.core.create_namespaced_pod(namespace, cast(Any, manifest))
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

    def ensure_pod(self, target: SandboxTarget, owner: dict[str, Any]) -> str:
        """Create the scratch PVC and workspace Pod when absent; return the Pod name.

        Raises:
            ExecutorError: the Pod is not Running yet (retryable).
        """
        size = scratch_size(
            target.strategy, self.source_size(target), self.settings.scratch_volume_size
        )
        claim = None
        if size is not None:
            pvc = build_scratch_pvc(target, size)
            claim = pvc["metadata"]["name"]
            self._create_if_absent(pvc, owner)
        pod = build_workspace_pod(target, self.settings, claim)
        self._create_if_absent(pod, owner)
        name = str(pod["metadata"]["name"])
        current = self.api.core.read_namespaced_pod(name, target.namespace)
        phase = current.status.phase if current.status is not None else None
        if phase != "Running":
            raise ExecutorError(f"workspace pod {name} is {phase}", retryable=True)
        return name

    def run(self, target: SandboxTarget, command: list[str]) -> dict[str, Any]:
        """Exec ``command`` in the workspace Pod and parse its JSON.

        Raises:
            ExecutorError: exec failed or the core reported an error.
        """
        from kubernetes import client as k8s_client
        from kubernetes.stream import stream

        pod = target.workspace_pod or child_name(target, "ws")
        # kubernetes.stream swaps call_api on the ApiClient it is given for the length of the
        # call. kopf runs handlers in threads, so on the shared client other threads' REST calls
        # went over WebSocket ("Handshake status 200 OK") and overlapping execs could leave it
        # swapped for good (found by the e2e tier). Each exec gets its own client.
        exec_client = k8s_client.ApiClient(self.api.api_client.configuration)
        try:
            ws = stream(
                k8s_client.CoreV1Api(exec_client).connect_get_namespaced_pod_exec,
                pod,
                target.namespace,
                container=CONTAINER,
                command=command,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                _preload_content=False,
            )
            ws.run_forever(timeout=self.settings.exec_timeout_seconds)
            stdout = ws.read_stdout() or ""
            ws.close()
        except ApiException as exc:
            raise ExecutorError(f"exec in pod {pod} failed: {exc.reason}") from exc
        finally:
            exec_client.close()  # type: ignore[no-untyped-call]
        return parse_output(command, stdout)

    def _workspace_pod_alive(self, target: SandboxTarget) -> bool:
        """True when the workspace Pod exists and is not being deleted."""
        name = target.workspace_pod or child_name(target, "ws")
        try:
            pod = self.api.core.read_namespaced_pod(name, target.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return getattr(pod.metadata, "deletion_timestamp", None) is None

    # -- Executor -----------------------------------------------------------------------------

    def provision(self, target: SandboxTarget) -> SandboxState:
        """Pod + PVC when absent, then ``create`` (or ``status`` when it exists) and activate."""
        owner = self.api.get("sandboxes", target.namespace, target.name)
        pod = self.ensure_pod(target, owner)
        target = _with_pod(target, pod)
        existing = self.describe(target)
        if existing is None:
            self.run(target, create_command(target, self.settings))
        handle = self.open(target)
        if handle.status.can_activate:
            handle.activate()
        return SandboxState.from_record(handle.record, workspace_pod=pod)

    def describe(self, target: SandboxTarget) -> SandboxState | None:
        """``sandbox-core status``; None when the Pod has no such sandbox."""
        try:
            payload = self.run(target, core_command("status", target.sandbox_id))
        except ExecutorError as exc:
            if not exc.retryable:
                return None
            raise
        return SandboxState.from_record(payload["record"], workspace_pod=target.workspace_pod)

    def open(self, target: SandboxTarget) -> RemoteSandbox:
        """A saga handle (status fetched now)."""
        payload = self.run(target, core_command("status", target.sandbox_id))
        return RemoteSandbox(self, target, payload["record"])

    def persist(self, target: SandboxTarget, handle: Any) -> SandboxState:
        """The CLI saves after every call; return the handle's last state."""
        return SandboxState.from_record(handle.record, workspace_pod=target.workspace_pod)

    def rollback(self, target: SandboxTarget, reactivate: bool = True) -> SandboxState:
        """``rollback`` then, for reuse, activate."""
        handle = self.open(target)
        handle.rollback()
        if reactivate:
            handle.activate()
        return SandboxState.from_record(handle.record, workspace_pod=target.workspace_pod)

    def cleanup(self, target: SandboxTarget) -> None:
        """``cleanup`` in the Pod, then delete the Pod and PVC (owner references would too).

        When the workspace Pod is gone or terminating (its namespace is being deleted, or
        someone deleted it), there is nothing left to exec into: the scratch volume goes with
        its PVC, and a git worktree's registration left in the original repository is pruned
        (``git worktree prune``) by the next git_worktree create on that repository; its branch
        ``sandbox/<plan>/<id>`` stays (never adopted by a later sandbox). Retrying the exec
        would only hold the finalizer, and the namespace, forever (found by the e2e tier).
        """
        if self._workspace_pod_alive(target):
            try:
                self.run(target, core_command("cleanup", target.sandbox_id))
            except ExecutorError as exc:
                if exc.retryable:
                    raise
        else:
            logger.warning(
                "workspace pod of sandbox %s/%s is gone; skipping in-pod cleanup",
                target.namespace,
                target.name,
            )
        for delete, name in (
            (self.api.core.delete_namespaced_pod, child_name(target, "ws")),
            (
                self.api.core.delete_namespaced_persistent_volume_claim,
                child_name(target, "scratch"),
            ),
        ):
            try:
                delete(name, target.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def create_checkpoint(
        self, target: SandboxTarget, phase: str, metadata: dict[str, str], uid: str = ""
    ) -> CheckpointInfo:
        """``sandbox-core checkpoint``."""
        meta = [f"--meta={key}={value}" for key, value in sorted(metadata.items())]
        if uid:
            meta.append(f"--meta=k8s_checkpoint_uid={uid}")
        data = self.run(
            target, core_command("checkpoint", target.sandbox_id, "--phase", phase, *meta)
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
        """``sandbox-core restore``."""
        self.run(target, core_command("restore", checkpoint.checkpoint_id))
        handle = self.open(target)
        return SandboxState.from_record(handle.record, workspace_pod=target.workspace_pod)

    def delete_checkpoint(self, checkpoint: CheckpointInfo) -> None:
        """Snapshots live on the scratch volume; they go with the Sandbox's cleanup."""


def _with_pod(target: SandboxTarget, pod: str) -> SandboxTarget:
    from dataclasses import replace

    return replace(target, workspace_pod=pod)
