"""Pure logic shared by the sync and the async client: manifests, names, wait predicates and
the state of a list-then-watch wait (:class:`Waiter`).

Nothing here does I/O, so both APIs behave the same and the rules are tested without a cluster.
A *predicate* takes the current objects of a watch (name -> raw object) and returns a value when
the wait is over, ``None`` to keep waiting, or raises the typed error that ends it.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, Generic, TypeAlias, TypeVar

from sandbox_api.models import (
    CheckpointRef,
    PlanCheckSpec,
    PlanCommitApproval,
    WorkspaceSpec,
    dump,
)
from sandbox_client.errors import NotFoundError, RefusedError, WaitTimeoutError, error_for
from sandbox_client.models import (
    API_VERSION,
    CREATED_BY_ANNOTATION,
    PLAN_LABEL,
    CheckpointInfo,
    CheckpointSpec,
    Condition,
    Identity,
    PlanCommitAction,
    PlanCommitPhase,
    PlanCommitResult,
    PlanCommitSpec,
    PlanReview,
    SandboxInfo,
    SandboxOptions,
    SandboxPhase,
    SandboxSource,
    SandboxSpec,
    find,
)

T = TypeVar("T")
Objects: TypeAlias = Mapping[str, dict[str, Any]]
Predicate = Callable[[Objects], T | None]

_DNS_MAX = 63
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
SourceLike: TypeAlias = SandboxSource | Mapping[str, Any] | str | PurePosixPath


def dns_name(*parts: str) -> str:
    """A DNS-1123 label (<= 63 chars) made of ``parts`` joined by ``-``.

    Lowercased, other characters replaced by ``-``; when that changed or shortened anything, an
    8-hex-digit hash of the input is appended so two different inputs never share a name.
    """
    wanted = "-".join(parts)
    clean = re.sub(r"[^a-z0-9-]+", "-", wanted.lower()).strip("-") or "x"
    if clean == wanted and len(clean) <= _DNS_MAX:
        return clean
    digest = hashlib.sha256(wanted.encode()).hexdigest()[:8]
    return f"{clean[: _DNS_MAX - 9].rstrip('-')}-{digest}"


def source_model(source: SourceLike) -> SandboxSource:
    """``SandboxSource`` from a model, a CRD-shaped mapping or a path (-> ``nodePath``).

    Raises:
        RefusedError: reason ``InvalidSpec``, the mapping does not validate.
    """
    if isinstance(source, SandboxSource):
        return source
    if isinstance(source, str | PurePosixPath) or hasattr(source, "__fspath__"):
        return SandboxSource(node_path=str(source))
    try:
        return SandboxSource.model_validate(dict(source))
    except ValueError as exc:
        raise RefusedError("InvalidSpec", f"source: {exc}") from exc


def sandbox_manifest(
    name: str,
    plan_id: str,
    resource_id: str,
    strategy: str,
    source: SourceLike,
    *,
    options: SandboxOptions | Mapping[str, Any] | None = None,
    workspace: Mapping[str, Any] | None = None,
    ttl_seconds_after_finished: int | None = None,
) -> dict[str, Any]:
    """The Sandbox object to create, its spec validated by the operator's ``SandboxSpec``.

    ``workspace`` is passed through as ``spec.workspace`` (the pod executor's Pod shape); the
    API server refuses it while the installed CRD does not declare that field.

    Raises:
        RefusedError: reason ``InvalidSpec``, the spec does not validate.
    """
    try:
        spec = SandboxSpec(
            plan_id=plan_id,
            resource_id=resource_id,
            strategy=strategy,
            source=source_model(source),
            options=SandboxOptions.model_validate(dict(options or {}))
            if not isinstance(options, SandboxOptions)
            else options,
            ttl_seconds_after_finished=ttl_seconds_after_finished,
        )
        if workspace is not None:
            WorkspaceSpec.model_validate(dict(workspace))  # refused here, not by the server
    except ValueError as exc:
        raise RefusedError("InvalidSpec", str(exc)) from exc
    body = dump(spec)
    # Send only what the engine asked for: the server's defaults fill in the rest.
    body.pop("suspend", None)
    body.pop("workspace", None)
    if workspace is not None:
        body["workspace"] = dict(workspace)
    metadata: dict[str, Any] = {"name": name}
    if _LABEL_VALUE.match(plan_id):
        metadata["labels"] = {PLAN_LABEL: plan_id}
    return {"apiVersion": API_VERSION, "kind": "Sandbox", "metadata": metadata, "spec": body}


def checkpoint_manifest(
    sandbox: str, phase: str, metadata: Mapping[str, str] | None, name: str | None
) -> dict[str, Any]:
    """The Checkpoint object to create (``generateName`` ``<sandbox>-`` unless ``name``)."""
    spec = CheckpointSpec(sandbox_name=sandbox, phase=phase, metadata=dict(metadata or {}))
    meta: dict[str, Any] = {"name": name} if name else {"generateName": f"{sandbox[:50]}-"}
    return {"apiVersion": API_VERSION, "kind": "Checkpoint", "metadata": meta, "spec": dump(spec)}


def plancommit_manifest(
    plan_id: str,
    action: PlanCommitAction,
    message: str | None,
    cleanup_policy: str = "Retain",
    *,
    approval_required: bool = False,
    mode: str | None = None,
    created_by: str | None = None,
    sandboxes: Sequence[str] | None = None,
    checks: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The PlanCommit object to create (``generateName`` ``<plan>-commit-`` / ``-rollback-``);
    with ``approval_required`` it stops at ``AwaitingApproval`` after its review, ``mode``
    (``"TwoPhase"`` | ``"Saga"``) chooses the protocol (unset: the operator's default,
    TwoPhase), ``created_by`` names the creator in the annotation the approval policy checks
    (the requester's own user name: docs/approvals.md), ``sandboxes`` names the Sandboxes to
    commit (the others are discarded) and ``checks`` the pre-commit checks (``{"name",
    "sandbox", "command": [...], "timeoutSeconds"}``; docs/forks.md). Only the fields given
    are sent.

    Raises:
        RefusedError: reason ``InvalidSpec``, a check is malformed.
    """
    fields: dict[str, Any] = {
        "plan_id": plan_id,
        "action": action,
        "message": message,
        "cleanup_policy": cleanup_policy,
    }
    if approval_required:
        fields["approval"] = PlanCommitApproval.REQUIRED
    if mode is not None:
        fields["mode"] = mode
    if sandboxes is not None:
        fields["sandboxes"] = list(sandboxes)
    try:
        if checks:
            fields["checks"] = [PlanCheckSpec.model_validate(dict(c)) for c in checks]
        spec = PlanCommitSpec(**fields)
    except ValueError as exc:
        raise RefusedError("InvalidSpec", str(exc)) from exc
    verb = "commit" if action is PlanCommitAction.COMMIT else "rollback"
    meta: dict[str, Any] = {"generateName": f"{dns_name(plan_id)[:40]}-{verb}-"}
    if created_by:
        meta["annotations"] = {CREATED_BY_ANNOTATION: created_by}
    # Only the fields set here: mode and approval keep the server's defaults.
    body = spec.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, mode="json")
    return {"apiVersion": API_VERSION, "kind": "PlanCommit", "metadata": meta, "spec": body}


