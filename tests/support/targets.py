"""An executor's view of one Sandbox (:class:`SandboxTarget`) for unit tests of the pod
executor's manifests: a git repository on a claim's sub-path."""

from __future__ import annotations

from sandbox_operator.executors.base import SandboxTarget, sandbox_id_for_uid

from sandbox_api.models import SandboxOptions, SandboxSource

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def pod_target(strategy: str = "git_worktree", **options: str) -> SandboxTarget:
    return SandboxTarget(
        name="My_Sandbox",
        namespace="ns",
        uid=UID,
        sandbox_id=sandbox_id_for_uid(UID),
        plan_id="plan/with spaces",
        resource_id="r",
        strategy=strategy,
        original="/workspace/source/repo",
        source=SandboxSource.model_validate(
            {"persistentVolumeClaim": {"claimName": "data", "subPath": "repo"}}
        ),
        options=SandboxOptions.model_validate(options),
    )
