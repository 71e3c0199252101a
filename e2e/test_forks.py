"""Tier 3: forks and pre-commit checks with the pod executor (docs/forks.md, "Forks in
workspace Pods").

A Sandbox in its workspace Pod, a Checkpoint of it, two forks, each in a workspace Pod of its
own that started from the checkpoint carried by the operator from the parent's agent to its
own; the parent deleted (the forks never need it again); a PlanCommit whose check fails in the
fork's jail (its exit code and output in the result, nothing touched); then a PlanCommit naming
one fork, with a check that passes there, commits it and discards the other. The original holds
exactly the committed fork's content.
"""

from __future__ import annotations

from typing import Any

from e2e.conftest import Originals
from e2e.kube import Kube
from sandbox_client import Plan, SandboxClient


def claim(sub_path: str) -> dict[str, Any]:
    return {"persistentVolumeClaim": {"claimName": "originals", "subPath": sub_path}}


def test_two_forks_in_workspace_pods_one_committed_the_other_discarded(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    client = SandboxClient(namespace=namespace)
    plan = Plan(client, "forks-e2e", namespace)
    base = plan.add_sandbox("base", "copy_on_write", claim("data"))
    parent = base.wait_ready(timeout=300)
    assert parent.executor == "pod" and parent.workspace_pod
    base.write_file("g.txt", "tuned\n")
    base.write_file("conf/limits.ini", "retries = 2\n")
    start = base.checkpoint("explore", name="explore")
    base.write_file("late.txt", "after the checkpoint\n")  # not part of the forks

    forks = [base.fork(start, name=f"attempt-{n}") for n in (1, 2)]
    pods = {parent.workspace_pod}
    for fork in forks:
        info = fork.wait_ready(timeout=300)
        assert info.workspace_pod and info.workspace_pod not in pods
        pods.add(info.workspace_pod)
        assert fork.read_file("g.txt") == "tuned\n"
        assert fork.read_file("conf/limits.ini") == "retries = 2\n"
        assert sorted(fork.list_files()) == ["conf/limits.ini", "g.txt"]
    base.delete(wait=True, timeout=300)  # the forks never need their parent again
    forks[0].write_file("a.txt", "one\n")
    forks[1].write_file("b.txt", "two\n")
    forks[1].write_file("g.txt", "the other attempt\n")

    # A check runs in the fork's jail through the workspace agent's command route: one that
    # fails ends the PlanCommit before anything lands.
    failing = {
        "name": "has-b",
        "sandbox": "attempt-1",
        "command": ["sh", "-c", "cat a.txt; test -f b.txt"],
        "timeoutSeconds": 60,
    }
    refused = plan.commit(sandboxes=["attempt-1"], checks=[failing], timeout=300)
    assert not refused.committed
    [result] = refused.validation
    assert (result["name"], result["passed"], result["exitCode"]) == ("has-b", False, 1), result
    assert result["outputTail"].strip() == "one", result
    assert originals.read("data/g.txt") == "d0\n"
    assert sorted(o["metadata"]["name"] for o in client.list_objects("sandboxes", namespace)) == [
        "attempt-1",
        "attempt-2",
    ]

    passing = {
        "name": "has-a",
        "sandbox": "attempt-1",
        "command": ["test", "-f", "a.txt"],
        "timeoutSeconds": 60,
    }
    done = plan.commit(sandboxes=["attempt-1"], checks=[passing], timeout=300)
    assert done.committed, done.conditions
    assert [(r["name"], r["passed"]) for r in done.validation] == [("has-a", True)]

    def only_the_committed(objects: dict[str, Any]) -> list[str] | None:
        return sorted(objects) if sorted(objects) == ["attempt-1"] else None

    left = client.wait(
        "sandboxes", only_the_committed, 300, "the other fork gone", namespace=namespace
    )
    assert left == ["attempt-1"]
    recorded = {commit.name: commit for commit in plan.commits()}[done.name]
    assert recorded.discarded_sandboxes == ["attempt-2"]
    assert originals.read("data/g.txt") == "tuned\n"
    assert originals.read("data/conf/limits.ini") == "retries = 2\n"
    assert originals.read("data/a.txt") == "one\n"
    assert sorted(originals.sh("ls -A data").split()) == ["a.txt", "conf", "g.txt"]
