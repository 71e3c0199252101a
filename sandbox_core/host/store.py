"""``SandboxStore``: sandbox records persisted in a state directory.

One JSON file per sandbox (``<state_dir>/sandboxes/<sandbox_id>.json``), written atomically
(temp file + rename), so that separate CLI invocations, the operator after a restart, and crash
recovery all see the same sandboxes (DESIGN.md: "A sandbox must be re-openable from its persisted
context").
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sandbox_core.durable import write_json_atomic
from sandbox_core.errors import SandboxError
from sandbox_core.strategies.base import BaseSandbox

__all__ = [
    "STATE_DIR_ENV",
    "SandboxStore",
    "default_state_dir",
]

STATE_DIR_ENV = "SANDBOX_CORE_STATE_DIR"


def default_state_dir() -> Path:
    """``$SANDBOX_CORE_STATE_DIR`` when set, else ``~/.local/state/sandbox-core``."""
    configured = os.environ.get(STATE_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".local" / "state" / "sandbox-core"


class SandboxStore:
    """Records of sandboxes, keyed by sandbox id, in ``state_dir``.

    Args:
        state_dir: directory to keep records in (created on first save); default
            :func:`default_state_dir`.
    """

    def __init__(self, state_dir: str | os.PathLike[str] | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self._dir = self.state_dir / "sandboxes"

    def save(self, sandbox: BaseSandbox) -> None:
        """Persist ``sandbox.to_record()``.

        Raises:
            SandboxError: the record could not be written.
        """
        try:
            write_json_atomic(self._path(sandbox.sandbox_id), sandbox.to_record())
        except OSError as exc:
            raise SandboxError(f"cannot save sandbox {sandbox.sandbox_id}: {exc}") from exc

    def load(self, sandbox_id: str) -> dict[str, Any]:
        """The stored record of ``sandbox_id``.

        Raises:
            SandboxError: no such sandbox, or the record is unreadable.
        """
        path = self._path(sandbox_id)
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise SandboxError(f"no sandbox with id {sandbox_id} in {self.state_dir}") from exc
        except (OSError, ValueError) as exc:
            raise SandboxError(f"cannot read sandbox {sandbox_id}: {exc}") from exc
        return data

    def find(self, sandbox_id: str) -> dict[str, Any] | None:
        """The stored record of ``sandbox_id``, or ``None`` when there is none.

        Raises:
            SandboxError: the record exists but is unreadable.
        """
        if not self._path(sandbox_id).exists():
            return None
        return self.load(sandbox_id)

    def records(self, plan_id: str | None = None) -> list[dict[str, Any]]:
        """All stored records (of one plan when ``plan_id`` is given), oldest id first."""
        if not self._dir.is_dir():
            return []
        found = []
        for path in sorted(self._dir.glob("*.json")):
            record = self.load(path.stem)
            context = record.get("context") or {}
            if plan_id is None or context.get("plan_id") == plan_id:
                found.append(record)
        return found

    def delete(self, sandbox_id: str) -> None:
        """Forget ``sandbox_id`` (no error when already gone)."""
        self._path(sandbox_id).unlink(missing_ok=True)

    @contextmanager
    def plan_lock(self, plan_id: str) -> Iterator[None]:
        """Hold an exclusive lock on ``plan_id`` across processes sharing this state directory.

        Separate processes (two CLI invocations, a CLI and a recovery) that change sandboxes of
        one plan take it, then re-read the records, so neither acts on a stale status. It is an
        ``flock`` on ``<state_dir>/locks/<hash>.lock``: released when the holder exits, even by
        a crash. Not re-entrant: take it once per process.

        Raises:
            SandboxError: the lock file cannot be created.
        """
        digest = hashlib.sha256(plan_id.encode()).hexdigest()[:32]
        path = self.state_dir / "locks" / f"plan-{digest}.lock"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise SandboxError(f"cannot lock plan {plan_id}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _path(self, sandbox_id: str) -> Path:
        if not sandbox_id or "/" in sandbox_id or sandbox_id.startswith("."):
            raise SandboxError(f"invalid sandbox id {sandbox_id!r}")
        return self._dir / f"{sandbox_id}.json"
