"""Leader election through a ``coordination.k8s.io/v1`` Lease: many replicas, one active.

The policy is client-go's ``leaderelection`` in a few rules:

- :meth:`LeaderElector.acquire` runs from the startup handler, before kopf starts watching, so a
  replica that does not lead never sees an object. It reads the Lease; absent, it creates it as
  the holder; held by another identity, it waits until that holder's record (holder, renewTime,
  transitions) has not changed for ``lease_duration_seconds`` *as measured on this process's
  monotonic clock* (no comparison of clocks across nodes), then takes it with an update carrying
  the resourceVersion it read (a 409 means another standby won: keep waiting). A Lease with no
  holder (released) is taken at once.
- While it leads, a daemon thread renews every ``retry_period_seconds``. The lead is sure until
  the *start* of the last successful renewal (taken before its read was sent) plus
  ``renew_deadline_seconds``: a standby cannot have seen that renewal before it started, so it
  takes over no earlier than ``lease_duration_seconds`` after that start. The margin,
  ``lease_duration - renew_deadline`` (at least ``settings.LEASE_MARGIN_SECONDS``), holds
  however slow the API server answers. Every write checks that bound first
  (:mod:`~sandbox_operator.kube.fence`: a later write is refused unsent, also in a paused
  replica that resumes), and a watchdog thread exits the process (``os._exit``) when it passes
  or the Lease names another holder: it stops before a standby may take over, so two replicas
  never write at the same time.
- At interpreter exit, after kopf's handler threads have been joined, the Lease is released
  (holder cleared) so that a standby takes over without waiting for the expiry. A SIGKILLed
  leader releases nothing: the standby waits one lease duration.
- While it waits, a standby answers ``/healthz`` on ``standby_health_port`` (kopf's own liveness
  endpoint starts only once the startup handler returned).
"""

from __future__ import annotations

import atexit
import datetime
import http.server
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, NoReturn, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import Gauge

from sandbox_operator.kube.fence import FENCE, Fence
from sandbox_operator.settings import Settings

logger = logging.getLogger("sandbox_operator.leader")

LEADER = Gauge(
    "sandbox_operator_leader",
    "1 while this replica holds the leader-election Lease and reconciles, else 0.",
)

LEADING_MESSAGE = "leader election: leading"
"""Start of the log line written when this replica starts to lead (tests read it)."""


def _micro_time(moment: datetime.datetime) -> str:
    # MicroTime wants exactly six fractional digits; isoformat() drops them at .000000.
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _StandbyHealth:
    """``/healthz`` -> 200 while this replica waits as a standby."""

    def __init__(self, port: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = self.path.split("?", 1)[0] == "/healthz"
                body = b"standby\n" if ok else b"not found\n"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds would flood the log

        # Every interface: the kubelet probes the pod's address, as it does kopf's endpoint.
        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)  # noqa: S104
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # kopf binds the same port next


