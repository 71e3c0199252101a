"""``Sandbox.status.coreRecord``: the core's sandbox record, with a schema version.

docs/api-evolution.md is the policy. In short: the record is what the core's ``to_record()``
returns (strategy, ids, original path, options, status, context, last commit), plus
``schemaVersion``. A newer operator reads every older version (each step of :data:`UPGRADES`
turns version N into N+1); an operator refuses a version newer than it knows with a clear
error instead of guessing. Records written before versioning existed carry no
``schemaVersion`` and are version 0 (same fields as version 1).

No secret may ever be in the record: a ``transaction_rollback`` original is a DSN read from a
Secret, so :func:`encode` writes it with the password replaced by ``***`` and :func:`decode`
puts the real original (from the Sandbox's spec, which is immutable) back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sandbox_core.redaction import redact as redact_dsn

SCHEMA_VERSION_KEY = "schemaVersion"
CURRENT_SCHEMA_VERSION = 1


class CoreRecordVersionError(ValueError):
    """The record's ``schemaVersion`` is newer than this operator (or not an integer)."""


def _v0_to_v1(record: dict[str, Any]) -> dict[str, Any]:
    # Version 1 only added the version field itself.
    return record


UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _v0_to_v1}
"""``version -> function`` turning a record of that version into the next one."""


def redact(original: str) -> str:
    """``original`` without a password: the core's one DSN redaction (``sandbox_core.redact_dsn``,
    parsed by libpq's own parser); paths are returned unchanged."""
    return redact_dsn(original)


def encode(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``status.coreRecord`` value of a core record (None stays None; no password)."""
    if record is None:
        return None
    out = {key: value for key, value in record.items() if key != SCHEMA_VERSION_KEY}
    if isinstance(out.get("original_path"), str):
        out["original_path"] = redact(out["original_path"])
    context = out.get("context")
    if isinstance(context, Mapping) and isinstance(context.get("original_path"), str):
        out["context"] = {**context, "original_path": redact(context["original_path"])}
    out[SCHEMA_VERSION_KEY] = CURRENT_SCHEMA_VERSION
    return out


def decode(value: Mapping[str, Any] | None, original: str | None = None) -> dict[str, Any] | None:
    """The core record (``reopen()`` input) of a ``status.coreRecord`` of any known version.

    ``original`` (the Sandbox's resolved original) replaces the redacted one.

    Raises:
        CoreRecordVersionError: ``schemaVersion`` is newer than :data:`CURRENT_SCHEMA_VERSION`
            or not a non-negative integer.
    """
    if not value:
        return None
    record = dict(value)
    version = record.pop(SCHEMA_VERSION_KEY, 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CoreRecordVersionError(f"status.coreRecord.schemaVersion {version!r} is not valid")
    if version > CURRENT_SCHEMA_VERSION:
        raise CoreRecordVersionError(
            f"status.coreRecord.schemaVersion {version} is newer than this operator reads "
            f"(up to {CURRENT_SCHEMA_VERSION}); upgrade the operator"
        )
    while version < CURRENT_SCHEMA_VERSION:
        record = UPGRADES[version](record)
        version += 1
    if original is not None:
        record["original_path"] = original
        context = record.get("context")
        if isinstance(context, Mapping):
            record["context"] = {**context, "original_path": original}
    return record
