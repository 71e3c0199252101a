"""The process-wide objects the handlers share, built once at import and startup."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox_operator.checkpoint_handlers import CheckpointLogic
from sandbox_operator.events import EventSink
from sandbox_operator.executors.base import Executor
from sandbox_operator.k8s import Api
from sandbox_operator.plancommit_handlers import PlanCommitLogic
from sandbox_operator.redaction import scrubbing_events
from sandbox_operator.sandbox_handlers import SandboxLogic
from sandbox_operator.settings import ExecutorKind, Settings


@dataclass(frozen=True)
class Runtime:
    """Settings, executor, API access and the three logic objects."""

    settings: Settings
    executor: Executor
    api: Api
    sandboxes: SandboxLogic
    checkpoints: CheckpointLogic
    plancommits: PlanCommitLogic


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
    events = scrubbing_events(events)  # issue 8: no secret in any Event
    return Runtime(
        settings=settings,
        executor=executor,
        api=api,
        sandboxes=SandboxLogic(settings, executor, api, events),
        checkpoints=CheckpointLogic(settings, executor, api, events),
        plancommits=PlanCommitLogic(settings, executor, api, events),
    )