def request_id() -> str:
    """A fresh id for ``spec.rollbackRequest`` / ``spec.restoreRequest``."""
    return uuid.uuid4().hex


# -- predicates ---------------------------------------------------------------------------------


def _failure(conditions: list[Condition], *types: str) -> tuple[str, str]:
    for type_ in types:
        found = find(conditions, type_)
        if found is not None and found.reason:
            return found.reason, found.message
    return "Failed", "no condition says why"


def sandbox_ready(name: str) -> Predicate[SandboxInfo]:
    """Done when Sandbox ``name`` is Active with Ready=True.

    Raises (from the predicate): ``NotFoundError`` when it is deleted while waiting; the typed
    error of its Degraded condition when it is Errored; ``RefusedError`` (``InvalidState``) when
    it is already Committed, RolledBack or CleanedUp.
    """

    def check(objects: Objects) -> SandboxInfo | None:
        obj = objects.get(name)
        if obj is None:
            return None
        info = SandboxInfo.from_object(obj)
        if info.deleting:
            raise NotFoundError("NotFound", f"sandbox {name} is being deleted")
        if info.phase is SandboxPhase.ACTIVE and info.ready:
            return info
        if info.phase is SandboxPhase.ERRORED:
            raise error_for(*_failure(info.conditions, "Degraded", "Ready"))
        if info.phase in (
            SandboxPhase.COMMITTED,
            SandboxPhase.ROLLED_BACK,
            SandboxPhase.CLEANED_UP,
        ):
            raise RefusedError("InvalidState", f"sandbox {name} is {info.phase.value}")
        return None

    return check


