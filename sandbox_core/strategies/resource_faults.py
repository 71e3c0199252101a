"""Full and read-only file systems met by a sandbox operation (docs/fidelity.md, "Resource
faults"; case 42).

A volume fills up or flips to read-only (``errors=remount-ro``, a snapshot) and later comes
back: both are transient. :func:`resource_fault` finds such an ``OSError`` in an exception and
the errors it was raised from; :func:`resource_error` names it in the phase's error class:

==========================  ==========================================  ======================
errno                       error (commit / rollback / other)           meaning for callers
==========================  ==========================================  ======================
``ENOSPC``, ``EDQUOT``      ``SandboxCommitNoSpaceError`` /             retryable: free space,
                            ``SandboxRollbackNoSpaceError`` /           then retry
                            ``SandboxNoSpaceError``
``EROFS``                   ``SandboxCommitPermissionError`` /          a person makes the
                            ``SandboxRollbackPermissionError`` /        volume writable (CLI
                            ``SandboxPermissionError``                  exit code 9)
==========================  ==========================================  ======================
"""

from __future__ import annotations

import errno

from sandbox_core.errors import (
    SandboxCommitNoSpaceError,
    SandboxCommitPermissionError,
    SandboxError,
    SandboxNoSpaceError,
    SandboxPermissionError,
    SandboxRollbackNoSpaceError,
    SandboxRollbackPermissionError,
)

__all__ = ["NO_SPACE_ERRNOS", "READ_ONLY_ERRNOS", "resource_error", "resource_fault"]

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
READ_ONLY_ERRNOS = frozenset({errno.EROFS})
# ``cp`` and other tools report the fault only in their message (wrapped as EIO).
_TEXTS = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
          "Read-only file system": errno.EROFS}  # fmt: skip
_CHAIN_LIMIT = 16


def resource_fault(exc: BaseException) -> OSError | None:
    """The ``OSError`` with errno ENOSPC, EDQUOT or EROFS in ``exc``, its ``__cause__`` and
    ``__context__`` chain (at most 16 deep), or None. An ``OSError`` whose message names the
    fault (``cp -a failed: ... No space left on device``) counts, with that errno."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < _CHAIN_LIMIT:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            if current.errno in NO_SPACE_ERRNOS | READ_ONLY_ERRNOS:
                return current
            text = str(current)
            for needle, number in _TEXTS.items():
                if needle in text:
                    return OSError(number, needle, current.filename)
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
    return None


def resource_error(action: str, sandbox_id: str, fault: OSError) -> SandboxError:
    """The error saying that ``action`` (``"commit"``, ``"prepare"``, ``"apply"``,
    ``"rollback"``, ``"abort"``, ``"restore"``) of ``sandbox_id`` met ``fault``; its ``path``
    is the fault's file name when known."""
    where = f" at {fault.filename}" if fault.filename else ""
    no_space = fault.errno in NO_SPACE_ERRNOS
    if no_space:
        what = "no space left on device" if fault.errno == errno.ENOSPC else "disk quota exceeded"
        todo = "free space on that volume, then retry"
    else:
        what = "read-only file system"
        todo = "make that volume writable, then retry"
    kept = (
        "the decision stands: the retry finishes it"
        if action == "apply"
        else "the original is unchanged and the sandbox keeps its status and its changes"
    )
    message = f"{action} of sandbox {sandbox_id} stopped: {what}{where}; {kept}; {todo}"
    error: SandboxError
    if action in ("commit", "prepare", "apply"):
        error = (
            SandboxCommitNoSpaceError(message)
            if no_space
            else SandboxCommitPermissionError(message)
        )
    elif action == "rollback":
        error = (
            SandboxRollbackNoSpaceError(message, refused=True)
            if no_space
            else SandboxRollbackPermissionError(message, refused=True)
        )
    else:
        error = SandboxNoSpaceError(message) if no_space else SandboxPermissionError(message)
    error.path = fault.filename if isinstance(fault.filename, str) else None
    return error
