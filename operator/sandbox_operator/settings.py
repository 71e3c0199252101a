"""One typed settings object, read once from the environment (STYLE.md: "Configuration read once").

pydantic-settings reads every variable prefixed ``SANDBOX_OPERATOR_`` (units are in the names);
an empty variable means the default. A malformed value raises :class:`SettingsError` naming the
variable. The fault hooks at the end exist only so that the real-API-server tests can kill the
operator or fail a step at a chosen point (mocks only to inject faults); they are empty in
production.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict

from sandbox_core.agent.wire import DEFAULT_PORT

PREFIX = "SANDBOX_OPERATOR_"
# Least lease_duration - renew_deadline: a leader stops writing this long before any takeover.
LEASE_MARGIN_SECONDS = 2.0


class ExecutorKind(StrEnum):
    """Where the core runs: in the operator process (``local``) or in a workspace Pod (``pod``)."""

    LOCAL = "local"
    POD = "pod"


class SettingsError(ValueError):
    """An environment variable holds a value the operator cannot use."""


Seconds = Annotated[float, Field(ge=0)]
IdSet = Annotated[frozenset[str], NoDecode]

# pydantic's error types, in the words the operator's users read (the variable name is added).
_MESSAGES = {
    "enum": "must be 'local' or 'pod'",
    "literal_error": "must be one of {expected}",
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "bool_parsing": "must be true or false",
}


class Settings(BaseSettings):
    """Operator configuration. Build it with :meth:`from_env`; ``Settings(...)`` takes overrides.

    Attributes:
        executor: ``local`` (core in-process) or ``pod`` (workspace Pod per Sandbox).
        state_dir: where the local executor keeps core records (``SandboxStore``).
        sandbox_root: parent directory of sandbox artefacts (worktrees, copies, upper dirs).
        workspace_image: image of workspace Pods (the one image of the project).
        namespace: namespaces the operator watches, comma-separated; empty means all namespaces
            (informational: kopf's ``--namespace`` arguments decide).
        pod_namespace: namespace the operator runs in (its leader-election Lease lives there).
        pod_name: name of the operator's Pod (start of its Lease holder identity).
        allow_privileged_overlay: overlay containers may run privileged (real OverlayFS).
        workspace_seccomp_profile: a ``Localhost`` seccomp profile of workspace Pods, relative
            to the kubelet's ``seccomp`` directory (chart ``workspace.seccompProfile``: the
            chart's ``files/seccomp/sandbox-workspace.json`` installed on the nodes lets an
            actor's commands run in their jail, docs/security.md); empty: ``RuntimeDefault``.
        metrics_port: port of the Prometheus endpoint; 0 disables it.
        retry_delay_seconds: delay of TemporaryError retries (API conflicts, Blocked PlanCommits).
        ttl_check_interval_seconds: period of the TTL timer on Sandboxes.
        watch_server_timeout_seconds / watch_client_timeout_seconds: kopf watch timeouts.
        exec_timeout_seconds: limit of one ``sandbox-core`` call in a workspace Pod.
        fork_max_bytes: the largest checkpoint a fork carries from its parent's workspace Pod
            to its own (the pod executor; docs/forks.md), in bytes.
        scratch_volume_size: PVC size of the scratch volume for worktree/overlay sandboxes.
        log_format: ``json`` (default) or ``plain``.
        otel_exporter: ``none`` (default: no traces leave the process) or ``otlp`` (OpenTelemetry
            spans to the OTLP/HTTP endpoint of ``OTEL_EXPORTER_OTLP_ENDPOINT``; the ``tracing``
            extra).
        leader_election: only the holder of a ``coordination.k8s.io`` Lease reconciles
            (several replicas, one active; :mod:`sandbox_operator.kube.leader`).
        leader_election_lease_name: name of that Lease in ``pod_namespace``.
        lease_duration_seconds: a standby takes the Lease over when its holder has not renewed
            it for this long.
        renew_deadline_seconds: the holder exits when it could not renew for this long (must be
            below ``lease_duration_seconds``: it stops before anyone else may start).
        retry_period_seconds: period of renewals and of a standby's attempts.
        standby_health_port: port answering ``/healthz`` while a replica waits as a standby
            (kopf's own liveness endpoint only starts once it leads); 0 disables it.
        max_workers: kopf's handler thread pool size (``settings.execution.max_workers``); None
            keeps kopf's default (Python's executor default, min(32, CPUs + 4)). More threads
            did not help the CPU-bound local executor on 2 cores (docs/benchmarks.md).
        agent_key_file: file holding the key workspace-agent tokens are derived from (and a
            sibling file ``previous`` during a rotation); used when ``agent_key_secret`` is
            empty (tests, local runs).
        agent_key_secret: name of the Secret in ``pod_namespace`` holding that key (data
            ``key`` and, during a rotation, ``previous``); the operator makes it with a random
            key when absent (the chart sets it; ``executors.agent_keys``).
        agent_port: port of the workspace agent in workspace Pods.
        agent_token_lifetime_seconds: seconds a workspace agent accepts a Sandbox's token,
            measured by the agent from the moment it first reads it; the operator writes a
            new token every half lifetime (``sandbox_core.agent.tokens``). 0: tokens never
            expire.
        agent_token_renew_interval_seconds: period of the timer that renews tokens.
        pod_labels: ``k=v,k=v`` labels of the operator's Pods; workspace Pods admit ingress
            only from Pods with these labels in ``pod_namespace`` (NetworkPolicy peers).
        network_policy: create a NetworkPolicy per workspace Pod (ingress only from the
            operator; egress denied except DNS and ``spec.workspace.egress``).
        workspace_defaults: JSON of a ``spec.workspace`` block, the chart's ``workspace.*``
            defaults; a Sandbox's own fields win, field by field.
        warm_pool_size: free, pre-started workspace Pods kept per watched namespace and pool
            key (``executors.warm_pool``; chart ``workspace.warmPool.size``); 0 turns the pool
            off.
        warm_pool_namespaces: ``a,b``, the namespaces that keep a pool (empty: ``namespace``,
            the watched ones; with all namespaces watched and this empty, no pool is kept).
        warm_pool_source_claims: ``claim,claim``, ReadWriteMany source claims that get a pool
            of their own in each pool namespace where they exist (Pods that mount them up
            front); ReadWriteOnce claims and Secret sources always get a Pod of their own.
        warm_pool_interval_seconds: period of the pool's refill.
        warm_pool_start_grace_seconds: a free pool Pod not Ready this long after its creation
            is replaced.
        retry_backoff_max_seconds: cap of the exponential retry delay (from
            ``retry_delay_seconds``, doubling per attempt).
        handler_timeout_seconds: limit of every handler (kopf gives up and reports).
        node_path_roots: ``/a,/b``, the directories under which the local executor accepts a
            ``spec.source.nodePath`` (empty: any absolute path outside the operator's own
            ``state_dir`` and ``sandbox_root``); checked by the operator itself, not only by
            the CRD.
        approval_required: every Commit needs named approvals (chart ``approvals.required``;
            per namespace the label ``sandbox.cleveragents.io/approval-required=true``).
        min_approvals: distinct approvers a PlanCommit needs at least (``approvals.minApprovals``).
        forbidden_approvers: user names whose approvals never count (the operator, the engine).
        forbidden_approver_groups: groups whose members' approvals never count.
        approver_groups: when not empty, only approvals recording one of these groups count.
        fault_fail_commit / fault_fail_rollback: test hooks, resource ids whose commit /
            compensation raises in the local executor (``SANDBOX_OPERATOR_FAULT_FAIL_COMMIT=a,b``).
        fault_provision_delay_seconds: test hook, a pause after the local executor made the
            sandbox and before the handler returns (case 16: delete while create runs).
        fault_commit_delay_seconds: test hook, a pause before each sandbox commit of the local
            executor (a PlanCommit that is still running when a second one arrives).
    """

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_ignore_empty=True,
        frozen=True,
        extra="ignore",
    )

    executor: ExecutorKind = ExecutorKind.LOCAL
    state_dir: Path = Path("/var/lib/sandbox-operator/state")
    sandbox_root: Path = Path("/var/lib/sandbox-operator/sandboxes")
    workspace_image: str = "sandbox-operator:latest"
    namespace: str = ""
    pod_namespace: str = "default"
    pod_name: str = ""
    allow_privileged_overlay: bool = False
    workspace_seccomp_profile: Annotated[
        str, Field(pattern=r"^$|^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", max_length=253)
    ] = ""
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9090
    retry_delay_seconds: Seconds = 5.0
    ttl_check_interval_seconds: Seconds = 10.0
    watch_server_timeout_seconds: Seconds = 300.0
    watch_client_timeout_seconds: Seconds = 330.0
    exec_timeout_seconds: Seconds = 300.0
    fork_max_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024 * 1024
    scratch_volume_size: str = "1Gi"
    log_format: Literal["json", "plain"] = "json"
    otel_exporter: Literal["none", "otlp"] = "none"
    leader_election: bool = False
    leader_election_lease_name: str = "sandbox-operator-leader"
    lease_duration_seconds: Annotated[float, Field(gt=0)] = 15.0
    renew_deadline_seconds: Annotated[float, Field(gt=0)] = 10.0
    retry_period_seconds: Annotated[float, Field(gt=0)] = 2.0
    standby_health_port: Annotated[int, Field(ge=0, le=65535)] = 0
    max_workers: Annotated[int, Field(ge=1)] | None = None
    agent_key_file: Path = Path("/etc/sandbox-operator/agent/key")
    agent_key_secret: str = ""
    agent_port: Annotated[int, Field(ge=1, le=65535)] = DEFAULT_PORT
    agent_token_lifetime_seconds: Annotated[int, Field(ge=0)] = 86400
    agent_token_renew_interval_seconds: Annotated[float, Field(gt=0)] = 300.0
    pod_labels: str = ""
    network_policy: bool = True
    workspace_defaults: str = "{}"
    warm_pool_size: Annotated[int, Field(ge=0, le=100)] = 0
    warm_pool_namespaces: Annotated[tuple[str, ...], NoDecode] = ()
    warm_pool_source_claims: Annotated[tuple[str, ...], NoDecode] = ()
    warm_pool_interval_seconds: Annotated[float, Field(gt=0)] = 5.0
    warm_pool_start_grace_seconds: Annotated[float, Field(gt=0)] = 300.0
    retry_backoff_max_seconds: Seconds = 60.0
    handler_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    node_path_roots: Annotated[tuple[str, ...], NoDecode] = ()
    approval_required: bool = False
    min_approvals: Annotated[int, Field(ge=1, le=16)] = 1
    forbidden_approvers: IdSet = frozenset()
    forbidden_approver_groups: IdSet = frozenset()
    approver_groups: IdSet = frozenset()
    fault_fail_commit: IdSet = frozenset()
    fault_fail_rollback: IdSet = frozenset()
    fault_provision_delay_seconds: Seconds = 0.0
    fault_commit_delay_seconds: Seconds = 0.0

    @field_validator(
        "fault_fail_commit",
        "fault_fail_rollback",
        "forbidden_approvers",
        "forbidden_approver_groups",
        "approver_groups",
        mode="before",
    )
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return frozenset(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("workspace_seccomp_profile")
    @classmethod
    def _relative_profile(cls, value: str) -> str:
        if ".." in value.split("/") or "." in value.split("/"):
            raise ValueError(f"{value!r} is a path relative to the kubelet's seccomp directory")
        return value

    @field_validator("warm_pool_namespaces", "warm_pool_source_claims", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def pool_namespaces(self) -> tuple[str, ...]:
        """The namespaces that keep a warm pool: ``warm_pool_namespaces``, else the watched
        ``namespace`` list; none when the pool is off."""
        if self.warm_pool_size <= 0:
            return ()
        if self.warm_pool_namespaces:
            return self.warm_pool_namespaces
        return tuple(part.strip() for part in self.namespace.split(",") if part.strip())

    @field_validator("node_path_roots", mode="before")
    @classmethod
    def _absolute_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        for root in value:
            if not str(root).startswith("/") or ".." in str(root).split("/"):
                raise ValueError(f"{root!r} is not an absolute path without '..'")
        return value

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> Self:
        if self.renew_deadline_seconds + LEASE_MARGIN_SECONDS > self.lease_duration_seconds:
            raise ValueError(
                f"{PREFIX}RENEW_DEADLINE_SECONDS must be at least {LEASE_MARGIN_SECONDS:g} s "
                f"below {PREFIX}LEASE_DURATION_SECONDS (the leader stops that long before a "
                "standby may take over)"
            )
        return self

    @property
    def operator_namespace(self) -> str:
        """Namespace of the operator's Pods (NetworkPolicy peers): ``pod_namespace``."""
        return self.pod_namespace

    @property
    def operator_pod_labels(self) -> str:
        """``k=v,k=v`` labels of the operator's Pods: ``pod_labels``."""
        return self.pod_labels

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every setting from ``env`` (default ``os.environ``).

        Raises:
            SettingsError: a value is malformed (unknown executor, negative timeout, ...); the
                message names the variable and the value.
        """
        source = EnvSettingsSource(cls, env_prefix=PREFIX, env_ignore_empty=True)
        if env is not None:
            source.env_vars = {key.lower(): value for key, value in env.items() if value}
        try:
            # model_validate, not cls(): the values come from ``env`` only, never os.environ.
            return cls.model_validate(source())
        except ValidationError as exc:
            raise SettingsError(_explain(exc)) from None


def _explain(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = "".join(str(part) for part in error["loc"][:1]).upper()
        template = _MESSAGES.get(error["type"])
        ctx = error.get("ctx") or {}
        if template:
            text = template.format(**ctx)
        else:
            text = str(ctx["error"]) if "error" in ctx else error["msg"]
        name = f"{PREFIX}{where}" if where else "settings"
        lines.append(f"{name} {text}, got {error.get('input')!r}" if where else str(text))
    return "; ".join(lines)


def backoff_seconds(settings: Settings, retry: int) -> float:
    """Delay before retry number ``retry`` (0-based): ``retry_delay_seconds * 2**retry``, capped
    at ``retry_backoff_max_seconds`` (retries back off exponentially)."""
    base = settings.retry_delay_seconds
    return float(
        min(base * (2 ** min(max(retry, 0), 16)), max(base, settings.retry_backoff_max_seconds))
    )
