"""The kernel's path limits as the product meets them (docs/fidelity.md, "Long paths").

Linux refuses a path string of ``PATH_MAX`` (4096) bytes or more and a name of more than
``NAME_MAX`` (255) bytes with ``ENAMETOOLONG``. The product's own working paths (stage mirrors,
backups, staging areas) are kept no longer than the paths they mirror, so every path the user can
name in the original and in the sandbox view is committed. A path the product cannot name at all
(one the user made by directory file descriptor, longer than ``PATH_MAX``) refuses ``commit`` and
``prepare`` before anything is written, naming it; the sandbox keeps its status and its edits.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from sandbox_core.errors import SandboxCommitError

PATH_MAX = 4096  # bytes, the terminating NUL included (linux/limits.h)
NAME_MAX = 255  # bytes of one name


def too_long_refusal(
    action: str, sandbox_id: str, exc: BaseException, roots: list[str]
) -> SandboxCommitError | None:
    """The :class:`SandboxCommitError` (with the offending path, relative to the first of
    ``roots`` holding it, as its one conflict) for an ``ENAMETOOLONG`` raised by ``action``;
    None for any other error. Only for steps that write nothing before failing or undo what
    they wrote (the journaled sync, docs/fidelity.md)."""
    if not isinstance(exc, OSError) or exc.errno != errno.ENAMETOOLONG:
        return None
    name = os.fsdecode(exc.filename) if exc.filename is not None else "?"
    rel = name
    for root in roots:
        prefix = root.rstrip("/") + "/"
        if name.startswith(prefix):
            rel = name[len(prefix) :]
            break
    shown = rel if len(rel) <= 120 else f"{rel[:60]}...{rel[-40:]}"
    return SandboxCommitError(
        f"{action} of sandbox {sandbox_id} refused: {shown!r} is longer than the kernel allows "
        f"(PATH_MAX {PATH_MAX} bytes for a whole path, NAME_MAX {NAME_MAX} for one name); "
        "shorten or remove it in the sandbox, or sandbox a deeper directory",
        [rel],
    )


@contextlib.contextmanager
def short_alias(directory: Path) -> Iterator[Path]:
    """``directory`` named as ``/proc/self/fd/N`` while the context is open, so that a mirror
    of paths below it is no longer than the paths it mirrors (the magic link is resolved by the
    kernel, not counted in ``PATH_MAX``). Falls back to ``directory`` without ``/proc``."""
    if not Path("/proc/self/fd").is_dir():
        yield directory
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


_GIT_UNOPENED = "could not open directory '"


def refuse_what_git_skipped(stderr: str) -> None:
    """``git add -A`` only warns about a directory it cannot open because its path is too long
    (exit 0; the warning itself is cut short at git's message buffer), so the commit would leave
    it out silently: raise ``ENAMETOOLONG`` naming its top folder (relative to the worktree)
    instead, before anything is committed.

    Raises:
        OSError: ``ENAMETOOLONG`` with the folder as its filename.
    """
    for line in stderr.splitlines():
        _, found, rest = line.partition(_GIT_UNOPENED)
        if not found or ("': " in rest and not rest.endswith("File name too long")):
            continue  # another reason (a permission): git says so and the caller decides
        name = rest.split("/", 1)[0].rstrip("'")
        raise OSError(errno.ENAMETOOLONG, "File name too long (git cannot add it)", name)
