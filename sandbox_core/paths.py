"""Containment of resource-relative paths inside a sandbox root (every strategy's ``get_path``)."""

from __future__ import annotations

import os
from pathlib import Path

TRAVERSAL_MESSAGE = "Path traversal not allowed"


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
    joined = base / candidate
    # resolve() follows every existing symlink on the way; a link pointing out of the root shows
    # up as a resolved path that is no longer below it.
    resolved = joined.resolve()
    if resolved != base and base not in resolved.parents:
        raise ValueError(TRAVERSAL_MESSAGE)
    return str(joined)
