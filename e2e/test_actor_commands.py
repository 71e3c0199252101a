"""Tier 3: an actor's command in a real workspace Pod.

The workspace Pod's shape (RuntimeDefault seccomp, every capability dropped, the runtime's
masked ``/proc``) on this cluster's runtime (containerd 1.6, runc 1.1: no Pod user namespaces)
cannot hold a ``bwrap`` jail (docs/security.md, "Commands in a workspace Pod"). The promise
checked here is the one that holds anyway: the command is refused with ``JailUnavailable`` and
bwrap's own reason, nothing runs unjailed, the sandbox's files still work through the agent, and
the plan's commit lands exactly the file writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from e2e.conftest import Originals
from e2e.kube import Kube
from e2e.test_client_pod_executor import approver
from sandbox_client import OperationFailedError, Plan, SandboxClient


def claim(sub_path: str) -> dict[str, Any]:
    return {"persistentVolumeClaim": {"claimName": "originals", "subPath": sub_path}}


def test_a_command_in_a_workspace_pod_without_a_jail_is_refused_and_never_runs(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    client = SandboxClient(namespace=namespace)
    plan = Plan(client, "actor-e2e", namespace)
    data = plan.add_sandbox("data", "copy_on_write", claim("data"))
    [info] = plan.wait_ready(timeout=300)
    assert info.executor == "pod" and info.workspace_pod

    for _ in range(2):
        with pytest.raises(OperationFailedError) as refused:
            data.exec("echo ran > ran.txt", timeout=60)
        assert refused.value.reason == "JailUnavailable", refused.value
        assert "bwrap" in str(refused.value)
    assert data.list_files() == ["g.txt"]  # nothing ran: no ran.txt

    data.write_file("g.txt", "written\n")
    review = plan.review(message="e2e: actor without a jail")
    # A person approves, not the identity that asked for the review (docs/approvals.md).
    with SandboxClient(namespace=namespace, impersonate=approver(kube, namespace)) as person:
        result = Plan(person, plan.plan_id, namespace).approve(review.digest, timeout=300)
    assert result.committed, result.conditions
    assert originals.read("data/g.txt") == "written\n"
    assert originals.sh("ls data").split() == ["g.txt"]
