"""Plans across strategies in a real cluster: an atomic three-strategy commit, an injected failure
with compensation, checkpoint and restore, the operator Pod killed in the middle of a PlanCommit,
and cleanup with ``cleanupPolicy: Delete``.

The injected failure is a real one: a commit lands on the original repository's branch after
the sandbox was made, so the git sandbox's commit conflicts (case 03 of shared/cases)."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.conftest import (
    Originals,
    Release,
    active,
    plancommit_manifest,
    sandbox_manifest,
    write_in_sandbox,
)
from e2e.kube import Kube, wait_until

TERMINAL = {"Committed", "Failed", "RolledBack"}


def three_sandbox_plan(kube: Kube, namespace: str, plan: str) -> dict[str, dict[str, Any]]:
    """copy_on_write (a-copy), overlay (b-overlay) and git_worktree (c-git) Sandboxes of
    ``plan``, each Active with one change written through ``kubectl exec``."""
    kube.apply(
        namespace,
        sandbox_manifest("a-copy", plan, "copy_on_write", "data"),
        sandbox_manifest("b-overlay", plan, "overlay", "layer", {"overlayMode": "auto"}),
        sandbox_manifest("c-git", plan, "git_worktree", "repos/app"),
    )
    statuses = {name: active(kube, namespace, name) for name in ("a-copy", "b-overlay", "c-git")}
    write_in_sandbox(kube, namespace, statuses["a-copy"], "g.txt", "d1\n")
    write_in_sandbox(kube, namespace, statuses["b-overlay"], "h.txt", "o1\n")
    write_in_sandbox(kube, namespace, statuses["c-git"], "f.txt", "r1\n")
    return statuses


def originals_state(originals: Originals) -> tuple[str, str, str, str]:
    """(g.txt, h.txt, f.txt, main's HEAD) of the originals."""
    return (
        originals.read("data/g.txt"),
        originals.read("layer/h.txt"),
        originals.read("repos/app/f.txt"),
        originals.git("rev-parse", "main"),
    )


def test_three_strategies_commit_atomically(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    statuses = three_sandbox_plan(kube, namespace, "plan-three")
    # The chart does not allow privileged overlay Pods: the userspace fallback ran, and the
    # Sandbox says so.
    overlay = statuses["b-overlay"]
    assert overlay["effectiveStrategy"] == "overlay"
    assert overlay["strategyMode"] == "fallback", overlay
    assert originals_state(originals)[:3] == ("d0\n", "o0\n", "line1\n")

    kube.apply(namespace, plancommit_manifest("commit-three", "plan-three"))
    status = kube.wait_phase("plancommit", namespace, "commit-three", TERMINAL)
    assert status["phase"] == "Committed", status
    assert [r["success"] for r in status["results"]] == [True, True, True]
    assert {r["resourceId"]: r["changedFiles"] for r in status["results"]} == {
        "a-copy": ["g.txt"],
        "b-overlay": ["h.txt"],
        "c-git": ["f.txt"],
    }
    g, h, f, head = originals_state(originals)
    assert (g, h, f) == ("d1\n", "o1\n", "r1\n")
    git_result = next(r for r in status["results"] if r["resourceId"] == "c-git")
    assert head == git_result["commitRef"]
    assert kube.condition("plancommit", namespace, "commit-three", "Committed")["status"] == "True"


@pytest.mark.parametrize("mode", ["Saga", "TwoPhase"])
def test_injected_failure_compensates_and_leaves_originals(
    kube: Kube, namespace: str, originals: Originals, mode: str
) -> None:
    """The last sandbox conflicts. Saga: the two before it land and are compensated; TwoPhase:
    the conflict is found while preparing and no original is touched at all."""
    plan = f"plan-fail-{mode.lower()}"
    statuses = three_sandbox_plan(kube, namespace, plan)
    # The fault: main moves on under the git sandbox, on the same line.
    originals.sh("printf 'main moved\\n' > repos/app/f.txt")
    originals.git("commit", "-qam", "main moved")
    before = originals_state(originals)

    kube.apply(namespace, plancommit_manifest("commit-fail", plan, mode=mode))
    status = kube.wait_phase("plancommit", namespace, "commit-fail", TERMINAL)
    ids = {name: s["sandboxId"] for name, s in statuses.items()}
    assert status["phase"] == "Failed", status
    assert status["failedSandboxId"] == ids["c-git"]
    assert status["failedRollbackIds"] == []
    states = [s["state"] for s in status["sandboxes"]]
    if mode == "Saga":
        assert sorted(status["rolledBackIds"]) == sorted([ids["a-copy"], ids["b-overlay"]])
        assert states == ["Compensated", "Compensated", "Failed"]
    else:
        assert status["rolledBackIds"] == []
        assert states == ["Aborted", "Aborted", "Failed"]

    committed = kube.condition("plancommit", namespace, "commit-fail", "Committed")
    assert committed["status"] == "False"
    assert committed["reason"] in ("Conflict", "SandboxCommitFailed")
    assert ids["c-git"] in committed["message"]
    rolled = kube.condition("plancommit", namespace, "commit-fail", "RolledBack")
    if mode == "Saga":
        assert rolled["status"] == "True"
        assert ids["a-copy"] in rolled["message"] and ids["b-overlay"] in rolled["message"]
    else:
        assert rolled["reason"] == "Aborted", rolled
    assert (
        kube.condition("plancommit", namespace, "commit-fail", "RollbackFailed")["status"]
        == "False"
    )

    # Every original is as it was before the PlanCommit.
    assert originals_state(originals) == before
    events = kube.json("get", "events", "-n", namespace, "--field-selector", "type=Warning")
    assert any(e["involvedObject"]["name"] == "commit-fail" for e in events["items"])


def test_checkpoint_restore_round_trip(kube: Kube, namespace: str, originals: Originals) -> None:
    kube.apply(namespace, sandbox_manifest("app", "plan-ckpt", "git_worktree", "repos/app"))
    status = active(kube, namespace, "app")
    write_in_sandbox(kube, namespace, status, "f.txt", "checkpointed\n")
    kube.apply(
        namespace,
        {
            "apiVersion": "sandbox.cleveragents.io/v1beta1",
            "kind": "Checkpoint",
            "metadata": {"name": "app-pre-execute"},
            "spec": {"sandboxName": "app", "phase": "pre_execute", "metadata": {"step": "1"}},
        },
    )
    kube.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "ckpt/app-pre-execute", "--timeout=120s"
    )
    write_in_sandbox(kube, namespace, status, "f.txt", "after the checkpoint\n")
    write_in_sandbox(kube, namespace, status, "extra.txt", "to be dropped\n")

    kube.kubectl(
        "patch", "sbx", "app", "-n", namespace, "--type=merge", "-p",
        '{"spec":{"restoreRequest":{"id":"r1","checkpointName":"app-pre-execute"}}}',
    )  # fmt: skip
    wait_until(
        "restore r1 handled",
        lambda: kube.status("sandbox", namespace, "app").get("lastRestoreRequestId") == "r1",
        120,
    )
    path = status["sandboxPath"]
    pod = status["workspacePod"]
    content = kube.exec(namespace, pod, f"cat '{path}/f.txt'", container="workspace")
    assert content == "checkpointed\n"
    listing = kube.exec(namespace, pod, f"ls '{path}'", container="workspace").split()
    assert "extra.txt" not in listing
    assert originals.read("repos/app/f.txt") == "line1\n"


def test_operator_killed_mid_plancommit_ends_consistent(
    kube: Kube, namespace: str, originals: Originals, operator_release: Release
) -> None:
    three_sandbox_plan(kube, namespace, "plan-kill")
    (old_pod,) = operator_release.pod_names(kube)
    kube.apply(namespace, plancommit_manifest("commit-kill", "plan-kill"))
    # Kill the operator Pod as soon as the saga has started (phase Committing).
    wait_until(
        "PlanCommit Committing",
        lambda: (
            kube.status("plancommit", namespace, "commit-kill").get("phase")
            in {"Committing"} | TERMINAL
        ),
        60,
        interval=0.1,
    )
    mid = kube.status("plancommit", namespace, "commit-kill")
    kube.kubectl(
        "delete", "pod", old_pod, "-n", operator_release.namespace, "--grace-period=0", "--force"
    )
    # The Deployment brings a new operator Pod; it finishes the PlanCommit.
    new_pod = wait_until(
        "a new operator Pod Running",
        lambda: next(
            (
                p
                for p in operator_release.pod_names(kube)
                if p != old_pod
                and kube.json("get", "pod", p, "-n", operator_release.namespace)["status"].get(
                    "phase"
                )
                == "Running"
            ),
            None,
        ),
        180,
    )
    assert new_pod != old_pod
    final = kube.wait_phase("plancommit", namespace, "commit-kill", TERMINAL, timeout=240)
    g, h, f, _ = originals_state(originals)
    changed = [g == "d1\n", h == "o1\n", f == "r1\n"]
    assert all(changed) or not any(changed), (changed, final, mid)
    assert all(changed) == (final["phase"] == "Committed"), (changed, final)
    # No sandbox was committed twice: one commit on top of the initial one at most.
    assert int(originals.git("rev-list", "--count", "main")) <= 2
    print(f"killed at phase {mid.get('phase')!r} ({mid.get('sandboxes')}); ended {final['phase']}")


def test_delete_cleanup_leaves_nothing(kube: Kube, namespace: str, originals: Originals) -> None:
    statuses = three_sandbox_plan(kube, namespace, "plan-gc")
    plan_selector = "sandbox.cleveragents.io/plan-id=plan-gc"
    assert len(kube.names("pods", namespace, plan_selector)) == 3
    assert kube.names("pvc", namespace, plan_selector)
    volumes_before = {
        pv["metadata"]["name"]
        for pv in kube.json("get", "pv")["items"]
        if (pv["spec"].get("claimRef") or {}).get("namespace") == namespace
        and pv["spec"]["claimRef"]["name"] != "originals"
    }
    assert volumes_before
    kube.apply(namespace, plancommit_manifest("commit-gc", "plan-gc", cleanup="Delete"))
    assert kube.wait_phase("plancommit", namespace, "commit-gc", TERMINAL)["phase"] == "Committed"
    # cleanupPolicy Delete: the Sandboxes go as soon as the commit succeeded.
    wait_until("the plan's Sandboxes gone", lambda: not kube.names("sbx", namespace, ""), 120)
    assert kube.names("pcommit", namespace, "") == ["commit-gc"]

    kube.kubectl("delete", "pcommit", "commit-gc", "-n", namespace, "--wait=true", "--timeout=180s")
    wait_until("the plan's Sandboxes gone", lambda: not kube.names("sbx", namespace, ""), 120)
    wait_until(
        "the plan's Pods gone", lambda: not kube.names("pods", namespace, plan_selector), 120
    )
    assert not kube.names("pvc", namespace, plan_selector)
    assert kube.names("pvc", namespace, "") == ["originals"]
    wait_until(
        "the scratch volumes deleted",
        lambda: (
            not volumes_before & {pv["metadata"]["name"] for pv in kube.json("get", "pv")["items"]}
        ),
        60,
    )
    # No worktree, sandbox branch or sandbox tag is left in the repository.
    assert originals.git("worktree", "list", "--porcelain").count("worktree ") == 1
    assert originals.git("branch", "--list", "sandbox/*") == ""
    assert originals.git("tag", "--list", "sandbox/*") == ""
    # The originals keep the committed content; nothing of the sandboxes is left on the volume.
    assert originals_state(originals)[:3] == ("d1\n", "o1\n", "r1\n")
    leftovers = originals.sh("ls -A data && ls -A layer && ls -A repos")
    assert leftovers.split() == ["g.txt", "h.txt", "app"], leftovers
    assert all(s["sandboxPath"] not in leftovers for s in statuses.values())
