"""Typed views of the three custom resources, built on the operator's own models.

The spec models (``SandboxSpec``, ``SandboxSource``, ``CheckpointSpec``, ``PlanCommitSpec``,
``JournalStep``, ``StepResult``, phases) are imported from :mod:`sandbox_api.models`: the client
validates with exactly the definitions the operator validates with. That module imports only
pydantic and ``sandbox_core``, never kopf or kubernetes.
The classes below are read-only views of *status*, which the operator writes as plain dicts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from sandbox_api.models import (
    CHECKPOINT_PLURAL,
    CREATED_BY_ANNOTATION,
    GROUP,
    PLAN_LABEL,
    PLANCOMMIT_PLURAL,
    SANDBOX_PLURAL,
    VERSION,
    CheckpointSpec,
    JournalStep,
    PlanCommitAction,
    PlanCommitPhase,
    PlanCommitSpec,
    PvcSource,
    SandboxOptions,
    SandboxPhase,
    SandboxSource,
    SandboxSpec,
    SecretSource,
    StepResult,
    StepState,
)

__all__ = [
    "CHECKPOINT_PLURAL",
    "CREATED_BY_ANNOTATION",
    "GROUP",
    "PLANCOMMIT_PLURAL",
    "PLAN_LABEL",
    "SANDBOX_PLURAL",
    "VERSION",
    "AuditPage",
    "CheckpointInfo",
    "CheckpointSpec",
    "Condition",
    "EditResult",
    "ExecChunk",
    "ExecResult",
    "FileChange",
    "FileResult",
    "FileStat",
    "GlobEntry",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "HistoryEntry",
    "Identity",
    "JournalStep",
    "PlanCommitAction",
    "PlanCommitPhase",
    "PlanCommitResult",
    "PlanCommitSpec",
    "PlanReview",
    "PvcSource",
    "RecordedDecision",
    "ReviewedSandbox",
    "SandboxInfo",
    "SandboxOptions",
    "SandboxPhase",
    "SandboxSource",
    "SandboxSpec",
    "SecretSource",
    "SqlResult",
    "StepResult",
    "StepState",
]

API_VERSION = f"{GROUP}/{VERSION}"


class _View(BaseModel):
    # defer_build: the validators are built on first use, not at import (``import
    # sandbox_client.client`` stays light; a view is built the first time an object is read).
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        defer_build=True,
    )


class Condition(_View):
    """One Kubernetes condition (shared/DESIGN.md, "Conditions").

    ``status`` is ``"True"``, ``"False"`` or ``"Unknown"``; ``last_transition_time`` RFC 3339.
    """

    type: str
    status: Literal["True", "False", "Unknown"] = "Unknown"
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int | None = None


def conditions_of(obj: dict[str, Any]) -> list[Condition]:
    """The ``status.conditions`` of a raw object as models (``[]`` when there are none)."""
    raw = (obj.get("status") or {}).get("conditions") or []
    return [Condition.model_validate(c) for c in raw]


def find(conditions: list[Condition], type_: str) -> Condition | None:
    """The condition of ``type_``, or None."""
    return next((c for c in conditions if c.type == type_), None)


class SandboxInfo(_View):
    """A Sandbox object as the client sees it: its spec (the operator's model) and status.

    ``sandbox_path`` is where writes go as the executor sees it (local executor: a path on the
    operator's host). ``raw`` is the object as the API server returned it (for ``-o json``).
    """

    name: str
    namespace: str
    spec: SandboxSpec
    phase: SandboxPhase | None = None
    ready: bool = False
    sandbox_id: str = ""
    sandbox_path: str = ""
    executor: str = ""
    workspace_pod: str = ""
    effective_strategy: str = ""
    strategy_mode: str = ""
    conditions: list[Condition] = Field(default_factory=list)
    created: str = ""
    deleting: bool = False
    raw: dict[str, Any] = Field(default_factory=dict, repr=False)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> SandboxInfo:
        """Build from a raw Sandbox object (a dict from the API server)."""
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        conditions = conditions_of(obj)
        ready = find(conditions, "Ready")
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            spec=SandboxSpec.model_validate(obj.get("spec") or {}),
            phase=SandboxPhase(status["phase"]) if status.get("phase") else None,
            ready=ready is not None and ready.status == "True",
            sandbox_id=str(status.get("sandboxId") or ""),
            sandbox_path=str(status.get("sandboxPath") or ""),
            executor=str(status.get("executor") or ""),
            workspace_pod=str(status.get("workspacePod") or ""),
            effective_strategy=str(status.get("effectiveStrategy") or ""),
            strategy_mode=str(status.get("strategyMode") or ""),
            conditions=conditions,
            created=str(meta.get("creationTimestamp") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            raw=obj,
        )

    @property
    def base_commit(self) -> str:
        """git_worktree only: the commit the sandbox branch started from ("" when unknown)."""
        record = (self.raw.get("status") or {}).get("coreRecord") or {}
        metadata = (record.get("context") or {}).get("metadata") or {}
        return str(metadata.get("base_commit") or "")


class CheckpointInfo(_View):
    """A Checkpoint object: ``phase`` is ``Pending``, ``Ready`` or ``Failed``; ``kind`` is
    ``git-tag``, ``upper-snapshot``, ``directory-snapshot`` or ``metadata-only``."""

    name: str
    namespace: str
    spec: CheckpointSpec
    phase: str = ""
    checkpoint_id: str = ""
    kind: str = ""
    created_at: str = ""
    conditions: list[Condition] = Field(default_factory=list)
    raw: dict[str, Any] = Field(default_factory=dict, repr=False)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> CheckpointInfo:
        """Build from a raw Checkpoint object."""
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            spec=CheckpointSpec.model_validate(obj.get("spec") or {}),
            phase=str(status.get("phase") or ""),
            checkpoint_id=str(status.get("checkpointId") or ""),
            kind=str(status.get("kind") or ""),
            created_at=str(status.get("createdAt") or meta.get("creationTimestamp") or ""),
            conditions=conditions_of(obj),
            raw=obj,
        )


class PlanCommitResult(_View):
    """Outcome of a PlanCommit (commit or rollback of a whole plan).

    ``committed`` is True only when every sandbox landed. After a failure,
    ``rolled_back_ids`` lists the core sandbox ids (ULIDs) whose changes were compensated,
    ``failed_rollback_ids`` those whose compensation failed (they need attention) and
    ``failed_sandbox_id`` the one whose commit failed. ``conditions`` are the PlanCommit's
    (``Committed``, ``RolledBack``, ``RollbackFailed``, ``Blocked``) with the operator's reasons and
    messages. ``done`` is False while the phase is not terminal (``commit(wait=False)``).
    """

    name: str
    namespace: str
    plan_id: str
    action: PlanCommitAction = PlanCommitAction.COMMIT
    phase: PlanCommitPhase = PlanCommitPhase.PENDING
    done: bool = False
    committed: bool = False
    rolled_back_ids: list[str] = Field(default_factory=list)
    failed_rollback_ids: list[str] = Field(default_factory=list)
    failed_sandbox_id: str = ""
    steps: list[JournalStep] = Field(default_factory=list)
    results: list[StepResult] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    validation: list[dict[str, Any]] = Field(default_factory=list)
    """``status.validation``: each pre-commit check's ``name``, ``sandbox``, ``command``,
    ``exitCode``, ``timedOut``, ``passed``, ``outputTail`` (docs/forks.md)."""
    discarded_sandboxes: list[str] = Field(default_factory=list)
    """The Sandboxes a commit naming ``sandboxes`` discarded."""
    raw: dict[str, Any] = Field(default_factory=dict, repr=False)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> PlanCommitResult:
        """Build from a raw PlanCommit object (any phase)."""
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        spec = PlanCommitSpec.model_validate(obj.get("spec") or {})
        phase = PlanCommitPhase(status.get("phase") or PlanCommitPhase.PENDING.value)
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            plan_id=spec.plan_id,
            action=spec.action,
            phase=phase,
            done=phase.is_terminal,
            committed=phase is PlanCommitPhase.COMMITTED,
            rolled_back_ids=list(status.get("rolledBackIds") or []),
            failed_rollback_ids=list(status.get("failedRollbackIds") or []),
            failed_sandbox_id=str(status.get("failedSandboxId") or ""),
            steps=[JournalStep.model_validate(s) for s in status.get("sandboxes") or []],
            results=[StepResult.model_validate(r) for r in status.get("results") or []],
            conditions=conditions_of(obj),
            validation=[dict(row) for row in status.get("validation") or []],
            discarded_sandboxes=list(status.get("discardedSandboxes") or []),
            raw=obj,
        )

    def condition(self, type_: str) -> Condition | None:
        """The condition of ``type_`` (e.g. ``"Committed"``), or None."""
        return find(self.conditions, type_)


class ReviewedSandbox(_View):
    """One sandbox's row of a plan review (``status.review.sandboxes[]``).

    Counts of files ``added``/``changed``/``deleted``; ``paths`` the first ones (each
    ``"A path"``, ``"M path"`` or ``"D path"``); ``lines_added``/``lines_removed`` of text;
    ``bytes`` of new content; ``statements`` of a database sandbox; ``conflicts`` that would
    refuse the commit now; ``digest`` (``"sha256:<hex>"``) of its exact changes.
    """

    name: str = ""
    sandbox_id: str = ""
    resource_id: str = ""
    strategy: str = ""
    digest: str = ""
    added: int = 0
    changed: int = 0
    deleted: int = 0
    paths: list[str] = Field(default_factory=list)
    lines_added: int = 0
    lines_removed: int = 0
    bytes: int = 0
    statements: int = 0
    conflicts: list[str] = Field(default_factory=list)


class Identity(_View):
    """Who the API server authenticates for a client's credentials (a SelfSubjectReview's
    ``status.userInfo``, what ``kubectl auth whoami`` prints): ``user`` name, ``uid`` (may be
    empty) and every group."""

    user: str
    uid: str = ""
    groups: list[str] = Field(default_factory=list)

    @classmethod
    def from_user_info(cls, info: dict[str, Any]) -> Identity:
        """From a ``userInfo`` mapping (``username``, ``uid``, ``groups``)."""
        return cls(
            user=str(info.get("username") or ""),
            uid=str(info.get("uid") or ""),
            groups=[str(g) for g in info.get("groups") or []],
        )


class RecordedDecision(_View):
    """One decision of ``spec.approvals`` with the operator's judgement of it when it has
    one (``status.approvals``): ``counted`` None until the operator saw it; ``reason`` why it
    does not count (``StaleDigest``, ``Creator``, ...); ``observed_at`` RFC 3339."""

    user: str
    digest: str
    decision: str
    comment: str = ""
    counted: bool | None = None
    reason: str = ""
    observed_at: str = ""


def recorded_decisions(obj: dict[str, Any]) -> list[RecordedDecision]:
    """Every entry of ``spec.approvals`` of the raw PlanCommit ``obj``, in order, joined with
    the operator's ``status.approvals`` row of the same user, digest and decision."""
    judged = {
        (str(r.get("user")), str(r.get("digest")), str(r.get("decision"))): r
        for r in (obj.get("status") or {}).get("approvals") or []
    }
    out = []
    for entry in (obj.get("spec") or {}).get("approvals") or []:
        key = (str(entry.get("user")), str(entry.get("digest")), str(entry.get("decision")))
        row = judged.get(key) or {}
        out.append(
            RecordedDecision(
                user=key[0],
                digest=key[1],
                decision=key[2],
                comment=str(entry.get("comment") or ""),
                counted=row.get("counted") if row else None,
                reason=str(row.get("reason") or ""),
                observed_at=str(row.get("observedAt") or ""),
            )
        )
    return out


class PlanReview(_View):
    """The review of a plan, as a PlanCommit with ``approval: Required`` shows it
    (``status.review``). Approve it with its ``digest``: the commit then applies
    exactly these changes, or fails with ``ChangedSinceApproval`` touching nothing.

    ``plancommit`` names the PlanCommit waiting for the approval; ``phase`` is its phase
    (``AwaitingApproval`` while it waits); ``reviewed_at`` RFC 3339; ``truncated`` when the
    rows hold only the first paths of a sandbox. ``created_by`` the creator annotation;
    ``approvals`` every recorded decision (see :func:`recorded_decisions`); ``approved_by`` the
    users whose approvals count (``status.approvedBy``); ``required_approvals`` as asked in the
    spec (None: the administrator's minimum).
    """

    plancommit: str
    namespace: str
    plan_id: str
    phase: PlanCommitPhase = PlanCommitPhase.PENDING
    digest: str
    reviewed_at: str = ""
    truncated: bool = False
    has_conflicts: bool = False
    approved_digest: str | None = None
    created_by: str = ""
    required_approvals: int | None = None
    approved_by: list[str] = Field(default_factory=list)
    approvals: list[RecordedDecision] = Field(default_factory=list)
    sandboxes: list[ReviewedSandbox] = Field(default_factory=list)
    checks: list[dict[str, Any]] = Field(default_factory=list)
    """The pre-commit checks' results the digest binds (as ``status.validation``)."""
    conditions: list[Condition] = Field(default_factory=list)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> PlanReview | None:
        """Build from a raw PlanCommit object; None while it has no ``status.review``."""
        status = obj.get("status") or {}
        review = status.get("review") or {}
        if not review.get("digest"):
            return None
        meta = obj.get("metadata") or {}
        spec = PlanCommitSpec.model_validate(obj.get("spec") or {})
        return cls(
            plancommit=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            plan_id=spec.plan_id,
            phase=PlanCommitPhase(status.get("phase") or PlanCommitPhase.PENDING.value),
            digest=str(review["digest"]),
            reviewed_at=str(review.get("reviewedAt") or ""),
            truncated=bool(review.get("truncated")),
            has_conflicts=bool(review.get("hasConflicts")),
            approved_digest=spec.approved_digest,
            created_by=str((meta.get("annotations") or {}).get(CREATED_BY_ANNOTATION) or ""),
            required_approvals=spec.required_approvals,
            approved_by=[
                u.strip() for u in str(status.get("approvedBy") or "").split(",") if u.strip()
            ],
            approvals=recorded_decisions(obj),
            sandboxes=[ReviewedSandbox.model_validate(r) for r in review.get("sandboxes") or []],
            checks=[dict(row) for row in review.get("checks") or []],
            conditions=conditions_of(obj),
        )


class HistoryEntry(_View):
    """One line of a sandbox's history (``kubectl sandbox log``).

    ``kind``: ``commit``, ``rollback``, ``checkpoint``, ``restore`` or ``provision``;
    ``time`` RFC 3339; ``source`` the object the entry comes from (``PlanCommit/NAME``,
    ``Checkpoint/NAME``, ``Event/NAME``).
    """

    time: str
    kind: str
    source: str
    outcome: str
    message: str


# -- the actor's door: commands, files, search, SQL, audit (docs/actor.md, docs/actor-files.md) ---
#
# These are the agent's own JSON replies (snake_case on the wire) and the same dicts
# ``sandbox_core.actor`` returns on local paths, so one model reads both.


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class ExecResult(_Reply):
    """How a command ended, with its collected output.

    ``exit_code``: the exit status (``128 + N`` when ended by signal N, then ``signal`` is N);
    ``timed_out`` / ``cancelled``: killed at its timeout / cancelled; ``truncated``: a stream
    wrote more than ``max_output_bytes`` (the rest was dropped); ``stdout_bytes`` /
    ``stderr_bytes``: what it wrote in all (kept or dropped); ``duration_seconds``: start to
    exit; ``stdout`` / ``stderr``: the bytes kept; ``replayed``: the agent answered a retried
    request from its journal (the command did not run again; no output).
    """

    exec_id: str = ""
    exit_code: int
    signal: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    duration_seconds: float = 0.0
    stdout: bytes = b""
    stderr: bytes = b""
    replayed: bool = False

    @property
    def ok(self) -> bool:
        """The command exited with status 0."""
        return self.exit_code == 0


class ExecChunk(_Reply):
    """One event of a streamed command: ``kind`` is ``started`` (``exec_id``), ``stdout`` or
    ``stderr`` (``data``, in the order written), or ``exit`` (``result``, last)."""

    kind: Literal["started", "stdout", "stderr", "exit"]
    exec_id: str = ""
    data: bytes = b""
    result: ExecResult | None = None


class FileStat(_Reply):
    """A path's stat, never following a link: ``type`` is ``file``, ``dir``, ``symlink`` or
    ``special``; ``size`` in bytes; ``mode`` the permission bits as an octal string
    (``"0o644"``); ``mtime`` seconds since the epoch; ``target`` a symlink's target."""

    path: str
    type: str
    size: int = 0
    mode: str = ""
    mtime: float = 0.0
    target: str | None = None


class FileChange(_Reply):
    """What a write, append, delete, move or mkdir did: ``size`` bytes written (``appended``
    when added at the end); ``type`` of what was deleted; ``to`` where it was moved;
    ``created`` when mkdir made a directory."""

    path: str
    size: int | None = None
    appended: bool | None = None
    type: str | None = None
    to: str | None = None
    created: bool | None = None


class EditResult(_Reply):
    """An exact-match edit: ``occurrences`` replaced; ``bytes`` the file's new size."""

    path: str
    occurrences: int
    bytes: int | None = None


class GrepMatch(_Reply):
    """One matching line: ``line`` is 1-based; ``text`` at most 1,000 characters."""

    path: str
    line: int
    text: str


class GrepResult(_Reply):
    """A page of matches; pass ``next_cursor`` back to continue (None at the end)."""

    matches: list[GrepMatch] = Field(default_factory=list)
    truncated: bool = False
    next_cursor: str | None = None


class GlobEntry(_Reply):
    """One entry of a glob: its path relative to the sandbox root and its ``type``."""

    path: str
    type: str = ""


class GlobResult(_Reply):
    """A page of paths; pass ``next_cursor`` back to continue (None at the end)."""

    paths: list[GlobEntry] = Field(default_factory=list)
    truncated: bool = False
    next_cursor: str | None = None


class FileResult(_Reply):
    """One file of a batch upload or download: ``ok`` with its ``size`` (and, downloaded,
    its ``data``), or ``error`` (``{"type", "message"}``); one failure never stops the rest."""

    path: str
    ok: bool
    size: int = 0
    data: bytes = b""
    error: dict[str, str] | None = None


class SqlResult(_Reply):
    """One statement's (or one ``many`` batch's) outcome: ``kind`` is its leading keyword;
    ``columns`` and ``rows`` of a query (bytes as ``{"$bytes": base64}``, dates ISO 8601,
    decimals as text; at most ``max_rows``, then ``truncated``); ``rowcount`` (``-1`` when
    not applicable); ``last_id`` the last inserted row id (SQLite)."""

    kind: str = ""
    columns: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)
    rowcount: int = -1
    last_id: int | None = None
    truncated: bool = False


class AuditPage(_Reply):
    """A page of a sandbox's audit log: ``entries`` (``{"seq", "time", "op", ...}``, never a
    file's content, a statement's text or a value), ``total``, and ``next`` (the ``after`` of
    the following page, None at the end)."""

    entries: list[dict[str, Any]] = Field(default_factory=list)
    total: int = 0
    next: int | None = None
