# ruff: noqa: PTH118
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""Text views of a change: :func:`compute_diff` (the unified diff git would print) and
:func:`change_stats` (lines added and removed, bytes of new content).

Symlinks diff as their target text; binary files (a NUL byte, not UTF-8, or over 8 MiB for the
stats) show no lines.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
from collections.abc import Iterable

from sandbox_core.tree.scan import Entry, StrPath, TreeChanges, _entry, diff_entries, scan_tree


def _read_text(path: str, entry: Entry | None) -> list[str] | None:
    """Lines of a text file, the target of a symlink, ``[]`` when absent; None when binary."""
    if entry is None or entry.kind == "dir":
        return []
    if entry.kind == "symlink":
        return [f"{entry.target}\n"]
    if entry.kind != "file":
        return None
    with open(path, "rb") as handle:
        data = handle.read()
    if b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _git_mode(entry: Entry) -> str:
    prefix = {"symlink": "120", "dir": "040", "file": "100"}.get(entry.kind, "000")
    return f"{prefix}{entry.mode:03o}" if entry.kind != "symlink" else "120000"


def compute_diff(original: StrPath, modified: StrPath, *, exclude: Iterable[str] = ()) -> str:
    """Unified diff text from ``original`` to ``modified`` (seed 002, "compute_diff").

    One ``diff --git a/<p> b/<p>`` section per added, changed or deleted non-directory path,
    sorted: ``new file mode`` / ``deleted file mode`` / ``old mode`` + ``new mode`` lines as git
    prints them, then ``---``/``+++`` headers (``/dev/null`` for a missing side) and hunks.
    Symlinks diff as their target text; binary files (NUL byte or not UTF-8) print
    ``Binary files a/<p> and b/<p> differ``. Returns ``""`` for equal trees.

    Raises:
        OSError: a tree cannot be read.
    """
    excluded = list(exclude)
    old = scan_tree(original, exclude=excluded)
    new = scan_tree(modified, exclude=excluded)
    # A unified diff cannot show an xattr: skip reading them for every path of both trees.
    changes = diff_entries(old, new, old_root=original, new_root=modified, xattrs=False)
    out: list[str] = []
    for rel in changes.paths:
        a, b = old.get(rel), new.get(rel)
        a_shown = a if a is not None and a.kind != "dir" else None
        b_shown = b if b is not None and b.kind != "dir" else None
        if a_shown is None and b_shown is None:
            continue
        out.append(f"diff --git a/{rel} b/{rel}\n")
        if a_shown is None and b_shown is not None:
            out.append(f"new file mode {_git_mode(b_shown)}\n")
        elif b_shown is None and a_shown is not None:
            out.append(f"deleted file mode {_git_mode(a_shown)}\n")
        elif (
            a_shown is not None and b_shown is not None and _git_mode(a_shown) != _git_mode(b_shown)
        ):
            out.append(f"old mode {_git_mode(a_shown)}\nnew mode {_git_mode(b_shown)}\n")
        a_lines = _read_text(os.path.join(original, rel), a_shown)
        b_lines = _read_text(os.path.join(modified, rel), b_shown)
        from_name = f"a/{rel}" if a_shown is not None else "/dev/null"
        to_name = f"b/{rel}" if b_shown is not None else "/dev/null"
        if a_lines is None or b_lines is None:
            out.append(f"Binary files {from_name} and {to_name} differ\n")
            continue
        for line in difflib.unified_diff(a_lines, b_lines, from_name, to_name):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


_TEXT_LIMIT = 8 << 20
"""Files larger than this (bytes) count as binary in :func:`change_stats` (no line diff)."""


def _text_lines(path: str) -> list[str] | None:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if not stat.S_ISREG(st.st_mode):
        return []
    if st.st_size > _TEXT_LIMIT:
        return None
    return _read_text(path, _entry(path, st))


def change_stats(
    old_root: StrPath, new_root: StrPath, changes: TreeChanges, *, lines: bool = True
) -> tuple[int, int, int]:
    """``(lines_added, lines_removed, bytes)`` of a change set: text lines added and removed
    (a unified diff's ``+``/``-`` lines; binary files, and files over 8 MiB, count none) and
    the size in bytes of the new content of added and changed regular files. ``lines=False``
    counts no lines (both 0) and reads no file: only the sizes, from ``lstat``.

    Raises:
        OSError: a file cannot be read.
    """
    old_s, new_s = os.fspath(old_root), os.fspath(new_root)
    added = removed = size = 0
    for rel in [*changes.added, *changes.changed, *changes.deleted]:
        new_path, old_path = os.path.join(new_s, rel), os.path.join(old_s, rel)
        if rel not in changes.deleted:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                st = os.lstat(new_path)
                if stat.S_ISREG(st.st_mode):
                    size += st.st_size
        if not lines:
            continue
        old_lines = [] if rel in changes.added else _text_lines(old_path)
        new_lines = [] if rel in changes.deleted else _text_lines(new_path)
        if old_lines is None or new_lines is None:
            continue
        for line in difflib.unified_diff(old_lines, new_lines, n=0):
            if line.startswith(("+++", "---")):
                continue
            if line.startswith("+"):
                added += 1
            elif line.startswith("-"):
                removed += 1
    return added, removed, size
