"""Pydantic models of the three custom resources' spec and status (docs: the CRD contract).

Field names follow the CRD (camelCase aliases); Python code uses snake_case. ``model_dump_status``
helpers emit only fields the CRD declares (case 15: undeclared status fields are pruned).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.catalogue import rollbackable_strategies

GROUP = "sandbox.cleveragents.io"
VERSION = "v1beta1"
"""The version the operator and the client read and write, and the CRDs' storage version."""
SERVED_VERSIONS = ("v1beta1", "v1alpha1")
"""Every version the CRDs serve, newest first. They declare the same fields (one schema in
``crds/``), so the API server's ``None`` conversion is lossless (docs/api-evolution.md)."""
DEPRECATED_VERSIONS = ("v1alpha1",)
"""Served versions the API server answers with a deprecation warning."""
SANDBOX_PLURAL = "sandboxes"
CHECKPOINT_PLURAL = "checkpoints"
PLANCOMMIT_PLURAL = "plancommits"
FINALIZER = f"{GROUP}/cleanup"
PLAN_LABEL = f"{GROUP}/plan-id"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "sandbox-operator"

# The core's answer (each strategy class's ``rollbackable``); never a list of our own.
ROLLBACKABLE_STRATEGIES = rollbackable_strategies()


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class SandboxPhase(StrEnum):
    """``Sandbox.status.phase``: the core's SandboxStatus in CamelCase."""

    PENDING = "Pending"
    CREATED = "Created"
    ACTIVE = "Active"
    COMMITTED = "Committed"
    ROLLED_BACK = "RolledBack"
    CLEANED_UP = "CleanedUp"
    ERRORED = "Errored"
    SUSPENDED = "Suspended"  # spec.suspend: no workspace Pod, the scratch claim kept

    @classmethod
    def from_core(cls, status: SandboxStatus | str) -> SandboxPhase:
        """Mirror of a core status (``"rolled_back"`` -> ``RolledBack``)."""
        return _CORE_TO_PHASE[SandboxStatus(status)]

    @property
    def is_terminal(self) -> bool:
        """Phases after which ``ttlSecondsAfterFinished`` counts (CRD contract): the core's
        terminal statuses (``SandboxStatus.is_terminal``); ``Suspended`` has no core status and
        is not terminal (it resumes)."""
        core = _PHASE_TO_CORE.get(self)
        return core is not None and core.is_terminal


_CORE_TO_PHASE = {
    SandboxStatus.PENDING: SandboxPhase.PENDING,
    SandboxStatus.CREATED: SandboxPhase.CREATED,
    SandboxStatus.ACTIVE: SandboxPhase.ACTIVE,
    SandboxStatus.COMMITTED: SandboxPhase.COMMITTED,
    SandboxStatus.ROLLED_BACK: SandboxPhase.ROLLED_BACK,
    SandboxStatus.CLEANED_UP: SandboxPhase.CLEANED_UP,
    SandboxStatus.ERRORED: SandboxPhase.ERRORED,
}
_PHASE_TO_CORE = {phase: status for status, phase in _CORE_TO_PHASE.items()}


class PvcSource(_Model):
    """A PersistentVolumeClaim (pod executor) and an optional relative sub-path."""

    claim_name: str
    sub_path: str = ""


class SecretSource(_Model):
    """A Secret holding the database DSN (strategy transaction_rollback)."""

    name: str
    key: str = "dsn"


class CheckpointRef(_Model):
    """``spec.source.fromCheckpoint``: start from Checkpoint ``checkpoint`` of Sandbox
    ``sandbox`` (same namespace, plan, strategy and original; docs/forks.md)."""

    sandbox: str
    checkpoint: str


class SandboxSource(_Model):
    """Where the original lives; exactly one of the first three members is set (enforced by
    the CRD); ``from_checkpoint`` may be added beside it (a fork)."""

    persistent_volume_claim: PvcSource | None = None
    node_path: str | None = None
    secret_ref: SecretSource | None = None
    from_checkpoint: CheckpointRef | None = None

    def original(self) -> dict[str, Any]:
        """The source without ``fromCheckpoint``, in the CRD's shape: what a fork and its
        parent must have equal."""
        return self.model_dump(by_alias=True, exclude_none=True, exclude={"from_checkpoint"})


