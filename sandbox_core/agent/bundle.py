"""A checkpoint carried from one workspace agent to another as a tar stream: a fork across
workspace Pods (docs/forks.md, "Forks in workspace Pods").

The parent's agent packs what a fork needs of one checkpoint (:func:`pack`); the operator pipes
the bytes, unread, into the fork's agent, which unpacks them on its own scratch volume
(:func:`unpack`) and starts the new sandbox from there. Neither Pod reaches the other: no
shared volume, no Pod-to-Pod traffic, no token of the one in the other.

The bundle (an uncompressed POSIX tar)::

    fork.json      {"format": 1, "sandbox_id", "checkpoint_id", "kind", "commit",
                    "parent_metadata", "snapshot": bool, "baseline": bool}
    snapshot/...   the checkpoint's snapshot directory (directory and overlay checkpoints)
    baseline       the parent's baseline of the original, kept with the checkpoint

A ``git_ref`` checkpoint is ``fork.json`` alone: its commit lives in the original repository,
which both Pods mount.

:func:`unpack` trusts nothing in the stream: every member must lie under ``snapshot/`` or be
one of the two files; absolute names, ``..``, links leading out of the tree (symlinks and hard
links), devices, FIFOs and sparse members are refused, and so are members beneath a symlink of
the bundle; every member is made by hand (no ``tarfile`` extraction, never following a
symlink), no owner is applied and setuid, setgid and sticky bits are dropped; the members'
sizes together may not exceed the bound. A refused bundle leaves nothing behind. Kernel-mode
overlay checkpoints are refused by :func:`pack`: their upper layer holds whiteouts (character
devices) and overlay xattrs that no unprivileged unpack may make.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

from sandbox_core.errors import SandboxForkError
from sandbox_core.protocol import ForkSource

__all__ = [
    "BUNDLE_FORMAT",
    "CHECKPOINT_ID_PATTERN",
    "DEFAULT_MAX_BYTES",
    "fork_source_of",
    "pack",
    "remove",
    "unpack",
]

BUNDLE_FORMAT = 1
DEFAULT_MAX_BYTES = 8 * 1024 * 1024 * 1024
"""The largest bundle (bytes of its members together) packed or unpacked when the caller names
no smaller bound."""
CHECKPOINT_ID_PATTERN = re.compile(r"^[0-9A-Za-z]{1,64}$")
_INFO, _SNAPSHOT, _BASELINE = "fork.json", "snapshot", "baseline"
_COPY_CHUNK = 1024 * 1024
# the overlay snapshot's own description (strategies.overlay)
_OVERLAY_INFO = "overlay-checkpoint.json"


def pack(source: ForkSource, out: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """Write the bundle of ``source`` (a checkpoint's :meth:`fork_source
    <sandbox_core.host.checkpoint.CheckpointManager.fork_source>`) to the file ``out``.

    Returns:
        The bundle's size in bytes.

    Raises:
        SandboxForkError: the snapshot is missing, the checkpoint is a kernel-mode overlay
            one, or its members together exceed ``max_bytes`` (``out`` is removed).
        OSError: the snapshot could not be read or ``out`` written (``out`` is removed).
    """
    snapshot = Path(source.snapshot_path) if source.snapshot_path else None
    if source.kind != "git_ref" and (snapshot is None or not snapshot.is_dir()):
        raise SandboxForkError(
            f"checkpoint {source.checkpoint_id} has no snapshot here; nothing can start from it"
        )
    if snapshot is not None and source.kind == "overlay_snapshot":
        info = json.loads((snapshot / _OVERLAY_INFO).read_text(encoding="utf-8"))
        if info.get("overlay_mode") == "kernel":
            raise SandboxForkError(
                f"checkpoint {source.checkpoint_id} is a kernel-mode overlay layer (whiteouts "
                "and overlay xattrs), which cannot be carried to another workspace Pod; fork "
                "overlay sandboxes in fallback mode (options.overlayMode: fallback)"
            )
    baseline = Path(source.baseline_path) if source.baseline_path else None
    has_baseline = baseline is not None and baseline.is_file()
    facts = {
        "format": BUNDLE_FORMAT,
        "sandbox_id": source.sandbox_id,
        "checkpoint_id": source.checkpoint_id,
        "kind": source.kind,
        "commit": source.commit,
        "parent_metadata": dict(source.parent_metadata),
        "snapshot": snapshot is not None,
        "baseline": has_baseline,
    }
    total = 0

    def bounded(member: tarfile.TarInfo) -> tarfile.TarInfo:
        nonlocal total
        total += member.size
        if total > max_bytes:
            raise SandboxForkError(
                f"checkpoint {source.checkpoint_id} is larger than {max_bytes} bytes, the most "
                "a fork carries between workspace Pods"
            )
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        return member

    try:
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
            data = json.dumps(facts, sort_keys=True).encode()
            info = tarfile.TarInfo(_INFO)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
            if snapshot is not None:
                tar.add(snapshot, arcname=_SNAPSHOT, filter=bounded)
            if has_baseline:
                assert baseline is not None
                tar.add(baseline, arcname=_BASELINE, filter=bounded)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return out.stat().st_size


def unpack(bundle: Path, dest: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """Unpack the bundle file ``bundle`` into the new directory ``dest`` (made beside as
    ``<dest>.partial`` and renamed, so ``dest`` is whole or absent; an existing ``dest`` is
    replaced).

    Returns:
        The bundle's ``fork.json``, plus ``files`` (members unpacked) and ``bytes`` (their
        sizes together).

    Raises:
        SandboxForkError: the bundle is not a tar, lacks or mangles ``fork.json``, or holds a
            member refused by the module's rules (the message names it); nothing is left.
        OSError: ``dest`` could not be written (nothing is left).
    """
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        facts = _unpack_into(bundle, partial, max_bytes)
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return facts


def _unpack_into(bundle: Path, root: Path, max_bytes: int) -> dict[str, Any]:
    try:
        tar = tarfile.open(bundle, "r:")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise SandboxForkError(f"the checkpoint bundle is not a tar: {exc}") from None
    with tar:
        try:
            members = tar.getmembers()
        except tarfile.TarError as exc:
            raise SandboxForkError(f"the checkpoint bundle is not a tar: {exc}") from None
        total = 0
        links: set[str] = set()
        files: set[str] = set()
        for member in members:
            _admit(member, links, files)
            total += member.size
            if total > max_bytes:
                raise SandboxForkError(
                    f"the checkpoint bundle is larger than {max_bytes} bytes, the most a fork "
                    "carries between workspace Pods"
                )
        try:
            directories = [_extract(tar, member, root) for member in members]
        except tarfile.TarError as exc:
            raise SandboxForkError(f"the checkpoint bundle is damaged: {exc}") from None
        except OSError as exc:  # a path that is not what the bundle says: a file, not a dir
            raise SandboxForkError(
                f"the checkpoint bundle cannot be unpacked: {exc.strerror}"
            ) from None
    for member in reversed([m for m in directories if m is not None]):
        path = root / member.name  # modes and times of directories last: writes are done
        path.chmod(member.mode & 0o777)
        os.utime(path, (member.mtime, member.mtime))
    info = root / _INFO
    if info.is_symlink() or not info.is_file():
        raise SandboxForkError(f"the checkpoint bundle has no {_INFO}")
    try:
        facts = json.loads(info.read_text(encoding="utf-8"))
    except ValueError:
        raise SandboxForkError(f"the checkpoint bundle's {_INFO} is not JSON") from None
    if not isinstance(facts, dict) or facts.get("format") != BUNDLE_FORMAT:
        raise SandboxForkError(
            f"the checkpoint bundle's {_INFO} is not of format {BUNDLE_FORMAT}; the parent's "
            "agent and this one must be of versions that share it"
        )
    for key in ("sandbox_id", "checkpoint_id", "kind"):
        if not isinstance(facts.get(key), str) or not facts[key]:
            raise SandboxForkError(f"the checkpoint bundle's {_INFO} lacks {key}")
    return {**facts, "files": len(members), "bytes": total}


def _refused(member: tarfile.TarInfo, why: str) -> SandboxForkError:
    return SandboxForkError(f"the checkpoint bundle is refused: member {member.name!r} {why}")


def _admit(member: tarfile.TarInfo, links: set[str], files: set[str]) -> None:
    """Refuse a member outside the bundle's layout, of a kind no bundle holds, beneath a
    symlink of the bundle, or a link leading out of the tree. ``links`` and ``files`` collect
    the symlinks and regular files admitted so far (in order: a hard link names an earlier
    file)."""
    name = member.name
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise _refused(member, "is not a plain path")
    if parts[0] not in (_INFO, _SNAPSHOT, _BASELINE) or (
        parts[0] != _SNAPSHOT and (len(parts) > 1 or not member.isreg())
    ):
        raise _refused(member, "is not of a bundle")
    if member.issparse() or not (
        member.isreg() or member.isdir() or member.issym() or member.islnk()
    ):
        raise _refused(member, "is a device, FIFO or sparse file")
    if any("/".join(parts[:end]) in links for end in range(1, len(parts))):
        raise _refused(member, "lies beneath a symlink of the bundle")
    if member.issym():
        target = member.linkname
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if not target or target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise _refused(member, f"is a symlink leading out of the tree ({target!r})")
        links.add(name)
    elif member.islnk():
        if member.linkname not in files:
            raise _refused(member, "is a hard link to no earlier file of the bundle")
        files.add(name)
    elif member.isreg():
        files.add(name)


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path) -> tarfile.TarInfo | None:
    """Make one admitted member beneath ``root`` (never following a symlink, never applying
    an owner, permission bits only); returns a directory's member (its mode and time are set
    after every write), else None."""
    path = root / member.name
    if member.isdir():
        path.mkdir(parents=True, exist_ok=True)
        return member
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            raise _refused(member, "replaces a directory")
        path.unlink()
    if member.issym():
        path.symlink_to(member.linkname)
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
    elif member.islnk():
        os.link(root / member.linkname, path, follow_symlinks=False)
    else:
        source = tar.extractfile(member)
        assert source is not None  # a regular file
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with source, os.fdopen(os.open(path, flags, 0o600), "wb") as sink:
            shutil.copyfileobj(source, sink, _COPY_CHUNK)
        path.chmod(member.mode & 0o777)
        os.utime(path, (member.mtime, member.mtime))
    return None


def fork_source_of(root: Path) -> ForkSource:
    """The :class:`ForkSource` of a bundle unpacked at ``root`` (by :func:`unpack`).

    Raises:
        SandboxForkError: ``root`` holds no unpacked bundle.
    """
    try:
        facts = json.loads((root / _INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise SandboxForkError(f"no checkpoint bundle is unpacked at {root.name}") from None
    snapshot = root / _SNAPSHOT
    baseline = root / _BASELINE
    metadata = facts.get("parent_metadata")
    return ForkSource(
        sandbox_id=str(facts["sandbox_id"]),
        checkpoint_id=str(facts["checkpoint_id"]),
        kind=str(facts["kind"]),
        snapshot_path=str(snapshot) if facts.get("snapshot") and snapshot.is_dir() else "",
        commit=str(facts.get("commit") or ""),
        parent_metadata=dict(metadata) if isinstance(metadata, dict) else {},
        baseline_path=str(baseline) if facts.get("baseline") and baseline.is_file() else "",
    )


def remove(path: Path) -> None:
    """Remove an unpacked bundle (or a bundle file); missing is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
