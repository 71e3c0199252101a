"""The workspace agent: a workspace Pod's main process, serving sandbox operations over HTTP.

One long-lived process (``sandbox-core serve-workspace``) keeps the core in memory and answers
the operator over the pod network, so a call costs one HTTP round trip instead of an exec that
starts a Python process.

- :mod:`~sandbox_core.agent.wire`: the contract on the wire (routes, headers, error codes,
  limits), shared with every client; standard library and the core's vocabulary only.
- :mod:`~sandbox_core.agent.operations`: the sandbox operations, synchronous, without HTTP.
- :mod:`~sandbox_core.agent.server`: the aiohttp application and :func:`serve`; the only module
  of ``sandbox_core`` that imports aiohttp.

The names below are resolved lazily (PEP 562), so ``import sandbox_core.agent.wire`` (a client)
loads neither aiohttp nor the strategies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox_core.agent.operations import RESTORABLE, AgentConfig, Operations
    from sandbox_core.agent.server import Agent, RequestJournal, serve
    from sandbox_core.agent.wire import (
        DEFAULT_PORT,
        ENV_REF,
        REPLAY_HEADER,
        REQUEST_ID_HEADER,
        TOKEN_FILE,
        TOKEN_HEADER,
        AgentError,
    )

# Public name -> the module defining it.
_EXPORTS: dict[str, str] = {
    "Agent": "sandbox_core.agent.server",
    "AgentConfig": "sandbox_core.agent.operations",
    "AgentError": "sandbox_core.agent.wire",
    "DEFAULT_PORT": "sandbox_core.agent.wire",
    "ENV_REF": "sandbox_core.agent.wire",
    "Operations": "sandbox_core.agent.operations",
    "REPLAY_HEADER": "sandbox_core.agent.wire",
    "REQUEST_ID_HEADER": "sandbox_core.agent.wire",
    "RESTORABLE": "sandbox_core.agent.operations",
    "RequestJournal": "sandbox_core.agent.server",
    "TOKEN_FILE": "sandbox_core.agent.wire",
    "TOKEN_HEADER": "sandbox_core.agent.wire",
    "serve": "sandbox_core.agent.server",
}

__all__ = [
    "DEFAULT_PORT",
    "ENV_REF",
    "REPLAY_HEADER",
    "REQUEST_ID_HEADER",
    "RESTORABLE",
    "TOKEN_FILE",
    "TOKEN_HEADER",
    "Agent",
    "AgentConfig",
    "AgentError",
    "Operations",
    "RequestJournal",
    "serve",
]


def __getattr__(name: str) -> Any:
    """Import the module defining ``name`` on first access, then cache the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
