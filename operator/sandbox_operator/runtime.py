"""The process-wide objects the handlers share, built once at import and startup.

:data:`SETTINGS` is read from the environment once, at import: the reconcilers' decorators take
their timeouts and intervals from it. The :class:`Runtime` (executor, API access, the logic of
each resource) is built by the startup handler of :mod:`sandbox_operator.main` and reached by
every handler through :func:`runtime`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandbox_operator.executors.base import Executor
from sandbox_operator.kube.api import Api
from sandbox_operator.kube.events import EventSink
from sandbox_operator.kube.redaction import scrubbing_events
from sandbox_operator.resources.checkpoint import CheckpointLogic
from sandbox_operator.resources.plancommit import PlanCommitLogic
from sandbox_operator.resources.sandbox import SandboxLogic
from sandbox_operator.settings import ExecutorKind, Settings

SETTINGS = Settings.from_env()
TIMEOUT = SETTINGS.handler_timeout_seconds  # every handler has one


@dataclass(frozen=True)
class Runtime:
    """Settings, executor, API access and the three logic objects."""

    settings: Settings
    executor: Executor
    api: Api
    sandboxes: SandboxLogic
    checkpoints: CheckpointLogic
    plancommits: PlanCommitLogic


_RUNTIME: list[Runtime] = []


def runtime() -> Runtime:
    """The runtime built by the startup handler."""
    return _RUNTIME[0]


def install(built: Runtime) -> None:
    """Make ``built`` the runtime every handler reaches (the startup handler calls it once)."""
    _RUNTIME[:] = [built]


def make_executor(settings: Settings, api: Api) -> Executor:
    """The executor named by ``settings.executor``."""
    if settings.executor is ExecutorKind.POD:
        from sandbox_operator.executors.pod import PodExecutor

        pod: Executor = PodExecutor(settings, api)
        return pod
    from sandbox_operator.executors.local import LocalExecutor

    return LocalExecutor(settings)


def build_runtime(settings: Settings, api: Api, events: EventSink) -> Runtime:
    """Wire everything for one operator process."""
    executor = make_executor(settings, api)
    events = scrubbing_events(events)  # no secret in any Event
    return Runtime(
        settings=settings,
        executor=executor,
        api=api,
        sandboxes=SandboxLogic(settings, executor, api, events),
        checkpoints=CheckpointLogic(settings, executor, api, events),
        plancommits=PlanCommitLogic(settings, executor, api, events),
    )
