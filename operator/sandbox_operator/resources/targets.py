"""The executor's view of Sandbox and Checkpoint objects: the one translation from a custom
resource's body to what the executors act on.

``target_from_body`` (a Sandbox -> :class:`SandboxTarget`) serves every resource: the Sandbox
logic, the Checkpoint logic (the Sandbox it snapshots) and the PlanCommit logic (the plan's
Sandboxes). ``checkpoint_info_from_body`` (a Ready Checkpoint -> :class:`CheckpointInfo`)
serves a Sandbox's restore request. Here, below the three, none of them imports another for it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from sandbox_api import core_record
from sandbox_api.models import SandboxSpec, WorkspaceSpec
from sandbox_core.agent import wire
from sandbox_core.redaction import is_dsn
from sandbox_operator.errors import PermanentError
from sandbox_operator.executors.base import CheckpointInfo, SandboxTarget, sandbox_id_for_uid
from sandbox_operator.executors.pod_manifests import SOURCE_MOUNT
from sandbox_operator.kube import redaction
from sandbox_operator.kube.api import Api
from sandbox_operator.settings import Settings


def resolve_original(spec: SandboxSpec, namespace: str, settings: Settings, api: Api | None) -> str:
    """Where the executor finds the original of ``spec``.

    ``nodePath`` as given; a PVC's mount path in the workspace Pod (plus ``subPath``); for
    ``secretRef`` (transaction_rollback) the DSN read from the Secret with the local executor
    (registered with :mod:`redaction`, so it never reaches status, Events or logs; a value that
    is not a DSN is refused by the Secret's name and key, never shown), and with the
    pod executor only a reference, ``env:SANDBOX_SOURCE_DSN``: the kubelet puts the Secret's
    value into the workspace Pod's environment (``secretKeyRef``) and the operator never reads
    it.

    Raises:
        PermanentError: the source does not fit the executor (e.g. a PVC with the local
            executor) or names nothing; the Secret's value is not a DSN (the message names the
            Secret and key, never the value).
    """
    source = spec.source
    if source.secret_ref is not None:
        if settings.executor == "pod":
            return f"{wire.ENV_REF}{wire.SOURCE_DSN_ENV}"
        if api is None:
            raise PermanentError("secretRef sources need API access")
        ref = source.secret_ref
        try:
            value = api.secret_value(namespace, ref.name, ref.key)
        except KeyError as exc:
            raise PermanentError(str(exc)) from exc
        except UnicodeDecodeError:
            # Not text (a keystore, a binary key): never shown, not even one byte of it.
            raise PermanentError(
                f"the value of key {ref.key!r} in Secret {namespace}/{ref.name} is not a DSN "
                "(it is not UTF-8 text)"
            ) from None
        redaction.register(value)  # before anything could print it, whatever the key
        if not is_dsn(value):
            # Never embed the value (a private key, a token): name where it came from.
            raise PermanentError(
                f"the value of key {ref.key!r} in Secret {namespace}/{ref.name} is not a DSN "
                "(postgresql://..., libpq key=value, or sqlite:///path)"
            )
        return value.strip()
    if source.node_path:
        if settings.executor == "pod":
            raise PermanentError("source.nodePath needs the local executor")
        return source.node_path
    if source.persistent_volume_claim is not None:
        if settings.executor == "local":
            raise PermanentError(
                "source.persistentVolumeClaim needs the pod executor; "
                "the local executor only reaches source.nodePath"
            )
        sub = source.persistent_volume_claim.sub_path.strip("/")
        return posixpath.join(SOURCE_MOUNT, sub) if sub else SOURCE_MOUNT
    raise PermanentError("spec.source names no original")


def target_from_body(body: Mapping[str, Any], settings: Settings, api: Api | None) -> SandboxTarget:
    """Build the executor's view of one Sandbox object.

    Raises:
        PermanentError: the spec is invalid for this operator.
    """
    metadata = body["metadata"]
    try:
        spec = SandboxSpec.model_validate(dict(body.get("spec") or {}))
    except ValueError as exc:
        raise PermanentError(f"invalid Sandbox spec: {exc}") from exc
    status = dict(body.get("status") or {})
    sandbox_id = str(status.get("sandboxId") or sandbox_id_for_uid(str(metadata["uid"])))
    original = resolve_original(spec, str(metadata.get("namespace") or ""), settings, api)
    try:
        record = core_record.decode(status.get("coreRecord"), original)
    except core_record.CoreRecordVersionError as exc:
        raise PermanentError(str(exc)) from exc
    return SandboxTarget(
        name=str(metadata["name"]),
        namespace=str(metadata.get("namespace") or "default"),
        uid=str(metadata["uid"]),
        sandbox_id=sandbox_id,
        plan_id=spec.plan_id,
        resource_id=spec.resource_id,
        strategy=spec.strategy,
        original=original,
        source=spec.source,
        options=spec.options,
        core_record=record,
        workspace_pod=str(status.get("workspacePod") or ""),
        workspace=spec.workspace.merged_over(workspace_defaults(settings)),
    )


def workspace_defaults(settings: Settings) -> WorkspaceSpec:
    """The chart's ``workspace.*`` defaults (``settings.workspace_defaults``, JSON).

    Raises:
        PermanentError: the JSON is not a valid workspace block (a deployment error).
    """
    try:
        return WorkspaceSpec.model_validate_json(settings.workspace_defaults or "{}")
    except ValueError as exc:
        raise PermanentError(f"invalid workspace defaults: {exc}") from exc


KINDS_TO_CORE = {
    "git-tag": "git_ref",
    "upper-snapshot": "overlay_snapshot",
    "directory-snapshot": "directory",
}


def checkpoint_info_from_body(body: Mapping[str, Any], target: SandboxTarget) -> CheckpointInfo:
    """The snapshot a Ready Checkpoint object stands for (enough for the core to restore it)."""
    spec = dict(body.get("spec") or {})
    status = dict(body.get("status") or {})
    kind = str(status.get("kind") or "metadata-only")
    metadata = dict(spec.get("metadata") or {})
    core_kind = KINDS_TO_CORE.get(kind)
    if core_kind:
        metadata["checkpoint_kind"] = core_kind
    snapshot = str(status.get("snapshotLocation") or "")
    if core_kind == "git_ref":
        metadata["checkpoint_ref"] = str(status.get("checkpointId") or "")
        snapshot_path = ""
    else:
        snapshot_path = snapshot
    record = target.core_record or {}
    sandbox_path = ((record.get("context") or {}).get("sandbox_path")) or ""
    if sandbox_path:
        metadata.setdefault("sandbox_path", sandbox_path)
    return CheckpointInfo(
        checkpoint_id=str(status.get("checkpointId") or ""),
        sandbox_id=str(status.get("sandboxId") or target.sandbox_id),
        snapshot_location=snapshot,
        kind=kind,
        created_at=str(status.get("createdAt") or ""),
        extra={
            "checkpoint_id": str(status.get("checkpointId") or ""),
            "sandbox_id": str(status.get("sandboxId") or target.sandbox_id),
            "plan_id": target.plan_id,
            "phase": str(spec.get("phase") or ""),
            "snapshot_path": snapshot_path,
            "created_at": str(status.get("createdAt") or "") or None,
            "metadata": metadata,
        },
    )