class SandboxOptions(_Model):
    """Strategy options: ``overlayMode`` (auto|kernel|fallback)."""

    overlay_mode: str = "auto"


class RollbackRequest(_Model):
    """Discard all changes; acted on once per distinct ``id``."""

    id: str


class RestoreRequest(_Model):
    """Restore to Checkpoint ``checkpointName``; acted on once per distinct ``id``."""

    id: str
    checkpoint_name: str


class PortSpec(_Model):
    """One port of an egress rule."""

    port: int
    protocol: str = "TCP"


class EgressRule(_Model):
    """Allow egress from the workspace Pod to ``cidr`` (on ``ports``; all ports when empty)."""

    cidr: str
    ports: list[PortSpec] = Field(default_factory=list)


class ScratchSpec(_Model):
    """The scratch PersistentVolumeClaim: storage class and size (empty: chart defaults)."""

    storage_class_name: str | None = None
    size: str | None = None


class WorkspaceSpec(_Model):
    """``Sandbox.spec.workspace``: how the workspace Pod is shaped (pod executor).

    Every field is optional; an unset one takes the chart's ``workspace.*`` default
    (:meth:`merged_over`). Kubernetes-shaped fields (resources, tolerations, affinity...) are
    passed to the Pod as given.
    """

    resources: dict[str, Any] | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = None
    affinity: dict[str, Any] | None = None
    runtime_class_name: str | None = None
    priority_class_name: str | None = None
    image_pull_secrets: list[dict[str, str]] | None = None
    scratch: ScratchSpec | None = None
    egress: list[EgressRule] | None = None

    def merged_over(self, defaults: WorkspaceSpec) -> WorkspaceSpec:
        """This block with every unset field (and scratch sub-field) taken from ``defaults``."""
        values = {
            name: getattr(self, name)
            if getattr(self, name) is not None
            else getattr(defaults, name)
            for name in type(self).model_fields
        }
        mine, base = self.scratch or ScratchSpec(), defaults.scratch or ScratchSpec()
        values["scratch"] = ScratchSpec(
            storage_class_name=mine.storage_class_name or base.storage_class_name,
            size=mine.size or base.size,
        )
        return WorkspaceSpec(**values)


class SandboxSpec(_Model):
    """``Sandbox.spec``."""

    plan_id: str
    resource_id: str
    strategy: str
    source: SandboxSource = Field(default_factory=SandboxSource)
    options: SandboxOptions = Field(default_factory=SandboxOptions)
    ttl_seconds_after_finished: int | None = None
    rollback_request: RollbackRequest | None = None
    restore_request: RestoreRequest | None = None
    workspace: WorkspaceSpec = Field(default_factory=WorkspaceSpec)
    suspend: bool = False

    @property
    def rollbackable(self) -> bool:
        """Whether a commit of this strategy can be undone (seed 002, "Atomic Commit")."""
        return self.strategy in ROLLBACKABLE_STRATEGIES


class CheckpointSpec(_Model):
    """``Checkpoint.spec``."""

    sandbox_name: str
    phase: str
    metadata: dict[str, str] = Field(default_factory=dict)


class PlanCommitAction(StrEnum):
    """``PlanCommit.spec.action``."""

    COMMIT = "Commit"
    ROLLBACK = "Rollback"


class PlanCommitMode(StrEnum):
    """``PlanCommit.spec.mode``: how a Commit is carried out."""

    TWO_PHASE = "TwoPhase"
    """Prepare every sandbox, decide, then apply: a conflict touches no original."""
    SAGA = "Saga"
    """Commit one after another, compensating the landed ones on failure (seed 002)."""


class PlanCommitApproval(StrEnum):
    """``PlanCommit.spec.approval``: whether a person approves the reviewed plan first."""

    REQUIRED = "Required"
    """Stop at ``AwaitingApproval`` after the review until ``approvedDigest`` names it."""
    NOT_REQUIRED = "NotRequired"


CREATED_BY_ANNOTATION = f"{GROUP}/created-by"
"""Annotation naming the PlanCommit's creator; the approval policy checks it equals the
requester at creation and keeps it immutable (docs/approvals.md)."""

APPROVAL_REQUIRED_LABEL = f"{GROUP}/approval-required"
"""Namespace label: ``"true"`` makes every Commit in the namespace need named approvals."""


