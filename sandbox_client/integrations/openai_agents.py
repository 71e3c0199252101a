"""An OpenAI Agents SDK sandbox client over this product's sandboxes.

Install the ``openai-agents`` extra. Plug it into a ``SandboxAgent`` run in five lines::

    from agents import Runner, RunConfig
    from agents.run_config import SandboxRunConfig
    from sandbox_core.actor.actions import LocalActions
    from sandbox_client.integrations.openai_agents import (
        OperatorSandboxClient, OperatorSandboxClientOptions)

    client = OperatorSandboxClient(lambda sandbox_id: LocalActions(state_dir, sandbox_id))
    sandbox = SandboxRunConfig(client=client, options=OperatorSandboxClientOptions(sandbox_id))
    result = await Runner.run(agent, task, run_config=RunConfig(sandbox=sandbox))

The SDK's sandbox contract (``agents.sandbox``: ``BaseSandboxClient``, ``BaseSandboxSession``,
``SandboxSessionState``; the SDK's own ``unix_local`` backend is the model) is met on top of
:class:`~sandbox_client.integrations.actions.SandboxActions`: commands (``exec``, and the
SDK's ``ls``, ``mkdir``, ``rm``, ``mv`` and ``same_file``, which the base session runs as
commands) go through :meth:`SandboxActions.run` as one shell-quoted line, in the sandbox's jail
with its root as working directory; ``read`` and ``write`` go through ``download`` and
``upload``. The manifest's root is the sandbox's root (:attr:`SandboxActions.root`), so the
SDK's path policy and the door both refuse paths outside it. Every write lands in the sandbox,
shows in its diff and review, and reaches the original only through the plan's commit.

What differs from a throwaway backend:

- The sandbox is made and removed by the product (the ``sandbox-core`` CLI, the operator), not
  by this client: :meth:`OperatorSandboxClient.create` attaches to an existing sandbox named by
  :class:`OperatorSandboxClientOptions`, and ``delete`` leaves it in place for review and
  commit.
- The sandbox is durable, so sessions take no SDK snapshot (a given snapshot spec, including the
  Runner's default local one, is replaced by ``NoopSnapshot``), and ``resume`` reattaches by the
  sandbox id in the serialized state. :meth:`OperatorSandboxSession.persist_workspace` returns a
  tar of the root (without ``.git``) through one command; ``hydrate_workspace`` extracts such a
  tar over the root through the door (uploads and commands, checked first by the SDK's tar
  policy), so its files land in the sandbox like any other write.
- Exposed ports, manifest users and groups, ``run_as`` (``user=``; commands run as the jail's
  one user) and PTY sessions are refused with a clear error.
- A command's stdout and stderr come back joined, in ``ExecResult.stdout``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import shlex
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.materialization import MaterializationResult
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.snapshot import NoopSnapshot, SnapshotBase, SnapshotSpec
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.tar_utils import (
    UnsafeTarMemberError,
    safe_tar_member_rel_path,
    validate_tarfile,
)

from sandbox_client.integrations.actions import SandboxActions

__all__ = [
    "OperatorSandboxClient",
    "OperatorSandboxClientOptions",
    "OperatorSandboxSession",
    "OperatorSandboxSessionState",
]

BACKEND_ID = "sandbox_operator"
_DEFAULT_MANIFEST_ROOT = str(Manifest.model_fields["root"].default)

Connect = Callable[[str], SandboxActions]
"""Sandbox id -> its door; may raise when there is no such sandbox (or it is not open)."""


class OperatorSandboxClientOptions(BaseSandboxClientOptions):
    """Which sandbox a new session attaches to (JSON round-trips; no secrets).

    Args:
        sandbox_id: the product's sandbox id (``sandbox-core sandbox create``'s, a ``Sandbox``
            resource's ``status.sandboxId``).
        default_timeout_seconds: how long a command may run when the SDK gives no timeout.
    """

    type: Literal["sandbox_operator"] = "sandbox_operator"
    sandbox_id: str
    default_timeout_seconds: float = 600.0


class OperatorSandboxSessionState(SandboxSessionState):
    """The SDK's session state plus the sandbox it is attached to (``resume`` reattaches)."""

    type: Literal["sandbox_operator"] = "sandbox_operator"
    sandbox_id: str
    default_timeout_seconds: float = 600.0


