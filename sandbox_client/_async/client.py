"""The engine's client: :class:`SandboxClient`, :class:`Plan` and :class:`Sandbox`.

Built on ``kubernetes_asyncio``, reached through :mod:`sandbox_client._kube`. Every wait is a
*watch* (list, then watch from the list's resourceVersion, listing again after a 410 Gone),
never a polling loop. File operations go through the ones :meth:`SandboxClient.files_for` picks
per sandbox. Typical use::

    async with SandboxClient() as client:
        async with Plan(client, "plan-1", "default") as plan:
            repo = await plan.add_sandbox("repo", "git_worktree", "/src/repo")
            await plan.wait_ready(timeout=120)
            await repo.write_file("README.md", "hello\\n")
            result = await plan.commit()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import aclosing
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from sandbox_client import _kube, _logic
from sandbox_client import files as file_operations
from sandbox_client._config import default_namespace, kubeconfig_path
from sandbox_client.actor import (
    DEFAULT_MAX_ROWS,
    AsyncActorOperations,
    AsyncAgentActor,
    AsyncChunks,
    Command,
    Uploads,
    async_actor_for,
)
from sandbox_client.agent_files import AsyncAgentFileOperations, AsyncPodProxyTransport
from sandbox_client.errors import ConflictError, NotFoundError
from sandbox_client.history import sandbox_history
from sandbox_client.models import (
    CHECKPOINT_PLURAL,
    PLANCOMMIT_PLURAL,
    SANDBOX_PLURAL,
    AuditPage,
    CheckpointInfo,
    EditResult,
    ExecResult,
    FileChange,
    FileResult,
    FileStat,
    GlobResult,
    GrepResult,
    HistoryEntry,
    Identity,
    PlanCommitAction,
    PlanCommitResult,
    PlanReview,
    SandboxInfo,
    SandboxOptions,
    SqlResult,
)

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s

T = TypeVar("T")
ProgressCallback = Callable[[PlanCommitResult], None]

DEFAULT_READY_TIMEOUT = 120.0
DEFAULT_OPERATION_TIMEOUT = 120.0
DEFAULT_COMMIT_TIMEOUT = 300.0
DECISION_ATTEMPTS = 5


class SandboxClient:
    """One connection to a cluster, with the kubeconfig rules of kubectl.

    Close it with ``await client.close()``, or use ``async with SandboxClient() as client``.

    Args:
        kubeconfig: path of a kubeconfig file; default ``$KUBECONFIG``, then
            ``~/.kube/config``, then the in-cluster service account.
        context: kubeconfig context; default the current one.
        namespace: default namespace of :meth:`plan`, :meth:`sandbox` and the listings;
            default the context's namespace (``default`` when it has none).
        api_client: a ready ``kubernetes_asyncio.client.ApiClient`` (then ``kubeconfig`` and
            ``context`` are ignored).
        files: the :class:`~sandbox_client.files.FileOperations` to use for every sandbox;
            default chosen per sandbox from ``status.executor`` (``local``: the sandbox path;
            ``pod``: the workspace agent through the API server's pod proxy, with this
            client's credentials).
        local_state_dir: the local executor's state directory, for the actor's operations
            (commands, files, SQL) on its sandboxes from this host; default
            ``$SANDBOX_OPERATOR_STATE_DIR``, then ``/var/lib/sandbox-operator/state``.
        actor: the :class:`~sandbox_client.actor.AsyncActorOperations` to use for every
            sandbox (default chosen per sandbox from ``status.executor``, as ``files``).
        impersonate: act as this user (kubectl's ``--as``); the credentials must be allowed
            to impersonate. Approvals are then recorded with that user's identity.

    Raises:
        SandboxClientError: reason ``ConfigError`` when no configuration can be loaded (the
            blocking client when it is made, the async one on its first call).
    """

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        api_client: k8s.ApiClient | None = None,
        files: file_operations.FileOperations | None = None,
        local_state_dir: str | Path | None = None,
        actor: AsyncActorOperations | None = None,
        impersonate: str | None = None,
    ) -> None:
        path = kubeconfig_path(kubeconfig)
        self._kube = _kube.AsyncKube(path, context, api_client, impersonate)
        self.namespace = namespace or default_namespace(path, context)
        self.files = files
        transport = AsyncPodProxyTransport(self._kube)
        self.agent_files = AsyncAgentFileOperations(transport)
        self.agent_actor = AsyncAgentActor(transport)
        self.local_state_dir = local_state_dir
        self.actor = actor

    @property
    def api_client(self) -> k8s.ApiClient | None:
        """The Kubernetes ``ApiClient`` this client talks through (the async client makes it
        on its first call: None before)."""
        return self._kube.api_client

    # -- lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Release the connection pool (the HTTP session)."""
        await self._kube.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- raw objects (dicts, as the API server returns them) ----------------------------------

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    async def get_object(
        self, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """The object ``plural/name``.

        Raises:
            NotFoundError: it does not exist.
        """
        return await self._kube.read(plural, name, self._ns(namespace))

    async def list_objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every object of ``plural`` in the namespace."""
        found = await self._kube.listing(plural, self._ns(namespace))
        return list(found.get("items") or [])

    async def create_object(
        self, plural: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Create ``body``; returns the stored object (with its generated name).

        Raises:
            ConflictError: ``AlreadyExists``.
            RefusedError: ``Invalid`` (schema or CEL rule), ``Forbidden``.
        """
        return await self._kube.create(plural, body, self._ns(namespace))

    async def patch_object(
        self, plural: str, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """JSON merge patch of ``plural/name``.

        Raises:
            NotFoundError: it does not exist.
            RefusedError: ``Invalid`` (e.g. an immutable field).
        """
        return await self._kube.patch(plural, name, patch, self._ns(namespace))

    async def delete_object(self, plural: str, name: str, namespace: str | None = None) -> bool:
        """Ask for deletion (finalizers run afterwards); False when it was already gone."""
        try:
            await self._kube.delete(plural, name, self._ns(namespace))
        except NotFoundError:
            return False
        return True

    async def events(self, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The ``v1 Event`` dicts (camelCase) about the object ``name``."""
        return await self._kube.events(name, self._ns(namespace))

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
        """Watch ``plural`` (only ``name`` when given) until ``check`` returns a value.

        ``timeout`` in seconds. The objects seen so far (name -> raw object) are passed to
        ``check`` after the initial list and after every watch event.

        Raises:
            WaitTimeoutError: ``timeout`` passed; the message says what and the last state.
            SandboxClientError: whatever ``check`` raises, or an API failure.
        """
        waiter = _logic.Waiter(check, timeout, what, name, describe)
        namespace = self._ns(namespace)
        while True:
            done = waiter.listed(await self._kube.listing(plural, namespace, waiter.selector))
            if done is not None:
                return done
            try:
                while True:
                    arguments = waiter.watch_arguments()  # WaitTimeoutError at the deadline
                    async with aclosing(self._kube.watch(plural, namespace, arguments)) as events:
                        async for event in events:
                            done = waiter.seen(event)
                            if done is not None:
                                return done
                            if waiter.expired:
                                break
            except _kube.GoneError:
                continue  # the version expired: list again

    # -- typed API ----------------------------------------------------------------------------

    async def get_sandbox(self, name: str, namespace: str | None = None) -> SandboxInfo:
        """The Sandbox ``name``.

        Raises:
            NotFoundError: it does not exist.
        """
        return SandboxInfo.from_object(await self.get_object(SANDBOX_PLURAL, name, namespace))

    async def list_sandboxes(
        self, namespace: str | None = None, plan_id: str | None = None
    ) -> list[SandboxInfo]:
        """Sandboxes of the namespace (of ``plan_id`` only when given), sorted by name."""
        items = await self.list_objects(SANDBOX_PLURAL, namespace)
        if plan_id is not None:
            return _logic.plan_sandboxes(items, plan_id)
        return sorted((SandboxInfo.from_object(o) for o in items), key=lambda s: s.name)

    async def list_checkpoints(
        self, namespace: str | None = None, sandbox: str | None = None
    ) -> list[CheckpointInfo]:
        """Checkpoints of the namespace (of Sandbox ``sandbox`` only when given), oldest first."""
        items = await self.list_objects(CHECKPOINT_PLURAL, namespace)
        found = [CheckpointInfo.from_object(o) for o in items]
        if sandbox is not None:
            found = [c for c in found if c.spec.sandbox_name == sandbox]
        return sorted(found, key=lambda c: (c.created_at, c.name))

    async def list_plancommits(
        self, namespace: str | None = None, plan_id: str | None = None
    ) -> list[PlanCommitResult]:
        """PlanCommits of the namespace (of ``plan_id`` only when given), by name."""
        items = await self.list_objects(PLANCOMMIT_PLURAL, namespace)
        found = [PlanCommitResult.from_object(o) for o in items]
        if plan_id is not None:
            found = [p for p in found if p.plan_id == plan_id]
        return sorted(found, key=lambda p: p.name)

    async def history(self, name: str, namespace: str | None = None) -> list[HistoryEntry]:
        """Commits, rollbacks, checkpoints and restores of Sandbox ``name``, newest first.

        Raises:
            NotFoundError: the Sandbox does not exist.
        """
        info = await self.get_sandbox(name, namespace)
        return sandbox_history(
            name,
            await self.list_plancommits(namespace, info.spec.plan_id),
            await self.list_checkpoints(namespace, name),
            await self.events(name, namespace),
        )

    # -- approvals (docs/approvals.md) ------------------------------------------------------

    async def whoami(self) -> Identity:
        """The identity the API server authenticates for this client (a SelfSubjectReview,
        as ``kubectl auth whoami``): the one an approval written by this client records.

        Raises:
            RefusedError: ``Forbidden``, the server refuses self-reviews.
        """
        return Identity.from_user_info(await self._kube.whoami())

    async def pending_approvals(
        self, namespace: str | None = None, plan_id: str | None = None
    ) -> list[PlanReview]:
        """The reviewed PlanCommits waiting for approvals (phase ``AwaitingApproval``) in the
        namespace (of ``plan_id`` only when given), oldest first: each with its ``digest``,
        who created it, the decisions recorded so far and who counts as approved."""
        items = await self.list_objects(PLANCOMMIT_PLURAL, namespace)
        return _logic.pending_reviews(items, plan_id)

    async def plancommit_review(self, name: str, namespace: str | None = None) -> PlanReview:
        """The review of PlanCommit ``name`` with its recorded decisions.

        Raises:
            NotFoundError: no such PlanCommit, or it has no review (yet).
        """
        review = PlanReview.from_object(await self.get_object(PLANCOMMIT_PLURAL, name, namespace))
        if review is None:
            raise NotFoundError("NotFound", f"PlanCommit {name} has no review yet")
        return review

    async def decide(
        self,
        name: str,
        digest: str,
        decision: str,
        *,
        comment: str | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Record this client's own ``decision`` (``Approve`` or ``Reject``) on the reviewed
        ``digest`` of PlanCommit ``name``: an entry appended to ``spec.approvals`` with the
        identity the API server authenticates (:meth:`whoami`), which the chart's approval
        policy admits and nothing else. A decision written by someone else meanwhile (409)
        is read again and kept; returns the stored object.

        Raises:
            RefusedError: ``DigestMismatch`` (not the reviewed digest), ``InvalidState`` (not
                waiting for approvals), ``AlreadyDecided``, ``Invalid`` (a bad digest or
                decision) or ``Forbidden``/``Invalid`` from the admission policy (the
                creator, an operator or service-account identity, a forbidden approver).
            NotFoundError: no such PlanCommit.
            ConflictError: still conflicting after a few attempts.
        """
        entry = _logic.decision_entry(await self.whoami(), digest, decision, comment)
        for attempt in range(DECISION_ATTEMPTS):
            current = await self.get_object(PLANCOMMIT_PLURAL, name, namespace)
            patch = _logic.decision_patch(current, entry)
            try:
                return await self.patch_object(PLANCOMMIT_PLURAL, name, patch, namespace)
            except ConflictError:
                if attempt == DECISION_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def sandbox(self, name: str, namespace: str | None = None) -> Sandbox:
        """A handle on the existing Sandbox ``name`` (no API call yet)."""
        return Sandbox(self, name, self._ns(namespace))

    def plan(self, plan_id: str, namespace: str | None = None, *, keep: bool = False) -> Plan:
        """A :class:`Plan` in ``namespace`` (default: the client's)."""
        return Plan(self, plan_id, namespace, keep=keep)

    async def files_for(self, info: SandboxInfo) -> file_operations.AsyncFileOperations:
        """The file operations serving ``info``: the client's ``files`` when set, else those
        of its executor (:attr:`agent_files` for the pod executor).

        Raises:
            RefusedError: ``NoFileOperations`` (an executor without file operations here),
                ``InvalidState`` (not provisioned yet).
        """
        return file_operations.async_files_for(info, self.files, self.agent_files)

    def actor_for(self, info: SandboxInfo) -> AsyncActorOperations:
        """The actor's operations serving ``info`` (commands, files, search, SQL, audit): the
        client's ``actor`` when set, else the workspace agent for the pod executor and the
        core's own code on :attr:`local_state_dir` for the local one.

        Raises:
            RefusedError: ``NoFileOperations`` (another executor), ``InvalidState`` (not
                provisioned yet).
        """
        if self.actor is not None:
            return self.actor
        return async_actor_for(info, self.agent_actor, self.local_state_dir)


def _exec_options(
    cwd: str,
    env: Mapping[str, str] | None,
    stdin: bytes | str,
    timeout: float | None,
    max_output_bytes: int | None,
    network: bool | None,
) -> dict[str, Any]:
    return {
        "cwd": cwd, "env": env, "stdin": stdin, "timeout": timeout,
        "max_output_bytes": max_output_bytes, "network": network,
    }  # fmt: skip


class Sandbox:
    """One Sandbox object: files, diff, checkpoints, restore, rollback.

    Paths are relative to the resource root (``src/main.py``); a path that leaves the sandbox
    (absolute, ``..``, a symlink pointing out) raises ``RefusedError`` with reason
    ``PathTraversal``. Timeouts are in seconds.
    """

    def __init__(self, client: SandboxClient, name: str, namespace: str) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"Sandbox({self.namespace}/{self.name})"

    async def info(self) -> SandboxInfo:
        """The Sandbox's current spec and status.

        Raises:
            NotFoundError: it does not exist.
        """
        return await self.client.get_sandbox(self.name, self.namespace)

    async def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> SandboxInfo:
        """Watch until the Sandbox is Active with ``Ready=True``; return its info.

        Raises:
            WaitTimeoutError: not ready within ``timeout`` seconds.
            RefusedError / OperationFailedError: it went Errored (the Degraded condition's
                reason and message, e.g. ``SandboxCreationFailed``), or is already finished.
            NotFoundError: it was deleted while waiting.
        """
        return await self.client.wait(
            SANDBOX_PLURAL,
            _logic.sandbox_ready(self.name),
            timeout,
            f"sandbox {self.name} ready",
            namespace=self.namespace,
            name=self.name,
            describe=lambda objs: _logic.describe_sandboxes(objs, [self.name]),
        )

    # -- files ------------------------------------------------------------------------------

    async def _files(self) -> tuple[file_operations.AsyncFileOperations, SandboxInfo]:
        info = await self.info()
        return await self.client.files_for(info), info

    async def read_bytes(self, path: str) -> bytes:
        """The content of ``path`` (bytes).

        Raises:
            RefusedError: ``PathTraversal``, ``NoFileOperations``.
            NotFoundError: no such file.
        """
        files, info = await self._files()
        return await files.read_file(info, path)

    async def read_file(self, path: str, encoding: str = "utf-8") -> str:
        """The content of ``path`` decoded with ``encoding`` (errors as :meth:`read_bytes`)."""
        data = await self.read_bytes(path)
        return data.decode(encoding)

    async def write_file(self, path: str, content: str | bytes, encoding: str = "utf-8") -> None:
        """Create or replace ``path`` in the sandbox (never the original).

        Raises:
            RefusedError: ``PathTraversal``; ``InvalidState`` when the sandbox is not Active.
        """
        data = content.encode(encoding) if isinstance(content, str) else content
        files, info = await self._files()
        await files.write_file(info, path, data)

    async def list_files(self, path: str = "") -> list[str]:
        """Resource-relative paths of the files below ``path`` (recursive, sorted)."""
        files, info = await self._files()
        return await files.list_files(info, path)

    async def diff(self) -> str:
        """Unified diff (git format) of the sandbox against its original; ``""`` when equal."""
        files, info = await self._files()
        return await files.diff(info)

    # -- the actor's door: commands, files, search, SQL, audit (docs/actor.md) ---------------

    async def _actor(self) -> tuple[AsyncActorOperations, SandboxInfo]:
        info = await self.info()
        return self.client.actor_for(info), info

    async def exec(
        self,
        command: Command,
        *,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        stdin: bytes | str = b"",
        timeout: float | None = None,
        max_output_bytes: int | None = None,
        network: bool | None = None,
    ) -> ExecResult:
        """Run ``command`` in the sandbox's jail and wait for its end.

        Args:
            command: an argv (``["pytest", "-q"]``) or a shell line (``"make && make test"``).
            cwd: relative to the sandbox's root. env: added to the jail's own (``PATH``,
                ``HOME=/tmp``, ``LANG``); never the caller's. stdin: written, then closed.
            timeout: seconds (default 600); past it the command is killed (``timed_out``).
            max_output_bytes: kept per stream (default 16 MiB; ``truncated`` beyond).
            network: share the network (default the jail's).

        Returns:
            ``ExecResult``: ``exit_code``, ``stdout``, ``stderr``, ``truncated``,
            ``timed_out``, ``duration_seconds``, ... A non-zero exit is a result, not an error.

        Raises:
            RefusedError: ``PathTraversal`` (cwd), ``ExecRefused`` (no working tree:
                ``transaction_rollback``), ``InvalidState`` (committed).
            ConflictError: ``ExecLimit``, the sandbox already runs its limit of commands.
            OperationFailedError: ``JailUnavailable`` (no bubblewrap), ``StreamCut``.
        """
        actor, info = await self._actor()
        options = _exec_options(cwd, env, stdin, timeout, max_output_bytes, network)
        return await actor.exec(info, command, **options)

    async def exec_stream(
        self,
        command: Command,
        *,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        stdin: bytes | str = b"",
        timeout: float | None = None,
        max_output_bytes: int | None = None,
        network: bool | None = None,
    ) -> AsyncChunks:
        """:meth:`exec`, yielding the command's chunks as it writes them: ``started``
        (``exec_id``, for :meth:`signal`), ``stdout``/``stderr`` (``data``), then ``exit``
        (``result``, without the output). Leaving the loop early kills the command."""
        actor, info = await self._actor()
        options = _exec_options(cwd, env, stdin, timeout, max_output_bytes, network)
        async with aclosing(actor.exec_stream(info, command, **options)) as chunks:
            async for chunk in chunks:
                yield chunk
                if chunk.kind == "exit":
                    break

    async def signal(self, exec_id: str, signal: str | int = "SIGTERM") -> bool:
        """Signal a running command (``SIGTERM``, ``SIGINT``, ``SIGHUP``, ``SIGQUIT``,
        ``SIGUSR1``, ``SIGUSR2``; ``SIGKILL`` cancels it). Raises: ``NotFoundError``."""
        actor, info = await self._actor()
        return await actor.signal(info, exec_id, signal)

    async def audit(self, after: int = 0, limit: int = 100) -> AuditPage:
        """A page of the sandbox's audit log: every command, write, edit, move, delete and
        SQL statement (never a content or a value); ``next`` continues."""
        actor, info = await self._actor()
        return await actor.audit(info, after, limit)

    async def read_range(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes of ``path`` from ``offset`` (``length`` at most; to the end by default).

        Raises:
            RefusedError: ``PathTraversal``; ``InvalidOperation`` (not a regular file).
            NotFoundError: no such file.
        """
        actor, info = await self._actor()
        return await actor.read_bytes(info, path, offset, length)

    async def write(self, path: str, data: bytes | str) -> FileChange:
        """Create or replace ``path`` (``str`` as UTF-8; parents made); ``size`` written."""
        actor, info = await self._actor()
        return await actor.write(info, path, data)

    async def append(self, path: str, data: bytes | str) -> FileChange:
        """Append ``data`` to ``path`` (created when missing)."""
        actor, info = await self._actor()
        return await actor.write(info, path, data, append=True)

    async def delete_path(self, path: str, *, recursive: bool = False) -> FileChange:
        """Delete a file or link, or a directory (empty, or with ``recursive``).

        Raises:
            NotFoundError: no such path. RefusedError: ``InvalidOperation`` (a directory not
                empty), ``PathTraversal``.
        """
        actor, info = await self._actor()
        return await actor.delete(info, path, recursive=recursive)

    async def move(self, path: str, to: str, *, overwrite: bool = False) -> FileChange:
        """Move ``path`` to ``to``; refused (``InvalidOperation``) when ``to`` exists unless
        ``overwrite``."""
        actor, info = await self._actor()
        return await actor.move(info, path, to, overwrite=overwrite)

    async def mkdir(self, path: str, *, parents: bool = True, exist_ok: bool = True) -> FileChange:
        """Make the directory ``path`` (``created`` False when it was there)."""
        actor, info = await self._actor()
        return await actor.mkdir(info, path, parents=parents, exist_ok=exist_ok)

    async def stat(self, path: str) -> FileStat:
        """``type`` (file, dir, symlink, special), ``size``, ``mode``, ``mtime`` of ``path``,
        never following a link. Raises: ``NotFoundError``."""
        actor, info = await self._actor()
        return await actor.stat(info, path)

    async def edit(self, path: str, old: str, new: str, *, replace_all: bool = False) -> EditResult:
        """Replace the exact text ``old`` by ``new`` in the UTF-8 file ``path``.

        Raises:
            RefusedError: ``InvalidOperation`` when ``old`` is empty, absent, or occurs more
                than once without ``replace_all`` (nothing is written).
            NotFoundError: no such file.
        """
        actor, info = await self._actor()
        return await actor.edit(info, path, old, new, replace_all=replace_all)

    async def grep(
        self,
        pattern: str,
        *,
        path: str = ".",
        glob: str | None = None,
        ignore_case: bool = False,
        max_matches: int = 100,
        cursor: str | None = None,
    ) -> GrepResult:
        """Lines matching the Python regular expression ``pattern`` below ``path`` (only files
        matching ``glob``); at most ``max_matches``, then ``next_cursor`` continues."""
        actor, info = await self._actor()
        return await actor.grep(
            info, pattern, path=path, glob=glob, ignore_case=ignore_case,
            max_matches=max_matches, cursor=cursor,
        )  # fmt: skip

    async def glob(
        self, pattern: str, *, path: str = ".", max_results: int = 1000, cursor: str | None = None
    ) -> GlobResult:
        """Paths below ``path`` matching the shell pattern (``*``, ``?``, ``**``, ``[...]``);
        at most ``max_results``, then ``next_cursor`` continues."""
        actor, info = await self._actor()
        return await actor.glob(info, pattern, path=path, max_results=max_results, cursor=cursor)

    async def upload(self, files: Uploads) -> list[FileResult]:
        """Write several files (``{path: content}`` or pairs): one result per file; a refused
        one (``ok`` False, ``error``) does not stop the others."""
        actor, info = await self._actor()
        return await actor.upload(info, files)

    async def download(self, paths: Sequence[str]) -> list[FileResult]:
        """Read several files: one result per path, with its ``data`` or its ``error``."""
        actor, info = await self._actor()
        return await actor.download(info, paths)

    async def sql(
        self, statement: str, params: Any = None, *, max_rows: int = DEFAULT_MAX_ROWS
    ) -> SqlResult:
        """Run one statement in the sandbox's transaction (``transaction_rollback`` only).

        ``params``: a list (``?``/``%s``) or a mapping (``:name``/``%(name)s``); bytes as
        ``{"$bytes": base64}``. Returns ``columns``, ``rows`` (at most ``max_rows``, then
        ``truncated``), ``rowcount``, ``last_id``.

        Raises:
            RefusedError: ``InvalidState`` (another strategy, or committed); ``Invalid`` or
                ``InvalidOperation`` (the database refused the statement).
        """
        actor, info = await self._actor()
        return await actor.sql(info, statement, params, max_rows=max_rows)

    async def sql_many(
        self, statement: str, param_sets: Sequence[Any], *, max_rows: int = DEFAULT_MAX_ROWS
    ) -> SqlResult:
        """:meth:`sql` once per parameter set, in one call (``rowcount`` in all)."""
        actor, info = await self._actor()
        return await actor.sql_many(info, statement, param_sets, max_rows=max_rows)

    # -- checkpoints, restore, rollback -------------------------------------------------------

    async def checkpoint(
        self,
        phase: str = "manual",
        metadata: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        timeout: float = DEFAULT_OPERATION_TIMEOUT,
    ) -> CheckpointInfo:
        """Create a Checkpoint of this sandbox and watch until it is Ready (seed 004).

        ``phase``: lowercase snake_case label (``^[a-z][a-z0-9_]*$``). ``name``: default
        ``<sandbox>-<random>``.

        Raises:
            RefusedError: ``Invalid`` (bad phase); ``ConflictError``: ``name`` exists.
            OperationFailedError: the snapshot failed (the Ready condition's reason).
            WaitTimeoutError: not Ready within ``timeout`` seconds.
        """
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

    async def fork(
        self,
        checkpoint: str | CheckpointInfo,
        *,
        name: str,
        resource_id: str | None = None,
    ) -> Sandbox:
        """A new Sandbox of the same plan that starts from ``checkpoint`` of this one: its
        strategy, original and options, with this sandbox's change up to the checkpoint as its
        own (docs/forks.md). Does not wait: see :meth:`wait_ready`. The fork keeps working
        when this sandbox is deleted.

        Args:
            checkpoint: a Ready Checkpoint of this sandbox (its name or :class:`CheckpointInfo`).
            name: the fork's object name.
            resource_id: its ``spec.resourceId`` (default ``name``: siblings of one plan need
                distinct resource ids).

        Raises:
            RefusedError: ``Invalid`` (a strategy that cannot fork: transaction_rollback,
                none); ``ConflictError``: ``name`` exists.
        """
        parent = await self.info()
        wanted = checkpoint if isinstance(checkpoint, str) else checkpoint.name
        body = _logic.fork_manifest(parent, name, wanted, resource_id)
        await self.client.create_object(SANDBOX_PLURAL, body, self.namespace)
        return Sandbox(self.client, name, self.namespace)

    async def checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints of this sandbox, oldest first."""
        return await self.client.list_checkpoints(self.namespace, self.name)

    async def restore(
        self, checkpoint: str | CheckpointInfo, *, timeout: float = DEFAULT_OPERATION_TIMEOUT
    ) -> SandboxInfo:
        """Put the sandbox back to ``checkpoint`` (a name or a :class:`CheckpointInfo`).

        Raises:
            NotFoundError: the sandbox does not exist.
            OperationFailedError / RefusedError: the Restored condition's reason (e.g. the
                checkpoint belongs to another sandbox: ``InvalidSpec``).
            WaitTimeoutError: not served within ``timeout`` seconds.
        """
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
        """Discard every change made in this sandbox; it stays Active for more work.

        Raises:
            RefusedError: ``InvalidState`` (e.g. already committed).
            OperationFailedError: the RollbackRequested condition's reason.
            WaitTimeoutError: not served within ``timeout`` seconds.
        """
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
        """Commits, rollbacks, checkpoints and restores of this sandbox, newest first."""
        return await self.client.history(self.name, self.namespace)

    async def delete(
        self, *, wait: bool = True, timeout: float = DEFAULT_OPERATION_TIMEOUT
    ) -> None:
        """Delete the Sandbox; with ``wait`` watch until the operator's finalizer removed its
        artefacts (worktree, copy, layers) and the object is gone. The original is untouched."""
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
    """The Sandboxes of one plan in one namespace, committed or rolled back together.

    A context manager (``async with``): on exit the plan's Sandboxes (with their Checkpoints
    and PlanCommits) are deleted and cleaned up, unless ``keep`` is true.

    Args:
        client: the :class:`SandboxClient`.
        plan_id: ``spec.planId`` of the plan's Sandboxes (1-253 characters).
        namespace: default the client's namespace.
        keep: keep the Sandboxes when the ``async with`` block ends.
    """

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
        """Create a Sandbox of this plan for ``resource_id`` (does not wait: see
        :meth:`wait_ready`).

        Args:
            resource_id: the resource's id inside the plan.
            strategy: ``git_worktree``, ``copy_on_write``, ``overlay``,
                ``transaction_rollback`` or ``none``.
            source: a path the operator can reach (local executor: ``nodePath``), a
                ``SandboxSource`` or a CRD-shaped mapping (``{"persistentVolumeClaim": ...}``).
            workspace: ``spec.workspace`` (pod executor's Pod shape; needs a CRD that has it).
            options: ``spec.options`` (``{"overlayMode": "fallback"}``).
            name: the object's name; default ``<plan>-<resource>`` as a DNS label.

        Raises:
            RefusedError: ``InvalidSpec`` (the operator's model refused it) or ``Invalid``
                (the API server's schema or CEL rules did).
            ConflictError: ``AlreadyExists``.
        """
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
        """Handles on every Sandbox of the plan (``spec.planId``), by name."""
        found = await self.client.list_sandboxes(self.namespace, self.plan_id)
        return [Sandbox(self.client, s.name, self.namespace) for s in found]

    async def sandbox(self, resource_id: str) -> Sandbox:
        """The plan's Sandbox for ``resource_id``.

        Raises:
            NotFoundError: the plan has none.
        """
        for info in await self.client.list_sandboxes(self.namespace, self.plan_id):
            if info.spec.resource_id == resource_id:
                return Sandbox(self.client, info.name, self.namespace)
        raise NotFoundError(
            "NotFound", f"plan {self.plan_id} has no sandbox for resource {resource_id}"
        )

    async def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> list[SandboxInfo]:
        """Watch until every Sandbox of the plan is Active with ``Ready=True``.

        Raises:
            WaitTimeoutError: not all ready within ``timeout`` seconds (the message names the
                phase and last failure of each).
            RefusedError / OperationFailedError: one went Errored (its Degraded reason).
            NotFoundError: the plan has no Sandboxes.
        """
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
        sandboxes: Sequence[str] | None = None,
        checks: Sequence[Mapping[str, Any]] | None = None,
    ) -> PlanCommitResult:
        body = _logic.plancommit_manifest(
            self.plan_id, action, message, mode=mode, sandboxes=sandboxes, checks=checks
        )
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
        sandboxes: Sequence[str] | None = None,
        checks: Sequence[Mapping[str, Any]] | None = None,
    ) -> PlanCommitResult:
        """Commit every Sandbox of the plan, all or nothing (a PlanCommit; seed 002, "Atomic
        Commit"); or only the Sandboxes ``sandboxes`` names, discarding the others once they
        landed (``discarded_sandboxes``), after ``checks`` passed (docs/forks.md; a failed
        check ends it ``Failed``, reason ``ValidationFailed``, nothing touched, ``validation``
        has each result).

        A failed commit is a *result*, not an exception: ``committed`` is False and
        ``rolled_back_ids`` / ``failed_rollback_ids`` name the compensated sandboxes; the
        ``Committed`` condition has the reason (``Conflict``, ``SandboxCommitFailed``) and the
        message. With ``wait=False`` the just-created PlanCommit is returned (``done`` False).
        ``on_progress`` is called with every observed state while waiting. ``mode``:
        ``"TwoPhase"`` (the operator's default: a failure touches no original, so
        ``rolled_back_ids`` stays empty) or ``"Saga"`` (landed sandboxes are compensated).

        Raises:
            WaitTimeoutError: not finished within ``timeout`` seconds.
        """
        return await self._plancommit(
            PlanCommitAction.COMMIT, message, wait, timeout, on_progress, mode, sandboxes, checks
        )

    async def rollback(
        self,
        *,
        wait: bool = True,
        timeout: float = DEFAULT_COMMIT_TIMEOUT,
        on_progress: ProgressCallback | None = None,
    ) -> PlanCommitResult:
        """Discard the changes of every Sandbox of the plan (a PlanCommit with action
        Rollback); the result as in :meth:`commit`."""
        return await self._plancommit(PlanCommitAction.ROLLBACK, None, wait, timeout, on_progress)

    async def validate(
        self,
        checks: Sequence[Mapping[str, Any]],
        *,
        sandboxes: Sequence[str] | None = None,
        message: str | None = None,
        timeout: float = DEFAULT_COMMIT_TIMEOUT,
    ) -> list[dict[str, Any]]:
        """Run pre-commit ``checks`` (``{"name", "sandbox", "command": [...],
        "timeoutSeconds"}``) in the plan's Sandboxes through the actor's door, before anything
        is prepared (docs/forks.md): a PlanCommit with ``approval: Required``, ``checks`` and
        ``sandboxes`` (the ones it will commit; the others are discarded once they landed).

        When every check passed the PlanCommit waits for its approval with a review that
        shows the results and binds them in its digest (:meth:`review` returns it,
        :meth:`approve` commits). When one failed it ends ``Failed`` (reason
        ``ValidationFailed``) with no original touched.

        Returns:
            Each check's result: ``name``, ``sandbox``, ``command``, ``exitCode``, ``timedOut``,
            ``passed``, ``outputTail`` (the last lines, secrets masked).

        Raises:
            RefusedError: ``InvalidSpec`` / ``Invalid``: a malformed check.
            WaitTimeoutError: the checks did not finish within ``timeout`` seconds.
        """
        creator = await self.client.whoami()
        body = _logic.plancommit_manifest(
            self.plan_id,
            PlanCommitAction.COMMIT,
            message,
            approval_required=True,
            created_by=creator.user,
            sandboxes=sandboxes,
            checks=checks,
        )
        created = await self.client.create_object(PLANCOMMIT_PLURAL, body, self.namespace)
        name = str(created["metadata"]["name"])
        return await self.client.wait(
            PLANCOMMIT_PLURAL,
            _logic.plancommit_validated(name),
            timeout,
            f"checks of plan {self.plan_id} ({name})",
            namespace=self.namespace,
            name=name,
        )

    async def review(
        self, *, message: str | None = None, timeout: float = DEFAULT_COMMIT_TIMEOUT
    ) -> PlanReview:
        """The review of the plan's changes: per sandbox the files added,
        changed and deleted, lines, bytes, statements and conflicts, and the plan ``digest``.

        The review is made by a PlanCommit with ``approval: Required`` that then waits at
        ``AwaitingApproval``: the one already waiting for this plan, else a new one (with
        ``message``, naming this client's user as its creator, who then cannot approve it).
        Nothing is applied before enough people approve the digest (:meth:`approve`).

        Raises:
            WaitTimeoutError: no review within ``timeout`` seconds.
            OperationFailedError / RefusedError: the PlanCommit ended without a review (the
                ``Reviewed`` condition's reason, e.g. ``ReviewFailed``).
        """
        found = await self.client.list_objects(PLANCOMMIT_PLURAL, self.namespace)
        waiting = _logic.awaiting_approval(self.plan_id, {o["metadata"]["name"]: o for o in found})
        if waiting is None:
            creator = await self.client.whoami()
            body = _logic.plancommit_manifest(
                self.plan_id,
                PlanCommitAction.COMMIT,
                message,
                approval_required=True,
                created_by=creator.user,
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
        comment: str | None = None,
    ) -> PlanCommitResult:
        """Approve the reviewed plan as this client's own identity: an entry appended to
        ``spec.approvals`` of the PlanCommit waiting for it, with the user, uid and groups the
        API server authenticates (:meth:`SandboxClient.decide`; docs/approvals.md). Once
        enough distinct people approved, the PlanCommit commits exactly the reviewed changes
        (a sandbox changed since fails the commit with ``ChangedSinceApproval``).

        Args:
            digest: the :attr:`PlanReview.digest` a person approved (``"sha256:<64 hex>"``).
            wait: watch until the PlanCommit finished, or until the operator recorded this
                approval while more are needed (else return it as it is now).

        Returns:
            The commit's result, as :meth:`commit` returns it (``done`` False while more
            approvals are needed).

        Raises:
            NotFoundError: no PlanCommit of the plan waits for an approval (call :meth:`review`).
            RefusedError: ``DigestMismatch`` (not the reviewed digest), ``Invalid`` (not
                ``sha256:`` + 64 hex), ``AlreadyDecided``, or the admission policy's refusal
                (the creator, an engine's or the operator's identity cannot approve).
            WaitTimeoutError: not finished within ``timeout`` seconds.
        """
        return await self._decide(digest, "Approve", comment, wait, timeout, on_progress)

    async def reject(
        self,
        digest: str,
        *,
        comment: str | None = None,
        wait: bool = True,
        timeout: float = DEFAULT_COMMIT_TIMEOUT,
    ) -> PlanCommitResult:
        """Reject the reviewed plan as this client's own identity (``comment`` is shown with
        the rejection); a counted rejection ends the PlanCommit ``Failed`` with nothing
        touched. Errors as :meth:`approve`."""
        return await self._decide(digest, "Reject", comment, wait, timeout, None)

    async def _decide(
        self,
        digest: str,
        decision: str,
        comment: str | None,
        wait: bool,
        timeout: float,
        on_progress: ProgressCallback | None,
    ) -> PlanCommitResult:
        found = await self.client.list_objects(PLANCOMMIT_PLURAL, self.namespace)
        name = _logic.approval_target(self.plan_id, found)
        stored = await self.client.decide(
            name, digest, decision, comment=comment, namespace=self.namespace
        )
        if not wait:
            return PlanCommitResult.from_object(stored)
        user = str(stored["spec"]["approvals"][-1]["user"])
        check = _logic.decision_seen(name, user, digest)
        if on_progress is not None:
            progress = on_progress
            seen = check

            def check(objects: _logic.Objects) -> PlanCommitResult | None:
                if name in objects:
                    progress(PlanCommitResult.from_object(objects[name]))
                return seen(objects)

        return await self.client.wait(
            PLANCOMMIT_PLURAL,
            check,
            timeout,
            f"{decision.lower()} of plancommit {name} of plan {self.plan_id}",
            namespace=self.namespace,
            name=name,
        )

    async def pending(self) -> list[PlanReview]:
        """The plan's PlanCommits waiting for approvals (see
        :meth:`SandboxClient.pending_approvals`)."""
        return await self.client.pending_approvals(self.namespace, self.plan_id)

    async def commits(self) -> list[PlanCommitResult]:
        """The plan's PlanCommits (commits and rollbacks), by name."""
        return await self.client.list_plancommits(self.namespace, self.plan_id)

    async def delete(
        self, cleanup: bool = True, *, timeout: float = DEFAULT_OPERATION_TIMEOUT
    ) -> None:
        """Delete the plan's Sandboxes, their Checkpoints and the plan's PlanCommits.

        With ``cleanup`` watch until the operator's finalizers removed every sandbox artefact
        (worktrees, branches, copies, layers) and the Sandboxes are gone; the originals are
        never touched. Without it, return once the deletions are accepted.

        Raises:
            WaitTimeoutError: the Sandboxes were not gone within ``timeout`` seconds.
        """
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
