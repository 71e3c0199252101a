"""The agent key: where the operator gets it, and the tokens it derives (current and previous).

Workspace-agent tokens are ``HMAC-SHA256(key, Sandbox uid)``
(:func:`~sandbox_operator.executors.agent_client.derive_token`). The key lives in a Secret of the
operator's own namespace, data ``key`` (the current key) and optionally ``previous`` (the key
before the last rotation):

- The operator makes that Secret when it is absent (:func:`load_or_create`), with a random key;
  the chart renders no randomness, so ``helm template`` (GitOps) and ``helm upgrade`` never
  change the key. Two replicas racing to make it both end with the one that was stored (409:
  read it back).
- Rotation (docs/operations.md, "Rotating the agent key"): move ``key`` to ``previous``, write
  a new ``key``, restart the operator. New Sandboxes get tokens of the new key; the token
  Secret of a Sandbox made before holds a token of the previous key, which the operator offers
  when the current one is refused (:class:`AgentKeys.tokens`). Drop ``previous`` once the
  Sandboxes made before the rotation are gone.

Without a Secret name (tests, local runs) the key is read from a file, and ``previous`` from the
file of that name beside it when present: the layout of the Secret mounted as a volume.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from sandbox_operator.errors import ExecutorError

KEY = "key"
PREVIOUS = "previous"
# 32 random bytes, hex: the strength of the HMAC's own hash.
KEY_BYTES = 32


@dataclass(frozen=True)
class AgentKeys:
    """The current agent key and, during a rotation's grace period, the previous one."""

    current: bytes
    previous: bytes | None = None

    def all(self) -> tuple[bytes, ...]:
        """The keys to derive tokens from, the current one first."""
        return (self.current,) if self.previous is None else (self.current, self.previous)


def _key(raw: bytes, where: str) -> bytes:
    key = raw.strip()
    if not key:
        raise ExecutorError(f"agent key {where} is empty", retryable=False)
    return key


def read_key_files(path: Path) -> AgentKeys:
    """The keys from ``path`` and, when present, ``path``'s sibling file ``previous``.

    Raises:
        ExecutorError: ``path`` is missing, unreadable or empty (not retryable: a deployment
            problem).
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ExecutorError(f"agent key file {path} is unreadable", retryable=False) from exc
    current = _key(raw, f"file {path}")
    sibling = path.with_name(PREVIOUS)
    previous = _key(sibling.read_bytes(), f"file {sibling}") if sibling.is_file() else None
    return AgentKeys(current, previous)


def keys_from_secret_data(data: Mapping[str, str] | None, name: str) -> AgentKeys:
    """The keys from a Secret's ``data`` (base64 values, as the API returns them).

    Raises:
        ExecutorError: no ``key``, or an empty ``key`` or ``previous`` (not retryable).
    """
    values = {k: base64.b64decode(v) for k, v in (data or {}).items() if k in (KEY, PREVIOUS)}
    current = _key(values.get(KEY, b""), f"{KEY} of Secret {name}")
    previous = values.get(PREVIOUS)
    if previous is None:
        return AgentKeys(current)
    return AgentKeys(current, _key(previous, f"{PREVIOUS} of Secret {name}"))


def new_key_secret(namespace: str, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """The manifest of a new key Secret with a random key (``secrets.token_hex``)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "type": "Opaque",
        "stringData": {KEY: secrets.token_hex(KEY_BYTES)},
    }


def load_or_create(
    core: Any, namespace: str, name: str, labels: Mapping[str, str] | None = None
) -> AgentKeys:
    """The keys of Secret ``namespace/name``, made with a random key when absent.

    ``core`` is a ``CoreV1Api``; the operator needs ``get`` on this one Secret and ``create``
    on Secrets of its namespace (the chart's ``-agent-key`` Role).

    Raises:
        ExecutorError: the Secret holds no usable key (not retryable), or the API refused
            (retryable for 5xx and conflicts, not for 403).
    """

    def read() -> AgentKeys:
        secret = core.read_namespaced_secret(name, namespace)
        return keys_from_secret_data(secret.data, name)

    try:
        try:
            return read()
        except ApiException as exc:
            if exc.status != 404:
                raise
        try:
            core.create_namespaced_secret(namespace, new_key_secret(namespace, name, labels or {}))
        except ApiException as exc:
            if exc.status != 409:  # 409: another replica made it first; use that one
                raise
        return read()
    except ApiException as exc:
        raise ExecutorError(
            f"agent key Secret {namespace}/{name}: HTTP {exc.status} {exc.reason}",
            retryable=exc.status != 403,
        ) from None
