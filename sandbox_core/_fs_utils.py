# ruff: noqa: PTH100, PTH101, PTH102, PTH103, PTH104, PTH105, PTH108, PTH110, PTH112, PTH114, PTH115, PTH116, PTH118, PTH120, PTH211
# Why: this module works on str paths with os-level calls (scandir, lstat, rename) on purpose:
# scans and syncs of 5,000+ entry trees are measured against cp/rsync, and pathlib objects per
# entry cost time for nothing here.
"""Filesystem utilities shared by the directory strategies (seed 002, "Filesystem Utilities").

Public, stable API (re-exported by ``sandbox_core``):

- :func:`backup_directory` copies a tree exactly (modes, timestamps, symlinks *as links*).
- :func:`safe_restore` puts a backup in place of a directory with renames (case 09: EXDEV-safe).
- :func:`compute_changes` / :func:`compute_diff`: what differs between two trees.
- :func:`snapshot_tree` / :func:`differing_paths` / :func:`compute_changes_at`: the fast
  comparison behind ``compute_changes`` (one C-speed walk per tree, then O(changes)).
- :func:`sync_tree` makes a target tree equal to a source tree, crash-safe and O(changes);
  :func:`recover_sync` finishes or undoes a sync interrupted by a crash; :func:`undo_sync`
  reverts a finished sync from the backup it kept; :func:`lock_tree` serialises committers.

Conventions: paths in results are POSIX paths relative to the tree root, sorted. Symlinks are
never followed (case 06). File equality uses rsync's quick check: equal size and mtime (ns) mean
equal; equal size with a different mtime is settled by comparing content
(``filecmp.cmp(shallow=False)``). Directory mtimes are ignored (they move whenever a child does).
Top-level entries whose name starts with ``.sandbox-staging-`` are this module's own staging
areas and are invisible to scans.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import difflib
import errno
import fcntl
import filecmp
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ulid import ULID

StrPath = str | os.PathLike[str]

INNER_STAGING_PREFIX = ".sandbox-staging-"
_JOURNAL = "journal.json"
_LOCK = "lock"
_UNDO = "undo.json"

#: Test-only fault hook: called with the relative path after each path is swapped into the target
#: by :func:`sync_tree`, and with ``""`` once the journal says every path is in (case 09 variant C
#: kills the process from here). ``None`` in production.
fault_hook: Callable[[str], None] | None = None

ProgressCallback = Callable[[int, int], None]


# -- tree model -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """What one path is, without following symlinks.

    ``kind`` is ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"`` (fifo, socket, device);
    ``mode`` holds the permission bits only; ``mtime_ns`` is nanoseconds since the epoch;
    ``target`` is the symlink's target text (``None`` for other kinds).
    """

    kind: str
    mode: int
    size: int
    mtime_ns: int
    target: str | None = None

    def to_json(self) -> list[Any]:
        """Compact JSON form ``[kind, mode, size, mtime_ns, target]``."""
        return [self.kind, self.mode, self.size, self.mtime_ns, self.target]

    @classmethod
    def from_json(cls, data: list[Any]) -> Entry:
        """Inverse of :meth:`to_json`."""
        return cls(str(data[0]), int(data[1]), int(data[2]), int(data[3]), data[4])


def _kind(st_mode: int) -> str:
    if stat.S_ISLNK(st_mode):
        return "symlink"
    if stat.S_ISDIR(st_mode):
        return "dir"
    if stat.S_ISREG(st_mode):
        return "file"
    return "other"


def entry_of(path: StrPath) -> Entry | None:
    """The :class:`Entry` of ``path`` (lstat), or ``None`` when nothing is there (also when an
    ancestor is not a directory)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    kind = _kind(st.st_mode)
    target = os.readlink(path) if kind == "symlink" else None
    return Entry(kind, stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, target)


def _is_excluded(rel: str, exclude: frozenset[str]) -> bool:
    if "/" not in rel and rel.startswith(INNER_STAGING_PREFIX):
        return True
    return any(rel == ex or rel.startswith(ex + "/") for ex in exclude)


