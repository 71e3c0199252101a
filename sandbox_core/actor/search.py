"""grep and glob beneath a sandbox root: capped, in a stable order, with a cursor to continue.

Both walk the tree through directory descriptors (``os.scandir`` of a descriptor, each
directory opened ``O_NOFOLLOW``): symlinks are listed by glob but never followed, and ``.git``
directories are skipped (as ripgrep does). The walk visits names in sorted order, so the same
tree gives the same answer, and a reply cut at its cap carries ``next_cursor``: pass it back to
get the next page (an opaque string; a cursor from another query is refused).

- :func:`grep`: lines matching a Python regular expression (``re``), in regular files that are
  not binary (no NUL byte in their first 8 KiB); each line shown up to 1,000 characters.
- :func:`glob`: paths matching a shell pattern relative to the search root: ``*`` and ``?``
  within one component, ``**`` across components (``**/*.py``), ``[...]`` classes.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat as stat_module
from collections.abc import Iterator
from typing import Any

from sandbox_core.actor.beneath import Beneath, is_control, refused, split
from sandbox_core.errors import SandboxFileOperationError

DEFAULT_MAX_MATCHES = 100
DEFAULT_MAX_RESULTS = 1000
MAX_LINE_CHARS = 1000
MAX_LINE_BYTES = 64 * 1024
BINARY_PROBE_BYTES = 8192


def _encode_cursor(query: str, parts: tuple[str, ...], line: int) -> str:
    raw = json.dumps([query, list(parts), line], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_cursor(cursor: str | None, query: str) -> tuple[tuple[str, ...], int] | None:
    if not cursor:
        return None
    try:
        found, parts, line = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError) as exc:
        raise SandboxFileOperationError("the cursor is not one this search returned") from exc
    if found != query:
        raise SandboxFileOperationError("the cursor belongs to another search; start again")
    return tuple(str(p) for p in parts), int(line)


def walk(tree: Beneath, start: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], int]]:
    """``(components, st_mode)`` of every entry below ``start`` (depth first, names sorted;
    ``.git`` skipped; symlinks yielded, never entered)."""
    fd = tree.open_dir("/".join(start) or ".", start)
    try:
        with os.scandir(fd) as listing:
            entries = sorted(
                (entry.name, entry.stat(follow_symlinks=False).st_mode) for entry in listing
            )
    finally:
        os.close(fd)
    for name, mode in entries:
        parts = (*start, name)
        if is_control((name,)):
            continue
        yield parts, mode
        if stat_module.S_ISDIR(mode):
            yield from walk(tree, parts)


def _is_binary(fd: int) -> bool:
    return b"\x00" in os.pread(fd, BINARY_PROBE_BYTES, 0)


def grep(
    root: str | os.PathLike[str],
    pattern: str,
    *,
    path: str = ".",
    glob_pattern: str | None = None,
    ignore_case: bool = False,
    max_matches: int = DEFAULT_MAX_MATCHES,
    cursor: str | None = None,
) -> dict[str, Any]:
    """Lines matching ``pattern`` in the files below ``path`` (or the file ``path``).

    Args:
        glob_pattern: only files whose path relative to ``path`` matches it (see :func:`glob`).
        max_matches: the cap of one reply (1 or more).
        cursor: ``next_cursor`` of the previous page.

    Returns:
        ``{"matches": [{"path", "line" (1-based), "text"}], "truncated": bool,
        "next_cursor": str | None}``.

    Raises:
        SandboxFileOperationError: a bad regular expression, cap or cursor.
        SandboxPathError, SandboxFileNotFoundError: the path.
    """
    if max_matches < 1:
        raise SandboxFileOperationError("max_matches must be at least 1")
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise SandboxFileOperationError(f"not a regular expression: {exc}") from None
    query = json.dumps(["grep", pattern, path, glob_pattern, ignore_case])
    resume = _decode_cursor(cursor, query)
    matcher = _glob_regex(glob_pattern) if glob_pattern else None
    start = split(path)
    matches: list[dict[str, Any]] = []
    with Beneath(root) as tree:
        info = tree.lstat(path)
        if stat_module.S_ISLNK(info.st_mode):
            raise refused(path, "is a symlink (never followed)")
        if stat_module.S_ISDIR(info.st_mode):
            candidates: Iterator[tuple[tuple[str, ...], int]] = walk(tree, start)
        else:
            candidates = iter([(start, info.st_mode)])
        for parts, mode in candidates:
            if not stat_module.S_ISREG(mode):
                continue
            if resume is not None and parts < resume[0]:
                continue
            shown = "/".join(parts)
            if matcher is not None and not matcher.match("/".join(parts[len(start) :])):
                continue
            after = resume[1] if resume is not None and parts == resume[0] else 0
            for number, text in _lines(tree, shown):
                if number <= after or not regex.search(text):
                    continue
                if len(matches) == max_matches:
                    last = matches[-1]
                    next_cursor = _encode_cursor(query, split(last["path"]), last["line"])
                    return {"matches": matches, "truncated": True, "next_cursor": next_cursor}
                matches.append({"path": shown, "line": number, "text": text[:MAX_LINE_CHARS]})
    return {"matches": matches, "truncated": False, "next_cursor": None}


def _lines(tree: Beneath, rel: str) -> Iterator[tuple[int, str]]:
    """Numbered lines of a text file (nothing for a binary one); a line longer than 64 KiB
    is read in pieces (each numbered as its line)."""
    try:
        fd = tree.open_file(rel, os.O_RDONLY)
    except (OSError, ValueError):
        return  # gone, a FIFO, or swapped for a symlink meanwhile: skipped
    with os.fdopen(fd, "rb") as handle:
        if _is_binary(fd):
            return
        number, continuing = 0, False
        while True:
            raw = handle.readline(MAX_LINE_BYTES)
            if not raw:
                return
            if not continuing:
                number += 1
            continuing = not raw.endswith(b"\n")
            yield number, raw.decode("utf-8", "replace").rstrip("\r\n")


def glob(
    root: str | os.PathLike[str],
    pattern: str,
    *,
    path: str = ".",
    max_results: int = DEFAULT_MAX_RESULTS,
    cursor: str | None = None,
) -> dict[str, Any]:
    """Entries below ``path`` whose path relative to it matches ``pattern``.

    Returns:
        ``{"paths": [{"path" (relative to the sandbox root), "type"}], "truncated": bool,
        "next_cursor": str | None}``.

    Raises:
        SandboxFileOperationError: a bad cap or cursor; SandboxPathError,
        SandboxFileNotFoundError: the path.
    """
    if max_results < 1:
        raise SandboxFileOperationError("max_results must be at least 1")
    if pattern.startswith("/"):
        pattern = pattern.lstrip("/")
    matcher = _glob_regex(pattern)
    query = json.dumps(["glob", pattern, path])
    resume = _decode_cursor(cursor, query)
    start = split(path)
    found: list[dict[str, Any]] = []
    with Beneath(root) as tree:
        for parts, mode in walk(tree, start):
            if resume is not None and parts <= resume[0]:
                continue
            if not matcher.match("/".join(parts[len(start) :])):
                continue
            if len(found) == max_results:
                last = split(found[-1]["path"])
                return {
                    "paths": found,
                    "truncated": True,
                    "next_cursor": _encode_cursor(query, last, 0),
                }
            found.append({"path": "/".join(parts), "type": _type(mode)})
    return {"paths": found, "truncated": False, "next_cursor": None}


def _type(mode: int) -> str:
    if stat_module.S_ISDIR(mode):
        return "dir"
    if stat_module.S_ISLNK(mode):
        return "symlink"
    return "file" if stat_module.S_ISREG(mode) else "special"


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A shell pattern as an anchored regular expression over ``/``-separated paths."""
    out: list[str] = []
    index, size = 0, len(pattern)
    while index < size:
        char = pattern[index]
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
            continue
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find(
                "]", index + 2 if pattern[index + 1 : index + 2] == "!" else index + 1
            )
            if end < 0:
                out.append(re.escape(char))
            else:
                body = pattern[index + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                index = end
        else:
            out.append(re.escape(char))
        index += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)
