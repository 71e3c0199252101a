"""Nothing is deleted while the workspace agent refuses the cleanup.

A security review found: the pod executor's cleanup swallowed the agent's
refusal and deleted the scratch claim anyway (the claim holds what an undo of the original
needs). Now the refusal is raised, no child is deleted, and the Sandbox's finalizer (which
turns any cleanup error into a retry and a ``CleanupFailed`` Event) keeps the object; the
retry, once the cause is gone, is run again by the agent (a failed cleanup is not replayed
from its request journal) and then deletes the children.

Real parts: a workspace agent process on 127.0.0.1, a copy_on_write sandbox of a real
directory, a real refusal (a file of the sandbox made immutable with ``chattr +i``, so its
removal fails as on a volume that refuses it). The pod executor runs unchanged except for its
two Kubernetes-facing edges: the Pod lookup (straight to the agent, as the agent tests do) and
the deletion of the children (recorded, to be asserted).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.executors.pod import PodExecutor
from sandbox_operator.settings import Settings

from sandbox_core.agent import wire
from tests.support.agent import SANDBOX_ID, UID, AgentProcess


class AgentPodExecutor(PodExecutor):
    """The pod executor with its Pod lookup going straight to the agent process, and the
    children's deletion recorded instead of sent to an API server."""

    def __init__(self, agent: AgentProcess) -> None:
        super().__init__(Settings(executor="pod"), api=None)  # type: ignore[arg-type]
        self.agent = agent
        self.deleted: list[bool] = []

    def call(
        self,
        target: SandboxTarget,
        method: str,
        path: str,
        body: dict[str, Any] | bytes | None = None,
        *,
        query: dict[str, str] | None = None,
        request_id: str = "",
    ) -> dict[str, Any]:
        return self.agent.client().call(method, path, body, query=query, request_id=request_id)

    def _delete_children(self, target: SandboxTarget, *, pod_only: bool) -> None:
        self.deleted.append(pod_only)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path).start()
    yield process
    process.stop()


def test_a_refused_cleanup_deletes_nothing_and_a_retry_runs_it_again(
    agent: AgentProcess, tmp_path: Path
) -> None:
    original = tmp_path / "orig"
    original.mkdir()
    (original / "f").write_text("v0\n")
    client = agent.client()
    body = {
        "plan_id": "plan-c", "resource_id": "r", "strategy": "copy_on_write",
        "original": str(original), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    client.call("POST", "/v1/sandboxes", body, request_id="create-c")
    path = client.call("GET", wire.PATH.path(sid=SANDBOX_ID), query={wire.PATH_QUERY: "f"})
    stuck = Path(path["path"])
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    target = SandboxTarget(
        name="s", namespace="ns", uid=UID, sandbox_id=SANDBOX_ID, plan_id="plan-c",
        resource_id="r", strategy="copy_on_write", original=str(original),
    )  # fmt: skip
    executor = AgentPodExecutor(agent)
    try:
        with pytest.raises(ExecutorError) as refused:
            executor.cleanup(target)
        assert not refused.value.retryable
        assert "SandboxError" in str(refused.value)
        assert executor.deleted == [], "the scratch claim must outlive a refused cleanup"
        assert client.call("GET", wire.STATUS.path(sid=SANDBOX_ID))["record"]["status"] in (
            "created",
            "active",
        )
        # Still refused on retry: the agent runs it again (a stored refusal would also do).
        with pytest.raises(ExecutorError):
            executor.cleanup(target)
        assert executor.deleted == []
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    # The cause is gone: the same retry (same request id) now cleans up, then the children go.
    executor.cleanup(target)
    assert executor.deleted == [False]
    assert not stuck.exists()
    assert (original / "f").read_text() == "v0\n"
