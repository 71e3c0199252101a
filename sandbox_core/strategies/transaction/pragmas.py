"""SQLite pragmas that the sandbox's transactions would silently drop (docs/fidelity.md).

A SQLite sandbox runs every statement, and its commit, inside a transaction that replays the
statement log. SQLite ignores or refuses some pragmas there (checked on SQLite 3):

- ``PRAGMA foreign_keys = ON`` is a no-op inside a transaction. The sandbox honours it the way
  the application's own connection would: its connections set it before ``BEGIN`` from then on,
  and ``commit``/``prepare`` run ``PRAGMA foreign_key_check`` before the decision, so a
  violation (a ``DEFERRABLE INITIALLY DEFERRED`` key included) is refused as the application's
  own ``COMMIT`` would refuse it.
- ``journal_mode`` (returns the old mode, changes nothing), ``synchronous`` (an error) and
  ``locking_mode`` change how the database file is written and shared, not its content: setting
  them through a sandbox is refused with a clear error (set them on the database itself).

Reading any pragma (no value) runs as usual.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

FILE_PRAGMAS = frozenset({"journal_mode", "synchronous", "locking_mode"})

_PRAGMA = re.compile(
    r"""^\s*PRAGMA\s+(?:["`\[]?\w+["`\]]?\s*\.\s*)?["`\[]?(\w+)["`\]]?\s*(?:=\s*|\(\s*)?(['"]?[\w-]*['"]?)""",
    re.IGNORECASE,
)
_TRUE = frozenset({"1", "on", "true", "yes"})


def parse(sql: str) -> tuple[str, str | None] | None:
    """``(name, value)`` of a ``PRAGMA`` statement (``value`` None when it only reads), else
    None. Names are lower-case, values unquoted and lower-case."""
    match = _PRAGMA.match(sql)
    if match is None:
        return None
    value = match.group(2).strip("'\"").lower()
    return match.group(1).lower(), value or None


def refusal(sql: str) -> str | None:
    """The message refusing ``sql`` when it sets a pragma of :data:`FILE_PRAGMAS`, else None."""
    found = parse(sql)
    if found is None or found[1] is None or found[0] not in FILE_PRAGMAS:
        return None
    return (
        f"PRAGMA {found[0]} changes how the database file is written, which SQLite does not "
        "allow inside the sandbox's transaction (it would be silently ignored): set it on the "
        "database outside the sandbox"
    )


def foreign_keys_on(statements: Iterable[str]) -> bool:
    """Whether the last ``PRAGMA foreign_keys = ...`` among ``statements`` turned them on."""
    on = False
    for sql in statements:
        found = parse(sql)
        if found is not None and found[0] == "foreign_keys" and found[1] is not None:
            on = found[1] in _TRUE
    return on


def describe_violations(rows: list[tuple[object, ...]]) -> list[str]:
    """``PRAGMA foreign_key_check`` rows as ``table row N -> parent`` texts."""
    return [f"{row[0]} row {row[1]} -> {row[2]}" for row in rows]
