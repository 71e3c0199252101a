"""Unit tests of the operator's logic modules (no cluster): conditions, settings, models,
journal <-> status mapping, errors, TTL, status mirroring, blocking and the pod builders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import kopf
import pytest
from kubernetes.client.exceptions import ApiException
from sandbox_operator.errors import classify, to_kopf
from sandbox_operator.executors.base import SandboxState, sandbox_id_for_uid
from sandbox_operator.executors.pod_manifests import (
    build_network_policy,
    build_scratch_pvc,
    build_token_secret,
    build_workspace_pod,
    child_name,
    label_value,
    scratch_size,
)
from sandbox_operator.executors.remote import create_body
from sandbox_operator.kube.conditions import find_condition, set_condition
from sandbox_operator.resources.journal import journal_of_status, status_of_journal
from sandbox_operator.resources.plancommit import blocking_plancommit
from sandbox_operator.resources.sandbox import status_of_state, ttl_expired
from sandbox_operator.resources.targets import target_from_body
from sandbox_operator.settings import ExecutorKind, Settings, SettingsError

from sandbox_api.models import PlanCommitAction, SandboxPhase, SandboxSource
from sandbox_core import CommitResult, SandboxCommitError, SandboxCreationError, SandboxStatus
from sandbox_core.errors import (
    SandboxBusyError,
    SandboxCommitLockedError,
    SandboxConflictError,
    SandboxConnectionError,
    SandboxCreationPermissionError,
)
from sandbox_core.plan.journal import (
    JournalPhase,
    JournalReason,
    JournalState,
    JournalStep,
    StepState,
)
from tests.support.targets import pod_target

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"


# -- conditions (Go's meta.SetStatusCondition) ------------------------------------------------


def test_set_condition_keeps_transition_time_when_status_is_unchanged() -> None:
    first = set_condition([], "Ready", "True", "Active", "ok", 1, now="2026-01-01T00:00:00Z")
    again = set_condition(
        first, "Ready", "True", "Active", "still ok", 2, now="2026-01-02T00:00:00Z"
    )
    assert again[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert again[0]["message"] == "still ok"
    assert again[0]["observedGeneration"] == 2
    assert first[0]["message"] == "ok"  # the input is not modified


def test_set_condition_moves_transition_time_when_status_changes() -> None:
    first = set_condition([], "Ready", "True", "Active", "ok", now="2026-01-01T00:00:00Z")
    flipped = set_condition(first, "Ready", "False", "Errored", "bad", now="2026-01-03T00:00:00Z")
    assert flipped[0]["lastTransitionTime"] == "2026-01-03T00:00:00Z"
    assert flipped[0]["reason"] == "Errored"
    both = set_condition(flipped, "Degraded", "True", "IOError", "disk")
    assert [c["type"] for c in both] == ["Ready", "Degraded"]
    assert find_condition(both, "Degraded")["reason"] == "IOError"


# -- settings ---------------------------------------------------------------------------------


def test_settings_read_once_from_the_environment() -> None:
    settings = Settings.from_env(
        {
            "SANDBOX_OPERATOR_EXECUTOR": "pod",
            "SANDBOX_OPERATOR_ALLOW_PRIVILEGED_OVERLAY": "true",
            "SANDBOX_OPERATOR_RETRY_DELAY_SECONDS": "2.5",
            "SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "a, b",
        }
    )
    assert settings.executor is ExecutorKind.POD
    assert settings.allow_privileged_overlay is True
    assert settings.retry_delay_seconds == 2.5
    assert settings.fault_fail_commit == frozenset({"a", "b"})
    assert Settings.from_env({}).executor is ExecutorKind.LOCAL


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("EXECUTOR", "vm", "must be 'local' or 'pod'"),
        ("RETRY_DELAY_SECONDS", "-1", "must be >= 0"),
        ("RETRY_DELAY_SECONDS", "soon", "must be a number"),
        ("ALLOW_PRIVILEGED_OVERLAY", "maybe", "must be true or false"),
    ],
)
def test_settings_refuse_malformed_values(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({f"SANDBOX_OPERATOR_{name}": value})


# -- ids, targets, status mirroring -----------------------------------------------------------


def test_sandbox_id_is_a_ulid_derived_from_the_object_uid() -> None:
    first = sandbox_id_for_uid(UID)
    assert len(first) == 26
    assert sandbox_id_for_uid(UID) == first  # a retried create meets the same id (case 18)


def sandbox_body(**spec: object) -> dict[str, object]:
    return {
        "metadata": {"name": "s1", "namespace": "ns", "uid": UID, "generation": 3},
        "spec": {
            "planId": "p",
            "resourceId": "r",
            "strategy": "git_worktree",
            "source": {"nodePath": "/repo"},
            **spec,
        },
    }


def test_target_from_body_uses_node_path_for_the_local_executor() -> None:
    target = target_from_body(sandbox_body(), Settings(), None)
    assert target.original == "/repo"
    assert target.sandbox_id == sandbox_id_for_uid(UID)


def test_a_pvc_source_is_refused_permanently_by_the_local_executor() -> None:
    body = sandbox_body(source={"persistentVolumeClaim": {"claimName": "data"}})
    with pytest.raises(kopf.PermanentError, match="needs the pod executor"):
        target_from_body(body, Settings(), None)


def test_status_of_state_mirrors_the_core_with_declared_fields_only() -> None:
    record = {
        "strategy": "overlay",
        "sandbox_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "status": "active",
        "context": {"sandbox_path": "/sb/merged", "metadata": {"overlay_mode": "fallback"}},
        "last_commit": None,
    }
    status = status_of_state(SandboxState.from_record(record), "local", None, 4)
    assert status["phase"] == "Active"
    assert status["strategyMode"] == "fallback"
    assert status["effectiveStrategy"] == "overlay"
    assert status["observedGeneration"] == 4
    assert find_condition(status["conditions"], "Ready")["status"] == "True"
    declared = {
        "phase",
        "sandboxId",
        "sandboxPath",
        "workspacePod",
        "effectiveStrategy",
        "strategyMode",
        "executor",
        "lastCommit",
        "lastRollbackRequestId",
        "lastRestoreRequestId",
        "coreRecord",
        "conditions",
        "observedGeneration",
    }
    assert set(status) <= declared  # case 15


def test_phase_mirrors_every_core_status() -> None:
    # Suspended is the operator's own phase (spec.suspend; no core status stands for it).
    assert {SandboxPhase.from_core(s).value for s in SandboxStatus} | {"Suspended"} == {
        p.value for p in SandboxPhase
    }


def test_ttl_counts_from_the_terminal_transition() -> None:
    finished = datetime(2026, 1, 1, tzinfo=UTC)
    body = {
        "spec": {"ttlSecondsAfterFinished": 30},
        "status": {
            "phase": "Committed",
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
        },
    }
    assert not ttl_expired(body, finished + timedelta(seconds=29))
    assert ttl_expired(body, finished + timedelta(seconds=30))
    body["status"]["phase"] = "Active"
    assert not ttl_expired(body, finished + timedelta(days=1))


# -- errors -----------------------------------------------------------------------------------


def test_core_and_api_errors_map_to_permanent_or_temporary() -> None:
    assert isinstance(to_kopf(SandboxCreationError("no source"), 5), kopf.PermanentError)
    temporary = to_kopf(ApiException(status=503, reason="Unavailable"), 7)
    assert isinstance(temporary, kopf.TemporaryError)
    assert temporary.delay == 7
    assert classify(SandboxCommitError("x", conflicts=["f"])).reason == "Conflict"
    assert classify(ApiException(status=409, reason="Conflict")).retryable


@pytest.mark.parametrize(
    ("error", "reason", "retryable"),
    [
        (SandboxBusyError("database is locked"), "DatabaseBusy", True),
        (SandboxConnectionError("server closed the connection"), "DatabaseUnreachable", True),
        (SandboxCommitLockedError("index.lock exists"), "Locked", True),
        (SandboxCreationPermissionError("owned by uid 1000"), "PermissionDenied", False),
        (SandboxConflictError("overlap", conflicts=["f"]), "Conflict", False),
    ],
)
def test_classified_core_failures_keep_their_kind(
    error: Exception, reason: str, retryable: bool
) -> None:
    """A lock or a busy database is retried; a permission problem or a conflict is not."""
    failure = classify(error)
    assert (failure.reason, failure.retryable) == (reason, retryable)
    assert isinstance(to_kopf(error, 3), kopf.TemporaryError if retryable else kopf.PermanentError)


# -- journal <-> PlanCommit status ------------------------------------------------------------


def failed_journal() -> JournalState:
    return JournalState(
        plan_id="p3",
        phase=JournalPhase.FAILED,
        reason=JournalReason.COMMIT_FAILED,
        steps=[
            JournalStep(
                sandbox_id="A",
                resource_id="ra",
                strategy="git_worktree",
                state=StepState.COMPENSATED,
                result=CommitResult(
                    sandbox_id="A", success=True, commit_ref="abc", changed_files=["f"]
                ).to_dict(),
            ),
            JournalStep(
                sandbox_id="B",
                resource_id="rb",
                strategy="copy_on_write",
                state=StepState.FAILED,
                error="SandboxCommitError: merge conflict in g",
            ),
            JournalStep(sandbox_id="C", resource_id="rc", strategy="none", rollbackable=False),
        ],
        failed_sandbox_id="B",
        rolled_back_ids=["A"],
        finished_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_a_failed_journal_becomes_conditions_naming_sandbox_error_and_ids() -> None:
    names = {"A": "sa", "B": "sb", "C": "sc"}
    status = status_of_journal(failed_journal(), PlanCommitAction.COMMIT, names, None, 1)
    assert status["phase"] == "Failed"
    assert [s["state"] for s in status["sandboxes"]] == ["Compensated", "Failed", "Skipped"]
    committed = find_condition(status["conditions"], "Committed")
    assert committed["status"] == "False"
    assert committed["reason"] == "Conflict"
    assert "sb (B)" in committed["message"] and "merge conflict in g" in committed["message"]
    assert "A" in find_condition(status["conditions"], "RolledBack")["message"]
    assert find_condition(status["conditions"], "RollbackFailed")["status"] == "False"
    assert status["rolledBackIds"] == ["A"]
    assert status["failedSandboxId"] == "B"
    assert status["completedAt"] == "2026-01-01T00:00:00Z"
    assert [r["success"] for r in status["results"]] == [True, False]


def test_status_round_trips_to_the_journal_for_recovery() -> None:
    running = failed_journal()
    running.phase = JournalPhase.COMMITTING
    running.steps[1].state = StepState.COMMITTING
    status = status_of_journal(running, PlanCommitAction.COMMIT, {}, None, 1)
    back = journal_of_status("p3", status)
    assert back is not None
    assert back.phase is JournalPhase.COMMITTING
    assert [s.state for s in back.steps] == [
        StepState.COMPENSATED,
        StepState.COMMITTING,
        StepState.PENDING,
    ]
    assert back.steps[0].result is not None and back.steps[0].result["commit_ref"] == "abc"
    assert back.rolled_back_ids == ["A"]
    assert journal_of_status("p3", {}) is None


def test_resaving_a_terminal_journal_keeps_condition_timestamps() -> None:
    first = status_of_journal(failed_journal(), PlanCommitAction.COMMIT, {}, None, 1)
    again = status_of_journal(failed_journal(), PlanCommitAction.COMMIT, {}, first["conditions"], 1)
    assert again["conditions"] == first["conditions"]  # case 22: nothing moves


def plancommit(name: str, created: str, plan: str = "p", phase: str | None = None) -> dict:
    return {
        "metadata": {"name": name, "uid": name, "creationTimestamp": created},
        "spec": {"planId": plan},
        "status": {"phase": phase} if phase else {},
    }


def test_an_older_running_plancommit_of_the_same_plan_blocks() -> None:
    older = plancommit("a", "2026-01-01T00:00:00Z", phase="Committing")
    me = plancommit("b", "2026-01-01T00:00:05Z")
    other_plan = plancommit("c", "2026-01-01T00:00:00Z", plan="q")
    assert blocking_plancommit(me, [older, me, other_plan]) == "a"
    assert blocking_plancommit(older, [older, me]) is None
    done = plancommit("a", "2026-01-01T00:00:00Z", phase="Failed")
    assert blocking_plancommit(me, [done, me]) is None


# -- pod executor builders --------------------------------------------------------------------


def test_workspace_pod_is_non_root_with_source_and_scratch_volumes() -> None:
    pod = build_workspace_pod(pod_target(), Settings(), "sbx-my-sandbox-scratch")
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = spec["containers"][0]
    assert container["command"] == ["sandbox-core", "serve-workspace"]
    assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    token = next(v for v in spec["volumes"] if v["name"] == "agent-token")
    assert token["secret"]["secretName"] == child_name(pod_target(), "agent")
    assert all("token" not in str(e.get("value", "")).lower() for e in container["env"][:2])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"].get("privileged") is None
    claims = {
        v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in spec["volumes"]
    }
    assert claims["source"] == "data"
    assert claims["scratch"] == "sbx-my-sandbox-scratch"
    assert pod["metadata"]["labels"]["sandbox.cleveragents.io/plan-id"] == "plan-with-spaces"
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "sandbox-operator"


def test_overlay_is_privileged_only_when_allowed() -> None:
    allowed = Settings(allow_privileged_overlay=True)
    pod = build_workspace_pod(pod_target("overlay"), allowed, None)
    assert pod["spec"]["containers"][0]["securityContext"]["privileged"] is True
    refused = build_workspace_pod(pod_target("overlay"), Settings(), None)
    assert "privileged" not in refused["spec"]["containers"][0]["securityContext"]
    body = create_body(pod_target("overlay"), Settings())
    assert body["options"] == {"mode": "fallback"}  # without privilege, the fallback runs
    assert create_body(pod_target("overlay"), allowed)["options"] == {}


def test_scratch_volume_is_sized_per_strategy() -> None:
    assert scratch_size("copy_on_write", "20Gi", "1Gi") == "20Gi"
    assert scratch_size("git_worktree", "20Gi", "1Gi") == "1Gi"
    assert scratch_size("git_worktree", None, "1Gi", "4Gi") == "4Gi"
    # transaction_rollback and none keep their state on a small claim that outlives the Pod.
    assert scratch_size("none", None, "1Gi") == scratch_size("transaction_rollback", None, "1Gi")
    assert scratch_size("transaction_rollback", None, "1Gi") == "256Mi"
    assert scratch_size("transaction_rollback", None, "1Gi", "512Mi") == "512Mi"
    pvc = build_scratch_pvc(pod_target(), "3Gi")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "3Gi"
    assert pvc["metadata"]["name"] == child_name(pod_target(), "scratch")
    assert (
        len(
            child_name(pod_target().__class__(**{**pod_target().__dict__, "name": "x" * 300}), "ws")
        )
        <= 63
    )


def test_the_agent_create_request_carries_the_deterministic_id_and_no_secret() -> None:
    body = create_body(pod_target(), Settings())
    assert body["sandbox_id"] == sandbox_id_for_uid(UID)
    assert body["original"] == "/workspace/source/repo"
    assert label_value("---") == "x"


def test_a_secret_source_reaches_the_pod_only_through_secret_key_ref() -> None:
    from dataclasses import replace

    target = replace(
        pod_target("transaction_rollback"),
        source=SandboxSource.model_validate({"secretRef": {"name": "db", "key": "uri"}}),
        original="env:SANDBOX_SOURCE_DSN",
    )
    pod = build_workspace_pod(target, Settings(), None)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["SANDBOX_SOURCE_DSN"]["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "uri"}
    assert "value" not in env["SANDBOX_SOURCE_DSN"]
    assert create_body(target, Settings())["original"] == "env:SANDBOX_SOURCE_DSN"
    body = {
        "metadata": {"name": "s", "namespace": "ns", "uid": UID},
        "spec": {
            "planId": "p",
            "resourceId": "db",
            "strategy": "transaction_rollback",
            "source": {"secretRef": {"name": "db"}},
        },
    }
    pod_settings = Settings(executor=ExecutorKind.POD)
    assert target_from_body(body, pod_settings, None).original == "env:SANDBOX_SOURCE_DSN"


def test_the_workspace_block_shapes_the_pod_claim_and_network_policy() -> None:
    from dataclasses import replace

    from sandbox_api.models import WorkspaceSpec

    defaults = WorkspaceSpec.model_validate(
        {
            "nodeSelector": {"pool": "sandboxes"},
            "scratch": {"storageClassName": "fast", "size": "5Gi"},
        }
    )
    own = WorkspaceSpec.model_validate(
        {
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            "tolerations": [{"key": "sandbox", "operator": "Exists"}],
            "runtimeClassName": "gvisor",
            "priorityClassName": "low",
            "imagePullSecrets": [{"name": "regcred"}],
            "scratch": {"size": "2Gi"},
            "egress": [{"cidr": "10.1.0.0/16", "ports": [{"port": 5432}]}],
        }
    )
    workspace = own.merged_over(defaults)
    assert workspace.node_selector == {"pool": "sandboxes"}
    assert workspace.scratch is not None
    assert (workspace.scratch.size, workspace.scratch.storage_class_name) == ("2Gi", "fast")
    target = replace(pod_target(), workspace=workspace)
    settings = Settings(pod_namespace="sandbox-system", pod_labels="app.kubernetes.io/name=op")
    spec = build_workspace_pod(target, settings, None)["spec"]
    assert spec["containers"][0]["resources"]["requests"]["cpu"] == "100m"
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["priorityClassName"] == "low"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeSelector"] == {"pool": "sandboxes"}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    policy = build_network_policy(target, settings)["spec"]
    peer = policy["ingress"][0]["from"][0]
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "op"}
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "sandbox-system"
    }
    assert policy["ingress"][0]["ports"] == [{"port": 8471, "protocol": "TCP"}]
    assert {
        "to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}],
        "ports": [{"port": 5432, "protocol": "TCP"}],
    } in policy["egress"]
    assert build_token_secret(target, "t0k")["stringData"] == {"token": "t0k"}


def test_reconcile_timer_counts_outcomes_and_durations() -> None:
    from prometheus_client import REGISTRY
    from sandbox_operator.kube import metrics

    def value(outcome: str) -> float:
        labels = {"kind": "Test", "handler": "h", "outcome": outcome}
        return REGISTRY.get_sample_value("sandbox_operator_reconciles_total", labels) or 0.0

    ok_before, error_before = value("ok"), value("error")
    with metrics.reconcile_timer("Test", "h"):
        pass
    with pytest.raises(RuntimeError), metrics.reconcile_timer("Test", "h"):
        raise RuntimeError("boom")
    assert value("ok") == ok_before + 1
    assert value("error") == error_before + 1


def test_pod_cleanup_skips_the_agent_when_the_workspace_pod_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A terminating namespace deletes workspace Pods first: cleanup must not retry forever."""
    from types import SimpleNamespace

    from kubernetes.client.exceptions import ApiException
    from sandbox_operator.executors import pod as pod_module
    from sandbox_operator.executors.pod import PodExecutor
    from sandbox_operator.settings import Settings

    deleted: list[str] = []

    def missing_pod(name: str, namespace: str) -> None:
        raise ApiException(status=404, reason="Not Found")

    def delete_controlled(api: object, kind: str, namespace: str, name: str, uid: str) -> bool:
        deleted.append(f"{kind}/{name}/{uid}")
        return True

    monkeypatch.setattr(pod_module, "delete_controlled", delete_controlled)

    def no_pool_pods(namespace: str, label_selector: str = "") -> SimpleNamespace:
        selector = "sandbox.cleveragents.io/sandbox-uid=u1,sandbox.cleveragents.io/pooled"
        assert label_selector == selector
        return SimpleNamespace(items=[])  # nor a warm-pool Pod claimed by the Sandbox

    core = SimpleNamespace(read_namespaced_pod=missing_pod, list_namespaced_pod=no_pool_pods)
    executor = PodExecutor(Settings.from_env({}), SimpleNamespace(core=core))  # type: ignore[arg-type]
    executor.token = lambda target: "t"  # type: ignore[method-assign]
    target = SimpleNamespace(
        name="s1", namespace="ns", uid="u1", sandbox_id="01ABC", strategy="git_worktree"
    )
    executor.cleanup(target)  # type: ignore[arg-type]
    # No Secret delete: the token Secret goes with its Sandbox (ownerReference), so the
    # operator holds no right to delete Secrets. Each kind under its current and legacy name.
    kinds = [d.split("/")[0] for d in deleted]
    assert kinds == [k for k in ("Pod", "PersistentVolumeClaim", "NetworkPolicy") for _ in (0, 1)]
    assert all(d.endswith("/u1") for d in deleted)  # only what uid u1 controls


