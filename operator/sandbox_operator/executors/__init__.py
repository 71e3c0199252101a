"""Executors: where the core runs for a Sandbox (DESIGN.md, "Where the work happens").

:mod:`.base` is the interface; :mod:`.local` runs the core in the operator's process;
:mod:`.pod` runs it in one workspace Pod per Sandbox, built by the pure functions of
:mod:`.pod_manifests` and called over HTTP through :mod:`.remote` and :mod:`.agent_client`.

May import: :mod:`sandbox_operator.errors`, :mod:`sandbox_operator.kube`,
:mod:`sandbox_operator.settings`, ``sandbox_api`` and the core. Not kopf (a child is adopted
through :func:`sandbox_operator.kube.api.adopt`), and nothing of ``resources``, ``reconcilers``,
``runtime`` or ``main``.
"""

from sandbox_operator.executors.base import (
    CheckpointInfo,
    Executor,
    SandboxHandle,
    SandboxState,
    SandboxTarget,
)

__all__ = ["CheckpointInfo", "Executor", "SandboxHandle", "SandboxState", "SandboxTarget"]