def scan_tree(root: StrPath, *, exclude: Iterable[str] = ()) -> dict[str, Entry]:
    """Map every path below ``root`` (not ``root`` itself) to its :class:`Entry`.

    Symlinks are recorded, never followed, so link loops cost nothing (case 06). ``exclude`` lists
    relative paths whose subtrees are skipped (e.g. ``[".git"]``).

    Raises:
        OSError: ``root`` is missing or unreadable.
    """
    excluded = frozenset(exclude)
    result: dict[str, Entry] = {}
    stack: list[tuple[str, str]] = [(os.fspath(root), "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as it:
            for item in it:
                rel = prefix + item.name
                if _is_excluded(rel, excluded):
                    continue
                st = item.stat(follow_symlinks=False)
                kind = _kind(st.st_mode)
                target = os.readlink(item.path) if kind == "symlink" else None
                result[rel] = Entry(
                    kind, stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, target
                )
                if kind == "dir":
                    stack.append((item.path, rel + "/"))
    return result


def entries_differ(a: Entry, b: Entry, path_a: StrPath | None, path_b: StrPath | None) -> bool:
    """True when two entries are different content (see module docstring for the rules).

    With ``path_a``/``path_b`` given, files of equal size but different mtime are compared by
    content; without them such files count as different.
    """
    if a.kind != b.kind or a.mode != b.mode:
        return True
    if a.kind == "symlink":
        return a.target != b.target
    if a.kind == "file":
        if a.size != b.size:
            return True
        if a.mtime_ns == b.mtime_ns:
            return False
        if path_a is None or path_b is None:
            return True
        return not filecmp.cmp(path_a, path_b, shallow=False)
    return False


@dataclass(frozen=True)
class TreeChanges:
    """Differences from an original tree to a modified one (seed 002, "compute_diff").

    Each list holds sorted POSIX paths relative to the tree roots, directories included:
    ``added`` exist only in the modified tree (a new directory and everything in it),
    ``deleted`` only in the original, ``changed`` in both with a different type, mode, symlink
    target or content. A type swap (file <-> dir <-> symlink) lists the path as changed and the
    old/new children as deleted/added (case 08). A directory whose children changed is not
    itself changed.
    """

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        """True when the trees are equal."""
        return not (self.added or self.changed or self.deleted)

    @property
    def paths(self) -> list[str]:
        """Every touched path, sorted."""
        return sorted({*self.added, *self.changed, *self.deleted})

    def to_dict(self) -> dict[str, list[str]]:
        """JSON-ready form."""
        return {"added": self.added, "changed": self.changed, "deleted": self.deleted}


def diff_entries(
    old: dict[str, Entry],
    new: dict[str, Entry],
    *,
    old_root: StrPath | None = None,
    new_root: StrPath | None = None,
) -> TreeChanges:
    """:class:`TreeChanges` between two scans; roots enable content comparison of files."""
    added = [p for p in new if p not in old]
    deleted = [p for p in old if p not in new]
    changed = [
        p
        for p, entry in new.items()
        if p in old
        and entries_differ(
            old[p],
            entry,
            os.path.join(old_root, p) if old_root is not None else None,
            os.path.join(new_root, p) if new_root is not None else None,
        )
    ]
    return TreeChanges(sorted(added), sorted(changed), sorted(deleted))


def compute_changes(
    original: StrPath, modified: StrPath, *, exclude: Iterable[str] = ()
) -> TreeChanges:
    """Structured differences from ``original`` to ``modified`` (both directories).

    Raises:
        OSError: either tree cannot be read.
    """
    excluded = list(exclude)
    old, new = snapshot_trees(original, modified, exclude=excluded)
    return compute_changes_at(original, modified, differing_paths(old, new))


# -- quick-check snapshots ----------------------------------------------------------------------

_NS = 1_000_000_000
_GLOB_SPECIALS = "*?[]\\"


def _mtime_text(ns: int) -> str:
    """``st_mtime_ns`` as GNU find's ``%T@`` prints it (seconds, nine digits of ns, then 0)."""
    return f"{ns // _NS}.{ns % _NS:09d}0"


def signature(entry: Entry) -> str:
    """The quick-check signature of an entry: equal signatures mean "not changed".

    ``"f <mode> <size> <mtime>"`` for files, ``"l <mode> <target>"`` for symlinks,
    ``"d <mode>"`` for directories (their mtime is ignored) and ``"o <mode>"`` for other kinds;
    modes in octal, mtime as :func:`_mtime_text`. Two entries with equal signatures never
    :func:`entries_differ`; unequal signatures may still hold equal content (settled by
    :func:`compute_changes_at`).
    """
    if entry.kind == "file":
        return f"f {entry.mode:o} {entry.size} {_mtime_text(entry.mtime_ns)}"
    if entry.kind == "symlink":
        return f"l {entry.mode:o} {entry.target}"
    return f"{entry.kind[0]} {entry.mode:o}"


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in _GLOB_SPECIALS else ch for ch in text)


def _snapshot_with_find(find: str, root: str, exclude: frozenset[str]) -> dict[str, str]:
    prune: list[str] = ["-path", f"./{INNER_STAGING_PREFIX}*"]
    for rel in sorted(exclude):
        prune += ["-o", "-path", "./" + _glob_escape(rel)]
    proc = subprocess.run(
        [
            find, ".", "-mindepth", "1",
            "(", *prune, ")", "-prune",
            "-o", "-type", "d", "-printf", "%P\\0d %m\\0",
            "-o", "-type", "l", "-printf", "%P\\0l %m %l\\0",
            "-o", "-type", "f", "-printf", "%P\\0f %m %s %T@\\0",
            "-o", "-printf", "%P\\0o %m\\0",
        ],
        cwd=root,
        capture_output=True,
        check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        message = os.fsdecode(proc.stderr).strip()
        raise OSError(errno.EIO, f"find failed: {message}", root)
    fields = os.fsdecode(proc.stdout).split("\0")
    fields.pop()  # the text ends with a separator
    pairs = iter(fields)
    return dict(zip(pairs, pairs, strict=True))


def snapshot_tree(root: StrPath, *, exclude: Iterable[str] = ()) -> dict[str, str]:
    """Map every path below ``root`` to its :func:`signature`, without following symlinks.

    The same paths as :func:`scan_tree`, in about half its time on large trees: GNU ``find``
    does the walk and the ``lstat`` calls in C when it is installed (falls back to
    :func:`scan_tree`). Comparing two snapshots is a set operation (:func:`differing_paths`), so
    a commit costs one C-speed walk per tree plus O(changes) Python work, like ``rsync``.

    Raises:
        OSError: ``root`` is missing or a directory in it cannot be read.
    """
    root_s = os.fspath(root)
    if not os.path.isdir(root_s):
        raise FileNotFoundError(errno.ENOENT, "directory not found", root_s)
    excluded = frozenset(exclude)
    find = shutil.which("find")
    if find is not None:
        return _snapshot_with_find(find, root_s, excluded)
    return {rel: signature(entry) for rel, entry in scan_tree(root_s, exclude=excluded).items()}


def snapshot_trees(*roots: StrPath, exclude: Iterable[str] = ()) -> list[dict[str, str]]:
    """:func:`snapshot_tree` of several trees at once, one thread (and ``find``) per tree, as
    ``rsync`` walks sender and receiver side in two processes.

    Raises:
        OSError: a tree cannot be read.
    """
    excluded = list(exclude)
    if len(roots) < 2:  # no thread for a single walk
        return [snapshot_tree(root, exclude=excluded) for root in roots]
    with ThreadPoolExecutor(max_workers=len(roots)) as pool:
        futures = [pool.submit(snapshot_tree, root, exclude=excluded) for root in roots]
        return [future.result() for future in futures]


def differing_paths(a: dict[str, str], b: dict[str, str]) -> set[str]:
    """Paths present in only one snapshot or with different signatures in the two."""
    return {rel for rel, _ in set(a.items()).symmetric_difference(b.items())}


def compute_changes_at(original: StrPath, modified: StrPath, paths: Iterable[str]) -> TreeChanges:
    """:class:`TreeChanges` from ``original`` to ``modified``, looking only at ``paths``.

    Each path is compared as itself (``lstat`` of both sides, content when the quick check is
    not enough), not its subtree: pass every path that may differ, e.g. the
    :func:`differing_paths` of two snapshots. O(len(paths)).

    Raises:
        OSError: a path cannot be read.
    """
    added: list[str] = []
    changed: list[str] = []
    deleted: list[str] = []
    for rel in paths:
        old_path, new_path = os.path.join(original, rel), os.path.join(modified, rel)
        old, new = entry_of(old_path), entry_of(new_path)
        if old is None and new is not None:
            added.append(rel)
        elif new is None and old is not None:
            deleted.append(rel)
        elif old is not None and new is not None and entries_differ(old, new, old_path, new_path):
            changed.append(rel)
    return TreeChanges(sorted(added), sorted(changed), sorted(deleted))


# -- unified diff -----------------------------------------------------------------------------


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
    changes = diff_entries(old, new, old_root=original, new_root=modified)
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


# -- copying ----------------------------------------------------------------------------------


def _copy_metadata(src: str, dst: str, st: os.stat_result) -> None:
    """Ownership (when permitted), mode and timestamps of ``src`` onto ``dst`` (no following)."""
    with contextlib.suppress(PermissionError):
        os.lchown(dst, st.st_uid, st.st_gid)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def copy_entry(src: StrPath, dst: StrPath) -> None:
    """Copy one path exactly to ``dst`` (must not exist): a file, a symlink (as a link) or a
    whole directory tree. Pure Python, used for small copies (staging of changed paths).

    Raises:
        OSError: on any I/O failure; FIFOs, sockets and devices raise ``EINVAL``.
    """
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    st = os.lstat(src_s)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src_s), dst_s)
        _copy_metadata(src_s, dst_s, st)
    elif stat.S_ISREG(st.st_mode):
        shutil.copy2(src_s, dst_s, follow_symlinks=False)
        with contextlib.suppress(PermissionError):
            os.lchown(dst_s, st.st_uid, st.st_gid)
    elif stat.S_ISDIR(st.st_mode):
        os.mkdir(dst_s, 0o700)
        with os.scandir(src_s) as it:
            children = [item.name for item in it]
        for name in children:
            copy_entry(os.path.join(src_s, name), os.path.join(dst_s, name))
        # Metadata last: children change the directory's mtime, and a read-only mode would
        # stop them from being written.
        _copy_metadata(src_s, dst_s, st)
    else:
        raise OSError(errno.EINVAL, "cannot copy special file", src_s)