def test_a_workspace_pod_event_becomes_a_readiness_annotation_of_its_sandbox() -> None:
    from sandbox_operator.resources.sandbox import pod_event_annotation

    def event(type_: str, phase: str, ready: str, deleting: bool = False) -> dict:
        metadata = {
            "namespace": "ns",
            "uid": "p1",
            "ownerReferences": [{"kind": "Sandbox", "name": "s1"}],
        }
        if deleting:
            metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        status = {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}
        return {"type": type_, "object": {"metadata": metadata, "status": status}}

    assert pod_event_annotation(event("ADDED", "Pending", "False")) == ("ns", "s1", "p1:NotReady")
    assert pod_event_annotation(event("MODIFIED", "Running", "True")) == ("ns", "s1", "p1:Ready")
    terminating = event("MODIFIED", "Running", "True", deleting=True)
    assert pod_event_annotation(terminating) == ("ns", "s1", "p1:Terminating")
    assert pod_event_annotation(event("MODIFIED", "Failed", "False"))[2] == "p1:Failed"
    assert pod_event_annotation(event("DELETED", "Running", "True"))[2] == "p1:Deleted"
    unplaced = event("MODIFIED", "Pending", "False")
    unplaced["object"]["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no"}
    )
    first = pod_event_annotation(unplaced)[2]
    assert first.startswith("p1:") and first.endswith(":Unschedulable")
    unplaced["object"]["status"]["conditions"][-1]["message"] = "another reason"
    assert pod_event_annotation(unplaced)[2] != first  # a new reason wakes the Sandbox again
    orphan = event("ADDED", "Running", "True")
    orphan["object"]["metadata"]["ownerReferences"] = []
    assert pod_event_annotation(orphan) is None


