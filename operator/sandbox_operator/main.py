"""kopf entry point: the one startup handler, kopf's tuning, and the handlers' registration.

Run: ``kopf run --standalone -A -m sandbox_operator.main`` (or ``--namespace NS``). Importing
this module imports the :mod:`sandbox_operator.reconcilers`, whose thin decorated handlers
(explicit ids) register with kopf; the logic lives in :mod:`sandbox_operator.resources`. Handlers
return nothing (case 15); progress lives in annotations, kopf's diff-base in the declared
``status.lastHandledConfiguration`` (:mod:`sandbox_operator.kube.diffbase`), nothing else of
kopf's in ``.status``.
With ``SANDBOX_OPERATOR_LEADER_ELECTION=true`` (the chart's default) the startup handler first
waits for the leader-election Lease (:mod:`sandbox_operator.kube.leader`): of several replicas
only the holder ever starts watching (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import kopf

from sandbox_api.models import FINALIZER, GROUP, SANDBOX_PLURAL
from sandbox_operator.errors import install_quiet_waits
from sandbox_operator.kube import api as k8s
from sandbox_operator.kube import clock, metrics, tracing
from sandbox_operator.kube.diffbase import StatusDiffBase
from sandbox_operator.kube.events import EventRecorder, NamespaceGate, install_kopf_filter
from sandbox_operator.kube.fence import install_kopf_fence
from sandbox_operator.kube.leader import LeaderElector
from sandbox_operator.kube.logs import configure_logging

# Imported for their decorators: importing a reconciler registers its handlers with kopf.
from sandbox_operator.reconcilers import (  # noqa: F401
    checkpoint,
    metadata,
    phases,
    plancommit,
    sandbox,
)
from sandbox_operator.resources.ttl import TTL
from sandbox_operator.runtime import SETTINGS, build_runtime, install

_EVENTS: list[EventRecorder] = []


def tune(settings: kopf.OperatorSettings) -> None:
    """All kopf tuning in one place (STYLE.md): storage, finalizer, posting, watching, workers."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = StatusDiffBase()
    # Only warnings become Events: no "Handler succeeded" spam on every restart (case 22).
    # Our Events go through EventRecorder (one post, none in terminating namespaces, case 17);
    # kopf's own log-derived Events stay off, and are filtered the same way if turned on.
    settings.posting.level = logging.WARNING
    settings.posting.loggers = False
    settings.watching.server_timeout = int(SETTINGS.watch_server_timeout_seconds)
    settings.watching.client_timeout = SETTINGS.watch_client_timeout_seconds
    # A deleted object waits for its timers (a PlanCommit's, a Sandbox's agent-token renewal
    # with the pod executor) to stop before the finalizer goes; poll often
    # (kopf's default is 60 s, which would hold every deletion for a minute).
    settings.background.cancellation_polling = 1.0
    # Handlers are synchronous (git, rsync, exec): they run in this many threads at once.
    if SETTINGS.max_workers is not None:
        settings.execution.max_workers = SETTINGS.max_workers


@kopf.on.startup(id="configure")
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Tune kopf, serve metrics, wait for the lead (leader election), build the runtime."""
    configure_logging(SETTINGS.log_format)
    tracing.configure(SETTINGS.otel_exporter)  # "none" by default: no exporter
    install_quiet_waits()  # a finalizer waiting for a saga is not an error
    tune(settings)
    k8s.load_config()
    # Metrics first: a standby's endpoint answers too (sandbox_operator_leader is 0 there).
    metrics.serve(SETTINGS.metrics_port)
    if SETTINGS.leader_election:
        install_kopf_fence()  # kopf's writes too stop when the lead may be lost
        elector = LeaderElector(SETTINGS)
        try:
            leading = await asyncio.to_thread(elector.acquire)
        except asyncio.CancelledError:
            elector.stop()  # the operator stops while still a standby
            raise
        if not leading:
            raise asyncio.CancelledError
    api = k8s.Api()
    # Times written for later comparison (TTLs) are on the API server's clock.
    clock.install(clock.ApiServerClock(lambda: clock.server_date(api.api_client)))
    gate = NamespaceGate(api.namespace)
    install_kopf_filter(gate)
    _EVENTS[:] = [EventRecorder(api.post_event, gate, background=True)]
    built = build_runtime(SETTINGS, api, _EVENTS[0])
    install(built)
    # Finished Sandboxes past their TTL, scheduled by the Sandbox watch (resources.ttl).
    TTL.start(
        SETTINGS.ttl_check_interval_seconds,
        lambda namespace, name: api.delete(SANDBOX_PLURAL, namespace, name),
    )
    start_warm_pools(built.executor, api)
    freeze_startup_heap()


_TASKS: list[asyncio.Task[None]] = []


def start_warm_pools(executor: object, api: k8s.Api) -> None:
    """Start refilling the warm pools (``settings.warm_pool_size`` > 0, the pod executor):
    :func:`~sandbox_operator.resources.warm_pool.keep_pools` as a task of kopf's loop."""
    from sandbox_operator.executors.pod import PodExecutor
    from sandbox_operator.resources.warm_pool import PoolKeeper, keep_pools

    if not SETTINGS.pool_namespaces or not isinstance(executor, PodExecutor):
        return
    keeper = PoolKeeper(SETTINGS, api, executor.pool)
    task = asyncio.get_running_loop().create_task(
        keep_pools(keeper, SETTINGS.warm_pool_interval_seconds)
    )
    _TASKS.append(task)  # kept referenced: the loop holds tasks weakly


def freeze_startup_heap() -> int:
    """Move every object alive after startup out of the garbage collector's reach; return
    how many objects are frozen (``gc.get_freeze_count()``).

    The modules the operator imports (kopf, the kubernetes client's models, pydantic) leave
    objects that live as long as the process, and every full collection walked them all: about
    140 ms of a held event loop each. Frozen, kopf's loop took 0.50-0.54 s of CPU for 100 new
    Sandboxes instead of 0.57-0.65 s (docs/benchmarks.md). Garbage made
    so far is collected first, so nothing that could be freed is frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
