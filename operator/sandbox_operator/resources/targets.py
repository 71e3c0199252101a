"""The executor's view of Sandbox and Checkpoint objects: the one translation from a custom
resource's body to what the executors act on.

``target_from_body`` (a Sandbox -> :class:`SandboxTarget`) serves every resource: the Sandbox
logic, the Checkpoint logic (the Sandbox it snapshots) and the PlanCommit logic (the plan's
Sandboxes). ``checkpoint_info_from_body`` (a Ready Checkpoint -> :class:`CheckpointInfo`)
serves a Sandbox's restore request. Here, below the three, none of them imports another for it.

Input is the spec and the object's uid, never the status: whoever may patch a Sandbox's status
must not steer the operator. The core sandbox id is derived from the uid (``status.sandboxId``
is ignored), the workspace Pod is found by its owner (``status.workspacePod`` is ignored), and
``status.coreRecord`` is used only when it describes this Sandbox and keeps every path inside
its own sandbox directory (:func:`trusted_core_record`). Every path of the spec is checked
here again, not only by the CRD's CEL rules (:func:`check_paths`): an object written past the
API server's validation, or by an older CRD, is refused with a clear condition.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from kubernetes.client.exceptions import ApiException

from sandbox_api import core_record
from sandbox_api.models import SandboxSpec, WorkspaceSpec
from sandbox_core.agent import wire
from sandbox_core.redaction import is_dsn
from sandbox_operator.errors import PermanentError, TemporaryError
from sandbox_operator.executors.base import (
    CheckpointInfo,
    ForkRef,
    SandboxTarget,
    sandbox_id_for_uid,
)
from sandbox_operator.executors.pod_manifests import SANDBOX_ROOT, SOURCE_MOUNT
from sandbox_operator.kube import redaction
from sandbox_operator.kube.api import Api
from sandbox_operator.settings import Settings

logger = logging.getLogger("sandbox_operator.targets")


def _dotdot(path: str) -> bool:
    return ".." in PurePosixPath(path).parts


def check_paths(spec: SandboxSpec, settings: Settings) -> None:
    """Refuse a spec path the operator must not use (the CRD's CEL rules, checked again, plus
    the operator's own roots).

    - ``persistentVolumeClaim.subPath``: relative, no ``..`` component, no NUL.
    - ``nodePath``: absolute, no ``..`` component, no NUL; not inside the operator's own
      ``state_dir`` or ``sandbox_root`` (nor one of them inside it); and, when
      ``settings.node_path_roots`` is set, inside one of those roots.

    Raises:
        PermanentError: the path is refused; the message names the field and the rule.
    """
    pvc = spec.source.persistent_volume_claim
    if pvc is not None and pvc.sub_path:
        sub = pvc.sub_path
        if sub.startswith("/") or _dotdot(sub) or "\0" in sub:
            raise PermanentError(
                f"source.persistentVolumeClaim.subPath {sub!r} refused: it must be a relative "
                "path without '..'"
            )
    node = spec.source.node_path
    if node is None:
        return
    if not node.startswith("/") or _dotdot(node) or "\0" in node:
        raise PermanentError(
            f"source.nodePath {node!r} refused: it must be an absolute path without '..'"
        )
    path = PurePosixPath(posixpath.normpath(node))
    for own in (settings.state_dir, settings.sandbox_root):
        mine = PurePosixPath(posixpath.normpath(str(own)))
        if path == mine or path.is_relative_to(mine) or mine.is_relative_to(path):
            raise PermanentError(
                f"source.nodePath {node!r} refused: it overlaps the operator's own directory {mine}"
            )
    roots = [PurePosixPath(posixpath.normpath(r)) for r in settings.node_path_roots]
    if roots and not any(path.is_relative_to(root) for root in roots):
        raise PermanentError(
            f"source.nodePath {node!r} refused: it is outside the allowed roots "
            f"({', '.join(str(r) for r in roots)}; SANDBOX_OPERATOR_NODE_PATH_ROOTS)"
        )


def _paths_in(value: Any, skip: frozenset[str]) -> list[str]:
    """Every absolute-path string in ``value`` (nested dicts and lists), keys in ``skip``
    excepted."""
    if isinstance(value, str):
        return [value] if value.startswith("/") else []
    if isinstance(value, Mapping):
        return [p for k, v in value.items() if k not in skip for p in _paths_in(v, skip)]
    if isinstance(value, list):
        return [p for item in value for p in _paths_in(item, skip)]
    return []


def trusted_core_record(
    record: dict[str, Any] | None,
    *,
    sandbox_id: str,
    spec: SandboxSpec,
    original: str,
    settings: Settings,
) -> dict[str, Any] | None:
    """``record`` (a decoded ``status.coreRecord``) when it describes this Sandbox, else None.

    It must name the derived ``sandbox_id``, the spec's strategy, resource and plan, this
    executor's sandbox root (``options.sandbox_root``), and every absolute path in its options
    and context must lie inside ``<sandbox root>/<kind>/<sandbox_id>``, or be the original, its
    ``.git``, or a path under the original that names the sandbox id (a git worktree's
    registration). A record that fails is ignored (logged): the core's cleanup never steers by
    it.
    """
    if not record:
        return None
    root = PurePosixPath(
        str(settings.sandbox_root) if settings.executor == "local" else SANDBOX_ROOT
    )
    context = record.get("context") or {}
    problems = []
    if (
        record.get("sandbox_id") != sandbox_id
        or context.get("sandbox_id", sandbox_id) != sandbox_id
    ):
        problems.append("sandbox id")
    if record.get("strategy") != spec.strategy:
        problems.append("strategy")
    if (
        record.get("resource_id") != spec.resource_id
        or context.get("resource_id", spec.resource_id) != spec.resource_id
    ):
        problems.append("resource id")
    if context.get("plan_id", spec.plan_id) != spec.plan_id:
        problems.append("plan id")
    options = record.get("options") or {}
    if not isinstance(options, Mapping) or options.get("sandbox_root", str(root)) != str(root):
        problems.append("sandbox root")
    skip = frozenset({"original_path"})
    base = PurePosixPath(posixpath.normpath(original)) if original.startswith("/") else None
    for path in _paths_in(options, skip | {"sandbox_root"}) + _paths_in(context, skip):
        pure = PurePosixPath(posixpath.normpath(path))
        own = pure.is_relative_to(root) and sandbox_id in pure.relative_to(root).parts[:2]
        # In the original: itself, its repository's .git, or something named by this id.
        in_original = (
            base is not None
            and pure.is_relative_to(base)
            and (pure in (base, base / ".git") or sandbox_id in pure.relative_to(base).parts)
        )
        if not (own or in_original) or _dotdot(path):
            problems.append(f"path {path}")
    if problems:
        logger.warning(
            "status.coreRecord ignored: it does not describe sandbox %s (%s)",
            sandbox_id,
            ", ".join(problems),
        )
        return None
    return record


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
            executor), names nothing, or a path is refused (:func:`check_paths`); the Secret's
            value is not a DSN (the message names the Secret and key, never the value).
    """
    check_paths(spec, settings)
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


def target_from_body(
    body: Mapping[str, Any],
    settings: Settings,
    api: Api | None,
    *,
    for_deletion: bool = False,
) -> SandboxTarget:
    """Build the executor's view of one Sandbox object from its spec and uid (module
    docstring: the status is not input, but a verified ``coreRecord``).

    ``for_deletion``: deleting a Sandbox never waits for another object, so a fork's parent is
    not checked (it may be gone, or never have fitted); a source that cannot be resolved any
    more (its Secret gone, or holding no DSN) is the caller's to handle
    (:func:`refused_spec_target`).
    A fork not made yet (no ``status.coreRecord``) has its parent checked
    (:func:`resolve_fork`); once made, the parent is never looked at again (its record, even
    one not trusted here, says it was made).

    Raises:
        PermanentError: the spec is invalid for this operator, or a path is refused.
    """
    metadata = body["metadata"]
    try:
        spec = SandboxSpec.model_validate(dict(body.get("spec") or {}))
    except ValueError as exc:
        raise PermanentError(f"invalid Sandbox spec: {exc}") from exc
    status = dict(body.get("status") or {})
    sandbox_id = sandbox_id_for_uid(str(metadata["uid"]))
    original = resolve_original(spec, str(metadata.get("namespace") or ""), settings, api)
    try:
        record = core_record.decode(status.get("coreRecord"), original)
    except core_record.CoreRecordVersionError as exc:
        raise PermanentError(str(exc)) from exc
    record = trusted_core_record(
        record, sandbox_id=sandbox_id, spec=spec, original=original, settings=settings
    )
    fork = None
    made = bool(status.get("coreRecord"))  # mirrored once made, trusted here or not
    if not for_deletion and spec.source.from_checkpoint is not None and not made:
        fork = resolve_fork(spec, str(metadata.get("namespace") or "default"), api)
    return SandboxTarget(
        fork=fork,
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
        workspace=spec.workspace.merged_over(workspace_defaults(settings)),
    )


def refused_spec_target(body: Mapping[str, Any]) -> SandboxTarget:
    """The target a Sandbox is deleted by when :func:`target_from_body` refuses its spec now:
    the spec no longer validates, or a path is refused (e.g. outside ``NODE_PATH_ROOTS`` after
    the operator restarted with other roots), or its source does not fit the executor.

    Only the sandbox id (derived from the uid) steers the cleanup: no original and no
    ``status.coreRecord``, so the executor removes exactly what its own record of that id names
    (the local executor's state directory, the agent's store), never a path of the refused spec.
    A Sandbox refused from the start made nothing, and nothing is removed. The spec's names are
    copied for logs only, best effort.
    """
    metadata = body["metadata"]
    raw = body.get("spec")
    spec: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    return SandboxTarget(
        name=str(metadata["name"]),
        namespace=str(metadata.get("namespace") or "default"),
        uid=str(metadata["uid"]),
        sandbox_id=sandbox_id_for_uid(str(metadata["uid"])),
        plan_id=str(spec.get("planId") or ""),
        resource_id=str(spec.get("resourceId") or ""),
        strategy=str(spec.get("strategy") or ""),
        original="",
    )


class ForkRefusedError(PermanentError):
    """A fork whose parent or Checkpoint can never fit it (condition reason ``ForkRefused``)."""


def resolve_fork(spec: SandboxSpec, namespace: str, api: Api | None) -> ForkRef:
    """Check ``spec.source.fromCheckpoint`` against the parent Sandbox and its Checkpoint, in
    ``namespace`` (docs/forks.md), before the fork is made. Only then: once made, the fork
    never looks at its parent again, so deleting the parent leaves it working.

    Raises:
        ForkRefusedError: the parent has another plan, strategy or original, or the
            Checkpoint is of another Sandbox.
        TemporaryError: the parent or the Checkpoint does not exist yet, or the Checkpoint is
            not Ready.
    """
    wanted = spec.source.from_checkpoint
    assert wanted is not None
    if api is None:
        raise ForkRefusedError("forking a Sandbox needs the API to find its parent")
    try:
        parent = api.get("sandboxes", namespace, wanted.sandbox)
        checkpoint = api.get("checkpoints", namespace, wanted.checkpoint)
    except ApiException as exc:
        if exc.status == 404:
            raise TemporaryError(
                f"waiting for Sandbox {wanted.sandbox} and Checkpoint {wanted.checkpoint} "
                f"in namespace {namespace} (source.fromCheckpoint)",
                delay=5,
            ) from exc
        raise
    try:
        parent_spec = SandboxSpec.model_validate(dict(parent.get("spec") or {}))
    except ValueError as exc:
        raise ForkRefusedError(f"parent {wanted.sandbox} is invalid: {exc}") from exc
    differences = [
        field
        for field, mine, theirs in (
            ("planId", spec.plan_id, parent_spec.plan_id),
            ("strategy", spec.strategy, parent_spec.strategy),
            ("source", spec.source.original(), parent_spec.source.original()),
        )
        if mine != theirs
    ]
    if differences:
        raise ForkRefusedError(
            f"Sandbox {wanted.sandbox} is not a parent this Sandbox can fork: "
            f"its {', '.join(differences)} differ; a fork has its parent's plan, strategy and "
            "original"
        )
    if str((checkpoint.get("spec") or {}).get("sandboxName") or "") != wanted.sandbox:
        raise ForkRefusedError(
            f"Checkpoint {wanted.checkpoint} is not a checkpoint of Sandbox {wanted.sandbox}"
        )
    checkpoint_id = str((checkpoint.get("status") or {}).get("checkpointId") or "")
    if not checkpoint_id:
        raise TemporaryError(
            f"waiting for Checkpoint {wanted.checkpoint} to be Ready (source.fromCheckpoint)",
            delay=5,
        )
    return ForkRef(
        parent_sandbox_id=sandbox_id_for_uid(str(parent["metadata"]["uid"])),
        checkpoint_id=checkpoint_id,
        parent_name=wanted.sandbox,
        parent_uid=str(parent["metadata"]["uid"]),
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
    """The snapshot a Ready Checkpoint object stands for (enough for the core to restore it).

    The sandbox id and ``sandbox_path`` are the Sandbox's own (``target``), never the
    Checkpoint's status or spec metadata; the executor checks the rest against what it keeps
    (``LocalExecutor._check_own_checkpoint``)."""
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
    metadata.pop("sandbox_path", None)  # the Sandbox's own, never the Checkpoint's spec
    if sandbox_path:
        metadata["sandbox_path"] = sandbox_path
    return CheckpointInfo(
        checkpoint_id=str(status.get("checkpointId") or ""),
        sandbox_id=target.sandbox_id,
        snapshot_location=snapshot,
        kind=kind,
        created_at=str(status.get("createdAt") or ""),
        extra={
            "checkpoint_id": str(status.get("checkpointId") or ""),
            "sandbox_id": target.sandbox_id,
            "plan_id": target.plan_id,
            "phase": str(spec.get("phase") or ""),
            "snapshot_path": snapshot_path,
            "created_at": str(status.get("createdAt") or "") or None,
            "metadata": metadata,
        },
    )
