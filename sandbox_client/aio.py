"""The asynchronous client: the same classes and method names as :mod:`sandbox_client.client`.

Built on ``kubernetes_asyncio``. Every method that talks to the API server or the file system is
a coroutine; shapes, units and errors are those of the synchronous method of the same name
(which documents them in full). File operations: the workspace agent's are awaited
(:class:`~sandbox_client.agent_files.AsyncAgentFileOperations`), the local executor's run the
blocking :class:`~sandbox_client.files.FileOperations` in a worker thread. Typical use::

    async with SandboxClient() as client:
        async with Plan(client, "plan-1", "default") as plan:
            repo = await plan.add_sandbox("repo", "git_worktree", "/src/repo")
            await plan.wait_ready(timeout=120)
            await repo.write_file("README.md", "hello\\n")
            result = await plan.commit()
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_client import _logic
from sandbox_client._config import default_namespace, kubeconfig_path
from sandbox_client.agent_files import AsyncAgentFileOperations, AsyncPodProxyTransport
from sandbox_client.client import (
    DEFAULT_COMMIT_TIMEOUT,
    DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_READY_TIMEOUT,
    ProgressCallback,
)
from sandbox_client.errors import (
    NotFoundError,
    SandboxClientError,
    from_api_exception,
)
from sandbox_client.files import (
    AGENT_EXECUTOR,
    AsyncFileOperations,
    FileOperations,
    ThreadedFileOperations,
    operations_for,
)
from sandbox_client.history import sandbox_history
from sandbox_client.models import (
    CHECKPOINT_PLURAL,
    GROUP,
    PLANCOMMIT_PLURAL,
    SANDBOX_PLURAL,
    VERSION,
    CheckpointInfo,
    HistoryEntry,
    PlanCommitAction,
    PlanCommitResult,
    PlanReview,
    SandboxInfo,
    SandboxOptions,
)

__all__ = ["Plan", "Sandbox", "SandboxClient"]

T = TypeVar("T")


@asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    try:
        yield
    except SandboxClientError:
        raise  # already typed (WaitTimeoutError is an OSError through TimeoutError)
    except ApiException as exc:
        raise from_api_exception(exc.status, exc.reason, exc.body) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise SandboxClientError("ApiUnreachable", str(exc)) from exc


class SandboxClient:
    """Async twin of :class:`sandbox_client.SandboxClient` (same arguments).

    The configuration is loaded on first use; close with ``await client.close()`` or
    ``async with SandboxClient() as client``.
    """

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        api_client: k8s.ApiClient | None = None,
        files: FileOperations | None = None,
    ) -> None:
        self._path = kubeconfig_path(kubeconfig)
        self._context = context
        self._api_client = api_client
        self._lock = asyncio.Lock()
        self.namespace = namespace or default_namespace(self._path, context)
        self.files = files
        self._agent_files: AsyncAgentFileOperations | None = None

    async def _api(self) -> k8s.ApiClient:
        async with self._lock:
            if self._api_client is None:
                try:
                    if self._path is not None:
                        self._api_client = await k8s_config.new_client_from_config(
                            config_file=self._path, context=self._context
                        )
                    else:
                        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                        self._api_client = k8s.ApiClient()
                except (k8s_config.ConfigException, OSError) as exc:
                    raise SandboxClientError("ConfigError", str(exc)) from exc
            return self._api_client

    async def _custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(await self._api())

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._api_client is not None:
            await self._api_client.close()
            self._api_client = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    # -- raw objects ------------------------------------------------------------------------------

    async def get_object(
        self, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """As :meth:`sandbox_client.SandboxClient.get_object`."""
        custom = await self._custom()
        async with _translated():
            found = await custom.get_namespaced_custom_object(
                GROUP, VERSION, self._ns(namespace), plural, name
            )
        return cast(dict[str, Any], found)

    async def list_objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """As :meth:`sandbox_client.SandboxClient.list_objects`."""
        custom = await self._custom()
        async with _translated():
            found = await custom.list_namespaced_custom_object(
                GROUP, VERSION, self._ns(namespace), plural
            )
        return list(cast(dict[str, Any], found).get("items") or [])

    async def create_object(
        self, plural: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """As :meth:`sandbox_client.SandboxClient.create_object`."""
        custom = await self._custom()
        async with _translated():
            found = await custom.create_namespaced_custom_object(
                GROUP, VERSION, self._ns(namespace), plural, body, field_validation="Strict"
            )
        return cast(dict[str, Any], found)

    async def patch_object(
        self, plural: str, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """As :meth:`sandbox_client.SandboxClient.patch_object` (JSON merge patch)."""
        custom = await self._custom()
        async with _translated():
            # Passed through **kwargs at run time; without it a dict body goes out as a JSON
            # patch (the first content type the generated code lists).
            found = await custom.patch_namespaced_custom_object(  # type: ignore[call-arg]
                GROUP,
                VERSION,
                self._ns(namespace),
                plural,
                name,
                patch,
                _content_type="application/merge-patch+json",
            )
        return cast(dict[str, Any], found)

    async def delete_object(self, plural: str, name: str, namespace: str | None = None) -> bool:
        """As :meth:`sandbox_client.SandboxClient.delete_object`."""
        custom = await self._custom()
        try:
            async with _translated():
                await custom.delete_namespaced_custom_object(
                    GROUP, VERSION, self._ns(namespace), plural, name
                )
        except NotFoundError:
            return False
        return True

    async def events(self, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """As :meth:`sandbox_client.SandboxClient.events`."""
        api = await self._api()
        async with _translated():
            found = await k8s.CoreV1Api(api).list_namespaced_event(
                self._ns(namespace), field_selector=f"involvedObject.name={name}"
            )
        data = api.sanitize_for_serialization(found)
        return list(cast(dict[str, Any], data).get("items") or [])

    async def wait(
        self,
        plural: str,
        check: _logic.Predicate[T],
        timeout: float,
        what: str,
        *,
        namespace: str | None = None,
        name: str | None = None,
        describe: Callable[[_logic.Objects], str] | None = None,
    ) -> T:
        """As :meth:`sandbox_client.SandboxClient.wait`: list, then watch; never polls."""
        waiter = _logic.Waiter(check, timeout, what, name, describe)
        namespace = self._ns(namespace)
        custom = await self._custom()
        while True:
            async with _translated():
                listing = await custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, field_selector=waiter.selector
                )
            done = waiter.listed(cast(dict[str, Any], listing))
            if done is not None:
                return done
            gone = False
            while not gone:
                arguments = waiter.watch_arguments()
                try:
                    async with k8s_watch.Watch() as watcher:
                        stream = watcher.stream(
                            custom.list_namespaced_custom_object,
                            GROUP,
                            VERSION,
                            namespace,
                            plural,
                            **arguments,
                        )
                        async for event in stream:
                            done = waiter.seen(event)
                            if done is not None:
                                return done
                            if waiter.expired:
                                break
                except ApiException as exc:
                    if exc.status != 410:
                        raise from_api_exception(exc.status, exc.reason, exc.body) from exc
                    gone = True
                except TimeoutError as exc:
                    if isinstance(exc, SandboxClientError):
                        raise  # a predicate's own WaitTimeoutError, not a quiet watch
                    continue  # a quiet watch: the deadline check decides

    # -- typed API --------------------------------------------------------------------------------

    async def get_sandbox(self, name: str, namespace: str | None = None) -> SandboxInfo:
        """As :meth:`sandbox_client.SandboxClient.get_sandbox`."""
        return SandboxInfo.from_object(await self.get_object(SANDBOX_PLURAL, name, namespace))

    async def list_sandboxes(
        self, namespace: str | None = None, plan_id: str | None = None
    ) -> list[SandboxInfo]:
        """As :meth:`sandbox_client.SandboxClient.list_sandboxes`."""
        items = await self.list_objects(SANDBOX_PLURAL, namespace)
        if plan_id is not None:
            return _logic.plan_sandboxes(items, plan_id)
        return sorted((SandboxInfo.from_object(o) for o in items), key=lambda s: s.name)

    async def list_checkpoints(
        self, namespace: str | None = None, sandbox: str | None = None
    ) -> list[CheckpointInfo]:
        """As :meth:`sandbox_client.SandboxClient.list_checkpoints`."""
        items = await self.list_objects(CHECKPOINT_PLURAL, namespace)
        found = [CheckpointInfo.from_object(o) for o in items]
        if sandbox is not None:
            found = [c for c in found if c.spec.sandbox_name == sandbox]
        return sorted(found, key=lambda c: (c.created_at, c.name))

    async def list_plancommits(
        self, namespace: str | None = None, plan_id: str | None = None
    ) -> list[PlanCommitResult]:
        """As :meth:`sandbox_client.SandboxClient.list_plancommits`."""
        items = await self.list_objects(PLANCOMMIT_PLURAL, namespace)
        found = [PlanCommitResult.from_object(o) for o in items]
        if plan_id is not None:
            found = [p for p in found if p.plan_id == plan_id]
        return sorted(found, key=lambda p: p.name)

    async def history(self, name: str, namespace: str | None = None) -> list[HistoryEntry]:
        """As :meth:`sandbox_client.SandboxClient.history`."""
        info = await self.get_sandbox(name, namespace)
        return sandbox_history(
            name,
            await self.list_plancommits(namespace, info.spec.plan_id),
            await self.list_checkpoints(namespace, name),
            await self.events(name, namespace),
        )

    def sandbox(self, name: str, namespace: str | None = None) -> Sandbox:
        """As :meth:`sandbox_client.SandboxClient.sandbox`."""
        return Sandbox(self, name, self._ns(namespace))

    def plan(self, plan_id: str, namespace: str | None = None, *, keep: bool = False) -> Plan:
        """As :meth:`sandbox_client.SandboxClient.plan`."""
        return Plan(self, plan_id, namespace, keep=keep)

    async def files_for(self, info: SandboxInfo) -> AsyncFileOperations:
        """As :meth:`sandbox_client.SandboxClient.files_for`, awaitable."""
        if self.files is not None:
            return ThreadedFileOperations(self.files)
        if info.executor == AGENT_EXECUTOR:
            if self._agent_files is None:
                self._agent_files = AsyncAgentFileOperations(
                    AsyncPodProxyTransport(await self._api())
                )
            return self._agent_files
        return ThreadedFileOperations(operations_for(info))


class Sandbox:
    """Async twin of :class:`sandbox_client.Sandbox`."""

    def __init__(self, client: SandboxClient, name: str, namespace: str) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"Sandbox({self.namespace}/{self.name})"

    async def info(self) -> SandboxInfo:
        """As :meth:`sandbox_client.Sandbox.info`."""
        return await self.client.get_sandbox(self.name, self.namespace)

    async def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> SandboxInfo:
        """As :meth:`sandbox_client.Sandbox.wait_ready`."""
        return await self.client.wait(
            SANDBOX_PLURAL,
            _logic.sandbox_ready(self.name),
            timeout,
            f"sandbox {self.name} ready",
            namespace=self.namespace,
            name=self.name,
            describe=lambda objs: _logic.describe_sandboxes(objs, [self.name]),
        )

    async def _files(self) -> tuple[AsyncFileOperations, SandboxInfo]:
        info = await self.info()
        return await self.client.files_for(info), info

    async def read_bytes(self, path: str) -> bytes:
        """As :meth:`sandbox_client.Sandbox.read_bytes`."""
        files, info = await self._files()
        return await files.read_file(info, path)

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        """As :meth:`sandbox_client.Sandbox.read_file`."""
        return (await self.read_bytes(path)).decode(encoding)

    async def write_file(self, path: str, content: str | bytes, encoding: str = "utf-8") -> None:
        """As :meth:`sandbox_client.Sandbox.write_file`."""
        data = content.encode(encoding) if isinstance(content, str) else content
        files, info = await self._files()
        await files.write_file(info, path, data)

    async def list_files(self, path: str = "") -> list[str]:
        """As :meth:`sandbox_client.Sandbox.list_files`."""
        files, info = await self._files()
        return await files.list_files(info, path)

    async def diff(self) -> str:
        """As :meth:`sandbox_client.Sandbox.diff`."""
        files, info = await self._files()
        return await files.diff(info)

    async def checkpoint(
        self,
        phase: str = "manual",
        metadata: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        timeout: float = DEFAULT_OPERATION_TIMEOUT,
    ) -> CheckpointInfo:
        """As :meth:`sandbox_client.Sandbox.checkpoint`."""
        body = _logic.checkpoint_manifest(self.name, phase, metadata, name)
        created = await self.client.create_object(CHECKPOINT_PLURAL, body, self.namespace)
        checkpoint = str(created["metadata"]["name"])
        return await self.client.wait(
            CHECKPOINT_PLURAL,
            _logic.checkpoint_ready(checkpoint),
            timeout,
            f"checkpoint {checkpoint} ready",
            namespace=self.namespace,
            name=checkpoint,
        )

    async def checkpoints(self) -> list[CheckpointInfo]:
        """As :meth:`sandbox_client.Sandbox.checkpoints`."""
        return await self.client.list_checkpoints(self.namespace, self.name)

    async def restore(
        self, checkpoint: str | CheckpointInfo, *, timeout: float = DEFAULT_OPERATION_TIMEOUT
    ) -> SandboxInfo:
        """As :meth:`sandbox_client.Sandbox.restore`."""
        checkpoint_name = checkpoint if isinstance(checkpoint, str) else checkpoint.name
        request = _logic.request_id()
        await self.client.patch_object(
            SANDBOX_PLURAL,
            self.name,
            {"spec": {"restoreRequest": {"id": request, "checkpointName": checkpoint_name}}},
            self.namespace,
        )
        return await self.client.wait(
            SANDBOX_PLURAL,
            _logic.request_served(self.name, "lastRestoreRequestId", "Restored", request),
            timeout,
            f"restore of {self.name} to {checkpoint_name}",
            namespace=self.namespace,
            name=self.name,
        )

    async def rollback(self, *, timeout: float = DEFAULT_OPERATION_TIMEOUT) -> SandboxInfo:
        """As :meth:`sandbox_client.Sandbox.rollback`."""
        request = _logic.request_id()
        await self.client.patch_object(
            SANDBOX_PLURAL,
            self.name,
            {"spec": {"rollbackRequest": {"id": request}}},
            self.namespace,
        )
        return await self.client.wait(
            SANDBOX_PLURAL,
            _logic.request_served(self.name, "lastRollbackRequestId", "RollbackRequested", request),
            timeout,
            f"rollback of {self.name}",
            namespace=self.namespace,
            name=self.name,
        )

    async def history(self) -> list[HistoryEntry]:
        """As :meth:`sandbox_client.Sandbox.history`."""
        return await self.client.history(self.name, self.namespace)

    async def delete(
        self, *, wait: bool = True, timeout: float = DEFAULT_OPERATION_TIMEOUT
    ) -> None:
        """As :meth:`sandbox_client.Sandbox.delete`."""
        await self.client.delete_object(SANDBOX_PLURAL, self.name, self.namespace)
        if wait:
            await self.client.wait(
                SANDBOX_PLURAL,
                _logic.all_gone([self.name]),
                timeout,
                f"deletion of {self.name}",
                namespace=self.namespace,
                name=self.name,
            )


class Plan:
    """Async twin of :class:`sandbox_client.Plan`; ``async with`` cleans up unless ``keep``."""

    def __init__(
        self,
        client: SandboxClient,
        plan_id: str,
        namespace: str | None = None,
        *,
        keep: bool = False,
    ) -> None:
        self.client = client
        self.plan_id = plan_id
        self.namespace = namespace or client.namespace
        self.keep = keep

    def __repr__(self) -> str:
        return f"Plan({self.namespace}/{self.plan_id})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.keep:
            await self.delete(cleanup=True)

    async def add_sandbox(
        self,
        resource_id: str,
        strategy: str,
        source: _logic.SourceLike,
        *,
        workspace: Mapping[str, Any] | None = None,
        options: SandboxOptions | Mapping[str, Any] | None = None,
        name: str | None = None,
        ttl_seconds_after_finished: int | None = None,
    ) -> Sandbox:
        """As :meth:`sandbox_client.Plan.add_sandbox`."""
        object_name = name or _logic.dns_name(self.plan_id, resource_id)
        body = _logic.sandbox_manifest(
            object_name,
            self.plan_id,
            resource_id,
            strategy,
            source,
            options=options,
            workspace=workspace,
            ttl_seconds_after_finished=ttl_seconds_after_finished,
        )
        await self.client.create_object(SANDBOX_PLURAL, body, self.namespace)
        return Sandbox(self.client, object_name, self.namespace)

    async def sandboxes(self) -> list[Sandbox]:
        """As :meth:`sandbox_client.Plan.sandboxes`."""
        found = await self.client.list_sandboxes(self.namespace, self.plan_id)
        return [Sandbox(self.client, s.name, self.namespace) for s in found]

    async def sandbox(self, resource_id: str) -> Sandbox:
        """As :meth:`sandbox_client.Plan.sandbox`."""
        for info in await self.client.list_sandboxes(self.namespace, self.plan_id):
            if info.spec.resource_id == resource_id:
                return Sandbox(self.client, info.name, self.namespace)
        raise NotFoundError(
            "NotFound", f"plan {self.plan_id} has no sandbox for resource {resource_id}"
        )

    async def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> list[SandboxInfo]:
        """As :meth:`sandbox_client.Plan.wait_ready`."""
        found = await self.client.list_sandboxes(self.namespace, self.plan_id)
        names = [s.name for s in found]
        if not names:
            raise NotFoundError("NotFound", f"plan {self.plan_id} has no sandboxes")
        return await self.client.wait(
            SANDBOX_PLURAL,
            _logic.all_ready(names),
            timeout,
            f"plan {self.plan_id} ready",
            namespace=self.namespace,
            describe=lambda objs: _logic.describe_sandboxes(objs, names),
        )

    async def _plancommit(
        self,
        action: PlanCommitAction,
        message: str | None,
        wait: bool,
        timeout: float,
        on_progress: ProgressCallback | None,
        mode: str | None = None,
    ) -> PlanCommitResult:
        body = _logic.plancommit_manifest(self.plan_id, action, message, mode=mode)
        created = await self.client.create_object(PLANCOMMIT_PLURAL, body, self.namespace)
        name = str(created["metadata"]["name"])
        if not wait:
            return PlanCommitResult.from_object(created)
        return await self._wait_plancommit(name, timeout, on_progress)

    async def _wait_plancommit(
        self, name: str, timeout: float, on_progress: ProgressCallback | None
    ) -> PlanCommitResult:
        return await self.client.wait(
            PLANCOMMIT_PLURAL,
            _logic.plancommit_progress(name, on_progress),
            timeout,
            f"plancommit {name} of plan {self.plan_id}",
            namespace=self.namespace,
            name=name,
        )

    async def commit(
        self,
        *,
        wait: bool = True,
        message: str | None = None,
        timeout: float = DEFAULT_COMMIT_TIMEOUT,
        on_progress: ProgressCallback | None = None,
        mode: str | None = None,
    ) -> PlanCommitResult:
        """As :meth:`sandbox_client.Plan.commit` (a failed commit is a result)."""
        return await self._plancommit(
            PlanCommitAction.COMMIT, message, wait, timeout, on_progress, mode
        )

    async def rollback(
        self,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_COMMIT_TIMEOUT,
        on_progress: ProgressCallback | None = None,
    ) -> PlanCommitResult:
        """As :meth:`sandbox_client.Plan.rollback`."""
        return await self._plancommit(PlanCommitAction.ROLLBACK, None, wait, timeout, on_progress)

    async def _awaiting_approval(self) -> dict[str, Any] | None:
        objects = await self.client.list_objects(PLANCOMMIT_PLURAL, self.namespace)
        return _logic.awaiting_approval(self.plan_id, {o["metadata"]["name"]: o for o in objects})

    async def review(
        self, *, message: str | None = None, timeout: float = DEFAULT_COMMIT_TIMEOUT
    ) -> PlanReview:
        """As :meth:`sandbox_client.Plan.review` (a PlanCommit with ``approval: Required``)."""
        waiting = await self._awaiting_approval()
        if waiting is None:
            body = _logic.plancommit_manifest(
                self.plan_id, PlanCommitAction.COMMIT, message, approval_required=True
            )
            waiting = await self.client.create_object(PLANCOMMIT_PLURAL, body, self.namespace)
        name = str(waiting["metadata"]["name"])
        return await self.client.wait(
            PLANCOMMIT_PLURAL,
            _logic.plancommit_reviewed(name),
            timeout,
            f"review of plan {self.plan_id} ({name})",
            namespace=self.namespace,
            name=name,
        )

    async def approve(
        self,
        digest: str,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_COMMIT_TIMEOUT,
        on_progress: ProgressCallback | None = None,
    ) -> PlanCommitResult:
        """As :meth:`sandbox_client.Plan.approve` (sets ``spec.approvedDigest``)."""
        name = _logic.approval_target(
            self.plan_id, await self.client.list_objects(PLANCOMMIT_PLURAL, self.namespace)
        )
        patched = await self.client.patch_object(
            PLANCOMMIT_PLURAL, name, {"spec": {"approvedDigest": digest}}, self.namespace
        )
        if not wait:
            return PlanCommitResult.from_object(patched)
        return await self._wait_plancommit(name, timeout, on_progress)

    async def commits(self) -> list[PlanCommitResult]:
        """As :meth:`sandbox_client.Plan.commits`."""
        return await self.client.list_plancommits(self.namespace, self.plan_id)

    async def delete(
        self, cleanup: bool = True, *, timeout: float = DEFAULT_OPERATION_TIMEOUT
    ) -> None:
        """As :meth:`sandbox_client.Plan.delete`."""
        found = await self.client.list_sandboxes(self.namespace, self.plan_id)
        sandboxes = [s.name for s in found]
        for checkpoint in await self.client.list_checkpoints(self.namespace):
            if checkpoint.spec.sandbox_name in sandboxes:
                await self.client.delete_object(CHECKPOINT_PLURAL, checkpoint.name, self.namespace)
        for commit in await self.commits():
            await self.client.delete_object(PLANCOMMIT_PLURAL, commit.name, self.namespace)
        for name in sandboxes:
            await self.client.delete_object(SANDBOX_PLURAL, name, self.namespace)
        if cleanup and sandboxes:
            await self.client.wait(
                SANDBOX_PLURAL,
                _logic.all_gone(sandboxes),
                timeout,
                f"cleanup of plan {self.plan_id}",
                namespace=self.namespace,
            )
