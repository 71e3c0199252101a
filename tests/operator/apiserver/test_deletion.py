"""Deletion, namespaces and what the API says, on the real API server (tier 2, issue 11 §2, §6).

- Case 17: a namespace being deleted while a PlanCommit runs: no Event is posted there (no
  refused-post loop in the log), the PlanCommit never commits a Sandbox whose deletion began
  (the plan is compensated: all or nothing), every finalizer is removed by the operator and no
  core record or worktree outlives its object.
- Case 19: the chart's pre-delete hook logic (``python -m sandbox_operator.uninstall``) run with
  the hook's own ServiceAccount token and RBAC (rendered by ``helm template``): every custom
  object is gone while the operator still runs, so nothing is left holding a namespace.
- §6: ``status.phase`` Failed, ``cleanupPolicy: Delete`` timing and the plan-id label do what
  the CRD descriptions (read back from the API server) say.

No controller-manager runs on this tier, so the namespace controller's part (deleting the
objects of a terminating namespace) is done by the test with ``kubectl delete --all``; the
NamespaceLifecycle admission that refuses new content is the API server's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.operator import (
    REPO_ROOT,
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    git,
    make_repo,
    plancommit_manifest,
    run_operator,
    sandbox_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow

CHART_DIR = REPO_ROOT / "charts" / "sandbox-operator"
PLAN_LABEL = "sandbox.cleveragents.io/plan-id"


@pytest.fixture
def cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, prefix="del")


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator (not started yet: tests start it, some with fault hooks)."""
    yield from run_operator(
        local_apiserver, cluster, tmp_path, cleanup_kinds="sandbox-all", check_pruning=False
    )


def records(operator: OperatorProcess) -> list[str]:
    """Core records left in the operator's state directory (one file per sandbox)."""
    return sorted(p.name for p in (operator.work_dir / "state" / "sandboxes").glob("*.json"))


def events_in(cluster: Cluster) -> list[dict[str, Any]]:
    result = cluster.kubectl("get", "events", "-o", "json")
    return list(json.loads(result.stdout).get("items") or [])


# --- case 17 ---------------------------------------------------------------------------------


