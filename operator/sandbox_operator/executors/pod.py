"""Pod executor: one workspace Pod per Sandbox, driven through its workspace agent.

DESIGN.md, "Where the work happens": the Sandbox's work runs in its workspace Pod
(:mod:`~sandbox_operator.executors.pod_manifests` builds it and its children). Its main process is
the workspace agent (``sandbox_core.agent``): the operator calls it over the pod network
with a per-Sandbox token (an HMAC over the Sandbox uid; handed over in a Secret mounted as a
file) that expires: the operator writes a new one into the Secret every half lifetime
(:meth:`PodExecutor.renew_token`, a timer) and offers the new and the previous one, since the
kubelet brings the new one to the Pod up to about a minute later (``sandbox_core.agent.tokens``),
one HTTP round trip per operation, idempotent by request id
(:mod:`~sandbox_operator.executors.remote`). There is no exec path.

With a warm pool (``settings.warm_pool_size``, :mod:`~sandbox_operator.executors.warm_pool`),
:meth:`PodExecutor.ensure_children` first claims a Ready free pool Pod of the Sandbox's shape
(and ReadWriteMany source claim) and hands its agent the Sandbox's token
(:meth:`PodExecutor.hand_over`); a Secret source, a ReadWriteOnce claim, a privileged overlay,
a Sandbox that already has a scratch claim or Pod, or an empty pool make a Pod of its own. A
claimed Pod is found by its ``sandbox-uid`` label and controller, not by the hashed name; its
changes live on its emptyDir, so it is never suspended (:meth:`PodExecutor.suspend`), and a
Sandbox whose pool Pod is gone says so instead of starting empty.

Every child (token Secret, NetworkPolicy, scratch claim, Pod) is adopted by the Sandbox with
``kopf.adopt`` (ownerReferences, :func:`~sandbox_operator.kube.api.adopt`) and created only
when absent. Names are hashed (``sandbox_api.naming``), and names are not identities: an
existing child (a 409, or one made before hashed names) is used, and deleted, only when its
controller ownerReference is the Sandbox's uid (:mod:`~sandbox_operator.kube.ownership`);
otherwise ``ChildNameTaken`` and the object is left alone. The Sandbox's status is output
only: the Pod is found by its owner, never by ``status.workspacePod``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from kubernetes.client.exceptions import ApiException

from sandbox_api.models import MANAGED_BY, MANAGED_BY_LABEL
from sandbox_api.naming import AGENT_SECRET_SUFFIX, AGENT_TOKEN_KEY, child_object_names
from sandbox_core import SandboxError, SandboxForkError, SandboxStateError, SandboxStatus
from sandbox_core.agent import wire
from sandbox_core.plan.validation import Check, CheckOutcome
from sandbox_operator.errors import ChildNameTaken, ExecutorError, PoolPodLost
from sandbox_operator.executors.agent_client import (
    AgentClient,
    AgentNotFound,
    AgentRefused,
    AgentUnauthorized,
    derive_token,
    request_id,
    token_serial,
)
from sandbox_operator.executors.agent_keys import AgentKeys, load_or_create, read_key_files
from sandbox_operator.executors.base import (
    CheckpointInfo,
    ForkRef,
    SandboxState,
    SandboxTarget,
    WorkspaceNotReady,
    WorkspaceUnschedulable,
)
from sandbox_operator.executors.placement import (
    Placement,
    plan_placement,
    shared_across_nodes,
    unschedulable_reason,
)
from sandbox_operator.executors.pod_manifests import (
    SANDBOX_UID_LABEL,
    allowed_root,
    build_network_policy,
    build_scratch_pvc,
    build_token_secret,
    build_workspace_pod,
    child_name,
    overlay_privileged,
    pod_is_ready,
    scratch_size,
)
from sandbox_operator.executors.remote import RemoteSandbox, create_body, state_key
from sandbox_operator.executors.warm_pool import POOLED_LABEL, WarmPool
from sandbox_operator.kube.api import Api, adopt
from sandbox_operator.kube.ownership import (
    create,
    delete_controlled,
    holder,
    is_controlled_by,
    read_metadata,
)
from sandbox_operator.settings import Settings

logger = logging.getLogger(__name__)
T = TypeVar("T")

CHECK_OUTPUT_BYTES = 64 * 1024
"""Bytes of each stream a pre-commit check keeps (only the tail is shown afterwards), as the
local door's checks (``sandbox_core.actor.checks``)."""

