"""Effects a sandbox's transaction does not hold, and effects a row count does not see.

SQLite: ``ATTACH`` / ``DETACH`` open another database file in the sandbox's connection; its
writes would be committed into that file, which is not the sandbox's original: refused before
it runs (sandbox that file on its own). The rest of this module is PostgreSQL's.

The sandbox is one transaction: whatever it does reaches the original only through ``COMMIT``.
A few PostgreSQL functions act outside the transaction at once, and a few transactional writes
go to system catalogs that the sandbox's measure of what a statement wrote
(``pg_stat_xact_user_tables``) does not cover (docs/transaction-strategy.md, "Database
sessions"):

- ``setval()`` sets a sequence for every session immediately, and ``ROLLBACK`` does not undo it
  (PostgreSQL documents sequence functions as non-transactional): the application's next
  inserts would collide with existing keys while the sandbox is still open, before any rollback
  could help (case 48). It is refused before it runs. ``ALTER SEQUENCE ... RESTART``, an
  identity column's ``RESTART`` and ``TRUNCATE ... RESTART IDENTITY`` are transactional
  (undone by rollback, checked on PostgreSQL 15) and allowed. ``nextval()`` is allowed: a value
  it drew is a gap after a rollback, as after any rolled-back transaction; no row changes and
  no value is ever handed out twice.
- ``dblink_exec()`` / ``dblink()`` write to another database in a transaction of their own:
  refused.
- Large-object functions (``lo_create``, ``lo_from_bytea``, ``lo_put``, ``lo_unlink``,
  ``lo_import``, ``lowrite``...) are transactional but write ``pg_largeobject``, a catalog, and
  ``pg_notify()`` queues a notification sent at COMMIT: a statement calling one is logged as a
  write whatever its keyword, so a replay (after a lost connection, in another process)
  reproduces it and verifies what it returned. So is session state set from a ``SELECT``
  (``set_config()``, e.g. a ``search_path`` later statements resolve their tables through, and
  advisory locks), which a replay without it would silently lose.
- ``PREPARE TRANSACTION`` refuses a transaction that used temporary objects or ``NOTIFY`` /
  ``LISTEN``: the two-phase prepare finds them first and says two phases are unavailable
  (``mode="auto"`` then commits the plan as a saga), before the held transaction is lost.

A lexical reading, not a parse: string literals in single quotes are skipped (dollar-quoted
bodies, as in ``DO $$ ... $$``, are read). A user-defined function that calls ``setval`` inside
is not seen.
"""

from __future__ import annotations

import re

_QUOTED = re.compile(r"'(?:[^']|'')*'")
_CALL = r"(?:\bpg_catalog\s*\.\s*|\b|(?<=\"))"
_REFUSED = {
    "setval": (
        "setval() is not transactional: it changes the sequence of the original database at "
        "once, for every session, and no rollback undoes it. Use ALTER SEQUENCE ... RESTART "
        "(transactional: applied at commit, undone by rollback) instead"
    ),
    "dblink_exec": (
        "dblink_exec() writes to another database outside the sandbox's transaction: sandbox "
        "that database on its own"
    ),
    "dblink": (
        "dblink() runs a statement in another database outside the sandbox's transaction: "
        "sandbox that database on its own"
    ),
}
_REFUSED_CALL = re.compile(
    _CALL + r"(" + "|".join(sorted(_REFUSED, key=len, reverse=True)) + r")\"?\s*\(",
    re.IGNORECASE,
)
_LARGE_OBJECT_CALL = re.compile(
    _CALL
    + r"(lo_create|lo_creat|lo_from_bytea|lo_put|lo_unlink|lo_import|lo_truncate|lo_truncate64"
    r"|lowrite|lo_open|lo_export|pg_notify|set_config|pg_advisory_lock|pg_advisory_xact_lock"
    r"|pg_advisory_lock_shared|pg_advisory_xact_lock_shared|pg_try_advisory_lock"
    r"|pg_try_advisory_xact_lock|pg_advisory_unlock|pg_advisory_unlock_shared|pg_advisory_unlock_all)"
    r"\"?\s*\(",
    re.IGNORECASE,
)
_NOTIFIES = re.compile(
    r"^\s*(?:NOTIFY|LISTEN|UNLISTEN)\b|" + _CALL + r"pg_notify\"?\s*\(", re.IGNORECASE
)
# What PostgreSQL looks for in this session's temporary schema when asked to PREPARE.
TEMPORARY_OBJECTS_SQL = (
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE relnamespace = pg_my_temp_schema())"
)


_SQLITE_REFUSED = {
    "ATTACH": (
        "ATTACH opens another database file, which is not this sandbox's original: its writes "
        "would reach that file at commit. Sandbox that database on its own; nothing was run"
    ),
    "DETACH": "DETACH is not needed: a sandbox attaches no other database; nothing was run",
}


def sqlite_refusal(keyword: str) -> str | None:
    """Why a SQLite statement starting with ``keyword`` (upper-case) cannot run in a sandbox,
    or ``None``."""
    return _SQLITE_REFUSED.get(keyword)


def _code(sql: str) -> str:
    """``sql`` without its single-quoted string literals (data, not calls)."""
    return _QUOTED.sub("''", sql)


def refusal(sql: str) -> str | None:
    """Why ``sql`` cannot run in a PostgreSQL sandbox (it calls a function that acts outside
    the transaction), or ``None``."""
    match = _REFUSED_CALL.search(_code(sql))
    if match is None:
        return None
    return _REFUSED[match.group(1).lower()] + "; nothing was run"


def acts_beyond_rows(sql: str) -> bool:
    """True when ``sql`` calls a large-object function, ``pg_notify()``, ``set_config()`` or
    an advisory lock: it writes, notifies at COMMIT or sets session state (a ``search_path``
    that later statements depend on, a lock) even when it reads as a ``SELECT``, and the
    per-table write counts cannot see it, so it must be logged to survive a replay."""
    return _LARGE_OBJECT_CALL.search(_code(sql)) is not None


def notifies(sql: str) -> bool:
    """True when ``sql`` is ``NOTIFY`` / ``LISTEN`` / ``UNLISTEN`` or calls ``pg_notify()``:
    PostgreSQL cannot ``PREPARE TRANSACTION`` after it."""
    return _NOTIFIES.search(_code(sql)) is not None


def two_phase_refusal(sandbox_id: str, why: str) -> str:
    """The message of a sandbox whose transaction PostgreSQL cannot ``PREPARE``."""
    return (
        f"sandbox {sandbox_id} cannot PREPARE TRANSACTION: {why}; PostgreSQL cannot prepare "
        "such a transaction, so it cannot take part in a two-phase commit (commit the plan as "
        "a saga, or with mode auto); nothing was prepared and the sandbox keeps its statements"
    )
