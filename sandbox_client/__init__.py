"""sandbox_client: the engine's side of the sandbox operator (issue 10).

A typed client for the ``Sandbox``, ``Checkpoint`` and ``PlanCommit`` custom resources, sync
(this module) and async (:mod:`sandbox_client.aio`, the same names). The ``kubectl-sandbox``
plugin (:mod:`sandbox_client.kubectl_plugin`) and the ``sandbox-mcp`` MCP server
(:mod:`sandbox_client.mcp_server`) are built on it. Tutorial: docs/client.md.

The spec models are the operator's own (:mod:`sandbox_api.models`), re-exported here.
"""

from sandbox_client.client import Plan, Sandbox, SandboxClient
from sandbox_client.errors import (
    ConflictError,
    NotFoundError,
    OperationFailedError,
    RefusedError,
    SandboxClientError,
    WaitTimeoutError,
)
from sandbox_client.files import FileOperations, LocalFileOperations
from sandbox_client.models import (
    CheckpointInfo,
    Condition,
    HistoryEntry,
    PlanCommitPhase,
    PlanCommitResult,
    PlanReview,
    ReviewedSandbox,
    SandboxInfo,
    SandboxPhase,
    SandboxSource,
    SandboxSpec,
)

__all__ = [
    "CheckpointInfo",
    "Condition",
    "ConflictError",
    "FileOperations",
    "HistoryEntry",
    "LocalFileOperations",
    "NotFoundError",
    "OperationFailedError",
    "Plan",
    "PlanCommitPhase",
    "PlanCommitResult",
    "PlanReview",
    "RefusedError",
    "ReviewedSandbox",
    "Sandbox",
    "SandboxClient",
    "SandboxClientError",
    "SandboxInfo",
    "SandboxPhase",
    "SandboxSource",
    "SandboxSpec",
    "WaitTimeoutError",
]
