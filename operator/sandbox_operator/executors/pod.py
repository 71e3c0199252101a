"""Pod executor: one workspace Pod per Sandbox, driven through its workspace agent.

DESIGN.md, "Where the work happens": the Sandbox's work runs in its workspace Pod
(:mod:`~sandbox_operator.executors.pod_manifests` builds it and its children). Its main process is
the workspace agent (``sandbox_core.agent``): the operator calls it over the pod network
with a per-Sandbox token (HMAC of the Sandbox uid; handed over in a Secret mounted as a file),
one HTTP round trip per operation, idempotent by request id
(:mod:`~sandbox_operator.executors.remote`). There is no exec path.

Every child (token Secret, NetworkPolicy, scratch claim, Pod) is adopted by the Sandbox with
``kopf.adopt`` (ownerReferences, :func:`~sandbox_operator.kube.api.adopt`) and created only
when absent (409 means an earlier attempt made them: case 18).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from sandbox_core import SandboxStateError, SandboxStatus
from sandbox_core.agent import wire
from sandbox_operator.executors.agent_client import (
    AgentClient,
    AgentNotFound,
    AgentUnauthorized,
    derive_token,
    request_id,
)
from sandbox_operator.executors.agent_keys import AgentKeys, load_or_create, read_key_files
from sandbox_operator.executors.base import (
    CheckpointInfo,
    SandboxState,
    SandboxTarget,
    WorkspaceNotReady,
)
from sandbox_operator.executors.pod_manifests import (
    build_network_policy,
    build_scratch_pvc,
    build_token_secret,
    build_workspace_pod,
    child_name,
    pod_is_ready,
    scratch_size,
)
from sandbox_operator.executors.remote import RemoteSandbox, create_body, state_key
from sandbox_operator.kube.api import Api, adopt
from sandbox_operator.settings import Settings

logger = logging.getLogger(__name__)


class PodExecutor:
    """Executor calling the workspace agent of one workspace Pod per Sandbox."""

    kind = "pod"

    def __init__(self, settings: Settings, api: Api) -> None:
        self.settings = settings
        self.api = api
        self._keys: AgentKeys | None = None
        # Sandbox uid -> index of the key whose token its agent last accepted (0: current).
        self._accepted: dict[str, int] = {}

    # -- children -----------------------------------------------------------------------------

    def _create_if_absent(self, manifest: dict[str, Any], owner: dict[str, Any]) -> None:
        adopt(manifest, owner)
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

    def keys(self) -> AgentKeys:
        """The agent keys, read once: from Secret ``settings.agent_key_secret`` of the
        operator's namespace (made when absent), else from ``settings.agent_key_file``."""
        if self._keys is None:
            name = self.settings.agent_key_secret
            if name:
                labels = dict(
                    p.strip().split("=", 1)
                    for p in self.settings.operator_pod_labels.split(",")
                    if "=" in p
                )
                self._keys = load_or_create(
                    self.api.core, self.settings.operator_namespace, name, labels
                )
            else:
                self._keys = read_key_files(self.settings.agent_key_file)
        return self._keys

    def token(self, target: SandboxTarget) -> str:
        """The agent token of ``target`` (HMAC of its uid with the operator's current key)."""
        return derive_token(self.keys().current, target.uid)

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
        """One agent call in ``target``'s workspace Pod, with the token of the key its agent last
        accepted first, then the other key's (after a rotation a Sandbox made before holds the
        previous key's token: ``executors.agent_keys``).

        Raises:
            WorkspaceNotReady: the Pod is not Ready.
            AgentNotFound: the agent has no such sandbox or checkpoint.
            AgentUnauthorized: the agent refused the token of every key (current, previous).
            ExecutorError: the agent refused or could not be reached.
        """
        address = self._ready_pod_ip(target)
        host = f"[{address}]" if ":" in address else address
        keys = self.keys().all()
        first = self._accepted.get(target.uid, 0) % len(keys)
        order = [first, *(i for i in range(len(keys)) if i != first)]
        for attempt, index in enumerate(order):
            client = AgentClient(
                f"http://{host}:{self.settings.agent_port}",
                derive_token(keys[index], target.uid),
                self.settings.exec_timeout_seconds,
            )
            try:
                reply = client.call(method, path, body, query=query, request_id=request_id)
            except AgentUnauthorized:
                if attempt == len(order) - 1:
                    raise
                continue  # refused before anything ran: offer the other key's token
            self._accepted[target.uid] = index
            return reply
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    def _call_route(
        self,
        target: SandboxTarget,
        route: wire.Route,
        body: dict[str, Any] | None = None,
        *,
        request_id: str = "",
        **params: str,
    ) -> dict[str, Any]:
        """:meth:`call` of the agent's ``route`` for ``target``'s sandbox (``{sid}``; ``params``
        fill the route's other names, e.g. ``cid``)."""
        path = route.path(sid=target.sandbox_id, **params)
        return self.call(target, route.method, path, body, request_id=request_id)

    # -- Executor -----------------------------------------------------------------------------

    def provision(self, target: SandboxTarget) -> SandboxState:
        """Children when absent, then ``create`` (re-opens what exists) and activate.

        Raises:
            WorkspaceNotReady: the Pod is starting (the Pod's events resume; not an error).
        """
        owner = self.api.get("sandboxes", target.namespace, target.name)
        pod = self.ensure_children(target, owner)
        target = replace(target, workspace_pod=pod)
        self._call_route(
            target,
            wire.CREATE,
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
            payload = self._call_route(target, wire.STATUS)
        except AgentNotFound:
            return None
        return SandboxState.from_record(payload["record"], workspace_pod=target.workspace_pod)

    def open(self, target: SandboxTarget) -> RemoteSandbox:
        """A saga handle (status fetched now)."""
        payload = self._call_route(target, wire.STATUS)
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
        rid = request_id("discard", target.sandbox_id, reactivate, state_key(handle.reply))
        payload = self._call_route(
            target, wire.ROLLBACK, {"reactivate": reactivate}, request_id=rid
        )
        return SandboxState.from_record(payload["record"], workspace_pod=target.workspace_pod)

    def cleanup(self, target: SandboxTarget) -> None:
        """``cleanup`` through the agent, then delete the children (owner references would too).

        The agent first finishes or undoes whatever an interrupted commit left in the original
        (``BaseSandbox.finish_interrupted``). While it refuses (or cannot be reached) nothing
        is deleted: the error is raised, the Sandbox's finalizer keeps the object and says why
        in a ``CleanupFailed`` Event, and retries (the agent does not remember a failed
        cleanup, so a retry runs it again). Deleting the scratch claim then would lose the
        state that the undo needs.

        When the workspace Pod is gone, not Ready or terminating (its namespace is being
        deleted, or the Sandbox is suspended), there is nobody to ask: the scratch volume goes
        with its claim, and a git worktree's registration left in the original repository is
        pruned by the next git_worktree create on that repository. Waiting would only hold the
        finalizer, and the namespace, forever (found by the e2e tier).

        Raises:
            ExecutorError: the agent refused the cleanup (not retryable: a person must look,
                e.g. an artefact that cannot be removed) or could not be reached (retryable);
                nothing was deleted.
        """
        try:
            self._call_route(target, wire.CLEANUP, request_id=request_id("cleanup", target.uid))
        except WorkspaceNotReady:
            logger.warning(
                "workspace pod of sandbox %s/%s is not serving; skipping in-pod cleanup",
                target.namespace,
                target.name,
            )
        except AgentNotFound:
            pass  # the agent has no such sandbox: nothing of it is left in the Pod
        self._delete_children(target, pod_only=False)
        self._accepted.pop(target.uid, None)

    def _networking(self) -> Any:
        from kubernetes import client as k8s_client

        return k8s_client.NetworkingV1Api(self.api.api_client)

    def _delete_children(self, target: SandboxTarget, *, pod_only: bool) -> None:
        deletes: list[tuple[Any, str]] = [
            (self.api.core.delete_namespaced_pod, child_name(target, "ws"))
        ]
        if not pod_only:
            # The token Secret is not deleted here: it is owned by the Sandbox and
            # garbage-collected with it, so the operator needs no right to delete Secrets.
            networking = self._networking()
            deletes += [
                (
                    self.api.core.delete_namespaced_persistent_volume_claim,
                    child_name(target, "scratch"),
                ),
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
        data = self._call_route(
            target,
            wire.CHECKPOINT,
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
        """Restore ``checkpoint`` (:data:`~sandbox_core.agent.wire.RESTORE`)."""
        payload = self._call_route(
            target,
            wire.RESTORE,
            request_id=request_id(
                "restore", checkpoint.checkpoint_id, target.sandbox_id, self.revision(target)
            ),
            cid=checkpoint.checkpoint_id,
        )
        return SandboxState.from_record(payload["record"], workspace_pod=target.workspace_pod)

    def delete_checkpoint(self, checkpoint: CheckpointInfo) -> None:
        """Snapshots live on the scratch volume; they go with the Sandbox's cleanup."""

    # -- suspend -------------------------------------------------------------------------------

    def suspend(self, target: SandboxTarget) -> None:
        """Delete the workspace Pod only; the scratch claim keeps every change and the state."""
        self._delete_children(target, pod_only=True)

    def resume(self, target: SandboxTarget) -> None:
        """Make the Pod again (the agent re-opens the sandbox from the scratch claim)."""
        owner = self.api.get("sandboxes", target.namespace, target.name)
        self.ensure_children(target, owner)