# The suffix of each child kind's name (sandbox_api.naming): the Pod and its NetworkPolicy
# share one.
CHILD_SUFFIXES = {
    "Pod": "ws",
    "NetworkPolicy": "ws",
    "Secret": AGENT_SECRET_SUFFIX,
    "PersistentVolumeClaim": "scratch",
}
# A Secret whose metadata the operator may not read (PodExecutor._read_metadata).
UNREADABLE: dict[str, Any] = {}
# On a Sandbox: the warm-pool Pod that holds its state (written once, after the claim).
POOL_POD_ANNOTATION = "sandbox.cleveragents.io/warm-pool-pod"


class PodExecutor:
    """Executor calling the workspace agent of one workspace Pod per Sandbox."""

    kind = "pod"

    def __init__(
        self, settings: Settings, api: Api, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.api = api
        self._clock = clock  # labels renewal windows only (token_serial)
        self._keys: AgentKeys | None = None
        # Sandbox uid -> the token its agent last accepted.
        self._accepted: dict[str, str] = {}
        # Sandbox uid -> the renewal window whose token this process wrote into its Secret.
        self._written: dict[str, int] = {}
        self._pods: dict[str, str] = {}
        self.pool = WarmPool(
            settings, api, self.keys, start_grace_seconds=settings.warm_pool_start_grace_seconds
        )

    # -- children -----------------------------------------------------------------------------

    def _ours(self, metadata: dict[str, Any], target: SandboxTarget) -> bool:
        """Whether ``target`` made this child: its controller is the Sandbox's uid and it
        carries the operator's managed-by label."""
        labels = metadata.get("labels") or {}
        return is_controlled_by(metadata, target.uid) and labels.get(MANAGED_BY_LABEL) == MANAGED_BY

    def _read_metadata(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """:func:`read_metadata`, except that a Secret the operator may not read (403: the
        chart grants no ``get`` on Secrets, docs/operations.md "Privileges") is
        :data:`UNREADABLE`. Its owner then goes unchecked: the name is a hash of the Sandbox's
        own name, so no other Sandbox's child holds it, and a Secret planted there by someone
        who may create Secrets in the namespace gives the Pod a token the operator does not
        hold: the agent refuses the operator (401), it never serves the planter's commands on
        the operator's behalf. With the ``get`` right the planted Secret is found and refused
        (``ChildNameTaken``)."""
        try:
            return read_metadata(self.api, kind, namespace, name)
        except ApiException as exc:
            if exc.status == 403 and kind == "Secret":
                return UNREADABLE
            raise

    def owned_child(self, kind: str, target: SandboxTarget) -> str | None:
        """Name of ``target``'s child of ``kind`` (``Pod``, ``Secret``, ``NetworkPolicy``,
        ``PersistentVolumeClaim``) that the Sandbox controls: the current name, else the name an
        operator before hashed names gave it (a Sandbox made then keeps its claim, Secret and
        Pod); None when neither exists.

        Raises:
            ChildNameTaken: the current name is held by an object this Sandbox does not control
                (and no child of its own exists under the legacy name).
            ApiException: the metadata could not be read.
        """
        taken: dict[str, Any] | None = None
        for name in child_object_names(target.name, CHILD_SUFFIXES[kind]):
            metadata = self._read_metadata(kind, target.namespace, name)
            if metadata is None or metadata is UNREADABLE:
                continue
            if self._ours(metadata, target):
                return name
            if taken is None and name == child_name(target, CHILD_SUFFIXES[kind]):
                taken = metadata
        if taken is not None:
            raise ChildNameTaken(
                f"name taken by another object: {holder(kind, taken)}; "
                f"it is not Sandbox {target.namespace}/{target.name}'s and is left alone"
            )
        return None

    def _ensure(
        self, manifest: dict[str, Any], owner: dict[str, Any], target: SandboxTarget
    ) -> str:
        """The name of ``target``'s child of ``manifest``'s kind: the one it controls, else
        ``manifest`` created (adopted by ``owner``). A 409 is an earlier attempt's object only
        when this Sandbox controls it.

        Raises:
            ChildNameTaken: the name is held by an object this Sandbox does not control.
        """
        kind = manifest["kind"]
        found = self.owned_child(kind, target)
        if found is not None:
            return found
        adopt(manifest, owner)
        name = str(manifest["metadata"]["name"])
        if create(self.api, manifest):
            return name
        metadata = self._read_metadata(kind, target.namespace, name)  # 409: who has it?
        if metadata is UNREADABLE:
            return name  # the token Secret under the chart's rights: see _read_metadata
        if metadata is not None and self._ours(metadata, target):
            return name  # made by an earlier attempt whose reply was lost
        raise ChildNameTaken(
            f"name taken by another object: "
            f"{holder(kind, metadata or {'namespace': target.namespace, 'name': name})}; "
            f"it is not Sandbox {target.namespace}/{target.name}'s and is left alone"
        )

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

    def placement(self, target: SandboxTarget) -> Placement | None:
        """Where ``target``'s workspace Pod may run for its source claim
        (:mod:`~sandbox_operator.executors.placement`): the claim's access modes (of the bound
        volume, else requested) and the namespace's Pods now; None for a Secret source. A
        claim that does not exist yet is placed as ReadWriteOnce (the Pod waits for it).

        Raises:
            ApiException: reading the claim (other than 404) or listing the Pods failed."""
        pvc = target.source.persistent_volume_claim
        if pvc is None:
            return None
        modes: list[str] = []
        try:
            claim = self.api.core.read_namespaced_persistent_volume_claim(
                pvc.claim_name, target.namespace
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        else:  # modes of the bound volume, else the requested ones
            modes = list(
                (claim.status.access_modes if claim.status else None)
                or (claim.spec.access_modes if claim.spec else None)
                or []
            )
        pods: list[dict[str, Any]] = []
        if not shared_across_nodes(modes):  # unknown (no claim yet) counts as one node
            listed = self.api.core.list_namespaced_pod(target.namespace)
            pods = [
                cast(dict[str, Any], self.api.api_client.sanitize_for_serialization(p))  # type: ignore[no-untyped-call]
                for p in listed.items
            ]
        return plan_placement(pvc.claim_name, modes, pods)

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

    def _serial(self) -> int | None:
        """The current renewal window; None when tokens never expire (lifetime 0)."""
        lifetime = self.settings.agent_token_lifetime_seconds
        return token_serial(self._clock(), lifetime) if lifetime > 0 else None

    def token(self, target: SandboxTarget) -> str:
        """The agent token of ``target`` for the current renewal window, with the operator's
        current key (:func:`derive_token`)."""
        lifetime = self.settings.agent_token_lifetime_seconds
        return derive_token(self.keys().current, target.uid, self._serial(), lifetime)

    def candidate_tokens(self, target: SandboxTarget) -> list[str]:
        """The tokens ``target``'s agent may hold, the likeliest first: the one it last
        accepted; then, per key (current, previous), the current window's, the previous
        window's (the kubelet has not brought the new one yet) and the one that never expires
        (a Sandbox made before tokens expired)."""
        lifetime = self.settings.agent_token_lifetime_seconds
        serial = self._serial()
        out: list[str] = []
        for key in self.keys().all():
            if serial is not None:
                out.append(derive_token(key, target.uid, serial, lifetime))
                out.append(derive_token(key, target.uid, serial - 1, lifetime))
            out.append(derive_token(key, target.uid))
        accepted = self._accepted.get(target.uid)
        if accepted in out:
            out.remove(accepted)
            out.insert(0, accepted)
        return out

    def renew_token(self, target: SandboxTarget) -> None:
        """Write the current window's token into ``target``'s token Secret, once per window
        and process (a patch of key ``token`` only; the same value again changes nothing).

        The Secret is the Sandbox's (current name, else the name before hashed names); one
        that does not exist yet (the Sandbox is being made) is left to :meth:`ensure_children`.

        Raises:
            ApiException: the API refused the patch (other than 404).
        """
        serial = self._serial()
        if serial is None or self._written.get(target.uid) == serial:
            return
        pooled = self.pooled_pod(target)  # once per window and Sandbox
        if pooled is not None:  # it mounts no token Secret: the new token is handed over
            self.hand_over(target, pooled, renewal=True)
            self._written[target.uid] = serial
            logger.info("sandbox %s/%s: agent token renewed", target.namespace, target.name)
            return
        token = base64.b64encode(self.token(target).encode("ascii")).decode("ascii")
        # A JSON patch whose first operation tests that the Sandbox controls the Secret: the
        # operator may not read Secrets, so the ownership check rides on the write itself, and
        # a Secret planted under the name by someone else is never written.
        patch = [
            {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": target.uid},
            {"op": "add", "path": f"/data/{AGENT_TOKEN_KEY}", "value": token},
        ]
        for name in child_object_names(target.name, CHILD_SUFFIXES["Secret"]):
            try:
                self.api.core.patch_namespaced_secret(name, target.namespace, patch)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                if exc.status == 422:  # the test failed: not this Sandbox's Secret
                    logger.warning(
                        "sandbox %s/%s: Secret %s is not controlled by it; its token is not "
                        "renewed there",
                        target.namespace,
                        target.name,
                        name,
                    )
                    continue
                raise
            self._written[target.uid] = serial
            logger.info("sandbox %s/%s: agent token renewed", target.namespace, target.name)
            return

    def ensure_children(self, target: SandboxTarget, owner: dict[str, Any]) -> str:
        """Create the token Secret, NetworkPolicy, scratch claim and Pod when absent.

        All are controlled by the Sandbox (``kopf.adopt``: ownerReferences, garbage-collected
        with it); a child already there is used only when the Sandbox controls it
        (:meth:`owned_child`, which also finds children named before hashed names). The Pod
        mounts the claim and Secret found. Returns the Pod name.

        Raises:
            ChildNameTaken: a child's name is held by an object this Sandbox does not control,
                or ``owner`` is not the object ``target`` was read from (deleted and made
                again under the same name).
        """
        if str((owner.get("metadata") or {}).get("uid")) != target.uid:
            raise ChildNameTaken(
                f"Sandbox {target.namespace}/{target.name} is no longer uid {target.uid}: "
                "nothing is made for the old one"
            )
        scratch = target.workspace.scratch
        size = scratch_size(
            target.strategy,
            self.source_size(target),
            self.settings.scratch_volume_size,
            scratch.size if scratch else None,
        )
        secret = self._ensure(build_token_secret(target, self.token(target)), owner, target)
        self.renew_token(target)  # a Secret made in an earlier window holds an older token
        if self.settings.network_policy:
            self._ensure(build_network_policy(target, self.settings), owner, target)
        lost = ((owner.get("metadata") or {}).get("annotations") or {}).get(POOL_POD_ANNOTATION)
        # One Pod list more per provision only where a pool Pod may be the Sandbox's.
        pooled = self.pooled_pod(target) if lost or self.settings.warm_pool_size > 0 else None
        if pooled is not None:  # claimed before: hand over again (idempotent) and use it
            return self._use_pooled(target, owner, pooled)
        if lost:
            raise PoolPodLost(
                f"the warm-pool Pod {lost} that held Sandbox {target.namespace}/{target.name}'s "
                "changes (on its emptyDir) is gone; they are lost and the sandbox is not made "
                "again empty"
            )
        claimed = self._claim_from_pool(target, owner)
        if claimed is not None:
            return self._use_pooled(target, owner, claimed)
        pvc = build_scratch_pvc(target, size, scratch.storage_class_name if scratch else None)
        claim = self._ensure(pvc, owner, target)
        name = self.owned_child("Pod", target)
        if name is None:  # placement matters, and costs a Pod list, only for a new Pod
            pod = build_workspace_pod(
                target, self.settings, claim, token_secret=secret, placement=self.placement(target)
            )
            name = self._ensure(pod, owner, target)
        self._pods[target.uid] = name
        return name

    # -- the warm pool --------------------------------------------------------------------------

    def pool_key(self, target: SandboxTarget) -> tuple[dict[str, Any], str] | None:
        """``(workspace, source claim)`` of the pool ``target`` may take a Pod from; None when
        it needs a Pod of its own: the pool is off, a Secret (DSN) source (the operator cannot
        hand a Secret's value over), a claim that is not ReadWriteMany (its Pod goes where the
        claim attaches), a privileged overlay (pool Pods are restricted).

        Raises:
            ApiException: reading the source claim failed (other than 404)."""
        if self.settings.warm_pool_size <= 0 or overlay_privileged(target, self.settings):
            return None
        pvc = target.source.persistent_volume_claim
        if pvc is None:
            return None  # a Secret source: its DSN reaches only a Pod made with secretKeyRef
        placement = self.placement(target)
        if placement is None or placement.together:  # unknown modes count as ReadWriteOnce
            return None
        workspace = target.workspace.model_dump(by_alias=True, exclude_none=True)
        return workspace, pvc.claim_name

    def pooled_pod(self, target: SandboxTarget) -> dict[str, Any] | None:
        """The warm-pool Pod ``target`` claimed (label ``sandbox-uid``, controlled by it, label
        ``pooled``); None when it has none."""
        listed = self.api.core.list_namespaced_pod(
            target.namespace, label_selector=f"{SANDBOX_UID_LABEL}={target.uid},{POOLED_LABEL}"
        )
        for item in listed.items:
            pod = cast(dict[str, Any], self.api.api_client.sanitize_for_serialization(item))  # type: ignore[no-untyped-call]
            metadata = pod.get("metadata") or {}
            if self._ours(metadata, target) and not metadata.get("deletionTimestamp"):
                return pod
        return None

    def _claim_from_pool(
        self, target: SandboxTarget, owner: dict[str, Any]
    ) -> dict[str, Any] | None:
        """A Ready pool Pod claimed for ``target``; None when it needs a Pod of its own (no
        pool key, a scratch claim or Pod of its own already: its state lives there)."""
        key = self.pool_key(target)
        if key is None:
            return None
        if self.owned_child("PersistentVolumeClaim", target) or self.owned_child("Pod", target):
            return None
        workspace, claim = key
        return self.pool.claim(target.namespace, owner, target.plan_id, workspace, claim)

    def _use_pooled(self, target: SandboxTarget, owner: dict[str, Any], pod: dict[str, Any]) -> str:
        """Hand ``pod`` its Sandbox, record it on the Sandbox (its state lives there), and
        return its name."""
        name = str(pod["metadata"]["name"])
        self._pods[target.uid] = name
        self.hand_over(target, pod)
        annotations = (owner.get("metadata") or {}).get("annotations") or {}
        if annotations.get(POOL_POD_ANNOTATION) != name:
            self.api.custom.patch_namespaced_custom_object(
                *_sandbox_path(owner), {"metadata": {"annotations": {POOL_POD_ANNOTATION: name}}}
            )
        return name

    def hand_over(
        self, target: SandboxTarget, pod: dict[str, Any], *, renewal: bool = False
    ) -> None:
        """Give the agent of the claimed pool ``pod`` the Sandbox's current token and allowed
        root (``wire.HANDOVER``), authenticated with what it may hold: the Sandbox's tokens
        (handed over before: a renewal), else its pool's bootstrap tokens. A Pod that refuses
        them all at its first hand-over (its bootstrap Secret was planted, or someone handed it
        over first) is deleted and never used; at a ``renewal`` it is left as it is.

        Raises:
            WorkspaceNotReady: the Pod is not Ready (it went away after the claim).
            AgentUnauthorized: a renewal's tokens were all refused.
            ExecutorError: every token was refused (the Pod was deleted; retryable: the next
                attempt takes another Pod) or the agent failed.
        """
        name = str(pod["metadata"]["name"])
        if not pod_is_ready(pod):
            raise WorkspaceNotReady(f"warm-pool pod {name} is not Ready")
        address = str(pod["status"]["podIP"])
        host = f"[{address}]" if ":" in address else address
        shape = str((pod["metadata"].get("labels") or {}).get(POOLED_LABEL) or "")
        body = {"token": self.token(target), "allowed_root": allowed_root(target)}
        offers = self.candidate_tokens(target) + self.pool.bootstrap_tokens(target.namespace, shape)
        for token in offers:
            client = AgentClient(
                f"http://{host}:{self.settings.agent_port}",
                token,
                self.settings.exec_timeout_seconds,
            )
            try:
                client.call(wire.HANDOVER.method, wire.HANDOVER.path(), body)
            except AgentUnauthorized:
                continue
            self._accepted[target.uid] = str(body["token"])
            return
        if renewal:
            raise AgentUnauthorized(f"warm-pool pod {name} refused the token renewal")
        delete_controlled(self.api, "Pod", target.namespace, name, target.uid)
        self._pods.pop(target.uid, None)
        raise ExecutorError(
            f"warm-pool pod {name} refused the hand-over (not the pool's bootstrap token); "
            "deleted, another Pod is taken",
            retryable=True,
        )

    def pod_name(self, target: SandboxTarget) -> str:
        """Name of ``target``'s workspace Pod as last found controlled by it (else the current
        name); never read from the Sandbox's status."""
        return self._pods.get(target.uid) or child_name(target, "ws")

    def _ready_pod_ip(self, target: SandboxTarget) -> str:
        """IP of the workspace Pod the Sandbox controls, when it is Ready.

        The Pod is found by name (current, else legacy) and used only when its controller
        ownerReference is the Sandbox's uid: ``status.workspacePod`` is output, never input.

        Raises:
            WorkspaceUnschedulable: not placed: no node fits (the scheduler's reason).
            WorkspaceNotReady: absent, being deleted, or not Ready yet.
            ChildNameTaken: the Pod's name is held by a Pod the Sandbox does not control.
        """
        taken = ""
        names = list(child_object_names(target.name, CHILD_SUFFIXES["Pod"]))
        known = self._pods.get(target.uid)
        if known and known not in names:  # a warm-pool Pod found before: read it first
            names.insert(0, known)
        for name in names:
            try:
                found = self.api.core.read_namespaced_pod(name, target.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            pod = cast(dict[str, Any], self.api.api_client.sanitize_for_serialization(found))  # type: ignore[no-untyped-call]
            if not self._ours(pod.get("metadata") or {}, target):
                taken = taken or holder("Pod", pod.get("metadata") or {})
                continue
            self._pods[target.uid] = name
            if not pod_is_ready(pod):
                unplaced = unschedulable_reason(pod)
                if unplaced:
                    raise WorkspaceUnschedulable(f"workspace pod {name} is not placed: {unplaced}")
                phase = (pod.get("status") or {}).get("phase") or "Unknown"
                raise WorkspaceNotReady(f"workspace pod {name} is {phase}, not Ready yet")
            return str(pod["status"]["podIP"])
        pooled = self.pooled_pod(target)  # only when no Pod has the Sandbox's names
        if pooled is not None:
            self._pods[target.uid] = str(pooled["metadata"]["name"])
            if pod_is_ready(pooled):
                return str(pooled["status"]["podIP"])
            phase = (pooled.get("status") or {}).get("phase") or "Unknown"
            raise WorkspaceNotReady(
                f"warm-pool pod {pooled['metadata']['name']} is {phase}, not Ready"
            )
        if taken:
            raise ChildNameTaken(
                f"name taken by another object: {taken}; it is not Sandbox "
                f"{target.namespace}/{target.name}'s and is left alone"
            )
        raise WorkspaceNotReady(f"workspace pod {child_name(target, 'ws')} does not exist")

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
        """One agent call in ``target``'s workspace Pod, with the token its agent last accepted
        first, then the others it may hold (:meth:`candidate_tokens`: after a renewal the Pod
        may still hold the previous window's token, after a rotation the previous key's:
        ``executors.agent_keys``). A 401 is given before anything runs.

        Raises:
            WorkspaceNotReady: the Pod is not Ready.
            AgentNotFound: the agent has no such sandbox or checkpoint.
            AgentUnauthorized: the agent refused every candidate token.
            ExecutorError: the agent refused or could not be reached.
        """
        return self._with_token(
            target,
            f"agent {method} {path}",
            lambda client: client.call(method, path, body, query=query, request_id=request_id),
        )

    def _with_token(
        self,
        target: SandboxTarget,
        what: str,
        send: Callable[[AgentClient], T],
        timeout_seconds: float | None = None,
    ) -> T:
        """``send`` with a client of ``target``'s agent per candidate token in turn (as
        :meth:`call` says), until one is not refused with 401; ``timeout_seconds`` (default
        ``settings.exec_timeout_seconds``) bounds each socket operation."""
        address = self._ready_pod_ip(target)
        host = f"[{address}]" if ":" in address else address
        order = self.candidate_tokens(target)
        expired = False
        for attempt, token in enumerate(order):
            client = AgentClient(
                f"http://{host}:{self.settings.agent_port}",
                token,
                timeout_seconds or self.settings.exec_timeout_seconds,
            )
            try:
                reply = send(client)
            except AgentUnauthorized as refused:
                expired = expired or refused.expired
                if attempt < len(order) - 1:
                    continue  # refused before anything ran: offer the next candidate
                if expired and not refused.expired:
                    raise AgentUnauthorized(
                        f"{what}: refused (token expired)", expired=True
                    ) from None
                raise
            self._accepted[target.uid] = token
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
            ExecutorError: a fork's parent Pod is not serving (retryable) or its agent refused
                the checkpoint (:meth:`_carry_checkpoint`).
            SandboxForkError: the fork's agent refused the checkpoint or could not start from
                it (docs/forks.md).
        """
        owner = self.api.get("sandboxes", target.namespace, target.name)
        pod = self.ensure_children(target, owner)
        body = create_body(target, self.settings)
        rid = request_id("create", target.uid)
        if target.fork is not None and not self._made(target):
            carried = self._carry_checkpoint(target, target.fork)
            body["fork_checkpoint"] = target.fork.checkpoint_id
            rid = request_id("create-fork", target.uid, target.fork.checkpoint_id, carried)
        self._call_route(target, wire.CREATE, body, request_id=rid)
        # The create reply may be a replay from long ago (a re-made Pod on the same claim):
        # read the current state.
        handle = self.open(target)
        if handle.status.can_activate:
            handle.activate()
        return SandboxState.from_record(handle.record, workspace_pod=pod)

    def _made(self, target: SandboxTarget) -> bool:
        """Whether ``target``'s agent already has its sandbox (a fork made before: it never
        needs its parent again)."""
        try:
            self._call_route(target, wire.STATUS)
        except AgentNotFound:
            return False
        return True

    def _carry_checkpoint(self, target: SandboxTarget, fork: ForkRef) -> str:
        """Pipe checkpoint ``fork.checkpoint_id`` from the parent's workspace agent
        (``wire.EXPORT``) into ``target``'s (``wire.IMPORT``), unread and unbuffered: neither
        Pod reaches the other, each agent sees only the operator (docs/forks.md, "Forks in
        workspace Pods"). At most ``settings.fork_max_bytes``.

        Returns:
            The transfer's id, a new one each time (part of the create's request id, so that a
            create after a new transfer is a new request).

        Raises:
            ExecutorError: the parent's Pod is not serving, or either agent could not be
                reached (retryable).
            SandboxForkError: the parent's agent cannot carry the checkpoint (no snapshot,
                too large, kernel-mode overlay) or the fork's agent refused the bundle.
        """
        parent = dataclasses.replace(
            target,
            name=fork.parent_name,
            uid=fork.parent_uid,
            sandbox_id=fork.parent_sandbox_id,
            fork=None,
            core_record=None,
        )
        if not fork.parent_name or not fork.parent_uid:
            raise SandboxForkError(f"Sandbox {target.name}: the parent Sandbox is not known")
        transfer = uuid.uuid4().hex
        limit = {wire.MAX_BYTES_QUERY: str(self.settings.fork_max_bytes)}
        export_path = wire.EXPORT.path(cid=fork.checkpoint_id)
        import_path = wire.IMPORT.path(cid=fork.checkpoint_id)

        def pipe(client: AgentClient) -> dict[str, Any]:
            try:
                source = self._with_token(
                    parent,
                    f"agent GET {export_path}",
                    lambda parent_client: parent_client.stream("GET", export_path, query=limit),
                )
            except WorkspaceNotReady as exc:
                raise ExecutorError(
                    f"the parent Sandbox {fork.parent_name}'s workspace is not serving: {exc}",
                    retryable=True,
                ) from None
            except AgentRefused as exc:
                raise wire.core_error(exc.error, exc.detail) from None
            with source:
                length = int(source.headers.get("Content-Length") or 0)
                try:
                    return client.call(
                        "PUT",
                        import_path,
                        source,
                        query=limit,
                        request_id=request_id("import", target.uid, transfer),
                        length=length,
                    )
                except AgentRefused as exc:
                    if exc.error_type == "SandboxForkError":
                        raise SandboxForkError(exc.detail) from None
                    raise

        reply = self._with_token(target, f"agent PUT {import_path}", pipe)
        logger.info(
            "sandbox %s/%s: checkpoint %s carried from %s (%s files, %s bytes)",
            target.namespace,
            target.name,
            fork.checkpoint_id,
            fork.parent_name,
            reply.get("files"),
            reply.get("bytes"),
        )
        return transfer

    def run_check(self, target: SandboxTarget, check: Check) -> CheckOutcome:
        """Run ``check`` through the agent's command route (``wire.EXEC``, the actor's door:
        jailed, audited, killed at its timeout) and wait for its exit. The output kept is the
        last :data:`CHECK_OUTPUT_BYTES` of stdout, then of stderr.

        Raises:
            SandboxError: the agent refused the command (the core's error as the agent
                reported it, its type first, e.g. ``JailUnavailableError: cannot isolate
                commands: ...`` where no jail can be built) or reported
                an error instead of its exit; the check fails with it.
            ExecutorError: the agent could not be reached, or the stream was cut (retryable).
        """
        body = {
            "argv": list(check.command),
            "timeout_seconds": check.timeout_seconds,
            "max_output_bytes": CHECK_OUTPUT_BYTES,
        }
        path = wire.EXEC.path(sid=target.sandbox_id)
        rid = request_id(
            "check", target.sandbox_id, check.name, *check.command, self.revision(target)
        )

        def run(client: AgentClient) -> CheckOutcome:
            try:
                reply = client.stream("POST", path, body, request_id=rid)
            except AgentRefused as exc:  # refused before it ran: the type says why
                raise SandboxError(f"{exc.error_type}: {exc.detail}") from None
            with reply:
                return read_exec_stream(reply, f"check {check.name}")

        return self._with_token(
            target,
            f"agent POST {path}",
            run,
            timeout_seconds=max(self.settings.exec_timeout_seconds, check.timeout_seconds + 30),
        )

    def describe(self, target: SandboxTarget) -> SandboxState | None:
        """The agent's ``status``; None when it has no such sandbox."""
        try:
            payload = self._call_route(target, wire.STATUS)
        except AgentNotFound:
            return None
        return SandboxState.from_record(payload["record"], workspace_pod=self.pod_name(target))

    def open(self, target: SandboxTarget) -> RemoteSandbox:
        """A saga handle (status fetched now)."""
        payload = self._call_route(target, wire.STATUS)
        return RemoteSandbox(self, target, payload)

    def revision(self, target: SandboxTarget) -> int:
        """The agent's change counter of ``target``'s sandbox (part of request ids)."""
        return int(self.open(target).reply.get("revision") or 0)

    def persist(self, target: SandboxTarget, handle: Any) -> SandboxState:
        """The agent saves after every call; return the handle's last state."""
        return SandboxState.from_record(handle.record, workspace_pod=self.pod_name(target))

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
        return SandboxState.from_record(payload["record"], workspace_pod=self.pod_name(target))

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
        self._written.pop(target.uid, None)

    def _delete_children(self, target: SandboxTarget, *, pod_only: bool) -> None:
        """Delete ``target``'s Pod (and, unless ``pod_only``, its claim and NetworkPolicy),
        under the current and the legacy names: only objects the Sandbox controls, each with
        ``preconditions.uid`` (:func:`delete_controlled`). The token Secret is not deleted here:
        it is owned by the Sandbox and garbage-collected with it, so the operator needs no right
        to delete Secrets; a NetworkPolicy it may not delete (403) is left to garbage collection
        the same way."""
        pooled = self.pooled_pod(target)
        if pooled is not None:
            delete_controlled(
                self.api, "Pod", target.namespace, str(pooled["metadata"]["name"]), target.uid
            )
        kinds = ["Pod"] if pod_only else ["Pod", "PersistentVolumeClaim", "NetworkPolicy"]
        for kind in kinds:
            for name in child_object_names(target.name, CHILD_SUFFIXES[kind]):
                try:
                    delete_controlled(self.api, kind, target.namespace, name, target.uid)
                except ApiException as exc:
                    if exc.status != 403 or kind in ("Pod", "PersistentVolumeClaim"):
                        raise
                    logger.info("%s %s: left to garbage collection (no right)", kind, name)
        self._pods.pop(target.uid, None)

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
        return SandboxState.from_record(payload["record"], workspace_pod=self.pod_name(target))

    def delete_checkpoint(self, checkpoint: CheckpointInfo) -> None:
        """Snapshots live on the scratch volume; they go with the Sandbox's cleanup."""

    # -- suspend -------------------------------------------------------------------------------

    def suspend(self, target: SandboxTarget) -> None:
        """Delete the workspace Pod only; the scratch claim keeps every change and the state.

        Raises:
            SandboxStateError: the Sandbox runs on a warm-pool Pod, whose changes live on an
                emptyDir that deleting the Pod would lose; nothing is deleted.
        """
        pooled = self.pooled_pod(target)
        if pooled is not None:
            raise SandboxStateError(
                f"Sandbox {target.name} runs on warm-pool pod {pooled['metadata']['name']}, "
                "whose changes live on the Pod's emptyDir: suspending would lose them, so it "
                "is not suspended (commit or roll back first; or turn the warm pool off for "
                "Sandboxes that must suspend)"
            )
        self._delete_children(target, pod_only=True)

    def resume(self, target: SandboxTarget) -> None:
        """Make the Pod again (the agent re-opens the sandbox from the scratch claim)."""
        owner = self.api.get("sandboxes", target.namespace, target.name)
        self.ensure_children(target, owner)


def _sandbox_path(owner: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """``(group, version, namespace, plural, name)`` of the Sandbox ``owner``."""
    group, _, version = str(owner.get("apiVersion") or "").partition("/")
    metadata = owner.get("metadata") or {}
    return group, version, str(metadata.get("namespace")), "sandboxes", str(metadata.get("name"))


def read_exec_stream(lines: Iterable[bytes], what: str) -> CheckOutcome:
    """The outcome of one command from the agent's exec stream (NDJSON, ``wire.EXEC``): its
    ``exit`` line, with the last :data:`CHECK_OUTPUT_BYTES` of stdout then of stderr.

    Raises:
        SandboxError: an ``error`` line (the command could not be run or recorded).
        ExecutorError: the stream ended without ``exit`` or ``error`` (cut), or a line is not
            an event (retryable).
    """
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    for raw in lines:
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
            name = event["event"]
            if name in kept:
                kept[name] += base64.b64decode(event["data_b64"], validate=True)
                del kept[name][:-CHECK_OUTPUT_BYTES]
                continue
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise ExecutorError(
                f"{what}: the agent's exec stream is garbled", retryable=True
            ) from None
        if name == "exit":
            code = event.get("exit_code")
            return CheckOutcome(
                exit_code=int(code) if isinstance(code, int) else -1,
                timed_out=bool(event.get("timed_out")),
                output=bytes(kept["stdout"] + kept["stderr"]),
            )
        if name == "error":
            error = event.get("error") if isinstance(event.get("error"), dict) else {}
            raise wire.core_error(error)
    raise ExecutorError(f"{what}: the agent's exec stream was cut before the exit", retryable=True)
