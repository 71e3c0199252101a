"""The original lock as the plan uses it (docs/concurrency.md): which participant has a local
path original, and the ``prepared`` hold a two-phase participant takes from its prepare to its
apply or abort.

The lock itself (its file, its holds, crash recovery) is :mod:`sandbox_core.tree.original_lock`,
below both the plan and the strategies, so that a lone ``sandbox.commit()`` takes the same lock
as a plan; its names are re-exported here.
"""

from __future__ import annotations

import logging
from typing import Any

from sandbox_core.errors import SandboxError
from sandbox_core.plan.participants import in_process
from sandbox_core.tree.original_lock import (
    LOCK_SUFFIX,
    Hold,
    OriginalLock,
    OriginalLockedError,
    clear_if_free,
    held_by_process,
    lock_path_for,
)

__all__ = [
    "LOCK_SUFFIX",
    "Hold",
    "OriginalLock",
    "OriginalLockedError",
    "clear_if_free",
    "held_by_process",
    "hold_prepared",
    "local_original",
    "lock_path_for",
    "release_prepared",
]

logger = logging.getLogger(__name__)


def local_original(participant: object) -> str | None:
    """The path original a participant writes from this process, else None.

    An in-process sandbox, or a local wrapper around one (``inner``: the operator's local
    executor); an executor's handle to a sandbox in another process has none here (the process
    serving it takes the lock)."""
    target = participant if in_process(participant) else getattr(participant, "inner", None)
    if target is None or not in_process(target):
        return None
    original = getattr(target, "original_path", None)
    return original if isinstance(original, str) and original.startswith("/") else None


def hold_prepared(participant: Any, txid: str) -> None:
    """Take the ``prepared`` hold of ``participant``'s original for ``txid`` (nothing when it
    has no local path original): what the process that prepares a participant does first.

    Raises:
        OriginalLockedError: another plan holds that original; nothing changed.
    """
    original = local_original(participant)
    if original is None:
        return
    context = getattr(participant, "context", None)
    OriginalLock(original).acquire(
        Hold(
            holder=txid,
            plan_id=str(getattr(context, "plan_id", "") or ""),
            kind="prepared",
            sandbox_id=str(participant.sandbox_id),
            txid=txid,
        )
    )


def release_prepared(participant: Any, txid: str) -> None:
    """Release ``txid``'s hold of ``participant``'s original (applied or aborted; idempotent;
    a failure to release is logged, never raised: the apply or abort already happened)."""
    original = local_original(participant)
    if original is None:
        return
    try:
        OriginalLock(original).release(txid, str(participant.sandbox_id))
    except SandboxError:
        logger.exception("cannot release the lock of %s", original)
