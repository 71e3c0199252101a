"""Names of the objects the pod executor makes per Sandbox (kopf-free: the client reads them).

One definition for the operator (``executors.pod``) and the engine's client
(``sandbox_client.agent_files``), which reads the agent token from the Secret named here.

A child's name is ``sbx-<readable prefix>-<hash>-<suffix>``: the prefix is the Sandbox's name
lower-cased, every character outside ``[a-z0-9-]`` made ``-``, cut so that the whole name fits
a DNS-1123 label (63 characters); the hash is the first :data:`HASH_CHARS` hex digits of the
SHA-256 of the exact Sandbox name and the suffix. So two Sandboxes of one namespace never share
a child, even when their names differ only by ``.`` against ``-`` or after the cut (a collision
needs two names whose 64-bit hashes agree). Children live in their Sandbox's namespace, so the
namespace is not hashed.

:func:`legacy_child_object_name` is the name operators before this scheme gave (no hash): the
operator still finds the children of a Sandbox made then, and adopts them only when their
controller ownerReference is that Sandbox's uid.
"""

from __future__ import annotations

import hashlib
import re

AGENT_SECRET_SUFFIX = "agent"  # noqa: S105 - the Secret holding the workspace agent's token
AGENT_TOKEN_KEY = "token"  # noqa: S105 - the Secret's key, not a token
PREFIX = "sbx-"
HASH_CHARS = 16
MAX_LABEL = 63
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUFFIX = re.compile(r"[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?")


def child_object_name(sandbox_name: str, suffix: str) -> str:
    """DNS-1123 label naming the child ``suffix`` of Sandbox ``sandbox_name``.

    Shape: ``sbx-<readable prefix>-<16 hex digits>-<suffix>``, at most 63 characters; a pure
    function of ``(sandbox_name, suffix)``, distinct for distinct inputs (module docstring).

    Raises:
        ValueError: ``suffix`` is not 1-20 characters of ``[a-z0-9-]`` with alphanumeric ends.
    """
    if not _SUFFIX.fullmatch(suffix):
        raise ValueError(f"child suffix {suffix!r} is not a short DNS-1123 label")
    digest = hashlib.sha256(f"{sandbox_name}\0{suffix}".encode()).hexdigest()[:HASH_CHARS]
    tail = f"-{digest}-{suffix}"
    readable = re.sub(r"[^a-z0-9-]", "-", sandbox_name.lower())
    return f"{PREFIX}{readable}"[: MAX_LABEL - len(tail)].rstrip("-") + tail


def legacy_child_object_name(sandbox_name: str, suffix: str) -> str:
    """The name operators before the hashed scheme gave the child (``sbx-<name>-<suffix>`` cut
    to 63 characters, ``.`` folded into ``-``): only for finding children made then; never
    unique, so whatever it names is used only when the Sandbox's uid controls it."""
    base = re.sub(r"[^a-z0-9-]", "-", sandbox_name.lower())
    return f"{PREFIX}{base}"[: 62 - len(suffix)].rstrip("-") + f"-{suffix}"


def child_object_names(sandbox_name: str, suffix: str) -> tuple[str, ...]:
    """Every name the child ``suffix`` of ``sandbox_name`` may have: the current one first,
    then the legacy one (when it differs)."""
    current = child_object_name(sandbox_name, suffix)
    legacy = legacy_child_object_name(sandbox_name, suffix)
    return (current,) if legacy == current else (current, legacy)
