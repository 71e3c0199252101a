"""The sandbox operations the workspace agent serves, synchronous and without HTTP.

:class:`Operations` does what one route of :mod:`sandbox_core.agent.server` asks, on the
sandboxes kept in one state directory, and returns the JSON-ready reply (the server runs it in
its one worker thread). :class:`AgentConfig` says where that state lives and how the server
listens.

- A DSN arrives as a reference, ``env:NAME`` (the kubelet filled ``NAME`` from the Sandbox's
  Secret through ``secretKeyRef``); every reply shows the reference, never the value.
- Every reply describing a sandbox has its ``revision`` (a counter of the agent's changes to
  it), which callers put into their request ids.

Two-phase plan commit (docs/two-phase-commit.md): ``prepare``, ``apply_prepared`` and
``abort_prepared`` are idempotent by transaction id in the core (``apply_prepared`` and
``abort_prepared`` may run again). A participant that cannot prepare durably (``prepares_durably``
false in every sandbox reply: SQLite holds its prepared writes in an open connection) is kept in
this process between ``prepare`` and ``apply-prepared``/``abort-prepared``; an agent restart in
between loses the prepare, as the last resource's contract allows (its ``apply`` is the decision,
recovery asks the status).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sandbox_core.actor.audit import AuditLog
from sandbox_core.actor.door import ActorDoor
from sandbox_core.actor.files import FileRange
from sandbox_core.actor.search import DEFAULT_MAX_MATCHES, DEFAULT_MAX_RESULTS
from sandbox_core.actor.sql import DEFAULT_MAX_ROWS
from sandbox_core.agent import bundle
from sandbox_core.agent.wire import (
    ALLOWED_ROOTS_ENV,
    BAD_REQUEST,
    BOOTSTRAP_TOKEN_FILE_ENV,
    CURSOR_QUERY,
    DEFAULT_PORT,
    ENV_REF,
    GLOB_QUERY,
    IGNORE_CASE_QUERY,
    MAX_QUERY,
    PATH_QUERY,
    PATTERN_QUERY,
    PORT_ENV,
    ROOT_ENV,
    SOURCE_DSN_ENV,
    STATE_DIR_ENV,
    TOKEN_FILE,
    TOKEN_FILE_ENV,
    TXID_PATTERN,
    AgentError,
)
from sandbox_core.describe import describe as describe_sandbox
from sandbox_core.describe import sandbox_diff
from sandbox_core.errors import (
    SandboxError,
    SandboxForkError,
    SandboxRollbackLockedError,
    SandboxStateError,
)
from sandbox_core.host.checkpoint import CheckpointManager
from sandbox_core.host.host import SandboxHost, is_half_made
from sandbox_core.host.store import SandboxStore
from sandbox_core.plan.original_lock import held_by_process, hold_prepared, release_prepared
from sandbox_core.redaction import is_dsn, same_database, secret_forms, url_scheme
from sandbox_core.redaction import secrets_of as dsn_secrets
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.factory import SandboxFactory

T = TypeVar("T")
REVISION_WIDTH = 20  # digits of a revision file, padded with blanks (int() ignores them)
RESTORABLE = (SandboxStatus.CREATED, SandboxStatus.ACTIVE, SandboxStatus.ROLLED_BACK)
# What a create request must name (the rest has defaults).
CREATE_FIELDS = ("plan_id", "resource_id", "original", "strategy")


@dataclass(frozen=True)
class AgentConfig:
    """Where the agent keeps its state and how it listens.

    ``secret_env``: names of environment variables whose values are secrets (DSNs); replies
    show ``env:NAME`` instead of the value.

    ``allowed_roots``: where a create may find an original (its real path equal to or beneath
    one of them); ``None`` when not configured (a local agent: any path but the forbidden
    areas of :meth:`Operations.admit_original`). ``()`` admits no path at all (a Sandbox whose
    original is a Secret's DSN).

    ``bootstrap_token_file``: a warm-pool Pod's bootstrap token (``wire.HANDOVER``); None for a
    Pod made for its Sandbox.
    """

    state_dir: Path
    sandbox_root: Path
    token_file: Path = Path(TOKEN_FILE)
    host: str = "0.0.0.0"  # noqa: S104 - the pod network; a NetworkPolicy admits only the operator
    port: int = DEFAULT_PORT
    secret_env: tuple[str, ...] = (SOURCE_DSN_ENV,)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    allowed_roots: tuple[Path, ...] | None = None
    bootstrap_token_file: Path | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> AgentConfig:
        """Read the variables named by ``wire.STATE_DIR_ENV``, ``ROOT_ENV``, ``TOKEN_FILE_ENV``
        ``PORT_ENV``, ``ALLOWED_ROOTS_ENV`` and ``BOOTSTRAP_TOKEN_FILE_ENV`` (defaults:
        ~/.local/state/sandbox-core, <state>/sandboxes, ``wire.TOKEN_FILE``,
        ``wire.DEFAULT_PORT``, not configured, none)."""
        env = dict(os.environ if environ is None else environ)
        state = Path(env.get(STATE_DIR_ENV) or Path.home() / ".local/state/sandbox-core")
        roots = env.get(ALLOWED_ROOTS_ENV)
        bootstrap = env.get(BOOTSTRAP_TOKEN_FILE_ENV)
        return cls(
            state_dir=state,
            sandbox_root=Path(env.get(ROOT_ENV) or state / "sandboxes"),
            token_file=Path(env.get(TOKEN_FILE_ENV) or TOKEN_FILE),
            port=int(env.get(PORT_ENV) or DEFAULT_PORT),
            environ=env,
            allowed_roots=(
                None
                if roots is None
                else tuple(Path(root) for root in roots.split(os.pathsep) if root)
            ),
            bootstrap_token_file=Path(bootstrap) if bootstrap else None,
        )


class Operations:
    """The sandbox operations, synchronous, on one state directory (run in the worker thread)."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.store = SandboxStore(str(config.state_dir))
        self.factory = SandboxFactory()
        self.checkpoints = CheckpointManager(state_dir=str(config.state_dir))
        self.host = SandboxHost(self.store, self.factory, reopen=self._reopen, save=self._save)
        # Prepared participants that cannot prepare durably, by (sandbox id, txid).
        self._held: dict[tuple[str, str], BaseSandbox] = {}
        # Sandboxes kept open between requests (the agent is their only writer: every change
        # goes through this object and is saved). A PostgreSQL sandbox holds its transaction
        # (and row locks) between statements: re-opening it per request would replay the log
        # into a second transaction behind the first one's back. For the others it spares a
        # re-open per call (a git worktree's costs tens of milliseconds).
        self._live: dict[str, BaseSandbox] = {}
        self._pairs: list[tuple[str, str]] = []
        self._pairs_of: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        # Revisions as last written by this process (the agent is their only writer); the
        # lock orders the worker's bumps with those of finished commands (their own threads).
        self._revisions: dict[str, int] = {}
        self._revision_lock = threading.Lock()

    # -- secrets ------------------------------------------------------------------------------

    def resolve(self, original: str) -> str:
        """``env:NAME`` -> the value of ``NAME``; anything else as is.

        Raises:
            AgentError: 422 when ``NAME`` is not set in the Pod, or its value is not a DSN
                (the message names the variable, never the value: it may be any key of a
                Secret, a private key or a token).
        """
        if not original.startswith(ENV_REF):
            return original
        name = original[len(ENV_REF) :]
        value = self.config.environ.get(name)
        if not value:
            raise AgentError(422, "MissingSecret", f"environment variable {name} is not set")
        if not is_dsn(value):
            raise AgentError(
                422,
                "NotADsn",
                f"the value of environment variable {name} (the Sandbox's secretRef) is not "
                "a DSN (postgresql://..., libpq key=value, or sqlite:///path)",
            )
        return value.strip()

    def admit_original(self, original: str) -> str:
        """The original a create may sandbox, resolved (``env:NAME`` -> its DSN).

        Admitted: ``env:NAME`` of a secret variable of this agent (``secret_env``); a path (or
        ``sqlite:///path``) whose real path (symlinks resolved) lies at or beneath one of
        ``allowed_roots``. Never: a path that is, lies in or holds the agent's state directory,
        its sandbox root or its token file, nor one under ``/proc``, ``/sys`` or ``/dev``; a
        relative path; a literal DSN when ``allowed_roots`` is configured (a DSN reaches the
        agent only as ``env:NAME``). The messages name the request's own text, never a real
        path the caller did not give.

        Raises:
            AgentError: 422 ``RefusedOriginal``; the errors of :meth:`resolve`.
        """
        if original.startswith(ENV_REF):
            if original[len(ENV_REF) :] not in self.config.secret_env:
                raise AgentError(422, "RefusedOriginal", f"{original} is not this agent's secret")
            return self.resolve(original)
        scheme = url_scheme(original)
        if (scheme is not None and scheme != "sqlite") or (
            scheme is None and is_dsn(original) and not original.startswith("/")
        ):
            if self.config.allowed_roots is not None:
                raise AgentError(
                    422, "RefusedOriginal", "a DSN reaches this agent only as env:NAME"
                )
            return original
        path = original
        if scheme == "sqlite":  # as the transaction strategy reads it: sqlite:///abs/path
            path = path.strip().split("://", 1)[1]
            path = "/" + path.lstrip("/") if path.startswith("/") else path
        if not path.startswith("/"):
            raise AgentError(422, "RefusedOriginal", f"the original {original!r} is not absolute")
        real = Path(os.path.realpath(path))
        own = [self.config.state_dir, self.config.sandbox_root, self.config.token_file]
        if self.config.bootstrap_token_file is not None:
            own.append(self.config.bootstrap_token_file)
        forbidden = [Path("/proc"), Path("/sys"), Path("/dev")]
        for area in own + forbidden:
            area_real = Path(os.path.realpath(area))
            if (
                real == area_real
                or area_real in real.parents
                or (area in own and real in area_real.parents)
            ):
                raise AgentError(
                    422,
                    "RefusedOriginal",
                    f"the original {original!r} is, lies in or holds the agent's own state or "
                    "a system area (/proc, /sys, /dev)",
                )
        roots = self.config.allowed_roots
        if roots is not None and not any(
            real == (allowed := Path(os.path.realpath(root))) or allowed in real.parents
            for root in roots
        ):
            raise AgentError(
                422,
                "RefusedOriginal",
                f"the original {original!r} is not under this Sandbox's source (symlinks "
                "resolved); the agent serves only what its Sandbox's spec names",
            )
        return original

    def _secret_pairs(self) -> list[tuple[str, str]]:
        """``(form, "env:NAME")`` of every form of every secret environment value, longest
        form first; worked out again only when a value changed."""
        values = tuple(self.config.environ.get(name) or "" for name in self.config.secret_env)
        if self._pairs_of != (self.config.secret_env, values):
            pairs = [
                (form, ENV_REF + name)
                for name, value in zip(self.config.secret_env, values, strict=True)
                for form in secret_forms(value)
            ]
            pairs.sort(key=lambda pair: len(pair[0]), reverse=True)
            self._pairs, self._pairs_of = pairs, (self.config.secret_env, values)
        return self._pairs

    def hide(self, payload: Any) -> Any:
        """``payload`` with every secret environment value, in every form a message may carry
        it (:func:`~sandbox_core.redaction.secret_forms`), replaced by its ``env:NAME``."""
        pairs = self._secret_pairs()

        def clean(value: Any) -> Any:
            if isinstance(value, str):
                for form, reference in pairs:
                    value = value.replace(form, reference)
                return value
            if isinstance(value, dict):
                return {clean(k): clean(v) for k, v in value.items()}
            if isinstance(value, list):
                return [clean(v) for v in value]
            return value

        return clean(json.loads(json.dumps(payload, default=str)))

    def reply_text(self, payload: Any) -> str:
        """The JSON text of a reply, ``payload`` with its secrets hidden (:meth:`hide`): what
        the agent journals and sends, encoded once. Without secret values in the environment
        there is nothing to hide, and the payload is encoded as it is (the same text: values
        JSON does not know become their ``str``)."""
        if not self._secret_pairs():
            return json.dumps(payload, default=str)
        return json.dumps(self.hide(payload))

    # -- helpers ------------------------------------------------------------------------------

    def _revision_path(self, sandbox_id: str) -> Path:
        return self.config.state_dir / "revisions" / sandbox_id

    def revision(self, sandbox_id: str) -> int:
        """How many times the agent changed this sandbox (0 when never). Callers put it into
        their request ids, so one logical call is deduplicated while a new one after any
        change is a new request. Read from ``<state>/revisions/<id>`` once per process, then
        kept in memory (this process writes every later value)."""
        with self._revision_lock:
            return self._revision_locked(sandbox_id)

    def _revision_locked(self, sandbox_id: str) -> int:
        known = self._revisions.get(sandbox_id)
        if known is None:
            try:
                known = int(self._revision_path(sandbox_id).read_text())
            except (OSError, ValueError):
                known = 0
            self._revisions[sandbox_id] = known
        return known

    def _save(self, sandbox: BaseSandbox) -> None:
        self.store.save(sandbox)
        self._bump(sandbox.sandbox_id)

    def _bump(self, sandbox_id: str) -> None:
        # Written in place, padded to a fixed width, never truncated: rewriting a file
        # truncated to zero makes ext4 flush it (auto_da_alloc), which costs a disk write.
        path = self._revision_path(sandbox_id)
        with self._revision_lock:
            value = self._revision_locked(sandbox_id) + 1
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.pwrite(fd, str(value).ljust(REVISION_WIDTH).encode(), 0)
            finally:
                os.close(fd)
            self._revisions[sandbox_id] = value

    def _reopen(self, record: dict[str, Any]) -> BaseSandbox:
        """Re-open from a record; a database sandbox gets its password back from the Pod's
        secret environment (records keep DSNs redacted)."""
        sandbox = self.factory.reopen(record)
        use_credentials = getattr(sandbox, "use_credentials", None)
        if use_credentials is None:
            return sandbox
        for name in self.config.secret_env:
            dsn = os.environ.get(name, "")
            if dsn_secrets(dsn) and same_database(dsn, sandbox.original_path):
                use_credentials(dsn)
                break
        return sandbox

    def load(self, sandbox_id: str) -> BaseSandbox:
        """The sandbox this process keeps open, else re-opened from its record (and kept).

        Raises:
            AgentError: 404 when unknown.
        """
        live = self._live.get(sandbox_id)
        if live is not None:
            return live
        try:
            record = self.store.load(sandbox_id)
        except SandboxError as exc:
            raise AgentError(404, "NotFound", str(exc)) from exc
        sandbox = self._reopen(record)
        self._live[sandbox_id] = sandbox
        return sandbox

    def describe(self, sandbox: BaseSandbox) -> dict[str, Any]:
        """The reply shape of one sandbox: the CLI's ``status --json`` shape without the
        top-level ``original_path`` (the record holds it), plus the agent's ``revision``."""
        reply = describe_sandbox(sandbox)
        del reply["original_path"]
        reply["revision"] = self.revision(sandbox.sandbox_id)
        reply["prepares_durably"] = bool(getattr(sandbox, "prepares_durably", True))
        return reply

    # -- operations ---------------------------------------------------------------------------

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create (or re-open: same ``sandbox_id``) a sandbox and return it (case 18).

        :meth:`SandboxHost.provision <sandbox_core.host.host.SandboxHost.provision>`: a complete
        record of ``sandbox_id`` is reopened, what an interrupted create left is cleaned up and
        made again; every record it writes counts as a revision.
        """
        missing = [key for key in CREATE_FIELDS if not body.get(key)]
        if missing:
            raise AgentError(
                BAD_REQUEST, "ValueError", f"create needs {', '.join(missing)} in its body"
            )
        for key in (*CREATE_FIELDS, "sandbox_id"):
            if key in body and not isinstance(body[key], str):
                raise AgentError(BAD_REQUEST, "ValueError", f"{key} must be a string")
        if not isinstance(body.get("options") or {}, dict):
            raise AgentError(BAD_REQUEST, "ValueError", "options must be an object")
        options: dict[str, Any] = {str(k): v for k, v in dict(body.get("options") or {}).items()}
        root = options.setdefault("sandbox_root", str(self.config.sandbox_root))
        if Path(str(root)) != self.config.sandbox_root:
            raise AgentError(
                422, "RefusedOriginal", "options.sandbox_root is the agent's own, not the caller's"
            )
        original = self.admit_original(str(body["original"]))
        sandbox_id = str(body.get("sandbox_id") or "") or options.pop("sandbox_id", None)
        fork_checkpoint = str(body.get("fork_checkpoint") or "")
        fork = None
        made = self.store.find(sandbox_id) if sandbox_id else None
        if fork_checkpoint and (made is None or is_half_made(made)):
            fork = bundle.fork_source_of(self._import_dir(fork_checkpoint))
        sandbox = self.host.provision(
            str(body["plan_id"]),
            str(body["resource_id"]),
            original,
            str(body["strategy"]),
            sandbox_id=sandbox_id,
            fork=fork,
            **options,
        )
        self._live[sandbox.sandbox_id] = sandbox
        if fork_checkpoint:  # the fork holds its own copy now: the import is not needed again
            bundle.remove(self._import_dir(fork_checkpoint))
        return self.describe(sandbox)

    # -- forks across workspace Pods (sandbox_core.agent.bundle) -------------------------------

    def _import_dir(self, checkpoint_id: str) -> Path:
        """Where the bundle of ``checkpoint_id`` is unpacked on this agent's state volume.

        Raises:
            AgentError: 422 when ``checkpoint_id`` is not a checkpoint id (letters, digits).
        """
        if not bundle.CHECKPOINT_ID_PATTERN.match(checkpoint_id):
            raise AgentError(422, "ValueError", "a checkpoint id is 1-64 letters or digits")
        return self.config.state_dir / "imports" / checkpoint_id

    def export_checkpoint(self, checkpoint_id: str, max_bytes: int) -> Path:
        """The bundle of checkpoint ``checkpoint_id`` packed into a new file of the state
        volume (:func:`bundle.pack`); the caller streams it and removes it.

        Raises:
            AgentError: 404 when there is no such checkpoint here.
            SandboxForkError: it cannot be carried (no snapshot, kernel-mode overlay, larger
                than ``max_bytes``).
        """
        self._import_dir(checkpoint_id)  # the id's shape
        found = self.checkpoints.get_checkpoint(checkpoint_id)
        if found is None:
            raise AgentError(404, "NotFound", f"no checkpoint with id {checkpoint_id}")
        source = self.checkpoints.fork_source(found)
        # one file per export: two forks of one checkpoint may stream at the same time
        out = self.config.state_dir / "exports" / f"{checkpoint_id}.{uuid.uuid4().hex}.tar"
        out.parent.mkdir(parents=True, exist_ok=True)
        bundle.pack(source, out, max_bytes)
        return out

    def import_checkpoint(
        self, checkpoint_id: str, spooled: Path, max_bytes: int
    ) -> dict[str, Any]:
        """Unpack the bundle file ``spooled`` (the request's body, written to this agent's
        state volume) as the import of ``checkpoint_id``, replacing an earlier one; ``spooled``
        is removed. A bundle of another checkpoint is refused.

        Returns:
            ``{"checkpoint_id", "kind", "files", "bytes"}``.

        Raises:
            SandboxForkError: the bundle is refused (:func:`bundle.unpack`); nothing is kept.
        """
        dest = self._import_dir(checkpoint_id)
        try:
            facts = bundle.unpack(spooled, dest, max_bytes)
        finally:
            bundle.remove(spooled)
        if facts["checkpoint_id"] != checkpoint_id:
            bundle.remove(dest)
            raise SandboxForkError(
                f"the bundle sent as checkpoint {checkpoint_id} is of checkpoint "
                f"{facts['checkpoint_id']}"
            )
        return {key: facts[key] for key in ("checkpoint_id", "kind", "files", "bytes")}

    def status(self, sandbox_id: str) -> dict[str, Any]:
        """One sandbox."""
        return self.describe(self.load(sandbox_id))

    def activate(self, sandbox_id: str) -> dict[str, Any]:
        """CREATED or ROLLED_BACK -> ACTIVE; other states unchanged."""
        sandbox = self.load(sandbox_id)
        if sandbox.status in (SandboxStatus.CREATED, SandboxStatus.ROLLED_BACK):
            sandbox.activate()
            self._save(sandbox)
        return self.describe(sandbox)

    def path(self, sandbox_id: str, rel: str) -> Path:
        """The sandbox path of ``rel`` (activates; ``ValueError`` on traversal). Only an
        activation is saved: a read must not rewrite the record nor move the revision."""
        sandbox = self.load(sandbox_id)
        before = sandbox.status
        try:
            return Path(sandbox.get_path(rel))
        finally:
            if sandbox.status is not before:
                self._save(sandbox)

    def read(self, sandbox_id: str, rel: str) -> dict[str, Any]:
        """``{"path", "content_b64"}`` of a file in the sandbox, through the actor's files
        (no symlink followed; at most ``MAX_INLINE_READ_BYTES``: larger files are streamed by
        ``FILE_BYTES``, so memory stays bounded)."""
        data = self.actor(sandbox_id, lambda door: door.files().read(rel), changes=False)
        return {"path": rel, "content_b64": base64.b64encode(data).decode()}

    def write(self, sandbox_id: str, rel: str, content: bytes) -> dict[str, Any]:
        """Write ``content`` to ``rel`` in the sandbox (parents made), through the actor's
        files: a control path (``.git``, the core's own files) is refused as on every other
        route, and the write is audited."""
        written = self.put_bytes(sandbox_id, rel, content, append=False)
        return {"path": rel, "size": written["size"]}

    def listdir(self, sandbox_id: str, rel: str) -> dict[str, Any]:
        """Entries of a directory of the sandbox: ``[{"name", "type", "size"}]``."""
        target = self.path(sandbox_id, rel)
        if not target.is_dir():
            raise AgentError(404, "NotFound", f"no directory {rel} in sandbox {sandbox_id}")
        entries = []
        for entry in sorted(target.iterdir()):
            kind = "dir" if entry.is_dir() else "symlink" if entry.is_symlink() else "file"
            size = entry.lstat().st_size
            entries.append({"name": entry.name, "type": kind, "size": size})
        return {"path": rel, "entries": entries}

    def diff(self, sandbox_id: str) -> dict[str, Any]:
        """Unified diff against the original (the CLI's ``diff``)."""
        return {"sandbox_id": sandbox_id, "diff": sandbox_diff(self.load(sandbox_id))}

    def commit(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Commit; the reply is the CommitResult plus the record after it."""
        sandbox = self.load(sandbox_id)
        try:
            with held_by_process(
                [sandbox.original_path], _plan_of(sandbox), f"commit:{sandbox_id}"
            ):
                result = sandbox.commit(body.get("message"))
        finally:
            self._save(sandbox)
        return {"result": result.to_dict(), "sandbox": self.describe(sandbox)}

    def rollback(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Discard changes (or undo a commit); re-activate when ``reactivate``."""
        sandbox = self.load(sandbox_id)
        try:
            if sandbox.status is SandboxStatus.CREATED:
                sandbox.activate()
            if sandbox.status is SandboxStatus.COMMITTED:  # writes the original: its lock
                with held_by_process(
                    [sandbox.original_path],
                    _plan_of(sandbox),
                    f"rollback:{sandbox_id}",
                    error=SandboxRollbackLockedError,
                ):
                    sandbox.rollback()
            elif sandbox.status is not SandboxStatus.ROLLED_BACK:
                sandbox.rollback()
            if body.get("reactivate") and sandbox.status is SandboxStatus.ROLLED_BACK:
                sandbox.activate()
        finally:
            self._save(sandbox)
        return self.describe(sandbox)

    def checkpoint(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Snapshot; a ``metadata.k8s_checkpoint_uid`` seen before returns the first snapshot."""
        sandbox = self.load(sandbox_id)
        metadata = {str(k): str(v) for k, v in dict(body.get("metadata") or {}).items()}
        uid = metadata.get("k8s_checkpoint_uid")
        if uid:
            for existing in self.checkpoints.list_checkpoints(sandbox_id):
                if existing.metadata.get("k8s_checkpoint_uid") == uid:
                    return existing.model_dump(mode="json")
        plan_id = sandbox.context.plan_id if sandbox.context else ""
        created = self.checkpoints.create_checkpoint(
            sandbox, plan_id, str(body.get("phase") or "manual"), metadata
        )
        self._save(sandbox)
        return created.model_dump(mode="json")

    def restore(self, checkpoint_id: str) -> dict[str, Any]:
        """Restore the sandbox of ``checkpoint_id`` to it (and activate)."""
        found = self.checkpoints.get_checkpoint(checkpoint_id)
        if found is None:
            raise AgentError(404, "NotFound", f"no checkpoint with id {checkpoint_id}")
        sandbox = self.load(found.sandbox_id)
        if sandbox.status not in RESTORABLE:
            raise SandboxStateError(
                f"cannot restore sandbox {sandbox.sandbox_id} in status {sandbox.status.value}"
            )
        if not self.checkpoints.restore(sandbox, found):
            raise SandboxError(f"restore of checkpoint {checkpoint_id} failed")
        if sandbox.status in (SandboxStatus.CREATED, SandboxStatus.ROLLED_BACK):
            sandbox.activate()
        self._save(sandbox)
        return self.describe(sandbox)

    # -- two-phase plan commit -------------------------------------------------------------------

    @staticmethod
    def _txid(body: dict[str, Any]) -> str:
        txid = str(body.get("txid") or "")
        if not TXID_PATTERN.match(txid):
            raise AgentError(422, "ValueError", "txid must be 1-64 characters of [A-Za-z0-9._-]")
        return txid

    def _participant(self, sandbox_id: str, txid: str) -> BaseSandbox:
        """The sandbox that prepared under ``txid`` when this process holds it, else re-opened."""
        held = self._held.get((sandbox_id, txid))
        return held if held is not None else self.load(sandbox_id)

    def review(self, sandbox_id: str) -> dict[str, Any]:
        """``{"summary": ChangeSummary, "sandbox"}``; nothing changes, nothing is saved."""
        sandbox = self.load(sandbox_id)
        return {
            "summary": sandbox.review().to_dict(),
            "sandbox": self.describe(sandbox),
            "audit": AuditLog(self.config.state_dir, sandbox_id).summary(),  # bounded
        }

    def target_identity(self, sandbox_id: str) -> dict[str, str]:
        """``{"identity"}``: the sandbox's ``target_identity()`` (a database's system
        identifier, oid and name; never a DSN), "" for a sandbox that reports none. Read from
        the original each time: a database replaced at the same DSN gives another value.

        Raises:
            SandboxError: no such sandbox, or the original cannot be queried.
        """
        sandbox = self.load(sandbox_id)
        own = getattr(sandbox, "target_identity", None)
        return {"identity": str(own()) if callable(own) else ""}

    def prepare(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"prepared": PreparedCommit, "sandbox"}``: stage the commit under ``txid``.

        A participant that does not prepare durably is held in this process for the apply.
        """
        txid = self._txid(body)
        message = body.get("message")
        sandbox = self._participant(sandbox_id, txid)
        hold_prepared(sandbox, txid)  # the original's lock, until apply or abort
        try:
            prepared = sandbox.prepare(txid, str(message) if message is not None else None)
        except BaseException:
            release_prepared(sandbox, txid)
            raise
        if not getattr(sandbox, "prepares_durably", True):
            self._held[(sandbox_id, txid)] = sandbox
        self._save(sandbox)
        return {"prepared": prepared.to_dict(), "sandbox": self.describe(sandbox)}

    def apply_prepared(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"result": CommitResult, "sandbox"}``: apply what ``prepare`` staged (idempotent)."""
        txid = self._txid(body)
        sandbox = self._participant(sandbox_id, txid)
        try:
            result = sandbox.apply_prepared(txid)
        finally:
            self._save(sandbox)
        release_prepared(sandbox, txid)
        self._held.pop((sandbox_id, txid), None)
        return {"result": result.to_dict(), "sandbox": self.describe(sandbox)}

    def abort_prepared(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"sandbox"}``: drop what ``prepare`` staged (idempotent; fine when nothing was)."""
        txid = self._txid(body)
        sandbox = self._participant(sandbox_id, txid)
        sandbox.abort_prepared(txid)
        release_prepared(sandbox, txid)
        self._held.pop((sandbox_id, txid), None)
        self._save(sandbox)
        return {"sandbox": self.describe(sandbox)}

    def commit_landed(self, sandbox_id: str) -> dict[str, Any]:
        """``{"landed": bool | None}``: the strategy's ``commit_landed()`` (did a commit whose
        outcome was lost reach the original?), None when the strategy cannot tell. Recovery
        asks it of a two-phase last resource recorded committing and of an interrupted saga."""
        sandbox = self.load(sandbox_id)
        probe = getattr(sandbox, "commit_landed", None)
        answer = probe() if callable(probe) else None
        return {"landed": answer if isinstance(answer, bool) else None}

    def cleanup(self, sandbox_id: str) -> dict[str, Any]:
        """Remove every artefact and forget the sandbox; unknown ids are fine."""
        try:
            sandbox = self.load(sandbox_id)
        except AgentError:
            return {"sandbox_id": sandbox_id, "status": "cleaned_up"}
        sandbox.cleanup()
        self._live.pop(sandbox_id, None)
        self.store.delete(sandbox_id)
        with self._revision_lock:
            self._revisions.pop(sandbox_id, None)
            self._revision_path(sandbox_id).unlink(missing_ok=True)
        return {"sandbox_id": sandbox_id, "status": sandbox.status.value}

    # -- the actor's door (docs/actor.md) -------------------------------------------------------

    def open_for_actor(self, sandbox_id: str) -> BaseSandbox:
        """The sandbox an actor's operation runs in: re-opened, and activated (and saved) when
        CREATED or ROLLED_BACK.

        Raises:
            AgentError: 404 when unknown.
            SandboxStateError: it is not open (COMMITTED, CLEANED_UP, ...).
        """
        sandbox = self.load(sandbox_id)
        if sandbox.status in (SandboxStatus.CREATED, SandboxStatus.ROLLED_BACK):
            sandbox.activate()
            self._save(sandbox)
        return sandbox

    def is_open(self, sandbox_id: str) -> bool:
        """Whether this process keeps ``sandbox_id`` open and ACTIVE: an actor's read of it
        then touches neither its record nor its status (nothing to save)."""
        live = self._live.get(sandbox_id)
        return live is not None and live.status is SandboxStatus.ACTIVE

    def count_change(self, sandbox_id: str) -> None:
        """An actor changed the sandbox's content: move its revision (a later commit is a new
        request)."""
        self._bump(sandbox_id)

    def audit(self, sandbox_id: str, after: int, limit: int) -> dict[str, Any]:
        """A page of the sandbox's audit log (:meth:`AuditLog.read`)."""
        self.load(sandbox_id)  # 404 when unknown
        return AuditLog(self.config.state_dir, sandbox_id).read(after, limit)

    # -- the actor's files and SQL (sandbox_core.actor) --------------------------------------------

    def actor(self, sandbox_id: str, action: Callable[[ActorDoor], T], *, changes: bool) -> T:
        """``action`` run on the :class:`~sandbox_core.actor.door.ActorDoor` of a sandbox (its
        audit log under ``<state>/actor/<sandbox_id>``); a status that moved (activation) is
        saved, a change moves the revision."""
        sandbox = self.load(sandbox_id)
        before = sandbox.status
        door = ActorDoor(sandbox, self.config.state_dir)
        try:
            return action(door)
        finally:
            if sandbox.status is not before:
                self._save(sandbox)
            elif changes:
                self._bump(sandbox_id)

    def open_range(self, sandbox_id: str, rel: str, offset: int, length: int | None) -> FileRange:
        """An open byte range of a file for the streamed read (the caller closes it)."""
        return self.actor(
            sandbox_id, lambda door: door.files().open_range(rel, offset, length), changes=False
        )

    def read_text(
        self, sandbox_id: str, rel: str, offset: int, length: int | None
    ) -> dict[str, Any]:
        """``SandboxFiles.read_text``."""
        return self.actor(
            sandbox_id, lambda door: door.files().read_text(rel, offset, length), changes=False
        )

    def put_bytes(self, sandbox_id: str, rel: str, content: bytes, append: bool) -> dict[str, Any]:
        """``SandboxFiles.write`` of the request's bytes."""
        return self.actor(
            sandbox_id, lambda door: door.files().write(rel, content, append=append), changes=True
        )

    def write_file(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"path", "content", "encoding", "append"}`` -> ``SandboxFiles.write``."""
        encoding = str(body.get("encoding") or "utf-8")
        content = str(body.get("content") or "")
        if encoding == "base64":
            data = _base64(content, "content")
        elif encoding == "utf-8":
            data = content.encode()
        else:
            raise AgentError(422, "ValueError", "encoding must be utf-8 or base64")
        return self.put_bytes(sandbox_id, _field(body, "path"), data, bool(body.get("append")))

    def stat_file(self, sandbox_id: str, rel: str) -> dict[str, Any]:
        """``SandboxFiles.stat``."""
        return self.actor(sandbox_id, lambda door: door.files().stat(rel), changes=False)

    def edit_file(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"path", "old", "new", "replace_all"}`` -> ``SandboxFiles.edit``."""
        rel, old, new = _field(body, "path"), _field(body, "old"), str(body.get("new") or "")
        replace_all = bool(body.get("replace_all"))
        return self.actor(
            sandbox_id,
            lambda door: door.files().edit(rel, old, new, replace_all=replace_all),
            changes=True,
        )

    def delete_file(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"path", "recursive"}`` -> ``SandboxFiles.delete``."""
        rel, recursive = _field(body, "path"), bool(body.get("recursive"))
        return self.actor(
            sandbox_id, lambda door: door.files().delete(rel, recursive=recursive), changes=True
        )

    def move_file(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"path", "to", "overwrite"}`` -> ``SandboxFiles.move``."""
        src, dst, overwrite = _field(body, "path"), _field(body, "to"), bool(body.get("overwrite"))
        return self.actor(
            sandbox_id, lambda door: door.files().move(src, dst, overwrite=overwrite), changes=True
        )

    def make_dir(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"path", "parents", "exist_ok"}`` -> ``SandboxFiles.mkdir`` (both default true)."""
        rel = _field(body, "path")
        parents, exist_ok = body.get("parents", True) is not False, body.get("exist_ok", True)
        return self.actor(
            sandbox_id,
            lambda door: door.files().mkdir(rel, parents=parents, exist_ok=exist_ok is not False),
            changes=True,
        )

    def grep(self, sandbox_id: str, query: Mapping[str, str]) -> dict[str, Any]:
        """``search.grep`` from the query (``pattern``, ``path``, ``glob``, ``ignore_case``,
        ``max``, ``cursor``)."""
        options: dict[str, Any] = {
            "path": query.get(PATH_QUERY, "."),
            "glob_pattern": query.get(GLOB_QUERY) or None,
            "ignore_case": query.get(IGNORE_CASE_QUERY) in ("1", "true"),
            "max_matches": _int(query, MAX_QUERY, DEFAULT_MAX_MATCHES),
            "cursor": query.get(CURSOR_QUERY) or None,
        }
        pattern = _field(query, PATTERN_QUERY)
        return self.actor(sandbox_id, lambda door: door.grep(pattern, **options), changes=False)

    def glob(self, sandbox_id: str, query: Mapping[str, str]) -> dict[str, Any]:
        """``search.glob`` from the query (``pattern``, ``path``, ``max``, ``cursor``)."""
        options: dict[str, Any] = {
            "path": query.get(PATH_QUERY, "."),
            "max_results": _int(query, MAX_QUERY, DEFAULT_MAX_RESULTS),
            "cursor": query.get(CURSOR_QUERY) or None,
        }
        pattern = _field(query, PATTERN_QUERY)
        return self.actor(sandbox_id, lambda door: door.glob(pattern, **options), changes=False)

    def upload(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"files": [{"path", "content_b64"}]}`` -> ``{"results"}`` (one per file)."""
        items = []
        for index, item in enumerate(list(body.get("files") or [])):
            where = f"files[{index}]"
            if not isinstance(item, dict):
                raise AgentError(BAD_REQUEST, "BadRequest", f"{where} must be an object")
            path, content = item.get("path"), item.get("content_b64")
            if not isinstance(path, str) or not isinstance(content, str | None):
                raise AgentError(
                    BAD_REQUEST, "BadRequest", f"{where}.path and .content_b64 must be strings"
                )
            items.append((path, _base64(content or "", f"{where}.content_b64")))
        results = self.actor(sandbox_id, lambda door: door.files().upload(items), changes=True)
        return {"results": results}

    def download(self, sandbox_id: str, rels: list[str]) -> Iterator[dict[str, Any]]:
        """``SandboxFiles.download`` (a generator the server streams; chunks are bytes)."""
        return self.actor(sandbox_id, lambda door: door.files().download(rels), changes=False)

    def sql(self, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{"sql", "params", "many", "max_rows"}`` -> :func:`sandbox_core.actor.sql.run_sql`
        in the transaction this process keeps open."""
        statement = _field(body, "sql")
        params, many = body.get("params"), bool(body.get("many"))
        max_rows = int(body.get("max_rows") or DEFAULT_MAX_ROWS)
        return self.actor(
            sandbox_id,
            lambda door: door.sql(statement, params, many=many, max_rows=max_rows),
            changes=True,
        )


def _plan_of(sandbox: BaseSandbox) -> str:
    """The plan a sandbox belongs to (for the original's lock record)."""
    return str(getattr(sandbox.context, "plan_id", "") or "")


def _base64(text: str, name: str) -> bytes:
    """``text`` decoded (strict base64).

    Raises:
        AgentError: 400 ``BadRequest`` naming ``name``.
    """
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error
        raise AgentError(BAD_REQUEST, "BadRequest", f"{name} is not base64") from None


def _field(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise AgentError(BAD_REQUEST, "ValueError", f"{name} is needed (a non-empty string)")
    return value


def _int(query: Mapping[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(str(raw))
    except ValueError:
        raise AgentError(BAD_REQUEST, "ValueError", f"{name} must be an integer") from None