class OperatorSandboxSession(BaseSandboxSession):
    """One SDK session over one sandbox of this product (module docstring).

    Args:
        state: the session's state (its manifest's root is the sandbox's root).
        actions: the sandbox's door.
        preserved: the session reattaches to a sandbox an earlier session used (``resume``),
            so the SDK reuses its workspace instead of applying the manifest again.
    """

    state: OperatorSandboxSessionState

    def __init__(
        self,
        *,
        state: OperatorSandboxSessionState,
        actions: SandboxActions,
        preserved: bool = False,
    ) -> None:
        if state.manifest.root != actions.root:
            raise ValueError(
                f"the manifest's root {state.manifest.root!r} is not the sandbox's root "
                f"{actions.root!r}; leave the manifest's root at its default"
            )
        self.state = state
        self.actions = actions
        self._running = False
        self._set_start_state_preserved(preserved)

    # Lifecycle -------------------------------------------------------------------------------

    async def _after_start(self) -> None:
        self._running = True

    async def _after_start_failed(self) -> None:
        self._running = False

    async def _after_shutdown(self) -> None:
        # The sandbox stays: the product reviews, commits or discards it.
        self._running = False

    async def running(self) -> bool:
        """Whether this session was started and not shut down (the sandbox itself outlives it)."""
        return self._running

    async def _apply_manifest(
        self, *, only_ephemeral: bool = False, provision_accounts: bool = True
    ) -> MaterializationResult:
        _refuse_accounts(self.state.manifest)
        return await super()._apply_manifest(
            only_ephemeral=only_ephemeral, provision_accounts=provision_accounts
        )

    async def provision_manifest_accounts(self) -> None:
        _refuse_accounts(self.state.manifest)

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        raise ExposedPortUnavailableError(
            port=port,
            exposed_ports=self.state.exposed_ports,
            reason="backend_unavailable",
            context={"backend": BACKEND_ID, "detail": "sandboxes expose no ports"},
        )

    # Commands ---------------------------------------------------------------------------------

    def _prepare_exec_command(
        self, *command: str | Path, shell: bool | list[str], user: str | User | None
    ) -> list[str]:
        _refuse_user(user)
        prepared: list[str] = super()._prepare_exec_command(*command, shell=shell, user=None)
        return prepared

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        """Run ``command`` (an argv, shell-quoted into one line) in the sandbox's jail.

        Raises:
            ExecTimeoutError: the command ran past ``timeout`` seconds and was killed.
        """
        line = shlex.join(str(part) for part in command)
        seconds = self.state.default_timeout_seconds if timeout is None else timeout
        outcome = await asyncio.to_thread(self.actions.run, line, seconds)
        if outcome.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=seconds)
        output = outcome.output
        if outcome.truncated:
            output += "\n[output truncated]"
        return ExecResult(stdout=output.encode("utf-8"), stderr=b"", exit_code=outcome.exit_code)

    # Files ------------------------------------------------------------------------------------

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        """The file's bytes, downloaded through the door.

        Raises:
            WorkspaceReadNotFoundError: no such file.
            WorkspaceArchiveReadError: any other failure (a directory, a path outside the root).
        """
        _refuse_user(user)
        target = self.normalize_path(path)
        [outcome] = await asyncio.to_thread(self.actions.download, [target.as_posix()])
        if outcome.error == "file_not_found":
            raise WorkspaceReadNotFoundError(path=target)
        if outcome.error is not None or outcome.content is None:
            raise WorkspaceArchiveReadError(path=target, context={"reason": outcome.error})
        return io.BytesIO(outcome.content)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        """Write ``data``'s bytes to ``path`` through the door (parents are created).

        Raises:
            WorkspaceArchiveWriteError: the door refused (a path outside the root, ``.git``).
        """
        _refuse_user(user)
        payload = coerce_write_payload(path=path, data=data)
        target = self.normalize_path(path, for_write=True)
        content = payload.stream.read()
        body = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        [outcome] = await asyncio.to_thread(self.actions.upload, [(target.as_posix(), body)])
        if outcome.error is not None:
            raise WorkspaceArchiveWriteError(path=target, context={"reason": outcome.error})

    async def persist_workspace(self) -> io.IOBase:
        """A tar of the sandbox's root (members relative to it; ``.git`` and the paths the SDK
        registered to skip left out).

        Raises:
            WorkspaceArchiveReadError: tar failed, or its output passed the door's cap.
        """
        root = Path(self.actions.root)
        skipped = sorted(p.as_posix() for p in self._persist_workspace_skip_relpaths())
        excludes = [f"--exclude=./{rel}" for rel in [".git", *skipped]]
        line = shlex.join(["tar", "-cf", "-", *excludes, "."]) + " | base64 -w0"
        outcome = await asyncio.to_thread(self.actions.run, line, None)
        if outcome.exit_code != 0 or outcome.truncated or outcome.timed_out:
            raise WorkspaceArchiveReadError(
                path=root,
                context={
                    "reason": "archive_failed",
                    "exit_code": outcome.exit_code,
                    "truncated": outcome.truncated,
                    "timed_out": outcome.timed_out,
                },
            )
        try:
            return io.BytesIO(base64.b64decode(outcome.output, validate=True))
        except binascii.Error as error:
            raise WorkspaceArchiveReadError(path=root, cause=error) from error

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Extract a tar (as :meth:`persist_workspace` gives) over the sandbox's root, through
        the door: directories by ``mkdir -p``, regular files by one batch upload (an owner's
        execute bit kept by ``chmod``), symlinks by ``ln -s`` after them, as the SDK's
        ``unix_local`` backend does. Files already there and not in the tar stay; every write
        lands in the sandbox, its diff and its audit, never in the original.

        The tar is checked whole first with the SDK's own policy (``validate_tarfile``):
        absolute or ``..`` members, hardlinks, devices and FIFOs, members under a symlink of the
        tar, symlinks whose target leaves the root, and members under ``.git`` are refused, and
        nothing is written.

        Raises:
            WorkspaceArchiveWriteError: the stream is not a tar, a member is refused (context
                ``reason`` and ``member``), or the door refused a write or a command failed.
        """
        root = Path(self.actions.root)
        try:
            plan = await asyncio.to_thread(_hydration_plan, data)
        except UnsafeTarMemberError as error:
            raise WorkspaceArchiveWriteError(
                path=root, context={"reason": error.reason, "member": error.member}, cause=error
            ) from error
        except (tarfile.TarError, OSError, TypeError) as error:
            raise WorkspaceArchiveWriteError(
                path=root, context={"reason": "invalid_tar"}, cause=error
            ) from error
        if plan.directories:
            await self._hydrate_command(
                root, shlex.join(["mkdir", "-p", "--", *(str(root / d) for d in plan.directories)])
            )
        if plan.files:
            uploads = [(str(root / rel), body) for rel, body in plan.files]
            outcomes = await asyncio.to_thread(self.actions.upload, uploads)
            refused = [o for o in outcomes if o.error is not None]
            if refused:
                raise WorkspaceArchiveWriteError(
                    path=root,
                    context={"reason": refused[0].error, "member": refused[0].path},
                )
        if plan.executables:
            await self._hydrate_command(
                root, shlex.join(["chmod", "u+x", "--", *(str(root / e) for e in plan.executables)])
            )
        for link, target in plan.symlinks:
            where = str(root / link)
            await self._hydrate_command(
                root,
                f"rm -f -- {shlex.quote(where)} && ln -s -- {shlex.quote(target)} "
                f"{shlex.quote(where)}",
            )

    async def _hydrate_command(self, root: Path, line: str) -> None:
        outcome = await asyncio.to_thread(self.actions.run, line, None)
        if outcome.exit_code != 0 or outcome.timed_out:
            raise WorkspaceArchiveWriteError(
                path=root,
                context={
                    "reason": "command_failed",
                    "exit_code": outcome.exit_code,
                    "output": outcome.output[-2000:],
                },
            )


@dataclass(frozen=True)
class _HydrationPlan:
    directories: list[str]
    files: list[tuple[str, bytes]]
    executables: list[str]
    symlinks: list[tuple[str, str]]


def _hydration_plan(data: io.IOBase) -> _HydrationPlan:
    """The tar's members by kind, relative to the root, after the SDK's safety check.

    Raises:
        UnsafeTarMemberError: a member the SDK's policy or ``.git`` refuses.
        tarfile.TarError: not a tar.
        TypeError: the stream gives neither bytes nor text.
    """
    raw = data.read()
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    if not isinstance(raw, bytes | bytearray):
        raise TypeError("a workspace archive is a byte stream")
    directories: list[str] = []
    files: list[tuple[str, bytes]] = []
    executables: list[str] = []
    symlinks: list[tuple[str, str]] = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
        validate_tarfile(tar, reject_rel_paths=[".git"], allow_external_symlink_targets=False)
        for member in tar.getmembers():
            rel = safe_tar_member_rel_path(member, allow_symlinks=True)
            if rel is None:
                continue
            name = rel.as_posix()
            if member.isdir():
                directories.append(name)
            elif member.issym():
                symlinks.append((name, member.linkname))
            else:
                payload = tar.extractfile(member)
                if payload is None:
                    raise UnsafeTarMemberError(member=member.name, reason="missing file payload")
                files.append((name, payload.read()))
                if member.mode & 0o100:
                    executables.append(name)
    return _HydrationPlan(directories, files, executables, symlinks)


class OperatorSandboxClient(BaseSandboxClient[OperatorSandboxClientOptions]):
    """Attach SDK sessions to sandboxes of this product.

    Args:
        connect: sandbox id -> its :class:`SandboxActions` (for sandboxes on local paths,
            ``lambda sandbox_id: LocalActions(state_dir, sandbox_id)``).
        instrumentation: the SDK's session instrumentation (events), if any.
    """

    backend_id = BACKEND_ID
    supports_default_options = False

    def __init__(self, connect: Connect, *, instrumentation: Instrumentation | None = None) -> None:
        self._connect = connect
        self._instrumentation = (
            instrumentation if instrumentation is not None else Instrumentation()
        )

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: OperatorSandboxClientOptions,
    ) -> SandboxSession:
        """A session on the sandbox ``options.sandbox_id`` (which must exist and be open).

        ``snapshot`` is not used (module docstring). A manifest root other than the SDK's
        default is refused unless it is the sandbox's root.

        Raises:
            TypeError: ``options`` is not :class:`OperatorSandboxClientOptions`.
            WorkspaceStartError: no such sandbox (or it is not open).
            ValueError: a manifest root that is not the sandbox's root; users or groups.
        """
        _ = snapshot
        if not isinstance(options, OperatorSandboxClientOptions):
            raise TypeError("OperatorSandboxClient.create expects OperatorSandboxClientOptions")
        actions = await self._attach(options.sandbox_id)
        manifest = manifest if manifest is not None else Manifest()
        _refuse_accounts(manifest)
        self._validate_manifest_for_create(manifest)
        if manifest.root == _DEFAULT_MANIFEST_ROOT:
            manifest = manifest.model_copy(update={"root": actions.root}, deep=True)
        state = OperatorSandboxSessionState(
            manifest=manifest,
            snapshot=NoopSnapshot(id=options.sandbox_id),
            sandbox_id=options.sandbox_id,
            default_timeout_seconds=options.default_timeout_seconds,
        )
        inner = OperatorSandboxSession(state=state, actions=actions)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Leave the sandbox in place: the product commits or discards it."""
        if not isinstance(session._inner, OperatorSandboxSession):
            raise TypeError("OperatorSandboxClient.delete expects an OperatorSandboxSession")
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """Reattach to the sandbox named in ``state``; its files are as the last session left
        them. The manifest's root follows the sandbox's root if that moved.

        Raises:
            TypeError: ``state`` is not :class:`OperatorSandboxSessionState`.
            WorkspaceStartError: the sandbox is gone (committed, discarded) or not open.
        """
        if not isinstance(state, OperatorSandboxSessionState):
            raise TypeError("OperatorSandboxClient.resume expects an OperatorSandboxSessionState")
        state.assert_path_grants_rebound()
        actions = await self._attach(state.sandbox_id)
        if state.manifest.root != actions.root:
            # The sandbox's root is where its files are now (the product may have moved it).
            state.manifest = state.manifest.model_copy(update={"root": actions.root}, deep=True)
        inner = OperatorSandboxSession(state=state, actions=actions, preserved=True)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, OperatorSandboxSessionState)

    async def _attach(self, sandbox_id: str) -> SandboxActions:
        try:
            return await asyncio.to_thread(self._connect, sandbox_id)
        except Exception as error:
            raise WorkspaceStartError(
                path=Path(sandbox_id),
                message=f"cannot attach to sandbox {sandbox_id!r}: {error}",
                cause=error,
            ) from error


def _refuse_accounts(manifest: Manifest) -> None:
    if manifest.users or manifest.groups:
        raise ValueError(
            "a sandbox of this product runs commands as one jailed user; the manifest may not "
            "declare users or groups"
        )


def _refuse_user(user: str | User | None) -> None:
    if user is not None:
        raise ValueError("a sandbox of this product runs as one jailed user; run_as is refused")