def backup_directory(src: StrPath, dst: StrPath) -> None:
    """Copy directory ``src`` to ``dst`` (which must not exist), exactly (seed 002).

    Permissions, ownership (as root), timestamps, empty directories are preserved; symlinks are
    copied as links and never followed, so link loops and dangling links are kept as they are
    (case 06). Uses ``cp -a --reflink=auto`` when available (measured ~2x faster than a Python
    walk on a 5,000-file tree), else :func:`copy_entry`.

    Raises:
        NotADirectoryError: ``src`` is not a directory.
        FileExistsError: ``dst`` exists.
        OSError: any other failure, with ``cp``'s message when ``cp`` was used.
    """
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    if not os.path.isdir(src_s) or os.path.islink(src_s):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", src_s)
    if os.path.lexists(dst_s):
        raise FileExistsError(errno.EEXIST, "backup destination exists", dst_s)
    cp = shutil.which("cp")
    if cp is None:
        copy_entry(src_s, dst_s)
        return
    proc = subprocess.run(
        [cp, "-a", "--reflink=auto", "--no-target-directory", src_s, dst_s],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise OSError(errno.EIO, f"cp -a failed: {proc.stderr.strip()}", src_s)


def _remove(path: str) -> None:
    """Remove whatever is at ``path`` (file, link, or tree); missing is fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _move(src: str, dst: str) -> None:
    """Rename, or copy + remove when ``dst`` is on another filesystem (EXDEV)."""
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _remove(dst)
        copy_entry(src, dst)
        _remove(src)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: str, data: object) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


# -- safe_restore -----------------------------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths with ``renameat2(RENAME_EXCHANGE)``; False if unsupported."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), a)


def _sibling(path: str, tag: str) -> str:
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{name}.sandbox-{tag}-{ULID()}")


def safe_restore(backup: StrPath, original: StrPath) -> None:
    """Replace directory ``original`` with ``backup`` by renames (seed 002, "safe_restore").

    The backup is consumed (moved). When both are on one filesystem the swap is a single atomic
    ``renameat2(RENAME_EXCHANGE)`` (or two renames where unsupported); when ``backup`` is on
    another filesystem it is first copied into a hidden sibling of ``original``
    (``.<name>.sandbox-restore-<ulid>``) and then swapped (case 09). The previous content is
    removed afterwards; no hidden siblings remain on success. ``original`` may be missing.

    Raises:
        FileNotFoundError: ``backup`` does not exist.
        OSError: any other failure; ``original`` is then either fully old or fully restored.
    """
    backup_s, original_s = os.path.abspath(backup), os.path.abspath(original)
    if not os.path.lexists(backup_s):
        raise FileNotFoundError(errno.ENOENT, "backup not found", backup_s)
    source = backup_s
    parent_dev = os.stat(os.path.dirname(original_s)).st_dev
    if os.lstat(backup_s).st_dev != parent_dev:
        source = _sibling(original_s, "restore")
        try:
            copy_entry(backup_s, source)
        except BaseException:
            _remove(source)
            raise
    if not os.path.lexists(original_s):
        os.rename(source, original_s)
    elif _exchange(source, original_s):
        _remove(source)  # now holds the previous content
    else:
        old = _sibling(original_s, "old")
        os.rename(original_s, old)
        os.rename(source, original_s)
        _remove(old)
    if source != backup_s:
        _remove(backup_s)


# -- sync engine ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Op:
    """One step of a sync: replace the entry at ``path`` (with ``new_src`` or nothing), or only
    change a directory's mode (``chmod`` = (old, new))."""

    path: str
    new_src: str | None = None
    had_old: bool = False
    chmod: tuple[int, int] | None = None


def staging_dir_for(target: StrPath) -> str:
    """Path for a new staging area of ``target``, on the same filesystem as ``target``.

    A hidden sibling ``<parent>/.<name>.sandbox-staging-<ulid>``; when ``target`` is a mount
    point (its parent is another filesystem) a hidden child ``.sandbox-staging-<ulid>`` instead,
    which scans ignore.
    """
    target_s = os.path.abspath(target)
    if os.stat(os.path.dirname(target_s)).st_dev == os.stat(target_s).st_dev:
        return _sibling(target_s, "staging")
    return os.path.join(target_s, f"{INNER_STAGING_PREFIX}{ULID()}")


def _staging_dirs(target: str) -> list[str]:
    parent, name = os.path.split(target)
    found: list[str] = []
    sibling_prefix = f".{name}.sandbox-staging-"
    with contextlib.suppress(FileNotFoundError), os.scandir(parent) as it:
        found += [i.path for i in it if i.name.startswith(sibling_prefix)]
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(target) as it:
        found += [i.path for i in it if i.name.startswith(INNER_STAGING_PREFIX)]
    return sorted(found)


@contextlib.contextmanager
def lock_tree(target: StrPath) -> Iterator[None]:
    """Hold an exclusive ``flock`` on directory ``target`` for a compare-then-sync sequence.

    Two committers of the same original serialise here, so neither syncs on a comparison the
    other made stale. The lock lives on the directory itself (no lock file is left beside it)
    and is released by the kernel if the process dies. :func:`sync_tree` does not take it: the
    caller holds it around its own comparison and the sync.

    Raises:
        OSError: ``target`` cannot be opened.
    """
    fd = os.open(os.fspath(target), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ancestors(rel: str) -> Iterable[str]:
    while "/" in rel:
        rel = rel.rsplit("/", 1)[0]
        yield rel


def _plan(source: str, target: str, changes: TreeChanges) -> list[_Op]:
    """Reduce path-level changes to disjoint replace roots plus directory mode changes."""
    roots: set[str] = set()
    ops: list[_Op] = []
    for rel in changes.paths:
        if any(a in roots for a in _ancestors(rel)):
            continue
        new, old = entry_of(os.path.join(source, rel)), entry_of(os.path.join(target, rel))
        if new is None and old is None:
            continue
        if new is not None and old is not None and new.kind == old.kind == "dir":
            if new.mode != old.mode:
                ops.append(_Op(rel, chmod=(old.mode, new.mode)))
            continue
        # A new path whose parent is missing in the target: replace the highest missing
        # ancestor instead, so every rename lands in an existing directory.
        root = rel
        for anc in _ancestors(rel):
            if os.path.lexists(os.path.join(target, anc)):
                break
            root = anc
        if root in roots:
            continue
        roots.add(root)
        src_path = os.path.join(source, root)
        ops.append(
            _Op(
                root,
                new_src=src_path if os.path.lexists(src_path) else None,
                had_old=os.path.lexists(os.path.join(target, root)),
            )
        )
    # Drop ops nested under a root that was promoted after them. Mode changes go last so that a
    # directory made read-only does not block renames into it.
    kept = [op for op in ops if not any(a in roots for a in _ancestors(op.path))]
    return [op for op in kept if op.chmod is None] + [op for op in kept if op.chmod is not None]


def _journal_ops(ops: list[_Op]) -> list[dict[str, Any]]:
    return [
        {
            "path": op.path,
            "new": op.new_src is not None,
            "old": op.had_old,
            "chmod": list(op.chmod) if op.chmod else None,
        }
        for op in ops
    ]


def _lock(staging: str, *, blocking: bool) -> int | None:
    fd = os.open(os.path.join(staging, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _apply(
    target: str, staging: str, ops: list[dict[str, Any]], progress: ProgressCallback | None
) -> None:
    total = len(ops)
    for index, op in enumerate(ops):
        dest = os.path.join(target, op["path"])
        if op["chmod"]:
            os.chmod(dest, op["chmod"][1])
        else:
            if op["old"]:
                os.rename(dest, os.path.join(staging, "old", str(index)))
            if op["new"]:
                os.rename(os.path.join(staging, "new", str(index)), dest)
        if fault_hook is not None:
            fault_hook(op["path"])
        if progress is not None:
            progress(index + 1, total)


def _undo(target: str, staging: str, ops: list[dict[str, Any]]) -> None:
    """Put every op of an interrupted apply back, newest first (idempotent)."""
    for index in reversed(range(len(ops))):
        op = ops[index]
        dest = os.path.join(target, op["path"])
        if op["chmod"]:
            if os.path.isdir(dest):
                os.chmod(dest, op["chmod"][0])
            continue
        staged_new = os.path.join(staging, "new", str(index))
        kept_old = os.path.join(staging, "old", str(index))
        if op["new"] and not os.path.lexists(staged_new) and os.path.lexists(dest):
            # The new entry was swapped in: move it back (not delete), so a second undo of the
            # same journal sees it staged again and leaves the restored old entry alone.
            os.rename(dest, staged_new)
        if op["old"] and os.path.lexists(kept_old):
            os.rename(kept_old, dest)


def _finish(staging: str, journal: dict[str, Any]) -> None:
    """After a complete apply: hand the replaced entries to ``keep_backup``, drop staging."""
    keep = journal.get("keep_backup")
    ops: list[dict[str, Any]] = journal["ops"]
    if keep:
        tree = os.path.join(keep, "tree")
        os.makedirs(tree, exist_ok=True)
        for index, op in enumerate(ops):
            kept_old = os.path.join(staging, "old", str(index))
            if op["old"] and not op["chmod"] and os.path.lexists(kept_old):
                dest = os.path.join(tree, op["path"])
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                _remove(dest)
                _move(kept_old, dest)
        _write_json_atomic(os.path.join(keep, _UNDO), {"version": 1, "ops": ops})
    shutil.rmtree(staging)


def _run(
    target: str,
    ops: list[_Op],
    *,
    keep_backup: str | None,
    progress: ProgressCallback | None,
) -> None:
    """Stage, journal, apply, finish; on an error undo to the old state and re-raise."""
    staging = staging_dir_for(target)
    os.mkdir(staging, 0o700)
    lock_fd = _lock(staging, blocking=True)
    try:
        os.mkdir(os.path.join(staging, "new"))
        os.mkdir(os.path.join(staging, "old"))
        for index, op in enumerate(ops):
            if op.new_src is not None:
                copy_entry(op.new_src, os.path.join(staging, "new", str(index)))
        journal: dict[str, Any] = {
            "version": 1,
            "target": target,
            "state": "prepared",
            "keep_backup": keep_backup,
            "ops": _journal_ops(ops),
        }
        _write_json_atomic(os.path.join(staging, _JOURNAL), journal)
        _apply(target, staging, journal["ops"], progress)
        journal["state"] = "applied"
        _write_json_atomic(os.path.join(staging, _JOURNAL), journal)
        if fault_hook is not None:
            fault_hook("")
        _finish(staging, journal)
    except BaseException:
        if os.path.isdir(staging):
            _recover_one(target, staging, locked=True)
        raise
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def _recover_one(target: str, staging: str, *, locked: bool = False) -> str | None:
    """Recover one staging area; returns what was done or None when a live sync holds it."""
    lock_fd = None
    if not locked:
        if not os.path.exists(os.path.join(staging, _LOCK)):
            shutil.rmtree(staging)
            return "discarded"
        lock_fd = _lock(staging, blocking=False)
        if lock_fd is None:
            return None
    try:
        try:
            with open(os.path.join(staging, _JOURNAL), encoding="utf-8") as handle:
                journal = json.load(handle)
        except FileNotFoundError:
            shutil.rmtree(staging)  # crashed while staging: the target was never touched
            return "discarded"
        if journal["state"] == "applied":
            _finish(staging, journal)
            return "completed"
        _undo(target, staging, journal["ops"])
        shutil.rmtree(staging)
        return "rolled_back"
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def recover_sync(target: StrPath) -> list[str]:
    """Finish or undo every interrupted :func:`sync_tree` of ``target`` (case 09 variant C).

    Reads the on-disk journal of each staging area of ``target``: a sync that had swapped in all
    its paths is completed (its backups handed over, staging removed); one interrupted while
    swapping is undone path by path, so ``target`` ends exactly old or exactly new; one that
    crashed while staging is discarded. Staging areas locked by a live sync are left alone.

    Returns:
        One outcome per staging area found: ``"completed"``, ``"rolled_back"`` or
        ``"discarded"`` (empty when there was nothing to recover).

    Raises:
        OSError: recovery itself failed (safe to retry).
    """
    target_s = os.path.abspath(target)
    outcomes: list[str] = []
    for staging in _staging_dirs(target_s):
        outcome = _recover_one(target_s, staging)
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes


def sync_tree(
    source: StrPath,
    target: StrPath,
    *,
    changes: TreeChanges | None = None,
    on_progress: ProgressCallback | None = None,
    backup_dir: StrPath | None = None,
    exclude: Iterable[str] = (),
) -> TreeChanges:
    """Make directory ``target`` equal to directory ``source``, crash-safe, in O(changes).

    Files, directories, symlinks (as links), modes, deletions and type swaps are applied. The
    new entries are first copied into a staging area on ``target``'s filesystem (see
    :func:`staging_dir_for`, so a ``source`` on another filesystem is fine: case 09); a journal is
    written; then each changed path is swapped in with two renames, keeping the replaced entry in
    the staging area. An error undoes the swaps already made; a crash is repaired by
    :func:`recover_sync` (called first by every sync). Nothing is left beside ``target``.

    Args:
        source: the tree to copy from.
        target: the existing directory to update.
        changes: the paths to apply (default :func:`compute_changes` of ``target`` ->
            ``source``). Passing a subset syncs only those paths, leaving the rest of
            ``target`` as it is.
        on_progress: called as ``on_progress(done, total)`` after each swapped path.
        backup_dir: when given (must not exist yet), the replaced entries are kept there
            (``tree/<path>`` plus ``undo.json``) so that :func:`undo_sync` can revert the sync.
        exclude: relative paths ignored when computing ``changes``.

    Returns:
        The applied :class:`TreeChanges`.

    Raises:
        FileNotFoundError: ``source`` or ``target`` is missing.
        FileExistsError: ``backup_dir`` exists.
        OSError: the sync failed; ``target`` is unchanged.
    """
    source_s, target_s = os.path.abspath(source), os.path.abspath(target)
    for path in (source_s, target_s):
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, "directory not found", path)
    keep = os.path.abspath(backup_dir) if backup_dir is not None else None
    if keep is not None and os.path.lexists(keep):
        raise FileExistsError(errno.EEXIST, "backup directory exists", keep)
    recover_sync(target_s)
    if changes is None:
        changes = compute_changes(target_s, source_s, exclude=exclude)
    ops = _plan(source_s, target_s, changes)
    if keep is not None:
        os.makedirs(keep)
    _run(target_s, ops, keep_backup=keep, progress=on_progress)
    return changes


def undo_sync(backup_dir: StrPath, target: StrPath) -> None:
    """Revert the :func:`sync_tree` that filled ``backup_dir``: replaced entries come back,
    added ones go, directory modes are reset. Crash-safe like :func:`sync_tree`; the backup is
    left in place (remove it when done).

    Raises:
        FileNotFoundError: ``backup_dir`` holds no ``undo.json``.
        OSError: the undo failed; ``target`` is unchanged.
    """
    keep, target_s = os.path.abspath(backup_dir), os.path.abspath(target)
    with open(os.path.join(keep, _UNDO), encoding="utf-8") as handle:
        record = json.load(handle)
    recover_sync(target_s)
    ops: list[_Op] = []
    for op in reversed(record["ops"]):
        if op["chmod"]:
            old_mode, new_mode = op["chmod"]
            ops.append(_Op(op["path"], chmod=(new_mode, old_mode)))
            continue
        ops.append(
            _Op(
                op["path"],
                new_src=os.path.join(keep, "tree", op["path"]) if op["old"] else None,
                had_old=os.path.lexists(os.path.join(target_s, op["path"])),
            )
        )
    _run(target_s, ops, keep_backup=None, progress=None)
