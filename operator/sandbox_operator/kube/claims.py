"""Which objects a handler is acting on, so that nothing acts on an object being finalized.

Case 17: a PlanCommit woke after a Sandbox's finalizer had run, committed that
sandbox anyway and wrote its core record back, a record that outlived its object. kopf runs one
object's handlers one at a time, but handlers of *different* objects (a PlanCommit and its
Sandboxes, a Checkpoint and its Sandbox) run concurrently. The policy:

- A handler that acts on another object first **claims** it (by uid) and re-reads it: an object
  whose deletion began (``metadata.deletionTimestamp``) or that is being finalized is refused.
  The PlanCommit saga never *commits* such a Sandbox (the step fails, and the plan is compensated:
  all or nothing); a Checkpoint is never taken of one; a restore never reads a Checkpoint that is
  being deleted.
- A finalizer first calls :meth:`Claims.begin_finalizing`: while another handler holds a claim,
  the finalizer waits (``kopf.TemporaryError``), so a commit that already landed is compensated
  before the sandbox's artefacts go; once finalizing began, no new claim is granted, so no record
  is written after cleanup.

The registry lives in the operator process; one operator is active at a time, so that is the
whole truth. After a restart nothing is held and every handler re-reads the objects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any


class BeingDeletedError(Exception):
    """The object's deletion began; it is not acted on (message names it)."""


def deletion_began(body: Mapping[str, Any] | None) -> bool:
    """True when ``body`` is None (gone) or carries ``metadata.deletionTimestamp``."""
    return body is None or bool((body.get("metadata") or {}).get("deletionTimestamp"))


class Claims:
    """Process-wide registry of objects in use (claims) and objects being finalized."""

    FINALIZED_MEMORY = 10_000
    """How many finalized uids are remembered (a late claim on one is refused)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: dict[str, set[str]] = {}
        self._finalizing: dict[str, None] = {}  # insertion-ordered set

    def acquire(self, uid: str, holder: str) -> bool:
        """Claim ``uid`` for ``holder``; False when it is being (or was) finalized."""
        with self._lock:
            if uid in self._finalizing:
                return False
            self._holders.setdefault(uid, set()).add(holder)
            return True

    def release(self, uid: str, holder: str) -> None:
        """Drop ``holder``'s claim on ``uid`` (missing claims are fine)."""
        with self._lock:
            holders = self._holders.get(uid)
            if holders is not None:
                holders.discard(holder)
                if not holders:
                    del self._holders[uid]

    def holders(self, uid: str) -> list[str]:
        """Who holds ``uid`` now (sorted)."""
        with self._lock:
            return sorted(self._holders.get(uid, ()))

    @contextmanager
    def holding(self, uid: str, holder: str, what: str) -> Iterator[None]:
        """Hold ``uid`` for the block.

        Raises:
            BeingDeletedError: ``uid`` is being finalized (``what`` names it in the message).
        """
        if not self.acquire(uid, holder):
            raise BeingDeletedError(f"{what} is being deleted")
        try:
            yield
        finally:
            self.release(uid, holder)

    def begin_finalizing(self, uid: str) -> list[str]:
        """Mark ``uid`` as being finalized unless it is held; returns the holders (empty = go).

        Idempotent: a retried finalizer calls it again.
        """
        with self._lock:
            holders = sorted(self._holders.get(uid, ()))
            if holders:
                return holders
            self._finalizing[uid] = None
            while len(self._finalizing) > self.FINALIZED_MEMORY:
                del self._finalizing[next(iter(self._finalizing))]
            return []

    def is_finalizing(self, uid: str) -> bool:
        """Whether :meth:`begin_finalizing` succeeded for ``uid``."""
        with self._lock:
            return uid in self._finalizing


CLAIMS = Claims()
"""The operator process's registry (handlers share it; tests may build their own)."""