def test_retries_back_off_exponentially_with_a_cap() -> None:
    from sandbox_operator.settings import backoff_seconds

    settings = Settings(retry_delay_seconds=2, retry_backoff_max_seconds=30)
    assert [backoff_seconds(settings, n) for n in range(6)] == [2, 4, 8, 16, 30, 30]


def test_a_condition_message_longer_than_the_schema_allows_is_cut() -> None:
    """The CRDs allow 32768 characters: a longer message would make the API server refuse the
    whole status write, kopf's diff-base with it, and the handler would run again."""
    from sandbox_operator.kube.conditions import MAX_MESSAGE, set_condition

    [condition] = set_condition(None, "Degraded", "True", "GitFailed", "é" * 40_000)
    assert len(condition["message"]) == MAX_MESSAGE
    assert condition["message"].endswith("(truncated)")
    [short] = set_condition(None, "Ready", "True", "Active", "fine")
    assert short["message"] == "fine"


def test_the_startup_heap_is_frozen_after_its_garbage_is_collected() -> None:
    """Issue 11, throughput: what is alive after startup leaves the collector's reach, and a
    garbage cycle made before is freed, not frozen."""
    import gc
    import weakref

    from sandbox_operator.main import freeze_startup_heap

    class Node:
        pass

    cycle = Node()
    cycle.self = cycle  # type: ignore[attr-defined]
    freed = []
    weakref.finalize(cycle, freed.append, True)
    del cycle
    gc.disable()  # no collection may free the cycle before the call does
    try:
        frozen = freeze_startup_heap()
        assert freed == [True]
        assert frozen == gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
        gc.enable()
    assert gc.get_freeze_count() == 0