class ApprovalDecisionKind(StrEnum):
    """``PlanCommit.spec.approvals[].decision``."""

    APPROVE = "Approve"
    REJECT = "Reject"


class ApprovalEntry(_Model):
    """One person's recorded decision on one plan digest (``spec.approvals[]``).

    ``user``, ``groups`` and ``uid`` are the identity the API server authenticated for the
    write: the chart's admission policy admits nothing else (docs/approvals.md).
    """

    digest: str
    decision: ApprovalDecisionKind
    user: str
    uid: str | None = None
    groups: list[str] | None = None
    comment: str | None = None


class PlanCheckSpec(_Model):
    """One item of ``PlanCommit.spec.checks``: ``command`` (argv) must exit 0 in Sandbox
    ``sandbox`` within ``timeout_seconds`` before prepare (docs/forks.md)."""

    name: str
    sandbox: str
    command: list[str]
    timeout_seconds: int = 300


class PlanCommitSpec(_Model):
    """``PlanCommit.spec``.

    ``approvals`` are the recorded decisions (append-only, named at admission);
    ``required_approvals`` how many distinct approvers the PlanCommit asks for (never fewer
    than the administrator's minimum). ``approved_digest`` (``"sha256:<64 hex>"``) is the older,
    unnamed approval: it counts only where the administrator did not require named approvals.
    ``approval_timeout_seconds`` ends an unapproved PlanCommit as ``Expired``.
    """

    plan_id: str
    action: PlanCommitAction = PlanCommitAction.COMMIT
    message: str | None = None
    cleanup_policy: str = "Retain"
    mode: PlanCommitMode = PlanCommitMode.TWO_PHASE
    approval: PlanCommitApproval = PlanCommitApproval.NOT_REQUIRED
    approved_digest: str | None = None
    approval_timeout_seconds: int | None = None
    approvals: list[ApprovalEntry] = Field(default_factory=list)
    required_approvals: int | None = None
    sandboxes: list[str] | None = None
    checks: list[PlanCheckSpec] = Field(default_factory=list)

    @property
    def approval_required(self) -> bool:
        """True when the Commit waits for ``approvedDigest`` after its review."""
        return self.approval is PlanCommitApproval.REQUIRED


class PlanCommitPhase(StrEnum):
    """``PlanCommit.status.phase``."""

    PENDING = "Pending"
    COMMITTING = "Committing"
    COMMITTED = "Committed"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    AWAITING_APPROVAL = "AwaitingApproval"  # reviewed; waits for spec.approvedDigest
    EXPIRED = "Expired"  # approvalTimeoutSeconds elapsed without an approval; nothing touched

    @property
    def is_terminal(self) -> bool:
        """Terminal PlanCommits are never processed again (case 22)."""
        return self in (
            PlanCommitPhase.COMMITTED,
            PlanCommitPhase.ROLLED_BACK,
            PlanCommitPhase.FAILED,
            PlanCommitPhase.EXPIRED,
        )


class StepState(StrEnum):
    """State of one journal step (``PlanCommit.status.sandboxes[].state``)."""

    PENDING = "Pending"
    COMMITTING = "Committing"
    COMMITTED = "Committed"
    FAILED = "Failed"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"
    COMPENSATION_FAILED = "CompensationFailed"
    SKIPPED = "Skipped"
    PREPARING = "Preparing"  # two-phase: the sandbox is being prepared (original untouched)
    PREPARED = "Prepared"
    ABORTED = "Aborted"  # two-phase: what was prepared was dropped


class JournalStep(_Model):
    """One sandbox in the PlanCommit journal, in commit order."""

    name: str
    sandbox_id: str = ""
    resource_id: str = ""
    strategy: str = ""
    rollbackable: bool = False
    state: StepState = StepState.PENDING
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None


class StepResult(_Model):
    """Commit result of one sandbox (``PlanCommit.status.results[]``)."""

    name: str
    sandbox_id: str = ""
    resource_id: str = ""
    success: bool = False
    commit_ref: str | None = None
    changed_files: list[str] = Field(default_factory=list)
    added_files: list[str] = Field(default_factory=list)
    deleted_files: list[str] = Field(default_factory=list)
    error: str | None = None


def dump(model: BaseModel) -> dict[str, Any]:
    """camelCase JSON-ready dict without ``None`` values (never writes nulls into status)."""
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")