class LeaderElector:
    """One replica's side of the election. Create it after the Kubernetes config is loaded.

    Args:
        settings: ``pod_namespace`` (where the Lease lives), ``leader_election_lease_name``,
            the three durations in seconds and ``standby_health_port``.
        api_client: the Kubernetes client (default: a new one from the loaded config).
        identity: this replica's holder identity (default ``<pod name>_<8 hex>``).
    """

    def __init__(
        self,
        settings: Settings,
        api_client: client.ApiClient | None = None,
        identity: str | None = None,
    ) -> None:
        self.settings = settings
        if api_client is None:
            # Its own client without the operator's retries (api.load_config): a renewal must
            # fail fast and count against the deadline, never sit in back-off past the expiry.
            configuration = client.Configuration.get_default_copy()
            configuration.retries = False
            api_client = client.ApiClient(configuration)
        self.api = client.CoordinationV1Api(api_client)
        # Each request is bounded so that a leader notices a lost renewal in time: the last
        # attempt (read + replace) ends before the Lease can expire for a standby.
        self.request_timeout = (
            settings.lease_duration_seconds - settings.renew_deadline_seconds
        ) / 2
        self.namespace = settings.pod_namespace
        self.name = settings.leader_election_lease_name
        base = settings.pod_name or socket.gethostname()
        self.identity = identity or f"{base}_{uuid.uuid4().hex[:8]}"
        self.stopping = threading.Event()
        self._renewer: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._released = False
        self.fence: Fence = FENCE

    # -- acquiring ----------------------------------------------------------------------------

    def acquire(self) -> bool:
        """Block until this replica holds the Lease (True), or :meth:`stop` was called (False).

        API errors while waiting are logged and retried; they never make a standby lead.
        """
        health = (
            _StandbyHealth(self.settings.standby_health_port)
            if self.settings.standby_health_port
            else None
        )
        observed: tuple[object, ...] | None = None
        observed_at = time.monotonic()
        waiting_logged = False
        try:
            while not self.stopping.is_set():
                started = time.monotonic()  # the lead, if taken now, is sure from here
                try:
                    lease = self._read()
                    if lease is None:
                        if self._create():
                            break
                    else:
                        spec = lease["spec"]
                        holder = spec.get("holderIdentity")
                        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
                        if record != observed:
                            observed, observed_at = record, time.monotonic()
                        duration = spec.get("leaseDurationSeconds") or (
                            self.settings.lease_duration_seconds
                        )
                        expired = time.monotonic() - observed_at >= duration
                        if (not holder or holder == self.identity or expired) and self._take(lease):
                            break
                        if not waiting_logged:
                            logger.info(
                                "leader election: standby, %s holds Lease %s/%s",
                                holder, self.namespace, self.name,
                            )  # fmt: skip
                            waiting_logged = True
                except (ApiException, urllib3.exceptions.HTTPError) as exc:
                    logger.warning("leader election: API error (%s), retrying", exc)
                self.stopping.wait(self.settings.retry_period_seconds)
            else:
                return False
        finally:
            if health is not None:
                health.close()
        logger.info("%s as %s (Lease %s/%s)", LEADING_MESSAGE, self.identity,
                    self.namespace, self.name)  # fmt: skip
        LEADER.set(1)
        self.fence.bind(started + self.settings.renew_deadline_seconds)
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)
        self._renewer.start()
        self._watchdog = threading.Thread(target=self._watch, name="lease-watchdog", daemon=True)
        self._watchdog.start()
        atexit.register(self.release)
        return True

    def _read(self) -> dict[str, Any] | None:
        """The Lease as the API server returns it (JSON, camelCase), or None when absent."""
        try:
            response: Any = self.api.read_namespaced_lease(
                self.name,
                self.namespace,
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        lease: dict[str, Any] = json.loads(response.data)
        lease.setdefault("spec", {})
        return lease

    def _replace(self, lease: dict[str, Any], spec: dict[str, Any]) -> None:
        """Write ``spec`` over the Lease read as ``lease`` (409 when it changed since)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": lease["metadata"]["resourceVersion"],
            },
            "spec": spec,
        }
        self.api.replace_namespaced_lease(
            self.name,
            self.namespace,
            cast(Any, body),
            _preload_content=False,
            _request_timeout=self.request_timeout,
        )

    def _spec(self, transitions: int, acquired: bool) -> dict[str, Any]:
        now = _micro_time(datetime.datetime.now(datetime.UTC))
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_duration_seconds)),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        if acquired:
            spec["acquireTime"] = now
        return spec

    def _create(self) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._spec(0, acquired=True),
        }
        try:
            self.api.create_namespaced_lease(
                self.namespace,
                cast(Any, body),
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                return False  # another replica created it first
            raise
        return True

    def _take(self, lease: dict[str, Any]) -> bool:
        transitions = int(lease["spec"].get("leaseTransitions") or 0)
        if lease["spec"].get("holderIdentity") != self.identity:
            transitions += 1
        try:
            self._replace(lease, self._spec(transitions, acquired=True))
        except ApiException as exc:
            if exc.status == 409:
                return False  # changed since we read it: someone renewed or took it
            raise
        return True

    # -- leading ------------------------------------------------------------------------------

    def _renew_once(self) -> None:
        started = time.monotonic()
        lease = self._read()
        holder = None if lease is None else lease["spec"].get("holderIdentity")
        if lease is None or holder != self.identity:
            self._lost(f"the Lease is now held by {holder!r}")
            return
        spec = self._spec(int(lease["spec"].get("leaseTransitions") or 0), acquired=False)
        spec["acquireTime"] = lease["spec"].get("acquireTime")
        self._replace(lease, spec)
        self.fence.bind(started + self.settings.renew_deadline_seconds)

    def _watch(self) -> None:
        """Exit when the sure lead has run out (the renewer may be stuck in a slow call)."""
        while not self.stopping.is_set():
            remaining = self.fence.remaining()
            if remaining <= 0:
                self._lost(
                    f"no renewal started in the last {self.settings.renew_deadline_seconds:g}s "
                    "succeeded"
                )
            self.stopping.wait(min(remaining, 0.1))

    def _renew_loop(self) -> None:
        last_renewed = time.monotonic()
        while not self.stopping.wait(self.settings.retry_period_seconds):
            try:
                self._renew_once()
                last_renewed = time.monotonic()
            except Exception as exc:  # any failure counts against the deadline
                logger.warning("leader election: renewal failed: %s", exc)
            if time.monotonic() - last_renewed >= self.settings.renew_deadline_seconds:
                self._lost(f"no renewal for {self.settings.renew_deadline_seconds:g}s")

    def _lost(self, why: str) -> NoReturn:
        """Stop at once: a standby may lead as soon as the Lease expires."""
        logger.critical("leader election: lost the lead (%s); exiting", why)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(70)

    # -- stopping -----------------------------------------------------------------------------

    def stop(self) -> None:
        """End a pending :meth:`acquire` (operator shutting down while a standby)."""
        self.stopping.set()

    def release(self) -> None:
        """Clear the holder so that a standby takes over at once (idempotent; at exit)."""
        if self._released or self._renewer is None:
            return
        self._released = True
        self.stopping.set()
        self._renewer.join(timeout=self.settings.retry_period_seconds + 5)
        try:
            lease = self._read()
            if lease is not None and lease["spec"].get("holderIdentity") == self.identity:
                spec = {
                    key: lease["spec"][key]
                    for key in ("leaseDurationSeconds", "leaseTransitions")
                    if key in lease["spec"]
                }
                self._replace(lease, spec)
                logger.info("leader election: released Lease %s/%s", self.namespace, self.name)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            logger.warning("leader election: could not release the Lease (%s)", exc)
        LEADER.set(0)
