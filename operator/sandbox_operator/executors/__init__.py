"""Executors: where the core runs for a Sandbox (DESIGN.md, "Where the work happens")."""

from sandbox_operator.executors.base import (
    CheckpointInfo,
    Executor,
    SandboxHandle,
    SandboxState,
    SandboxTarget,
)

__all__ = ["CheckpointInfo", "Executor", "SandboxHandle", "SandboxState", "SandboxTarget"]
