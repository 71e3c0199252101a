"""A small file participant for the two-phase coordinator's unit tests (issue 9).

``StagedFileSandbox`` sandboxes one file ``value`` of a real directory: the sandbox keeps its
own copy; ``prepare`` checks the original did not move since create (else a conflict) and
writes ``.value.<txid>.staged`` beside the target; ``apply_prepared`` renames it; ``abort``
removes it. ``VolatileSandbox`` prepares in memory only (``prepares_durably`` False), like
SQLite. Real strategies are tested in tests/core/plan/test_two_phase_crash.py; these fakes only
make the coordinator's rules testable without them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from sandbox_core.errors import SandboxConflictError, SandboxError, TwoPhaseUnavailableError
from sandbox_core.protocol import ChangeSummary, CommitResult, PreparedCommit, SandboxContext
from sandbox_core.strategies.base import BaseSandbox


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class StagedFileSandbox(BaseSandbox):
    strategy = "staged_fake"

    def _do_create(self, plan_id: str) -> SandboxContext:
        box = self.sandbox_root / "staged" / self.sandbox_id
        box.mkdir(parents=True)
        base = Path(self.original_path, "value").read_bytes()
        (box / "value").write_bytes(base)
        return SandboxContext(
            sandbox_id=self.sandbox_id,
            sandbox_path=str(box),
            original_path=self.original_path,
            resource_id=self.resource_id,
            plan_id=plan_id,
            metadata={"base": base.decode()},
        )

    def _mine(self) -> bytes:
        return Path(self._require_context().sandbox_path, "value").read_bytes()

    def _target(self) -> Path:
        return Path(self.original_path, "value")

    def _staged(self, txid: str) -> Path:
        return Path(self.original_path, f".value.{txid}.staged")

    def _conflicts(self) -> list[str]:
        base = self._require_context().metadata["base"].encode()
        return ["value"] if self._target().read_bytes() != base else []

    def _do_review(self) -> ChangeSummary:
        return ChangeSummary(
            sandbox_id=self.sandbox_id,
            resource_id=self.resource_id,
            strategy=self.strategy,
            digest=_sha(self._mine()),
            changed=["value"],
            bytes_changed=len(self._mine()),
            conflicts=self._conflicts(),
        )

    def _do_prepare(self, txid: str, message: str | None) -> PreparedCommit:
        if self._options.get("refuse_two_phase"):
            raise TwoPhaseUnavailableError("this fake refuses two phases")
        conflicts = self._conflicts()
        if conflicts:
            raise SandboxConflictError("original moved", conflicts=conflicts)
        staged = self._staged(txid)
        staged.write_bytes(self._mine())
        with open(staged, "rb") as handle:
            os.fsync(handle.fileno())
        return PreparedCommit(self.sandbox_id, txid, _sha(self._mine()), self._do_review())

    def _do_apply_prepared(self, txid: str) -> CommitResult:
        staged = self._staged(txid)
        if staged.exists():
            os.replace(staged, self._target())
        elif self._target().read_bytes() != self._mine():
            raise SandboxError(f"nothing staged under {txid}")
        return CommitResult(self.sandbox_id, True, changed_files=["value"])

    def _do_abort_prepared(self, txid: str) -> None:
        self._staged(txid).unlink(missing_ok=True)

    def _do_commit(self, message: str | None) -> CommitResult:
        if self._conflicts():
            raise SandboxConflictError("original moved", conflicts=["value"])
        self._target().write_bytes(self._mine())
        return CommitResult(self.sandbox_id, True, changed_files=["value"])

    def _do_rollback(self) -> None:
        (Path(self._require_context().sandbox_path) / "value").write_bytes(
            self._require_context().metadata["base"].encode()
        )

    def _do_rollback_committed(self) -> None:
        self._target().write_bytes(self._require_context().metadata["base"].encode())

    def _do_cleanup(self) -> None:
        if self._context is not None:
            shutil.rmtree(self._context.sandbox_path, ignore_errors=True)


class VolatileSandbox(StagedFileSandbox):
    """Prepares in memory only (like SQLite): it can only be the last resource."""

    strategy = "volatile_fake"
    rollbackable = False
    prepares_durably = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[str, bytes] = {}

    def _do_prepare(self, txid: str, message: str | None) -> PreparedCommit:
        if self._conflicts():
            raise SandboxConflictError("original moved", conflicts=["value"])
        self._held[txid] = self._mine()
        return PreparedCommit(self.sandbox_id, txid, _sha(self._mine()), self._do_review())

    def _do_apply_prepared(self, txid: str) -> CommitResult:
        if self._options.get("fail_apply"):
            raise SandboxError("the last resource refused to commit")
        data = self._held.pop(txid, None)
        if data is None:
            raise SandboxError(f"nothing held under {txid}")
        self._target().write_bytes(data)
        return CommitResult(self.sandbox_id, True, changed_files=["value"])

    def _do_abort_prepared(self, txid: str) -> None:
        self._held.pop(txid, None)

    def commit_landed(self) -> bool:
        return self._target().read_bytes() == self._mine()


def make_original(root: Path, name: str, text: str = "base\n") -> Path:
    """A directory with one file ``value`` holding ``text``."""
    path = root / name
    path.mkdir(parents=True)
    (path / "value").write_text(text)
    return path


def leftovers(originals: list[Path]) -> list[str]:
    """Staged files left beside the targets (must always be empty after an attempt)."""
    return sorted(p.name for o in originals for p in o.iterdir() if p.name.endswith(".staged"))
