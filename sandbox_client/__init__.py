"""sandbox_client: the engine's side of the sandbox operator.

A typed client for the ``Sandbox``, ``Checkpoint`` and ``PlanCommit`` custom resources, sync
(this module) and async (:mod:`sandbox_client.aio`, the same names). The ``kubectl-sandbox``
plugin (:mod:`sandbox_client.kubectl_plugin`) and the ``sandbox-mcp`` MCP server
(:mod:`sandbox_client.mcp_server`) are built on it. Tutorial: docs/client.md.

The spec models are the operator's own (:mod:`sandbox_api.models`), re-exported here.

The names are resolved lazily (PEP 562), as in ``sandbox_core``: ``import sandbox_client`` or
``import sandbox_client.errors`` loads no model, no Kubernetes client and nothing of the core
beyond its vocabulary; a name's module is imported on first access, then the name is cached in
this module's namespace. The Kubernetes clients themselves are imported on the first call that
talks to the API server (:mod:`sandbox_client._kube`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        AuditPage,
        CheckpointInfo,
        Condition,
        EditResult,
        ExecChunk,
        ExecResult,
        FileChange,
        FileResult,
        FileStat,
        GlobResult,
        GrepResult,
        HistoryEntry,
        PlanCommitPhase,
        PlanCommitResult,
        PlanReview,
        ReviewedSandbox,
        SandboxInfo,
        SandboxPhase,
        SandboxSource,
        SandboxSpec,
        SqlResult,
    )

# Public name -> its module (the attribute has the same name there).
_EXPORTS: dict[str, str] = {
    "SqlResult": "sandbox_client.models",
    "GrepResult": "sandbox_client.models",
    "GlobResult": "sandbox_client.models",
    "FileStat": "sandbox_client.models",
    "FileResult": "sandbox_client.models",
    "FileChange": "sandbox_client.models",
    "ExecResult": "sandbox_client.models",
    "ExecChunk": "sandbox_client.models",
    "EditResult": "sandbox_client.models",
    "AuditPage": "sandbox_client.models",
    "CheckpointInfo": "sandbox_client.models",
    "Condition": "sandbox_client.models",
    "ConflictError": "sandbox_client.errors",
    "FileOperations": "sandbox_client.files",
    "HistoryEntry": "sandbox_client.models",
    "LocalFileOperations": "sandbox_client.files",
    "NotFoundError": "sandbox_client.errors",
    "OperationFailedError": "sandbox_client.errors",
    "Plan": "sandbox_client.client",
    "PlanCommitPhase": "sandbox_client.models",
    "PlanCommitResult": "sandbox_client.models",
    "PlanReview": "sandbox_client.models",
    "RefusedError": "sandbox_client.errors",
    "ReviewedSandbox": "sandbox_client.models",
    "Sandbox": "sandbox_client.client",
    "SandboxClient": "sandbox_client.client",
    "SandboxClientError": "sandbox_client.errors",
    "SandboxInfo": "sandbox_client.models",
    "SandboxPhase": "sandbox_client.models",
    "SandboxSource": "sandbox_client.models",
    "SandboxSpec": "sandbox_client.models",
    "WaitTimeoutError": "sandbox_client.errors",
}

__all__ = [
    "AuditPage",
    "CheckpointInfo",
    "Condition",
    "ConflictError",
    "EditResult",
    "ExecChunk",
    "ExecResult",
    "FileChange",
    "FileOperations",
    "FileResult",
    "FileStat",
    "GlobResult",
    "GrepResult",
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
    "SqlResult",
    "WaitTimeoutError",
]


def __getattr__(name: str) -> Any:
    try:
        module_name = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'sandbox_client' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
