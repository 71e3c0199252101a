"""Sandboxes for the framework adapters' tests: made by the core on local paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sandbox_core.actor.actions import LocalActions
from sandbox_core.host.host import SandboxHost
from sandbox_core.host.store import SandboxStore


def local_actions(base: Path, strategy: str = "copy_on_write") -> Iterator[LocalActions]:
    """A sandbox of ``strategy`` over a fresh original under ``base``; cleaned up after."""
    original = base / "original"
    original.mkdir()
    (original / "README.md").write_text("the original\n")
    host = SandboxHost(SandboxStore(base / "state"))
    sandbox = host.provision(
        "plan-adapters", "workspace", str(original), strategy, sandbox_root=str(base / "sb")
    )
    try:
        yield LocalActions(base / "state", sandbox.sandbox_id)
    finally:
        host.reopen(sandbox.sandbox_id).cleanup()
