"""Names of the objects the pod executor makes per Sandbox (kopf-free: the client reads them).

One definition for the operator (``executors.pod``) and the engine's client
(``sandbox_client.agent_files``), which reads the agent token from the Secret named here.
"""

from __future__ import annotations

import re

AGENT_SECRET_SUFFIX = "agent"  # noqa: S105 - the Secret holding the workspace agent's token
AGENT_TOKEN_KEY = "token"  # noqa: S105 - the Secret's key, not a token


def child_object_name(sandbox_name: str, suffix: str) -> str:
    """DNS-1123 name of a child object: ``sbx-<sandbox name>-<suffix>`` cut to 63 chars."""
    base = re.sub(r"[^a-z0-9-]", "-", sandbox_name.lower())
    return f"sbx-{base}"[: 62 - len(suffix)].rstrip("-") + f"-{suffix}"