def all_ready(names: list[str]) -> Predicate[list[SandboxInfo]]:
    """Done when every Sandbox in ``names`` is ready (errors as :func:`sandbox_ready`)."""
    checks = [sandbox_ready(n) for n in names]

    def check(objects: Objects) -> list[SandboxInfo] | None:
        found = [c(objects) for c in checks]
        ready = [f for f in found if f is not None]
        return ready if len(ready) == len(found) else None

    return check


def describe_sandboxes(objects: Objects, names: list[str]) -> str:
    """Last state of ``names`` for a timeout message (phase and the latest failure, if any)."""
    parts = []
    for name in names:
        obj = objects.get(name)
        if obj is None:
            parts.append(f"{name}: not seen")
            continue
        info = SandboxInfo.from_object(obj)
        degraded = find(info.conditions, "Degraded")
        extra = (
            f" ({degraded.reason}: {degraded.message})"
            if degraded is not None and degraded.status == "True"
            else ""
        )
        parts.append(f"{name}: {info.phase.value if info.phase else 'no phase'}{extra}")
    return "; ".join(parts)


def checkpoint_ready(name: str) -> Predicate[CheckpointInfo]:
    """Done when Checkpoint ``name`` is Ready; its Ready condition's error when Failed."""

    def check(objects: Objects) -> CheckpointInfo | None:
        obj = objects.get(name)
        if obj is None:
            return None
        info = CheckpointInfo.from_object(obj)
        if info.phase == "Ready":
            return info
        if info.phase == "Failed":
            raise error_for(*_failure(info.conditions, "Ready"))
        return None

    return check


def request_served(
    name: str, status_key: str, condition_type: str, request: str
) -> Predicate[SandboxInfo]:
    """Done when Sandbox ``name`` reports ``status[status_key] == request`` (a rollback or
    restore request id) and ``condition_type`` is True; its typed error when that is False."""

    def check(objects: Objects) -> SandboxInfo | None:
        obj = objects.get(name)
        if obj is None:
            return None
        if (obj.get("status") or {}).get(status_key) != request:
            return None
        info = SandboxInfo.from_object(obj)
        condition = find(info.conditions, condition_type)
        if condition is None:
            return None
        if condition.status == "True":
            return info
        raise error_for(condition.reason or "Failed", condition.message)

    return check


def plancommit_done(name: str) -> Predicate[PlanCommitResult]:
    """Done when PlanCommit ``name`` reached a terminal phase (whatever the outcome)."""

    def check(objects: Objects) -> PlanCommitResult | None:
        obj = objects.get(name)
        if obj is None:
            return None
        result = PlanCommitResult.from_object(obj)
        return result if result.done else None

    return check


