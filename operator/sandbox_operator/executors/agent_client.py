"""The operator's side of the workspace agent (``sandbox_core.agent``): tokens and HTTP calls.

Tokens: ``token = HMAC-SHA256(key, sandbox uid)`` in hex, where ``key`` is the
operator's agent key (a Secret in the operator's own namespace, read and, when absent, made by
the operator: :mod:`~sandbox_operator.executors.agent_keys`). The operator hands the token to
one workspace Pod through a Secret it creates in the Sandbox's namespace, mounted as a file;
nothing else ever carries it, and no message of this
module contains it.

The routes, headers and status codes are the agent's own table, :mod:`sandbox_core.agent.wire`.

Request ids: a changing call carries one (:data:`~sandbox_core.agent.wire.REQUEST_ID_HEADER`);
the agent stores the reply under it. The ids are derived from what the call means (operation,
sandbox, arguments, and the state the operator saw before calling), so the same logical call
retried after a lost reply or an operator restart gets the same id and the agent does nothing
twice.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, BinaryIO

from sandbox_core.agent import tokens, wire
from sandbox_operator.errors import ExecutorError
from sandbox_operator.kube import tracing

AGENT_PORT = wire.DEFAULT_PORT


def derive_token(key: bytes, uid: str, serial: int | None = None, lifetime_seconds: int = 0) -> str:
    """The bearer token of the Sandbox with ``uid``.

    With ``serial`` (the renewal window, :func:`token_serial`) and a ``lifetime_seconds`` > 0:
    a token that expires, ``v2.<serial>.<lifetime>.<hex HMAC-SHA256>``
    (:mod:`sandbox_core.agent.tokens`); without: the bare hex HMAC-SHA256 of ``uid``, which
    never expires (the tokens of Sandboxes made before tokens expired).
    """
    if serial is None or lifetime_seconds <= 0:
        return hmac.new(key, uid.encode(), hashlib.sha256).hexdigest()
    text = tokens.signed_text(uid, serial, lifetime_seconds)
    mac = hmac.new(key, text, hashlib.sha256).hexdigest()
    return tokens.format_token(serial, lifetime_seconds, mac)


def token_serial(now_seconds: float, lifetime_seconds: int) -> int:
    """The renewal window of ``now_seconds`` (this process's clock, in seconds): a new token is
    minted every half lifetime. Only a label: the agent measures a token's age itself, so
    another replica's clock, ahead or behind, makes at most one more renewal."""
    return int(now_seconds // max(1, lifetime_seconds // 2))


def request_id(*parts: object) -> str:
    """A deterministic request id from the call's meaning (``op``, sandbox id, arguments...)."""
    text = json.dumps([str(p) for p in parts])
    return f"{parts[0]}-{hashlib.sha256(text.encode()).hexdigest()[:40]}"


class AgentUnauthorized(ExecutorError):  # noqa: N818 - named for what the agent did
    """The agent refused the token (HTTP 401): nothing was done (the token is checked first).

    Retryable: after a key rotation the previous key's token may be the one the Pod holds
    (:mod:`~sandbox_operator.executors.agent_keys`), after a renewal the previous window's.
    ``expired``: the agent knew the token and refused it as held past its lifetime
    (``wire.TOKEN_EXPIRED``)."""

    def __init__(self, message: str, *, expired: bool = False) -> None:
        super().__init__(message, retryable=True)
        self.expired = expired


class AgentRefused(ExecutorError):  # noqa: N818 - named for what the agent did
    """The agent refused the call (HTTP 4xx): the core's error as the agent reported it.

    ``error_type`` is the core exception's class name (``SandboxCommitError``,
    ``TwoPhaseUnavailableError``...), ``detail`` the agent's message, ``conflicts`` the
    conflicting paths or statements of a refused commit or prepare (empty otherwise, read by
    the saga and the two-phase coordinator like a core ``SandboxCommitError``'s), ``error`` the
    whole error object of the reply. ``wire.core_error(refused.error, refused.detail)`` is the
    core exception it stands for.
    """

    def __init__(self, message: str, *, error: dict[str, Any], retryable: bool = False) -> None:
        super().__init__(message, retryable=retryable)
        self.error = dict(error)
        self.error_type = str(error.get("type") or "Error")
        self.detail = str(error.get("message") or message)
        self.conflicts = [str(c) for c in error.get("conflicts") or []]


class AgentNotFound(AgentRefused):
    """The agent has no such sandbox or checkpoint (HTTP 404)."""


class AgentClient:
    """Synchronous JSON calls to one workspace agent (kopf runs sync handlers in threads).

    Args:
        base_url: ``http://<pod IP>:<port>``.
        token: the Sandbox's bearer token.
        timeout_seconds: limit of one call.
    """

    def __init__(self, base_url: str, token: str, timeout_seconds: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout_seconds = timeout_seconds

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | bytes | BinaryIO | None = None,
        *,
        query: dict[str, str] | None = None,
        request_id: str = "",
        length: int | None = None,
    ) -> dict[str, Any]:
        """One call; returns the JSON reply. ``body``: a JSON object, bytes, or a binary
        stream of ``length`` bytes, read and sent as it comes (a bundle piped from another
        agent, :mod:`sandbox_core.agent.bundle`).

        Raises:
            AgentNotFound: 404.
            AgentUnauthorized: 401 (the token is not this Pod's).
            ExecutorError: the agent refused (4xx, not retryable; the core's error type and
                message) or could not be reached / failed (retryable). Messages name the
                method and path only (never the token, never a DSN).
        """
        what = f"agent {method} {path}"
        with self.stream(
            method, path, body, query=query, request_id=request_id, length=length
        ) as reply:
            try:
                return _decode(reply.read(), what)
            except (OSError, TimeoutError) as exc:
                raise ExecutorError(f"{what}: {type(exc).__name__}", retryable=True) from None

    def stream(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | bytes | BinaryIO | None = None,
        *,
        query: dict[str, str] | None = None,
        request_id: str = "",
        length: int | None = None,
        accept: str = "",
    ) -> http.client.HTTPResponse:
        """One call whose reply the caller reads as it comes (and closes): an exec's NDJSON,
        a checkpoint's bundle. Arguments as :meth:`call`.

        Raises:
            The errors of :meth:`call`, for a refusal before the reply's body.
        """
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data: bytes | BinaryIO | None = None if isinstance(body, dict) else body
        headers = {wire.AUTHORIZATION_HEADER: f"{wire.BEARER_PREFIX}{self._token}"}
        if isinstance(body, dict):
            data = json.dumps(body).encode()
            headers["Content-Type"] = wire.JSON_CONTENT_TYPE
        elif body is not None and not isinstance(body, bytes):
            headers["Content-Type"] = wire.TAR_CONTENT_TYPE
            if length is not None:
                headers["Content-Length"] = str(length)
        if accept:
            headers["Accept"] = accept
        if request_id:
            headers[wire.REQUEST_ID_HEADER] = request_id
        tracing.inject(headers)  # traceparent of the operator's span, when tracing is on
        request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - http only, built from the Pod IP
        what = f"agent {method} {path}"
        try:
            reply: http.client.HTTPResponse = urllib.request.urlopen(  # noqa: S310
                request, timeout=self.timeout_seconds
            )
        except urllib.error.HTTPError as exc:
            with exc:
                payload = _decode(exc.read(), what, strict=False)
            error = wire.error_of(payload)
            message = f"{error.get('type', 'Error')}: {error.get('message', exc.reason)}"
            if exc.code == wire.NOT_FOUND:
                raise AgentNotFound(message, error=error) from None
            if exc.code == wire.UNAUTHORIZED:
                expired = error.get("type") == wire.TOKEN_EXPIRED
                why = "token expired" if expired else "token"
                raise AgentUnauthorized(f"{what}: refused ({why})", expired=expired) from None
            if exc.code >= wire.SERVER_ERROR:
                raise ExecutorError(message, retryable=True) from None
            raise AgentRefused(message, error=error) from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ExecutorError(f"{what}: {type(reason).__name__}", retryable=True) from None
        return reply


def _decode(raw: bytes, what: str, *, strict: bool = True) -> dict[str, Any]:
    try:
        payload = json.loads(raw or b"{}")
    except ValueError as exc:
        if not strict:
            return {}
        raise ExecutorError(f"{what}: reply is not JSON", retryable=True) from exc
    return payload if isinstance(payload, dict) else {"value": payload}
