"""A git_worktree Sandbox on a PersistentVolume holding a real repository: the
workspace Pod runs with the worktree in it, a write made with ``kubectl exec`` shows up in the
diff, and a PlanCommit lands it on the original's branch."""

from __future__ import annotations

import json

from e2e.conftest import (
    Originals,
    active,
    core_cli,
    plancommit_manifest,
    sandbox_manifest,
    write_in_sandbox,
)
from e2e.kube import Kube, wait_until


def test_worktree_sandbox_write_diff_and_commit(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    head_before = originals.git("rev-parse", "HEAD")
    kube.apply(namespace, sandbox_manifest("app", "plan-git", "git_worktree", "repos/app"))
    status = active(kube, namespace, "app")

    # The workspace Pod runs the worktree, on the sandbox branch, based on main's HEAD.
    assert status["effectiveStrategy"] == "git_worktree"
    pod = kube.json("get", "pod", status["workspacePod"], "-n", namespace)
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    worktree = status["sandboxPath"]
    inside = kube.exec(
        namespace,
        status["workspacePod"],
        f"git -C '{worktree}' rev-parse --is-inside-work-tree --abbrev-ref HEAD"
        f" && git -C '{worktree}' rev-parse HEAD",
        container="workspace",
    ).split()
    assert inside[0] == "true"
    assert inside[1].startswith("sandbox/plan-git/")
    assert inside[2] == head_before
    assert inside[1] in originals.git("branch", "--list", "sandbox/*")
    assert worktree in originals.sh("git -C repos/app worktree list --porcelain")

    # A write through kubectl exec shows up in the sandbox's diff, not in the original.
    write_in_sandbox(kube, namespace, status, "f.txt", "from the sandbox\n")
    write_in_sandbox(kube, namespace, status, "new.txt", "added\n")
    diff = json.loads(core_cli(kube, namespace, status, "diff", status["sandboxId"]))["diff"]
    assert "+from the sandbox" in diff and "-line1" in diff
    assert "new.txt" in diff
    assert originals.read("repos/app/f.txt") == "line1\n"

    # The PlanCommit commits it to the original, with the commit in the history.
    kube.apply(namespace, plancommit_manifest("commit-app", "plan-git"))
    kube.kubectl(
        "wait", "-n", namespace, "--for=condition=Committed", "pcommit/commit-app", "--timeout=180s"
    )
    result = kube.status("plancommit", namespace, "commit-app")
    assert result["phase"] == "Committed"
    (entry,) = result["results"]
    assert entry["success"] is True
    assert entry["changedFiles"] == ["f.txt"] and entry["addedFiles"] == ["new.txt"]
    commit = entry["commitRef"]
    assert originals.git("rev-parse", "main") == commit
    assert originals.git("merge-base", "--is-ancestor", head_before, commit) == ""
    assert "e2e: commit-app" in originals.git("log", "--format=%s", "-n", "5", "main")
    assert originals.read("repos/app/f.txt") == "from the sandbox\n"
    assert originals.read("repos/app/new.txt") == "added\n"
    assert kube.status("sandbox", namespace, "app")["phase"] == "Committed"

    # The printer columns (docs/testing-tiers.md keeps an example).
    table = kube.kubectl("get", "sbx", "-n", namespace).splitlines()
    assert table[0].split() == ["NAME", "PHASE", "READY", "STRATEGY", "PLAN", "AGE"]
    assert table[1].split()[:5] == ["app", "Committed", "False", "git_worktree", "plan-git"]
    table = kube.kubectl("get", "pcommit", "-n", namespace).splitlines()
    assert table[0].split() == [
        "NAME", "PLAN", "ACTION", "PHASE", "APPROVED-BY", "COMMITTED", "AGE"
    ]  # fmt: skip
    row = table[1].split()  # nobody approved by name: APPROVED-BY is empty
    assert row[:4] == ["commit-app", "plan-git", "Commit", "Committed"]
    assert row[-2] == "True"


def test_deleting_a_sandbox_cleans_up_everything_it_made(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    kube.apply(namespace, sandbox_manifest("gone", "plan-del", "git_worktree", "repos/app"))
    status = active(kube, namespace, "gone")
    write_in_sandbox(kube, namespace, status, "f.txt", "never committed\n")
    selector = "sandbox.cleveragents.io/plan-id=plan-del"
    claims = kube.names("pvc", namespace, selector)
    assert claims and kube.names("pods", namespace, selector) == [status["workspacePod"]]
    volumes = {
        pv["metadata"]["name"]
        for pv in kube.json("get", "pv")["items"]
        if (pv["spec"].get("claimRef") or {}).get("name") in claims
    }
    assert volumes

    kube.kubectl("delete", "sbx", "gone", "-n", namespace, "--wait=true", "--timeout=120s")
    wait_until("the workspace Pod gone", lambda: not kube.names("pods", namespace, selector), 120)
    wait_until("the scratch claim gone", lambda: not kube.names("pvc", namespace, selector), 60)
    wait_until(
        "the scratch volume deleted",
        lambda: not volumes & {pv["metadata"]["name"] for pv in kube.json("get", "pv")["items"]},
        60,
    )
    assert originals.git("worktree", "list", "--porcelain").count("worktree ") == 1
    assert originals.git("branch", "--list", "sandbox/*") == ""
    assert originals.git("tag", "--list", "sandbox/*") == ""
    assert originals.read("repos/app/f.txt") == "line1\n"  # the original is never touched
    assert originals.git("status", "--porcelain") == ""
