"""One typed settings object, read once from the environment (STYLE.md: "Configuration read once").

Every variable is prefixed ``SANDBOX_OPERATOR_``; units are in the names. The fault hooks at the
end exist only so that the real-API-server tests can kill the operator or fail a step at a chosen
point (mocks only to inject faults); they are empty in production.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

PREFIX = "SANDBOX_OPERATOR_"


class ExecutorKind(StrEnum):
    """Where the core runs: in the operator process (``local``) or in a workspace Pod (``pod``)."""

    LOCAL = "local"
    POD = "pod"


class SettingsError(ValueError):
    """An environment variable holds a value the operator cannot use."""


def _text(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(PREFIX + name, "").strip()
    return value or default


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(PREFIX + name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise SettingsError(f"{PREFIX}{name} must be a number, got {raw!r}") from exc
    if value < 0:
        raise SettingsError(f"{PREFIX}{name} must be >= 0, got {raw!r}")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(PREFIX + name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{PREFIX}{name} must be true or false, got {raw!r}")


@dataclass(frozen=True)
class Settings:
    """Operator configuration. Build it with :meth:`from_env`.

    Attributes:
        executor: ``local`` (core in-process) or ``pod`` (workspace Pod per Sandbox).
        state_dir: where the local executor keeps core records (``SandboxStore``).
        sandbox_root: parent directory of sandbox artefacts (worktrees, copies, upper dirs).
        workspace_image: image of workspace Pods (the one image of the project).
        namespace: namespace the operator watches; empty means all namespaces.
        allow_privileged_overlay: overlay containers may run privileged (real OverlayFS).
        metrics_port: port of the Prometheus endpoint; 0 disables it.
        retry_delay_seconds: delay of TemporaryError retries (API conflicts, Blocked PlanCommits).
        ttl_check_interval_seconds: period of the TTL timer on Sandboxes.
        watch_server_timeout_seconds / watch_client_timeout_seconds: kopf watch timeouts.
        exec_timeout_seconds: limit of one ``sandbox-core`` call in a workspace Pod.
        scratch_volume_size: PVC size of the scratch volume for worktree/overlay sandboxes.
        log_format: ``json`` (default) or ``plain``.
        agent_key_file: file holding the key workspace-agent tokens are derived from (the chart
            mounts a Secret of the operator's namespace there; issue 8).
        agent_port: port of the workspace agent in workspace Pods.
        operator_namespace: namespace the operator Pod runs in (NetworkPolicy peers).
        operator_pod_labels: ``k=v,k=v`` labels of the operator's Pods; workspace Pods admit
            ingress only from Pods with these labels in ``operator_namespace``.
        network_policy: create a NetworkPolicy per workspace Pod (ingress only from the
            operator; egress denied except DNS and ``spec.workspace.egress``).
        workspace_defaults: JSON of a ``spec.workspace`` block, the chart's ``workspace.*``
            defaults; a Sandbox's own fields win, field by field.
        retry_backoff_max_seconds: cap of the exponential retry delay (from
            ``retry_delay_seconds``, doubling per attempt).
        handler_timeout_seconds: limit of every handler (kopf gives up and reports).
        fault_fail_commit / fault_fail_rollback: test hooks, resource ids whose commit /
            compensation raises in the local executor.
        fault_provision_delay_seconds: test hook, a pause after the local executor made the
            sandbox and before the handler returns (case 16: delete while create runs).
        fault_commit_delay_seconds: test hook, a pause before each sandbox commit of the local
            executor (a PlanCommit that is still running when a second one arrives).
    """

    executor: ExecutorKind = ExecutorKind.LOCAL
    state_dir: Path = Path("/var/lib/sandbox-operator/state")
    sandbox_root: Path = Path("/var/lib/sandbox-operator/sandboxes")
    workspace_image: str = "ghcr.io/cleveragents/sandbox-operator:latest"
    namespace: str = ""
    allow_privileged_overlay: bool = False
    metrics_port: int = 9090
    retry_delay_seconds: float = 5.0
    ttl_check_interval_seconds: float = 10.0
    watch_server_timeout_seconds: float = 300.0
    watch_client_timeout_seconds: float = 330.0
    exec_timeout_seconds: float = 300.0
    scratch_volume_size: str = "1Gi"
    log_format: str = "json"
    agent_key_file: Path = Path("/etc/sandbox-operator/agent/key")
    agent_port: int = 8471
    operator_namespace: str = ""
    operator_pod_labels: str = ""
    network_policy: bool = True
    workspace_defaults: str = "{}"
    retry_backoff_max_seconds: float = 60.0
    handler_timeout_seconds: float = 600.0
    fault_fail_commit: frozenset[str] = field(default_factory=frozenset)
    fault_fail_rollback: frozenset[str] = field(default_factory=frozenset)
    fault_provision_delay_seconds: float = 0.0
    fault_commit_delay_seconds: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every setting from ``env`` (default ``os.environ``).

        Raises:
            SettingsError: a value is malformed (unknown executor, negative timeout, ...).
        """
        env = os.environ if env is None else env
        executor_raw = _text(env, "EXECUTOR", ExecutorKind.LOCAL.value)
        try:
            executor = ExecutorKind(executor_raw)
        except ValueError as exc:
            raise SettingsError(
                f"{PREFIX}EXECUTOR must be 'local' or 'pod', got {executor_raw!r}"
            ) from exc
        log_format = _text(env, "LOG_FORMAT", "json")
        if log_format not in ("json", "plain"):
            raise SettingsError(f"{PREFIX}LOG_FORMAT must be 'json' or 'plain', got {log_format!r}")
        defaults = cls()
        return cls(
            executor=executor,
            state_dir=Path(_text(env, "STATE_DIR", str(defaults.state_dir))),
            sandbox_root=Path(_text(env, "SANDBOX_ROOT", str(defaults.sandbox_root))),
            workspace_image=_text(env, "WORKSPACE_IMAGE", defaults.workspace_image),
            namespace=_text(env, "NAMESPACE", ""),
            allow_privileged_overlay=_flag(env, "ALLOW_PRIVILEGED_OVERLAY", False),
            metrics_port=int(_number(env, "METRICS_PORT", defaults.metrics_port)),
            retry_delay_seconds=_number(env, "RETRY_DELAY_SECONDS", defaults.retry_delay_seconds),
            ttl_check_interval_seconds=_number(
                env, "TTL_CHECK_INTERVAL_SECONDS", defaults.ttl_check_interval_seconds
            ),
            watch_server_timeout_seconds=_number(
                env, "WATCH_SERVER_TIMEOUT_SECONDS", defaults.watch_server_timeout_seconds
            ),
            watch_client_timeout_seconds=_number(
                env, "WATCH_CLIENT_TIMEOUT_SECONDS", defaults.watch_client_timeout_seconds
            ),
            exec_timeout_seconds=_number(
                env, "EXEC_TIMEOUT_SECONDS", defaults.exec_timeout_seconds
            ),
            scratch_volume_size=_text(env, "SCRATCH_VOLUME_SIZE", defaults.scratch_volume_size),
            log_format=log_format,
            agent_key_file=Path(_text(env, "AGENT_KEY_FILE", str(defaults.agent_key_file))),
            agent_port=int(_number(env, "AGENT_PORT", defaults.agent_port)),
            operator_namespace=_text(env, "POD_NAMESPACE", ""),
            operator_pod_labels=_text(env, "POD_LABELS", ""),
            network_policy=_flag(env, "NETWORK_POLICY", True),
            workspace_defaults=_text(env, "WORKSPACE_DEFAULTS", "{}"),
            retry_backoff_max_seconds=_number(
                env, "RETRY_BACKOFF_MAX_SECONDS", defaults.retry_backoff_max_seconds
            ),
            handler_timeout_seconds=_number(
                env, "HANDLER_TIMEOUT_SECONDS", defaults.handler_timeout_seconds
            ),
            fault_fail_commit=_id_set(env, "FAULT_FAIL_COMMIT"),
            fault_fail_rollback=_id_set(env, "FAULT_FAIL_ROLLBACK"),
            fault_provision_delay_seconds=_number(env, "FAULT_PROVISION_DELAY_SECONDS", 0.0),
            fault_commit_delay_seconds=_number(env, "FAULT_COMMIT_DELAY_SECONDS", 0.0),
        )


def backoff_seconds(settings: Settings, retry: int) -> float:
    """Delay before retry number ``retry`` (0-based): ``retry_delay_seconds * 2**retry``, capped
    at ``retry_backoff_max_seconds`` (issue 8: retries back off exponentially)."""
    base = settings.retry_delay_seconds
    return float(
        min(base * (2 ** min(max(retry, 0), 16)), max(base, settings.retry_backoff_max_seconds))
    )


def _id_set(env: Mapping[str, str], name: str) -> frozenset[str]:
    raw = env.get(PREFIX + name, "")
    return frozenset(part.strip() for part in raw.split(",") if part.strip())
