"""Where the original database of a ``transaction_rollback`` sandbox is: a file or a server.

:func:`parse_target` classifies the sandbox's ``original_path`` (a SQLite file path,
``sqlite:///abs/path``, or a PostgreSQL DSN in either libpq form) into a
:class:`DatabaseTarget`: the backend, what to connect with, the redacted form to show, and the
secrets to scrub from driver messages. Redaction itself is the core's vocabulary
(:mod:`sandbox_core.redaction`), shared with the operator, the client and the agent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sandbox_core.redaction import (
    POSTGRES_SCHEMES,
    connectable,
    is_postgres_dsn,
    redact,
    secrets_of,
    url_scheme,
)

__all__ = ["Backend", "DatabaseTarget", "parse_target"]

Backend = Literal["sqlite", "postgresql"]


@dataclass(frozen=True)
class DatabaseTarget:
    """Where the original database is.

    Attributes:
        backend: ``"sqlite"`` or ``"postgresql"``.
        location: absolute file path (SQLite) or the libpq DSN to connect with (PostgreSQL; it
            may hold the password: never print it, so it is left out of ``repr``).
        display: the redacted form, for messages, logs and metadata.
        secrets: the passwords ``location`` carries, scrubbed from driver messages.
    """

    backend: Backend
    location: str = field(repr=False)
    display: str
    secrets: tuple[str, ...] = field(default=(), repr=False)


def parse_target(original_path: str) -> DatabaseTarget:
    """Classify ``original_path``: a SQLite file path, ``sqlite:///abs/path``, or a PostgreSQL
    DSN (``postgresql://`` / ``postgres://`` URL, or libpq ``key=value`` string).

    A redacted DSN (password ``***``) connects without the password, so libpq reads it from
    ``PGPASSWORD`` / ``PGPASSFILE`` / ``~/.pgpass``. Relative SQLite paths are made absolute
    against the current directory; an existing file wins over the ``key=value`` reading.

    Raises:
        ValueError: unsupported URL scheme, or an in-memory SQLite database (it cannot be shared
            between the sandbox's connections and processes).
    """
    text = original_path.strip()
    scheme = url_scheme(text)
    if scheme in POSTGRES_SCHEMES or (
        scheme is None and is_postgres_dsn(text) and not Path(text).exists()
    ):
        return DatabaseTarget("postgresql", connectable(text), redact(text), secrets_of(text))
    if scheme is not None:
        if scheme != "sqlite":
            raise ValueError(f"unsupported database URL scheme {scheme!r}")
        text = text.split("://", 1)[1]
        # sqlite:///abs/path and sqlite:////abs/path both name /abs/path.
        text = "/" + text.lstrip("/") if text.startswith("/") else text
    if text in ("", ":memory:") or text.startswith("file::memory:"):
        raise ValueError("an in-memory SQLite database cannot be sandboxed")
    path = str(Path(text).absolute())
    return DatabaseTarget("sqlite", path, path)
