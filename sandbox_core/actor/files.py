"""``SandboxFiles``: an actor's file operations beneath one sandbox root.

One implementation for every door: the workspace agent's routes and the local executor call
the same methods. Every path goes through :mod:`sandbox_core.actor.beneath` (directory
descriptors, ``O_NOFOLLOW`` per component: no symlink is ever followed, no ``..``, nothing
absolute; no write under ``.git``). Every change (write, append, edit, delete, move, mkdir) is
reported to the ``audit`` callback as ``{"op", "path", ...}`` after it happened.

Semantics, as agent frameworks define them:

- ``edit(path, old, new, replace_all=False)`` is the exact-match edit of LangChain Deep Agents'
  ``BackendProtocol.edit`` (and of the coding agents that share it): ``old`` must occur in the
  file; when it occurs more than once the edit is refused unless ``replace_all``; the reply
  says how many occurrences were replaced. Nothing is written when refused.
- Reads take a byte range (``offset``, ``length``) and stream in chunks
  (:meth:`SandboxFiles.open_range`): memory stays bounded whatever the file's size.
- Writes are in place (the file keeps its inode, mode and hard links), parents made on demand.

Errors (all :class:`~sandbox_core.errors.SandboxError`): ``SandboxPathError`` (refused path),
``SandboxFileNotFoundError``, ``SandboxFileOperationError`` (exists, not a regular file, not
empty, edit refused), ``SandboxError`` for any other I/O failure (the ``OSError`` chained).
"""

from __future__ import annotations

import base64
import errno
import os
import shutil
import stat as stat_module
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sandbox_core.actor.beneath import Beneath, check_writable, split
from sandbox_core.errors import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileOperationError,
    SandboxPathError,
)

CHUNK_BYTES = 1024 * 1024
MAX_EDIT_BYTES = 64 * 1024 * 1024
MAX_INLINE_READ_BYTES = 16 * 1024 * 1024
Audit = Callable[[dict[str, Any]], None]


def _kind(mode: int) -> str:
    if stat_module.S_ISDIR(mode):
        return "dir"
    if stat_module.S_ISLNK(mode):
        return "symlink"
    if stat_module.S_ISREG(mode):
        return "file"
    return "special"


