"""The Checkpoint's kopf handlers: thin, with explicit ids; the logic is
:class:`~sandbox_operator.resources.checkpoint.CheckpointLogic`.

Take the snapshot on create (and again, idempotently, for a handled Checkpoint without a status
after a restart); delete it in the finalizer.
"""

from __future__ import annotations

from typing import Any

import kopf

from sandbox_api.models import CHECKPOINT_PLURAL, GROUP, VERSION
from sandbox_operator.runtime import TIMEOUT, runtime


@kopf.on.create(GROUP, VERSION, CHECKPOINT_PLURAL, id="snapshot", timeout=TIMEOUT)
def checkpoint_create(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Take the snapshot."""
    runtime().checkpoints.create(body, patch)


@kopf.on.resume(
    GROUP,
    VERSION,
    CHECKPOINT_PLURAL,
    id="snapshot-resume",
    when=lambda status, **_: not status.get("phase"),
    timeout=TIMEOUT,
)
def checkpoint_create_resume(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """A handled Checkpoint without a status: take the snapshot again to write it.

    As for Sandboxes (``sandbox_provision_resume``): an earlier operator killed between kopf's
    two writes left a Checkpoint marked handled with no phase. Snapshots are idempotent per
    Checkpoint uid (case 18), so the next operator records the same snapshot, not a second one.
    """
    runtime().checkpoints.create(body, patch)


@kopf.on.delete(GROUP, VERSION, CHECKPOINT_PLURAL, id="delete-snapshot", timeout=TIMEOUT)
def checkpoint_delete(body: kopf.Body, retry: int, **_: Any) -> None:
    """Finalizer: delete the snapshot."""
    runtime().checkpoints.finalize(body, retry)