def awaiting_approval(plan_id: str, objects: Objects) -> dict[str, Any] | None:
    """The newest PlanCommit of ``plan_id`` that waits for an approval (``approval: Required``
    and not terminal), or None."""
    waiting = []
    for obj in objects.values():
        spec = PlanCommitSpec.model_validate(obj.get("spec") or {})
        phase = PlanCommitPhase((obj.get("status") or {}).get("phase") or "Pending")
        if spec.plan_id == plan_id and spec.approval_required and not phase.is_terminal:
            waiting.append(obj)
    waiting.sort(key=lambda o: str(o["metadata"].get("creationTimestamp") or ""))
    return waiting[-1] if waiting else None


def plancommit_reviewed(name: str) -> Predicate[PlanReview]:
    """Done when PlanCommit ``name`` shows its review (``status.review``) and has left
    ``Pending`` (``AwaitingApproval`` when it waits for the approval).

    Raises (from the predicate): ``NotFoundError`` when it is deleted; the typed error of its
    ``Reviewed`` (or ``Committed``) condition when it ended without a review.
    """

    def check(objects: Objects) -> PlanReview | None:
        obj = objects.get(name)
        if obj is None:
            return None
        review = PlanReview.from_object(obj)
        # The operator writes the review, then the phase: a review is shown once the
        # PlanCommit moved past Pending (waiting, or already deciding with an approval).
        if review is not None and review.phase is not PlanCommitPhase.PENDING:
            return review
        result = PlanCommitResult.from_object(obj)
        if result.done:
            raise error_for(*_failure(result.conditions, "Reviewed", "Committed"))
        return None

    return check


def plancommit_validated(name: str) -> Predicate[list[dict[str, Any]]]:
    """Done when PlanCommit ``name`` recorded its checks (``status.validation``) and moved on:
    to its review (checks passed) or to its end (a check failed, ``ValidationFailed``).

    Raises (from the predicate): ``NotFoundError`` when it is deleted; the typed error of its
    ``Committed`` condition when it ended without checks.
    """

    def check(objects: Objects) -> list[dict[str, Any]] | None:
        obj = objects.get(name)
        if obj is None:
            return None
        status = obj.get("status") or {}
        result = PlanCommitResult.from_object(obj)
        moved_on = result.done or bool((status.get("review") or {}).get("digest"))
        if result.validation and moved_on:
            return result.validation
        if result.done:
            raise error_for(*_failure(result.conditions, "Reviewed", "Committed"))
        return None

    return check


def fork_manifest(
    parent: SandboxInfo, name: str, checkpoint: str, resource_id: str | None = None
) -> dict[str, Any]:
    """The Sandbox that starts from Checkpoint ``checkpoint`` of ``parent``: its plan,
    strategy, original and options, ``spec.source.fromCheckpoint`` added (docs/forks.md)."""
    source = parent.spec.source.model_copy(
        update={"from_checkpoint": CheckpointRef(sandbox=parent.name, checkpoint=checkpoint)}
    )
    return sandbox_manifest(
        name,
        parent.spec.plan_id,
        resource_id or name,
        parent.spec.strategy,
        source,
        options=parent.spec.options,
    )


def all_gone(names: list[str]) -> Predicate[bool]:
    """Done when none of ``names`` exists any more."""

    def check(objects: Objects) -> bool | None:
        return True if not any(n in objects for n in names) else None

    return check


def plan_sandboxes(items: list[dict[str, Any]], plan_id: str) -> list[SandboxInfo]:
    """The Sandboxes of ``plan_id`` among ``items``, sorted by name (spec.planId decides)."""
    out = [SandboxInfo.from_object(o) for o in items]
    return sorted((s for s in out if s.spec.plan_id == plan_id), key=lambda s: s.name)


