"""When finished Sandboxes are due for deletion (``spec.ttlSecondsAfterFinished``), without a
kopf timer.

A kopf timer on a resource makes kopf keep the last body of *every* object of that resource in
memory (its daemons' "live fresh body"), whether or not the timer's filter matches: about 20 KiB
per Sandbox, most of the operator's memory per Sandbox (docs/benchmarks.md, "Stress harness").
Instead, every watch event of a Sandbox updates :class:`TtlSchedule` (a uid -> name and due time
entry, only for a terminal Sandbox with a TTL), and one thread deletes the due ones every
``ttl_check_interval_seconds``, as the timer did.

Due times are on the API server's clock (:mod:`~sandbox_operator.kube.clock`): the Ready
condition's ``lastTransitionTime`` plus the TTL, compared with ``clock.now()``, so replicas
whose clocks differ agree. Only the leader watches (:mod:`~sandbox_operator.kube.leader`), so
only the leader's schedule holds anything; its deletions pass the write fence like every write.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sandbox_api.models import SandboxPhase
from sandbox_operator.kube import clock
from sandbox_operator.kube.conditions import find_condition

logger = logging.getLogger(__name__)

_TERMINAL = frozenset(p.value for p in SandboxPhase if p.is_terminal)


def ttl_deadline(body: Mapping[str, Any]) -> datetime | None:
    """When a terminal Sandbox's ``ttlSecondsAfterFinished`` runs out (API server clock), or
    None: no TTL, not terminal, or no Ready ``lastTransitionTime`` (the finish time)."""
    ttl = (body.get("spec") or {}).get("ttlSecondsAfterFinished")
    status = body.get("status") or {}
    if ttl is None or status.get("phase") not in _TERMINAL:
        return None
    ready = find_condition(status.get("conditions"), "Ready")
    if ready is None or not ready.get("lastTransitionTime"):
        return None
    finished = datetime.fromisoformat(str(ready["lastTransitionTime"]).replace("Z", "+00:00"))
    return finished + timedelta(seconds=float(ttl))


class TtlSchedule:
    """The Sandboxes this replica will delete when their TTL runs out: uid -> (namespace, name,
    due time). Thread-safe; holds only terminal Sandboxes with a TTL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[str, tuple[str, str, datetime]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def event(self, event: Mapping[str, Any]) -> None:
        """Record one watch event (``type`` and ``object``) of a Sandbox: scheduled when it is
        terminal with a TTL; dropped when deleted, being deleted, or no longer due."""
        body = event.get("object") or {}
        metadata = body.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if not uid:
            return
        deadline = None
        if event.get("type") != "DELETED" and not metadata.get("deletionTimestamp"):
            deadline = ttl_deadline(body)
        with self._lock:
            if deadline is None:
                self._due.pop(uid, None)
            else:
                self._due[uid] = (str(metadata.get("namespace") or ""), metadata["name"], deadline)

    def due(self, now: datetime | None = None) -> list[tuple[str, str, str]]:
        """``(uid, namespace, name)`` of every scheduled Sandbox whose time has come."""
        moment = now or clock.now()
        with self._lock:
            return [(uid, ns, name) for uid, (ns, name, at) in self._due.items() if at <= moment]

    def sweep(self, delete: Callable[[str, str], object], now: datetime | None = None) -> int:
        """Delete (``delete(namespace, name)``) every due Sandbox; return how many were asked.
        A failed deletion is logged and tried again at the next sweep; a deleted one leaves the
        schedule (its next event would drop it too)."""
        asked = 0
        for uid, namespace, name in self.due(now):
            try:
                delete(namespace, name)
            except Exception:
                logger.exception(
                    "TTL deletion of sandbox %s/%s failed; next sweep", namespace, name
                )
                continue
            asked += 1
            with self._lock:
                self._due.pop(uid, None)
        return asked

    def start(self, interval_seconds: float, delete: Callable[[str, str], object]) -> None:
        """Sweep every ``interval_seconds`` in a daemon thread until :meth:`stop`."""

        def run() -> None:
            while not self._stop.wait(interval_seconds):
                self.sweep(delete)

        self._stop.clear()
        self._thread = threading.Thread(target=run, name="sandbox-ttl", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the sweeping thread (idempotent)."""
        self._stop.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._due)


TTL = TtlSchedule()
"""The operator process's schedule (fed by the Sandbox watch, swept from the startup handler)."""
