"""Kubernetes Events, behind a small callable so that logic modules stay testable.

Handlers get an :class:`EventRecorder`; unit tests pass a list-appending function.

Policy for namespaces being deleted (case 17): the API server refuses every new
object in a terminating namespace (403 ``unable to create new content in namespace X because it
is being terminated``), so an Event there can never land and a retried post is a log loop.

- :class:`NamespaceGate` knows which namespaces are terminating: it reads the Namespace (its
  ``deletionTimestamp`` / ``status.phase``) when an object whose deletion began posts something,
  caches the answer for a few seconds, and remembers every refusal it is told about.
- :class:`EventRecorder` posts each Event once (from a background thread in the operator),
  never into a namespace the gate
  calls terminating; a refusal is swallowed, remembered and logged once per namespace.
- :func:`install_kopf_filter` keeps kopf's own log-derived Events (``Handler ... failed``) out
  of namespaces the gate already knows to be terminating.

Finalizer removal never depends on an Event: posting never raises.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

logger = logging.getLogger("sandbox_operator.events")

EventSink = Callable[[Mapping[str, Any], str, str, str], None]
"""``(body, type, reason, message) -> None``; ``type`` is ``Normal`` or ``Warning``."""

REPORTING_COMPONENT = "sandbox-operator"
MAX_MESSAGE_CHARS = 1000
TERMINATING_MARK = "because it is being terminated"
"""Part of the API server's refusal of new content in a terminating namespace."""


