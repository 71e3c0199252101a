"""The workspace agent (see :mod:`sandbox_core.agent.operations`)."""

from sandbox_core.agent.operations import (
    DEFAULT_PORT,
    ENV_REF,
    REPLAY_HEADER,
    REQUEST_ID_HEADER,
    RESTORABLE,
    TOKEN_FILE,
    TOKEN_HEADER,
    Agent,
    AgentConfig,
    AgentError,
    Operations,
    RequestJournal,
    serve,
)

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