def plancommit_progress(
    name: str, on_progress: Callable[[PlanCommitResult], None] | None
) -> Predicate[PlanCommitResult]:
    """:func:`plancommit_done` that also calls ``on_progress`` with every state of ``name``."""
    done = plancommit_done(name)

    def check(objects: Objects) -> PlanCommitResult | None:
        if on_progress is not None and name in objects:
            on_progress(PlanCommitResult.from_object(objects[name]))
        return done(objects)

    return check


def approval_target(plan_id: str, items: list[dict[str, Any]]) -> str:
    """Name of the PlanCommit of ``plan_id`` waiting for an approval (see
    :func:`awaiting_approval`) among ``items``.

    Raises:
        NotFoundError: none waits (the engine must call ``review`` first).
    """
    waiting = awaiting_approval(plan_id, {o["metadata"]["name"]: o for o in items})
    if waiting is None:
        raise NotFoundError(
            "NotFound", f"no PlanCommit of plan {plan_id} is waiting for an approval"
        )
    return str(waiting["metadata"]["name"])


DECISIONS = ("Approve", "Reject")


def decision_entry(
    identity: Identity, digest: str, decision: str, comment: str | None = None
) -> dict[str, Any]:
    """The ``spec.approvals`` entry recording ``identity``'s ``decision`` (``Approve`` or
    ``Reject``) on ``digest``: the user, uid (when it has one) and every group exactly as the
    API server authenticated them, which is what the approval policy admits.

    Raises:
        RefusedError: ``Invalid``, an unknown decision or a digest that is not
            ``sha256:`` + 64 hex.
    """
    if decision not in DECISIONS:
        raise RefusedError("Invalid", f"decision {decision!r}: use Approve or Reject")
    if not _DIGEST.fullmatch(digest):
        raise RefusedError("Invalid", f"digest {digest!r}: expected sha256:<64 hex>")
    entry: dict[str, Any] = {"digest": digest, "decision": decision, "user": identity.user}
    if identity.uid:
        entry["uid"] = identity.uid
    if identity.groups:
        entry["groups"] = list(identity.groups)
    if comment:
        entry["comment"] = comment
    return entry