def no_events(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """An EventSink that drops everything (tools and tests that do not care)."""


def is_terminating_refusal(exc: BaseException) -> bool:
    """True when ``exc`` is the API server's "namespace is being terminated" refusal.

    The NamespaceLifecycle admission plugin answers 403 (Forbidden) for most kinds; some paths
    answer 422. Both carry the same message.
    """
    status = getattr(exc, "status", None)
    text = f"{getattr(exc, 'body', '') or ''} {getattr(exc, 'reason', '') or ''} {exc}"
    return status in (403, 422) and TERMINATING_MARK in text


def namespace_is_terminating(namespace: Mapping[str, Any] | None) -> bool:
    """Whether a Namespace object is being deleted (``deletionTimestamp`` or phase Terminating)."""
    if not namespace:
        return False
    metadata = namespace.get("metadata") or {}
    status = namespace.get("status") or {}
    return bool(metadata.get("deletionTimestamp")) or status.get("phase") == "Terminating"


NamespaceReader = Callable[[str], Mapping[str, Any] | None]
"""``name -> Namespace object`` (None when it does not exist); may raise on API errors."""


class NamespaceGate:
    """Which namespaces are being deleted: cached reads plus remembered refusals.

    Args:
        read: reads a Namespace; None disables reads (only remembered refusals count).
        ttl_seconds: how long an answer is trusted. A terminating namespace never becomes active
            again, but a new namespace of the same name may appear, so answers expire.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        read: NamespaceReader | None = None,
        ttl_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._ttl = ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, tuple[bool, float]] = {}

    def known_terminating(self, namespace: str | None) -> bool:
        """What the cache says, without any API call (safe inside kopf's event loop)."""
        if not namespace:
            return False
        with self._lock:
            entry = self._known.get(namespace)
        # A terminating answer is kept longer: it only ends when the namespace is gone.
        return entry is not None and entry[0] and self._clock() - entry[1] < self._ttl * 12

    def terminating(self, namespace: str | None, *, refresh: bool = False) -> bool:
        """Whether ``namespace`` is being deleted.

        With ``refresh`` (the caller saw an object whose deletion began), a stale or missing
        answer is read from the API server. A failed read counts as "not terminating": the
        refusal path still catches it.
        """
        if not namespace:
            return False
        now = self._clock()
        with self._lock:
            entry = self._known.get(namespace)
        if entry is not None and now - entry[1] < self._ttl:
            return entry[0]
        if not refresh or self._read is None:
            return self.known_terminating(namespace)
        try:
            answer = namespace_is_terminating(self._read(namespace))
        except Exception as exc:  # no RBAC, API trouble: fall back to the refusal path
            logger.debug("cannot read namespace %s: %s", namespace, exc)
            return False
        self._set(namespace, answer)
        return answer

    def remember(self, namespace: str) -> None:
        """Record that the API server refused new content in ``namespace``."""
        self._set(namespace, True)

    def _set(self, namespace: str, terminating: bool) -> None:
        with self._lock:
            self._known[namespace] = (terminating, self._clock())


EventPoster = Callable[[str, dict[str, Any]], Any]
"""``(namespace, event) -> Any``: creates one core/v1 Event (:meth:`api.Api.post_event`)."""


def build_event(
    body: Mapping[str, Any], type_: str, reason: str, message: str, now: datetime | None = None
) -> dict[str, Any]:
    """The core/v1 Event about ``body`` (pure; the message is cut to 1,000 characters)."""
    metadata = body.get("metadata") or {}
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "generateName": f"{metadata.get('name', 'object')}.",
            "namespace": metadata.get("namespace"),
        },
        "involvedObject": {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE_CHARS],
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": REPORTING_COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    """The operator's EventSink: one post per Event, none in terminating namespaces.

    Args:
        poster: creates one Event.
        gate: which namespaces are terminating.
        background: post from one background thread, in order, so that a handler does not wait
            for the API round trip (for throughput); the Event is built (and its time
            stamped) when it is recorded. False posts synchronously (unit tests).

    ``posted`` and ``dropped`` count Events (metrics and tests).
    """

    def __init__(self, poster: EventPoster, gate: NamespaceGate, background: bool = False) -> None:
        self.poster = poster
        self.gate = gate
        self.posted = 0
        self.dropped = 0
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[Mapping[str, Any], dict[str, Any]]] | None = None
        if background:
            self._queue = queue.Queue()
            threading.Thread(target=self._drain, name="event-poster", daemon=True).start()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every recorded Event was posted or dropped; False on timeout."""
        if self._queue is None:
            return True
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _drain(self) -> None:
        assert self._queue is not None
        while True:
            body, event = self._queue.get()
            try:
                self._post(body, event)
            except Exception:  # never let the poster thread die
                logger.exception("cannot post Event")
            finally:
                self._queue.task_done()

    def observe(self, body: Mapping[str, Any]) -> bool:
        """Refresh the gate for an object whose deletion began; True when its namespace is
        terminating. Handlers of deletions call this first, so kopf's own messages about the
        object are filtered too (:func:`install_kopf_filter`)."""
        metadata = body.get("metadata") or {}
        return self.gate.terminating(
            metadata.get("namespace"), refresh=bool(metadata.get("deletionTimestamp"))
        )

    def __call__(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        event = build_event(body, type_, reason, message)
        if self._queue is not None:
            metadata = body.get("metadata") or {}
            # Only what the gate reads, copied now: the handler's body is not kept.
            kept = {key: metadata.get(key) for key in ("namespace", "deletionTimestamp")}
            self._queue.put(({"metadata": kept}, event))
            return
        self._post(body, event)

    def _post(self, body: Mapping[str, Any], event: dict[str, Any]) -> None:
        namespace = str((body.get("metadata") or {}).get("namespace") or "")
        reason = str(event["reason"])
        if not namespace or self.observe(body):
            self._drop(namespace, reason)
            return
        try:
            self.poster(namespace, event)
        except Exception as exc:  # Events are auxiliary: never raise, never retry
            if is_terminating_refusal(exc):
                self.gate.remember(namespace)
                self._drop(namespace, reason)
                return
            self._once(
                f"error:{namespace}", "cannot post Event %s in %s: %s", reason, namespace, exc
            )
            return
        with self._lock:
            self.posted += 1

    def _drop(self, namespace: str, reason: str) -> None:
        with self._lock:
            self.dropped += 1
        self._once(
            f"terminating:{namespace}",
            "namespace %s is being terminated: Events there are not posted (first: %s)",
            namespace,
            reason,
            level=logging.INFO,
        )

    def _once(self, key: str, fmt: str, *args: Any, level: int = logging.WARNING) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        logger.log(level, fmt, *args)


class _TerminatingNamespaceFilter(logging.Filter):
    """Drops kopf's log-derived Events aimed at a namespace known to be terminating."""

    def __init__(self, gate: NamespaceGate) -> None:
        super().__init__()
        self.gate = gate

    def filter(self, record: logging.LogRecord) -> bool:
        ref = getattr(record, "k8s_ref", None) or {}
        return not self.gate.known_terminating(ref.get("namespace"))


def install_kopf_filter(gate: NamespaceGate) -> int:
    """Attach the terminating-namespace filter to kopf's Event-posting log handlers.

    kopf turns WARNING+ records of its per-object logger (``kopf.objects``) into Events through
    a handler class named ``K8sPoster``; only that handler is filtered, so the log lines stay.
    Returns how many handlers were filtered (0 means kopf changed; the refusal path remains).
    """
    count = 0
    for handler in logging.getLogger("kopf.objects").handlers:
        if type(handler).__name__ == "K8sPoster":
            handler.addFilter(_TerminatingNamespaceFilter(gate))
            count += 1
    return count
