"""Tier 3: the engine's client flow against the real cluster with the pod executor.

The client runs where an engine runs, outside the cluster, with the admin kubeconfig: it creates
a plan of three Sandboxes (git_worktree, copy_on_write, overlay over the originals' claim),
reads, writes, lists and diffs through their workspace agents (the API server's pod proxy; the
workspace Pods' NetworkPolicies are in place and unchanged), checkpoints and restores, reviews
and approves (the commit of exactly the reviewed changes). A second plan is committed directly
by a ServiceAccount bound to exactly the Role docs/client.md documents (a bearer token: the API
server consumes ``Authorization``, the agent token travels in its own header); then cleanup.
It also measures 100 ``write_file`` + ``read_file`` pairs through the agent (sync client) and
writes them to ``$E2E_CLIENT_BENCH_OUT`` (default ``/tmp/bench-client-e2e.md``) for
docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import Originals
from e2e.kube import Kube
from sandbox_client import Plan, RefusedError, SandboxClient, aio

PAYLOAD = "".join(f"line {n:04d} of a one-kibibyte file.\n" for n in range(32))[:1024]
BENCH_CALLS = 100


def claim(sub_path: str) -> dict[str, Any]:
    """The source of a Sandbox over ``sub_path`` of the originals' claim."""
    return {"persistentVolumeClaim": {"claimName": "originals", "subPath": sub_path}}


DOC = Path(__file__).resolve().parents[1] / "docs" / "client.md"


def engine_kubeconfig(kube: Kube, namespace: str, work: Path) -> str:
    """A kubeconfig for a ServiceAccount of ``namespace`` bound to the documented Role."""
    section = DOC.read_text().split("### RBAC", 1)[1]
    role = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "sandbox-engine"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "sandbox-engine",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "engine", "namespace": namespace}],
    }
    kube.kubectl("create", "serviceaccount", "engine", "-n", namespace)
    kube.apply(namespace, role, binding)
    token = kube.kubectl("create", "token", "engine", "-n", namespace).strip()
    admin = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": "engine", "user": {"token": token}}],
        "contexts": [{"name": "engine", "context": {"cluster": "e2e", "user": "engine"}}],
        "current-context": "engine",
    }
    path = work / "engine.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)


def approver(kube: Kube, namespace: str) -> str:
    """The user alice, who may read and approve PlanCommits of ``namespace``; her name."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "plancommit-approver"},
        "rules": [
            {
                "apiGroups": ["sandbox.cleveragents.io"],
                "resources": ["plancommits"],
                "verbs": ["get", "list", "watch", "patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "plancommit-approver"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "plancommit-approver",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }
    kube.apply(namespace, role, binding)
    return "alice"


def test_client_flow_through_the_workspace_agents(
    kube: Kube, namespace: str, originals: Originals, tmp_path: Path
) -> None:
    client = SandboxClient(namespace=namespace)
    plan = Plan(client, "client-e2e", namespace)
    repo = plan.add_sandbox("repo", "git_worktree", claim("repos/app"))
    data = plan.add_sandbox("data", "copy_on_write", claim("data"))
    layer = plan.add_sandbox("layer", "overlay", claim("layer"), options={"overlayMode": "auto"})
    infos = plan.wait_ready(timeout=300)
    assert {info.executor for info in infos} == {"pod"}, infos
    assert all(info.workspace_pod for info in infos)
    # The workspace Pods' NetworkPolicies are in place: the proxied calls below pass them.
    policies = kube.json("get", "networkpolicies", "-n", namespace)["items"]
    assert len(policies) == 3, [p["metadata"]["name"] for p in policies]

    repo.write_file("f.txt", "line1\nline2\n")
    repo.write_file("src/new.py", "x = 1\n")
    data.write_file("g.txt", "d1\n")
    layer.write_file("h.txt", "o1\n")
    assert repo.read_file("f.txt") == "line1\nline2\n"
    assert repo.list_files() == ["f.txt", "src/new.py"]
    assert data.list_files() == ["g.txt"]
    assert "+line2" in repo.diff() and "src/new.py" in repo.diff()
    assert "+d1" in data.diff()
    for escape in ("../escape.txt", "/etc/passwd"):
        with pytest.raises(RefusedError) as refused:
            repo.write_file(escape, "no")
        assert refused.value.reason == "PathTraversal"
    assert originals.read("data/g.txt") == "d0\n"  # nothing lands before the commit

    before = data.checkpoint("before_rewrite", {"step": "e2e"})
    data.write_file("g.txt", "oops\n")
    data.restore(before)
    assert data.read_file("g.txt") == "d1\n"

    review = plan.review(message="e2e: client flow")
    assert review.digest.startswith("sha256:") and not review.has_conflicts
    assert len(review.sandboxes) == 3
    # A person approves, not the identity that asked for the review (docs/approvals.md).
    with SandboxClient(namespace=namespace, impersonate=approver(kube, namespace)) as person:
        result = Plan(person, plan.plan_id, namespace).approve(review.digest, timeout=300)
    assert result.committed, result.conditions
    assert result.raw["status"]["approvedBy"] == "alice"
    assert originals.read("repos/app/f.txt") == "line1\nline2\n"
    assert originals.read("repos/app/src/new.py") == "x = 1\n"
    assert originals.read("data/g.txt") == "d1\n"
    assert originals.read("layer/h.txt") == "o1\n"

    # A second plan committed directly by the engine's own identity (the documented Role),
    # with the async client and the agent benchmark.
    engine = engine_kubeconfig(kube, namespace, tmp_path)
    engine_client = SandboxClient(kubeconfig=engine, namespace=namespace)
    second = Plan(engine_client, "client-e2e-direct", namespace)
    work = second.add_sandbox("work", "copy_on_write", claim("data"))
    second.wait_ready(timeout=300)
    started = time.perf_counter()
    for i in range(BENCH_CALLS):
        work.write_file(f"bench/f{i:03d}.txt", PAYLOAD)
        assert work.read_file(f"bench/f{i:03d}.txt") == PAYLOAD
    elapsed = time.perf_counter() - started

    async def with_asyncio() -> None:
        async with aio.SandboxClient(kubeconfig=engine, namespace=namespace) as async_client:
            sandbox = async_client.sandbox(work.name)
            await sandbox.write_file("async.txt", "async\n")
            assert await sandbox.read_file("async.txt") == "async\n"
            assert "async.txt" in await sandbox.list_files()

    asyncio.run(with_asyncio())
    committed = second.commit(message="e2e: direct commit", timeout=300)
    assert committed.committed, committed.conditions
    assert originals.read("data/async.txt") == "async\n"
    assert originals.read("data/bench/f099.txt") == PAYLOAD

    plan.delete(cleanup=True)
    second.delete(cleanup=True)
    assert plan.sandboxes() == [] and second.sandboxes() == []
    client.close()
    engine_client.close()

    out = Path(os.environ.get("E2E_CLIENT_BENCH_OUT", "/tmp/bench-client-e2e.md"))  # noqa: S108
    out.write_text(
        f"{BENCH_CALLS} x (write_file + read_file) of a 1 KiB file through the workspace agent "
        f"(sync client, pod proxy, copy_on_write): {elapsed:.3f} s, "
        f"{elapsed / (2 * BENCH_CALLS) * 1000:.2f} ms per call\n"
    )
