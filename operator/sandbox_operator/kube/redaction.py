"""Keep secrets (database DSNs, passwords, agent tokens) out of status, Events and logs.

No secret in sight: whatever the operator itself reads from a Secret (the local
executor's ``transaction_rollback`` DSN), whatever its key, is registered here once; :func:`scrub`
then replaces every registered value in every form a message may carry it (the core's
``secret_forms``: the value, stripped of its trailing newline or white space, each of its lines
of meaningful length, percent-encoded, base64), and every password inside it, with ``***`` in
any string, dict or list.
:class:`ScrubFilter` does the same for every log record, and :func:`scrubbing_events` for every
Event. :func:`redact_dsn` removes the password of a DSN in either libpq form (URI or
``key=value``): it is the core's one redaction (``sandbox_core.redact_dsn``). The pod
executor never reads the Secret at all (``secretKeyRef``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sandbox_core import dsn_secrets
from sandbox_core import redact_dsn as core_redact_dsn
from sandbox_core.redaction import secret_forms

MASK = "***"

_lock = threading.Lock()
_secrets: set[str] = set()

T = TypeVar("T")


def dsn_password(dsn: str) -> str | None:
    """The password inside ``dsn`` (URI user-info, ``?password=`` or ``password=`` keyword), as
    libpq parses it, or None."""
    secrets = dsn_secrets(dsn.strip())
    return secrets[0] if secrets else None


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***`` (URI or ``key=value`` form); else as is."""
    return core_redact_dsn(dsn)


MIN_BARE_PASSWORD = 12


def register(secret: str) -> None:
    """Remember ``secret`` (any value read from a Secret, and the password inside it if it is
    a DSN) so it is scrubbed everywhere, in every form of ``secret_forms``.

    The bare password is scrubbed on its own only from :data:`MIN_BARE_PASSWORD` characters: a
    short one (``sandbox``) would also be an ordinary word of every path and message, and
    masking it there would garble them; the DSN that carries it is always scrubbed.
    """
    password = dsn_password(secret) or ""
    values = set(secret_forms(secret))
    if len(password) >= MIN_BARE_PASSWORD:
        values |= secret_forms(password)
    with _lock:
        _secrets.update(v for v in values if len(v) >= 4)


def known_secrets() -> frozenset[str]:
    """Every registered value (for tests)."""
    with _lock:
        return frozenset(_secrets)


def scrub_text(text: str) -> str:
    """``text`` with every registered secret (longest first) replaced by ``***``."""
    with _lock:
        values = sorted(_secrets, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, redact_dsn(value) if "://" in value else MASK)
    return text


def scrub(value: T) -> T:
    """A copy of ``value`` (str, dict, list, nested) with registered secrets masked."""
    if isinstance(value, str):
        return scrub_text(value)  # type: ignore[return-value]
    if isinstance(value, Mapping):
        return {k: scrub(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list | tuple):
        return type(value)(scrub(v) for v in value)
    return value


def redact_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A core ``to_record()`` fit for ``status.coreRecord``: DSN passwords removed.

    ``original_path`` (top level and in ``context``) is run through :func:`redact_dsn`, then the
    whole record through :func:`scrub`.
    """
    out = dict(record)
    if isinstance(out.get("original_path"), str):
        out["original_path"] = redact_dsn(out["original_path"])
    context = out.get("context")
    if isinstance(context, Mapping):
        context = dict(context)
        if isinstance(context.get("original_path"), str):
            context["original_path"] = redact_dsn(context["original_path"])
        out["context"] = context
    return scrub(out)


class ScrubFilter(logging.Filter):
    """A handler filter masking registered secrets in the formatted message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keeps the record; rewrites it first when it holds a secret."""
        if not known_secrets():
            return True
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        cleaned = scrub_text(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            # The traceback text is rendered from the exception: render it now, scrubbed.
            record.exc_text = scrub_text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def install_log_filter() -> None:
    """Add :class:`ScrubFilter` to every root handler (idempotent)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, ScrubFilter) for f in handler.filters):
            handler.addFilter(ScrubFilter())


EventSinkT = Callable[[Mapping[str, Any], str, str, str], None]


def scrubbing_events(sink: EventSinkT) -> EventSinkT:
    """Wrap an EventSink so that no Event message carries a registered secret."""

    def post(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        sink(body, type_, reason, scrub_text(message))

    return post
