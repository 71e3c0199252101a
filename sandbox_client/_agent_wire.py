"""The workspace agent's wire as the client speaks it: its routes and headers, in one place.

The workspace agent (``sandbox-core serve-workspace``) serves the same routes and reads the same
headers. This is the client's own copy, so that the client never imports the agent's server
(aiohttp's web framework, the core's host and store); tests/client/test_units.py checks it
against the agent. When the core's wire table (routes, headers, error codes shared with every
client) exists, the client imports these names from there instead.
"""

from __future__ import annotations

import urllib.parse

# The token for callers that reach the agent through the API server's pod proxy: the API server
# consumes ``Authorization`` (its own credentials) and never forwards it, so the proxied request
# carries the agent token in this header instead.
TOKEN_HEADER = "X-Sandbox-Agent-Token"  # noqa: S105 - a header name, not a token
REQUEST_ID_HEADER = "X-Request-Id"

SANDBOXES = "/v1/sandboxes"
FILES = "files"  # GET ?path= -> {"content_b64"}; PUT ?path= with the bytes
LIST = "list"  # GET ?path= -> {"entries": [{"name", "type"}]}
DIFF = "diff"  # GET -> {"diff"}


def sandbox_route(sandbox_id: str, suffix: str) -> str:
    """The agent's route ``/v1/sandboxes/{id}/{suffix}`` for one sandbox (the id quoted)."""
    return f"{SANDBOXES}/{urllib.parse.quote(sandbox_id, safe='')}/{suffix}"