def test_case17_namespace_terminating_mid_plancommit(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    first = make_repo(tmp_path / "first", {"a.txt": "a0\n"})
    second = make_repo(tmp_path / "second", {"b.txt": "b0\n"})
    heads = {repo: git(repo, "rev-parse", "HEAD") for repo in (first, second)}
    # A slow commit keeps the PlanCommit in flight while the namespace goes.
    operator.start({"SANDBOX_OPERATOR_FAULT_COMMIT_DELAY_SECONDS": "4"})
    cluster.create(sandbox_manifest("s1", "plan-17", "git_worktree", first))
    cluster.create(sandbox_manifest("s2", "plan-17", "git_worktree", second))
    s1, s2 = cluster.wait_active("s1"), cluster.wait_active("s2")
    (Path(s1["sandboxPath"]) / "a.txt").write_text("a1\n")
    (Path(s2["sandboxPath"]) / "b.txt").write_text("b1\n")
    cluster.create(checkpoint_manifest("c1", "s1"))
    assert cluster.wait_phase("checkpoint", "c1", {"Ready", "Failed"})["phase"] == "Ready"
    cluster.create(plancommit_manifest("pc1", "plan-17"))
    cluster.wait_phase("pcommit", "pc1", {"Committing"})
    events_before = len(events_in(cluster))

    # kubectl delete ns --wait=false; then what the namespace controller does.
    cluster.server.kubectl("delete", "namespace", cluster.namespace, "--wait=false", check=True)
    refused = cluster.server.kubectl(
        "create", "configmap", "probe", "-n", cluster.namespace, check=False
    )
    assert "being terminated" in refused.stderr  # the API server's NamespaceLifecycle refusal
    cluster.kubectl("delete", "sandbox-all", "--all", "--wait=false")

    started = time.monotonic()
    wait_for(
        lambda: all(cluster.gone(k, n) for k, n in (("sbx", "s1"), ("sbx", "s2"),
                                                     ("ckpt", "c1"), ("pcommit", "pc1"))),
        120,
        "every object finalized by the operator",
    )  # fmt: skip
    finalized_in = time.monotonic() - started
    time.sleep(2)  # anything still queued would be posted (and refused) by now
    operator.assert_alive()
    logs = operator.logs()

    # No Event was posted into the terminating namespace, so nothing was refused or retried.
    assert len(events_in(cluster)) == events_before
    assert "Failed to post an event" not in logs
    refused = [line for line in logs.splitlines() if "being terminated" in line]
    assert all('"level": "INFO"' in line for line in refused), refused
    assert logs.count("is being terminated: Events there are not posted") <= 1
    # The saga never committed a Sandbox whose deletion began: all or nothing on the originals.
    landed = [git(repo, "rev-parse", "HEAD") != heads[repo] for repo in (first, second)]
    assert not any(landed) or all(landed), landed
    if not any(landed):
        assert (first / "a.txt").read_text() == "a0\n"
        assert (second / "b.txt").read_text() == "b0\n"
    # No core record, worktree or sandbox branch outlives its object.
    assert records(operator) == []
    for repo in (first, second):
        assert len(git(repo, "worktree", "list").splitlines()) == 1
        assert git(repo, "branch", "--list", "sandbox/*").strip() == ""
    print(f"case 17: every object finalized {finalized_in:.1f}s after the namespace deletion")


def test_a_plancommit_never_commits_a_sandbox_whose_deletion_began(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    first = make_repo(tmp_path / "first", {"a.txt": "a0\n"})
    second = make_repo(tmp_path / "second", {"b.txt": "b0\n"})
    head_first, head_second = git(first, "rev-parse", "HEAD"), git(second, "rev-parse", "HEAD")
    operator.start({"SANDBOX_OPERATOR_FAULT_COMMIT_DELAY_SECONDS": "4"})
    cluster.create(sandbox_manifest("s1", "plan-d", "git_worktree", first))
    cluster.create(sandbox_manifest("s2", "plan-d", "git_worktree", second))
    s1, s2 = cluster.wait_active("s1"), cluster.wait_active("s2")
    (Path(s1["sandboxPath"]) / "a.txt").write_text("a1\n")
    (Path(s2["sandboxPath"]) / "b.txt").write_text("b1\n")
    cluster.create(plancommit_manifest("pc", "plan-d"))
    cluster.wait_phase("pcommit", "pc", {"Committing"})
    cluster.kubectl("delete", "sandbox", "s2", "--wait=false")
    # Its finalizer waits for the saga (the claim), so the object is still there meanwhile.
    status = cluster.wait_phase("pcommit", "pc", {"Committed", "Failed", "RolledBack"})
    assert status["phase"] == "Failed", status
    failed = [s for s in status["sandboxes"] if s["state"] == "Failed"]
    assert [s["name"] for s in failed] == ["s2"]
    assert "being deleted" in failed[0]["error"]
    assert cluster.condition("pcommit", "pc", "RolledBack")["status"] == "True"
    # All or nothing: s1's landed commit was compensated; s2 was never committed.
    assert git(first, "rev-parse", "HEAD") == head_first or (first / "a.txt").read_text() == "a0\n"
    assert (first / "a.txt").read_text() == "a0\n"
    assert git(second, "rev-parse", "HEAD") == head_second
    wait_for(lambda: cluster.gone("sbx", "s2"), 60, "s2 finalized after the saga")
    s2_id = s2["sandboxId"]
    assert not any(s2_id in name for name in records(operator)), records(operator)
    assert len(git(second, "worktree", "list").splitlines()) == 1
    # The cleanup waited for the saga: INFO lines with the reason, never an error (issue 11).
    waits = [json.loads(line) for line in operator.logs().splitlines() if "cleanup waits" in line]
    assert waits, operator.logs()[-3000:]
    assert {line["level"] for line in waits} == {"INFO"}, waits
    assert all("in use by PlanCommit" in line["message"] for line in waits), waits
    assert not [e for e in cluster.events("s2") if "cleanup waits" in e.get("message", "")]


# --- case 19 ---------------------------------------------------------------------------------


def _helm() -> Path:
    from tests.support.chart import _find_helm

    return _find_helm()


def hook_objects(namespace: str, release_namespace: str) -> list[dict[str, Any]]:
    """The pre-delete hook's ServiceAccount, ClusterRole and binding, as helm renders them."""
    done = subprocess.run(
        [str(_helm()), "template", "rel", str(CHART_DIR), "--namespace", release_namespace,
         "--set", f"watchNamespace={namespace}"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return [
        doc
        for doc in yaml.safe_load_all(done.stdout)
        if doc and (doc["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"
    ]


def test_case19_pre_delete_hook_deletes_every_object_while_the_operator_runs(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "x\n"})
    operator.start()
    cluster.create(sandbox_manifest("s1", "plan-19", "git_worktree", repo))
    cluster.wait_active("s1")
    cluster.create(checkpoint_manifest("c1", "s1"))
    cluster.wait_phase("checkpoint", "c1", {"Ready"})
    cluster.create(plancommit_manifest("pc1", "plan-19", action="Rollback"))
    cluster.wait_phase("pcommit", "pc1", {"RolledBack", "Failed"})

    # The hook's own identity: its ServiceAccount and RBAC as rendered, and a token for it.
    release_ns = f"{cluster.namespace}-rel"
    cluster.server.kubectl("create", "namespace", release_ns, check=True)
    objects = hook_objects(cluster.namespace, release_ns)
    job = next(o for o in objects if o["kind"] == "Job")
    others = [o for o in objects if o["kind"] != "Job"]
    cluster.server.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1",
                           "kind": "List", "items": others}), check=True)  # fmt: skip
    sa = job["spec"]["template"]["spec"]["serviceAccountName"]
    token = cluster.server.kubectl("create", "token", sa, "-n", release_ns, check=True)
    kubeconfig = tmp_path / "hook.kubeconfig"
    kubeconfig.write_text(_token_kubeconfig(cluster.server, token.stdout.strip()))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["python", "-m", "sandbox_operator.uninstall"]
    env = operator.env({"KUBECONFIG": str(kubeconfig)})
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, *container["args"][1:]],
        env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    # Nothing carries the finalizer any more: deleting the namespace now cannot strand it.
    for kind in ("sandboxes", "checkpoints", "plancommits"):
        assert cluster.kubectl("get", kind, "-o", "name").stdout.strip() == ""
    assert records(operator) == []
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    print(f"case 19: the pre-delete hook finished in {elapsed:.1f}s")


def test_pre_delete_hook_fails_when_the_operator_is_down(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Without the operator the finalizers cannot run: the hook fails (Helm stops the
    uninstall, the operator stays) instead of removing finalizers by hand."""
    repo = make_repo(tmp_path / "repo", {"f.txt": "x\n"})
    operator.start()
    cluster.create(sandbox_manifest("s1", "plan-19b", "git_worktree", repo))
    sandbox_path = Path(cluster.wait_active("s1")["sandboxPath"])
    operator.stop()
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_operator.uninstall", f"--namespace={cluster.namespace}",
         "--timeout-seconds=3", "--poll-seconds=0.5"],
        env=operator.env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"sandboxes/{cluster.namespace}/s1" in done.stderr
    body = cluster.get("sandbox", "s1")
    assert body is not None and body["metadata"]["deletionTimestamp"]
    assert "sandbox.cleveragents.io/cleanup" in body["metadata"]["finalizers"]
    assert (sandbox_path / "f.txt").is_file()  # untouched while the operator is down
    operator.start()  # back: the finalizer runs and the object goes (case 19, step 1)
    wait_for(lambda: cluster.gone("sbx", "s1"), 60, "s1 finalized after the operator is back")
    assert not sandbox_path.exists()
    assert len(git(repo, "worktree", "list").splitlines()) == 1


def _token_kubeconfig(server: Any, token: str) -> str:
    admin = yaml.safe_load(Path(server.kubeconfig_path).read_text())
    cluster_entry = admin["clusters"][0]
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster_entry],
            "users": [{"name": "hook", "user": {"token": token}}],
            "contexts": [
                {"name": "hook", "context": {"cluster": cluster_entry["name"], "user": "hook"}}
            ],
            "current-context": "hook",
        }
    )


# --- §6: the API says what it does ----------------------------------------------------------


def explain(cluster: Cluster, field: str) -> str:
    return " ".join(cluster.server.kubectl("explain", field, check=True).stdout.split())


def test_failed_means_the_commit_did_not_land_and_conditions_say_if_originals_are_back(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    assert "Failed (the action did not reach its goal" in explain(cluster, "pcommit.status.phase")
    good = make_repo(tmp_path / "good", {"a.txt": "a0\n"})
    bad = make_repo(tmp_path / "bad", {"b.txt": "b0\n"})
    operator.start({"SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "bad"})
    cluster.create(sandbox_manifest("good", "plan-f", "git_worktree", good, resource_id="good"))
    cluster.create(sandbox_manifest("bad", "plan-f", "git_worktree", bad, resource_id="bad"))
    (Path(cluster.wait_active("good")["sandboxPath"]) / "a.txt").write_text("a1\n")
    cluster.wait_active("bad")
    cluster.create(plancommit_manifest("pc", "plan-f"))
    status = cluster.wait_phase("pcommit", "pc", {"Committed", "Failed", "RolledBack"})
    assert status["phase"] == "Failed"
    assert cluster.condition("pcommit", "pc", "Committed")["status"] == "False"
    assert cluster.condition("pcommit", "pc", "RolledBack")["status"] == "True"
    assert cluster.condition("pcommit", "pc", "RollbackFailed")["status"] == "False"
    assert (good / "a.txt").read_text() == "a0\n"  # compensated: the original is as before


def test_cleanup_policy_delete_deletes_sandboxes_once_the_commit_succeeded(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    described = explain(cluster, "pcommit.spec.cleanupPolicy")
    assert "as soon as the action succeeded" in described
    repo = make_repo(tmp_path / "repo", {"f.txt": "x\n"})
    failing = make_repo(tmp_path / "failing", {"g.txt": "y\n"})
    operator.start({"SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "failing"})
    cluster.create(sandbox_manifest("ok", "plan-ok", "git_worktree", repo))
    cluster.create(
        sandbox_manifest("ko", "plan-ko", "git_worktree", failing, resource_id="failing")
    )
    cluster.wait_active("ok")
    cluster.wait_active("ko")
    cluster.create(plancommit_manifest("pc-ok", "plan-ok", cleanupPolicy="Delete"))
    cluster.create(plancommit_manifest("pc-ko", "plan-ko", cleanupPolicy="Delete"))
    assert cluster.wait_phase("pcommit", "pc-ok", {"Committed", "Failed"})["phase"] == "Committed"
    # Deleted once the commit succeeded, while the PlanCommit itself stays.
    wait_for(lambda: cluster.gone("sbx", "ok"), 60, "sandbox ok deleted after the commit")
    assert cluster.get("pcommit", "pc-ok") is not None
    # After a Failed commit the Sandbox stays for inspection until the PlanCommit is deleted.
    assert cluster.wait_phase("pcommit", "pc-ko", {"Committed", "Failed"})["phase"] == "Failed"
    time.sleep(2)
    assert cluster.get("sbx", "ko") is not None
    cluster.kubectl("delete", "pcommit", "pc-ko", "--wait=false")
    wait_for(lambda: cluster.gone("sbx", "ko"), 60, "sandbox ko deleted with its PlanCommit")


def test_sandboxes_carry_the_plan_id_label_and_a_versioned_core_record(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    assert f"label {PLAN_LABEL}" in explain(cluster, "sandbox.spec.planId")
    repo = make_repo(tmp_path / "repo", {"f.txt": "x\n"})
    other = make_repo(tmp_path / "other", {"f.txt": "x\n"})
    operator.start()
    cluster.create(sandbox_manifest("s1", "plan-label", "git_worktree", repo))
    cluster.create(sandbox_manifest("s2", "plan-other", "git_worktree", other))
    status = cluster.wait_active("s1")
    cluster.wait_active("s2")
    listed = cluster.kubectl("get", "sbx", "-l", f"{PLAN_LABEL}=plan-label", "-o", "name")
    assert listed.stdout.split() == ["sandbox.sandbox.cleveragents.io/s1"]
    assert status["coreRecord"]["schemaVersion"] == 1
