"""Containment of resource-relative paths inside a sandbox root (every strategy's ``get_path``),
and the control paths no actor may change (:func:`is_control_name`)."""

from __future__ import annotations

import os
import posixpath
import re
import unicodedata
from pathlib import Path

TRAVERSAL_MESSAGE = "Path traversal not allowed"

# Control directories of an original: a repository's ``.git`` (its config runs commands:
# ``core.fsmonitor``, hooks).
CONTROL_DIRS = frozenset({".git"})
# The core's own files beside an original (``.<name>.sandbox-lock``, ``.<name>.sandbox-staging-*``,
# ``.<name>.sandbox-<tag>-<ULID>`` backups, ``.<name>.overlay-<sandbox id>`` work dirs,
# ``.<name>.checkpoint-<ULID>``) and the staging area inside a mount point.
_CORE_SIBLING = re.compile(r"^\..+\.(?:sandbox-[a-z]+|overlay-|checkpoint-)")
_INNER_STAGING = ".sandbox-staging-"
# Code points a filesystem or a tool may ignore when it compares names (Unicode's
# Default_Ignorable_Code_Point; HFS+ drops them): ``.g\u200cit`` is ``.git`` there.
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)


def fold_name(name: str) -> str:
    """``name`` as a filesystem that aliases names may see it: NFKC, ignorable code points
    dropped, case folded, trailing dots and blanks dropped (Windows and SMB shares)."""
    text = _IGNORABLE.sub("", unicodedata.normalize("NFKC", name))
    text = unicodedata.normalize("NFKC", text.casefold())
    return text.rstrip(". ") or text


def is_control_name(name: str) -> bool:
    """Whether one path component names a control path: ``.git`` (any case or Unicode
    variant a filesystem could alias to it) or one of the core's own files beside an original
    (its lock, staging areas, backups, overlay work dirs, checkpoint staging)."""
    folded = fold_name(name)
    return (
        folded in CONTROL_DIRS
        or folded.startswith(_INNER_STAGING)
        or _CORE_SIBLING.match(folded) is not None
    )


def control_component(rel: str) -> str | None:
    """The first component of the relative path ``rel`` that is a control name, else None."""
    for part in rel.replace(os.sep, "/").split("/"):
        if part and is_control_name(part):
            return part
    return None


def resolve_inside(root: str | os.PathLike[str], resource_path: str) -> str:
    """Join ``resource_path`` onto ``root`` and return the absolute path.

    Refuses absolute paths, any ``..`` component, NUL bytes, and paths whose existing symlinks
    resolve outside ``root``.

    Raises:
        ValueError: ``"Path traversal not allowed"`` (seed 003, "Path traversal is rejected").
    """
    if "\x00" in resource_path:
        raise ValueError(TRAVERSAL_MESSAGE)
    candidate = Path(resource_path)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise ValueError(TRAVERSAL_MESSAGE)
    base = Path(root).resolve()
    if not candidate.parts:  # "." or "": the root itself, resolved above (one walk, not two)
        return str(base)
    joined = base / candidate
    # resolve() follows every existing symlink on the way; a link pointing out of the root shows
    # up as a resolved path that is no longer below it.
    resolved = joined.resolve()
    if resolved != base and base not in resolved.parents:
        raise ValueError(TRAVERSAL_MESSAGE)
    return str(joined)


def relative_to_root(root: str, path: str) -> str | None:
    """``path`` (absolute, as commands see it) relative to ``root``; None when it is relative,
    outside the root, the root itself, or names ``..``."""
    if not path.startswith("/") or "\x00" in path:
        return None
    if ".." in path.split("/"):
        return None
    normal = posixpath.normpath(path)
    base = posixpath.normpath(root)
    if not normal.startswith(base.rstrip("/") + "/"):
        return None
    return normal[len(base.rstrip("/")) + 1 :]


# The actor's per-file error types (sandbox_core.actor.files) -> the frameworks' standard codes.
_ERROR_CODES = {
    "SandboxFileNotFoundError": "file_not_found",
    "FileNotFoundError": "file_not_found",
    "SandboxFileOperationError": "is_directory",
    "IsADirectoryError": "is_directory",
    "NotADirectoryError": "file_not_found",
    "PermissionError": "permission_denied",
    "SandboxPathError": "invalid_path",
}


def framework_error_code(error: dict[str, str]) -> str:
    """A per-file error of the actor's batch operations (``{"type", "message"}``, the core's
    exception name) as the agent frameworks' standard code (Deep Agents'
    ``FileOperationError``): ``file_not_found``, ``is_directory``, ``permission_denied``,
    ``invalid_path``; else the message."""
    code = _ERROR_CODES.get(error.get("type", ""))
    if code is None and "Permission denied" in error.get("message", ""):
        code = "permission_denied"
    return code or error.get("message", "error")