def decision_patch(obj: Mapping[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The merge patch appending ``entry`` to ``spec.approvals`` of the PlanCommit ``obj`` as
    read: it names ``obj``'s resourceVersion, so a decision written meanwhile makes the API
    server answer 409 Conflict (read again and retry) instead of being lost.

    Raises:
        RefusedError: ``InvalidState`` when ``obj`` is not waiting for an approval or
            ``entry``'s digest is not its reviewed one (a stale entry would stay recorded
            forever); ``AlreadyDecided`` when that user already decided on that digest.
    """
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    name = meta.get("name")
    reviewed = str((status.get("review") or {}).get("digest") or "")
    if status.get("phase") != PlanCommitPhase.AWAITING_APPROVAL.value:
        raise RefusedError(
            "InvalidState", f"PlanCommit {name} is {status.get('phase') or 'Pending'}, "
            "not AwaitingApproval",
        )  # fmt: skip
    if entry["digest"] != reviewed:
        raise RefusedError(
            "DigestMismatch",
            f"PlanCommit {name} reviewed digest {reviewed}, not {entry['digest']}: review again",
        )
    current = list((obj.get("spec") or {}).get("approvals") or [])
    for known in current:
        if (known.get("user"), known.get("digest")) == (entry["user"], entry["digest"]):
            raise RefusedError(
                "AlreadyDecided",
                f"{entry['user']} already decided {known.get('decision')} on {entry['digest']}",
            )
    return {
        "metadata": {"resourceVersion": meta.get("resourceVersion")},
        "spec": {"approvals": [*current, entry]},
    }


def decision_seen(name: str, user: str, digest: str) -> Predicate[PlanCommitResult]:
    """Done when PlanCommit ``name`` finished, or when its operator judged ``user``'s decision
    on ``digest`` (a ``status.approvals`` row) as not counting (``counted`` false: the
    creator, a forbidden approver, ...), or as counting while more are needed: the
    ``Approved`` condition says ``AwaitingApproval`` for the current generation (the spec with
    that decision), so a decision that completes the approvals waits for the commit's
    outcome."""
    done = plancommit_done(name)

    def check(objects: Objects) -> PlanCommitResult | None:
        finished = done(objects)
        if finished is not None or name not in objects:
            return finished
        obj = objects[name]
        rows = (obj.get("status") or {}).get("approvals") or []
        mine = [r for r in rows if (r.get("user"), r.get("digest")) == (user, digest)]
        if not mine:
            return None
        result = PlanCommitResult.from_object(obj)
        if mine[0].get("counted") is False:
            return result
        approved = result.condition("Approved")
        generation = (obj.get("metadata") or {}).get("generation")
        if (
            approved is not None
            and approved.reason == "AwaitingApproval"
            and approved.observed_generation == generation
        ):
            return result
        return None

    return check


def pending_reviews(items: list[dict[str, Any]], plan_id: str | None = None) -> list[PlanReview]:
    """The reviews of the PlanCommits among ``items`` that wait for approvals (phase
    ``AwaitingApproval``, of ``plan_id`` only when given), oldest first."""
    found = []
    for obj in items:
        review = PlanReview.from_object(obj)
        if review is None or review.phase is not PlanCommitPhase.AWAITING_APPROVAL:
            continue
        if plan_id is None or review.plan_id == plan_id:
            found.append((str(obj["metadata"].get("creationTimestamp") or ""), review))
    return [review for _, review in sorted(found, key=lambda pair: (pair[0], pair[1].plancommit))]


class Waiter(Generic[T]):
    """The state of one list-then-watch wait, without the I/O (both clients drive it).

    Args:
        check: the predicate (see the module docstring).
        timeout: seconds from now.
        what: what is awaited, for the timeout message.
        name: watch only this object (a field selector).
        describe: the last state for the timeout message.
    """

    def __init__(
        self,
        check: Predicate[T],
        timeout: float,
        what: str,
        name: str | None = None,
        describe: Callable[[Objects], str] | None = None,
    ) -> None:
        self.check = check
        self.timeout = timeout
        self.what = what
        self.selector = f"metadata.name={name}" if name else ""
        self.describe = describe
        self.deadline = time.monotonic() + timeout
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = ""

    def listed(self, listing: Mapping[str, Any]) -> T | None:
        """Take a list reply (its items and resourceVersion); the predicate's verdict."""
        self.objects = {o["metadata"]["name"]: o for o in listing.get("items") or []}
        self.version = str(listing["metadata"]["resourceVersion"])
        return self.check(self.objects)

    def watch_arguments(self) -> dict[str, Any]:
        """Keyword arguments of the next watch (from the last version, until the deadline).

        Raises:
            WaitTimeoutError: the deadline passed (the message has the last state).
        """
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            detail = self.describe(self.objects) if self.describe else ""
            raise WaitTimeoutError(
                "Timeout", f"{self.what}: not done after {self.timeout:g}s. {detail}".strip()
            )
        return {
            "resource_version": self.version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": max(1, math.ceil(remaining)),
            "_request_timeout": remaining + 10,
            **({"field_selector": self.selector} if self.selector else {}),
        }

    def seen(self, event: Mapping[str, Any]) -> T | None:
        """Take one watch event; the predicate's verdict (None for a bookmark)."""
        obj = event["raw_object"]
        self.version = str(obj["metadata"]["resourceVersion"])
        if event["type"] == "BOOKMARK":
            return None
        if event["type"] == "DELETED":
            self.objects.pop(obj["metadata"]["name"], None)
        else:
            self.objects[obj["metadata"]["name"]] = obj
        return self.check(self.objects)

    @property
    def expired(self) -> bool:
        """True once the deadline passed."""
        return time.monotonic() >= self.deadline