class FileRange:
    """An open byte range of one regular file: ``size`` (the whole file's), ``offset``,
    ``length`` (what :meth:`chunks` yields at most). Close it (or use ``with``)."""

    def __init__(self, fd: int, path: str, offset: int, length: int | None) -> None:
        self.fd = fd
        self.path = path
        self.size = os.fstat(fd).st_size
        self.offset = min(max(0, offset), self.size)
        available = self.size - self.offset
        self.length = available if length is None else max(0, min(length, available))

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The range in chunks of at most ``chunk_bytes`` (``os.pread``: no shared offset)."""
        position, end = self.offset, self.offset + self.length
        while position < end:
            data = os.pread(self.fd, min(chunk_bytes, end - position), position)
            if not data:
                return  # the file shrank meanwhile
            position += len(data)
            yield data

    def read(self) -> bytes:
        """The whole range at once (callers cap ``length``)."""
        return b"".join(self.chunks())

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileRange:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class SandboxFiles:
    """The file operations beneath ``root`` (a sandbox's working tree).

    Args:
        root: the sandbox's root directory (``BaseSandbox.get_path(".")``).
        audit: called with one record per change (``None``: no audit).
        protected: top-level names no change may touch (the strategy's own files).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        audit: Audit | None = None,
        protected: frozenset[str] = frozenset(),
    ) -> None:
        self.root = os.fspath(root)
        self._audit = audit
        self.protected = protected

    def _writable(self, rel: str) -> None:
        check_writable(rel, split(rel), self.protected)

    def _record(self, record: dict[str, Any]) -> None:
        if self._audit is not None:
            self._audit(record)

    def _beneath(self) -> Beneath:
        return Beneath(self.root)

    # -- reads --------------------------------------------------------------------------------

    def open_range(self, rel: str, offset: int = 0, length: int | None = None) -> FileRange:
        """Open the byte range ``[offset, offset+length)`` of the regular file ``rel``.

        Raises:
            SandboxPathError, SandboxFileNotFoundError, SandboxFileOperationError (not a
            regular file; a negative offset or length).
        """
        if offset < 0 or (length is not None and length < 0):
            raise SandboxFileOperationError("offset and length must not be negative")
        with self._beneath() as tree:
            fd = self._open(tree, rel, os.O_RDONLY)
        return FileRange(fd, rel, offset, length)

    def read(self, rel: str, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes of ``rel`` in the range (at most 16 MiB in one call: use
        :meth:`open_range` to stream more).

        Raises:
            The errors of :meth:`open_range`; SandboxFileOperationError above the cap.
        """
        with self.open_range(rel, offset, length) as opened:
            if opened.length > MAX_INLINE_READ_BYTES:
                raise SandboxFileOperationError(
                    f"{rel!r}: {opened.length} bytes asked, at most {MAX_INLINE_READ_BYTES} in "
                    "one read; read a range (offset, length) or stream it"
                )
            return opened.read()

    def read_text(self, rel: str, offset: int = 0, length: int | None = None) -> dict[str, Any]:
        """``{"path", "offset", "length", "size", "encoding", "content"}``: ``content`` is the
        text when the range is UTF-8 (``encoding: "utf-8"``), else base64 (``"base64"``)."""
        with self.open_range(rel, offset, length) as opened:
            if opened.length > MAX_INLINE_READ_BYTES:
                raise SandboxFileOperationError(
                    f"{rel!r}: read at most {MAX_INLINE_READ_BYTES} bytes in one call"
                )
            data = opened.read()
            reply: dict[str, Any] = {
                "path": rel,
                "offset": opened.offset,
                "length": len(data),
                "size": opened.size,
            }
        try:
            reply.update(encoding="utf-8", content=data.decode("utf-8"))
        except UnicodeDecodeError:
            reply.update(encoding="base64", content=base64.b64encode(data).decode())
        return reply

    def stat(self, rel: str) -> dict[str, Any]:
        """``{"path", "type": file|dir|symlink|special, "size", "mode", "mtime"}`` (``mode``
        as an octal string, ``mtime`` in seconds), plus ``"target"`` for a symlink; never
        follows one.

        Raises:
            SandboxPathError, SandboxFileNotFoundError.
        """
        with self._beneath() as tree:
            info = tree.lstat(rel)
            reply: dict[str, Any] = {
                "path": rel,
                "type": _kind(info.st_mode),
                "size": info.st_size,
                "mode": oct(stat_module.S_IMODE(info.st_mode)),
                "mtime": info.st_mtime,
            }
            if stat_module.S_ISLNK(info.st_mode):
                with tree.parent(rel) as (fd, name):
                    reply["target"] = os.readlink(name, dir_fd=fd)
        return reply

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists (a symlink counts, never followed)."""
        try:
            self.stat(rel)
        except SandboxFileNotFoundError:
            return False
        return True

    def listdir(self, rel: str = ".") -> list[dict[str, Any]]:
        """``[{"name", "type", "size"}]`` of the directory ``rel``, sorted by name.

        Raises:
            SandboxPathError, SandboxFileNotFoundError.
        """
        with self._beneath() as tree:
            fd = tree.open_dir(rel, split(rel))
            try:
                entries = []
                with os.scandir(fd) as listing:
                    for entry in listing:
                        info = entry.stat(follow_symlinks=False)
                        entries.append(
                            {"name": entry.name, "type": _kind(info.st_mode), "size": info.st_size}
                        )
            finally:
                os.close(fd)
        return sorted(entries, key=lambda e: e["name"])

    def download(
        self, rels: Iterable[str], chunk_bytes: int = CHUNK_BYTES
    ) -> Iterator[dict[str, Any]]:
        """Several files, streamed: per file, ``{"path", "offset", "data": bytes}`` chunks then
        ``{"path", "ok": True, "size"}``, or one ``{"path", "ok": False, "error": {"type",
        "message"}}`` (a failure of one file does not stop the others)."""
        for rel in rels:
            try:
                with self.open_range(rel) as opened:
                    offset = 0
                    for data in opened.chunks(chunk_bytes):
                        yield {"path": rel, "offset": offset, "data": data}
                        offset += len(data)
                    yield {"path": rel, "ok": True, "size": offset}
            except (SandboxError, OSError) as exc:
                yield {"path": rel, "ok": False, "error": _error(exc)}

    # -- changes ------------------------------------------------------------------------------

    def write(
        self,
        rel: str,
        data: bytes | str | Iterable[bytes],
        *,
        append: bool = False,
        create_parents: bool = True,
    ) -> dict[str, Any]:
        """Write (or append) ``data`` to ``rel``, in place; ``str`` is written as UTF-8.

        Returns:
            ``{"path", "size": bytes written, "appended": bool}``.

        Raises:
            SandboxPathError (also under ``.git``), SandboxFileNotFoundError (a parent is
            missing and not ``create_parents``), SandboxFileOperationError (not a regular
            file), SandboxError (I/O).
        """
        self._writable(rel)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        with self._beneath() as tree:
            fd = self._open(tree, rel, flags, create_parents=create_parents)
            written = 0
            try:
                pieces: Iterable[bytes]
                if isinstance(data, str):
                    pieces = [data.encode()]
                elif isinstance(data, bytes | bytearray | memoryview):
                    pieces = [bytes(data)]
                else:
                    pieces = data
                for piece in pieces:
                    view = memoryview(piece)
                    while view:
                        count = os.write(fd, view)
                        written += count
                        view = view[count:]
            except OSError as exc:
                raise SandboxError(f"writing {rel!r} failed: {exc.strerror}") from exc
            finally:
                os.close(fd)
        self._record({"op": "write", "path": rel, "bytes": written, "append": append})
        return {"path": rel, "size": written, "appended": append}

    def edit(self, rel: str, old: str, new: str, *, replace_all: bool = False) -> dict[str, Any]:
        """Replace the exact text ``old`` by ``new`` in the UTF-8 file ``rel``.

        Refused (nothing written) when ``old`` is empty, absent, or occurs more than once and
        ``replace_all`` is false (Deep Agents' ``edit``).

        Returns:
            ``{"path", "occurrences": replaced count}``.

        Raises:
            SandboxFileOperationError: refused as above, or the file is not UTF-8 text.
            SandboxPathError, SandboxFileNotFoundError, SandboxError (I/O).
        """
        self._writable(rel)
        if not old:
            raise SandboxFileOperationError("edit needs a non-empty old text to replace")
        with self._beneath() as tree:
            fd = self._open(tree, rel, os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                if size > MAX_EDIT_BYTES:
                    raise SandboxFileOperationError(
                        f"{rel!r} is {size} bytes; edit takes files up to {MAX_EDIT_BYTES}"
                    )
                with FileRange(os.dup(fd), rel, 0, None) as whole:
                    raw = whole.read()
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise SandboxFileOperationError(
                        f"{rel!r} is not UTF-8 text; write its bytes instead of editing"
                    ) from None
                count = text.count(old)
                if count == 0:
                    raise SandboxFileOperationError(
                        f"old text not found in {rel!r}; read the file and copy the exact text"
                    )
                if count > 1 and not replace_all:
                    raise SandboxFileOperationError(
                        f"old text occurs {count} times in {rel!r}; give more surrounding "
                        "context to make it unique, or set replace_all"
                    )
                result = text.replace(old, new).encode("utf-8")
                os.ftruncate(fd, 0)
                view = memoryview(result)
                position = 0
                while position < len(result):
                    position += os.pwrite(fd, view[position:], position)
            except OSError as exc:
                raise SandboxError(f"editing {rel!r} failed: {exc.strerror}") from exc
            finally:
                os.close(fd)
        self._record({"op": "edit", "path": rel, "occurrences": count, "bytes": len(result)})
        return {"path": rel, "occurrences": count}

    def delete(self, rel: str, *, recursive: bool = False) -> dict[str, Any]:
        """Remove the file, symlink (not its target) or directory ``rel``; a directory that is
        not empty only when ``recursive`` (removed through descriptors: no symlink inside it is
        followed).

        Returns:
            ``{"path", "type"}`` of what was removed.

        Raises:
            SandboxFileNotFoundError, SandboxFileOperationError (a directory not empty),
            SandboxPathError, SandboxError (I/O).
        """
        self._writable(rel)
        with self._beneath() as tree, tree.parent(rel) as (fd, name):
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise SandboxFileNotFoundError(f"no such file or directory: {rel!r}") from None
            kind = _kind(info.st_mode)
            try:
                if kind != "dir":
                    os.unlink(name, dir_fd=fd)
                elif recursive:
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.rmdir(name, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY:
                    raise SandboxFileOperationError(
                        f"directory {rel!r} is not empty; delete it with recursive"
                    ) from None
                raise SandboxError(f"deleting {rel!r} failed: {exc.strerror}") from exc
        self._record({"op": "delete", "path": rel, "type": kind})
        return {"path": rel, "type": kind}

    def _refuse_escapes(self, *rels: str) -> None:
        """Refuse (SandboxPathError) any of ``rels`` whose way leads through a symlink, before
        a missing file of another is reported: a refusal always wins over "not found"."""
        with self._beneath() as tree:
            for rel in rels:
                try:
                    with tree.parent(rel):
                        pass
                except SandboxPathError:
                    raise
                except SandboxError:
                    continue  # a missing folder on the way: nothing to escape through

    def move(self, src: str, dst: str, *, overwrite: bool = False) -> dict[str, Any]:
        """Rename ``src`` to ``dst`` (parents of ``dst`` made); an existing ``dst`` is replaced
        only when ``overwrite`` (a directory only by an empty one's place, as ``rename(2)``).

        Returns:
            ``{"path": src, "to": dst}``.

        Raises:
            SandboxFileNotFoundError (``src``), SandboxFileOperationError (``dst`` exists, or
            a directory into itself), SandboxPathError, SandboxError (I/O).
        """
        self._writable(src)
        self._writable(dst)
        self._refuse_escapes(src, dst)
        with (
            self._beneath() as tree,
            tree.parent(src) as (src_fd, src_name),
            tree.parent(dst, create=True) as (dst_fd, dst_name),
        ):
            try:
                os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise SandboxFileNotFoundError(f"no such file or directory: {src!r}") from None
            if not overwrite:
                try:
                    os.stat(dst_name, dir_fd=dst_fd, follow_symlinks=False)
                except FileNotFoundError:
                    pass
                else:
                    raise SandboxFileOperationError(
                        f"{dst!r} exists; move with overwrite to replace it"
                    )
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR):
                    raise SandboxFileOperationError(
                        f"cannot move {src!r} to {dst!r}: {exc.strerror}"
                    ) from None
                raise SandboxError(f"moving {src!r} to {dst!r} failed: {exc.strerror}") from exc
        self._record({"op": "move", "path": src, "to": dst})
        return {"path": src, "to": dst}

    def mkdir(self, rel: str, *, parents: bool = True, exist_ok: bool = True) -> dict[str, Any]:
        """Make the directory ``rel`` (and its parents when ``parents``).

        Returns:
            ``{"path", "created": bool}``.

        Raises:
            SandboxFileOperationError: it exists and not ``exist_ok``, or a file is there.
            SandboxFileNotFoundError: a parent is missing and not ``parents``.
            SandboxPathError, SandboxError (I/O).
        """
        self._writable(rel)
        with self._beneath() as tree, tree.parent(rel, create=parents) as (fd, name):
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
                created = True
            except FileExistsError:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat_module.S_ISDIR(info.st_mode):
                    raise SandboxFileOperationError(
                        f"{rel!r} exists and is a {_kind(info.st_mode)}"
                    ) from None
                if not exist_ok:
                    raise SandboxFileOperationError(f"directory {rel!r} exists") from None
                created = False
            except OSError as exc:
                raise SandboxError(f"making {rel!r} failed: {exc.strerror}") from exc
        if created:
            self._record({"op": "mkdir", "path": rel})
        return {"path": rel, "created": created}

    def upload(self, items: Iterable[tuple[str, bytes]]) -> list[dict[str, Any]]:
        """Write several files; one result per file, in order: ``{"path", "ok": True, "size"}``
        or ``{"path", "ok": False, "error": {"type", "message"}}`` (one failure does not stop
        the others)."""
        results: list[dict[str, Any]] = []
        for rel, data in items:
            try:
                written = self.write(rel, data)
            except (SandboxError, OSError) as exc:
                results.append({"path": rel, "ok": False, "error": _error(exc)})
            else:
                results.append({"path": rel, "ok": True, "size": written["size"]})
        return results

    # -- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _open(tree: Beneath, rel: str, flags: int, *, create_parents: bool = False) -> int:
        try:
            return tree.open_file(rel, flags, create_parents=create_parents)
        except IsADirectoryError:
            raise SandboxFileOperationError(
                f"{rel!r} is not a regular file (a directory or a special file)"
            ) from None
        except SandboxError:
            raise
        except OSError as exc:
            raise SandboxError(f"opening {rel!r} failed: {exc.strerror}") from exc


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}
