"""Where an actor's command runs: a bubblewrap (``bwrap``) jail that sees only its sandbox.

The mechanism (docs/actor.md, "Isolation"): ``bwrap`` from Debian's ``bubblewrap`` package,
the tool Flatpak uses. Each command gets new user, mount, PID, IPC, UTS (and cgroup)
namespaces. Its file system is an empty read-only root with:

- the system directories read-only (``/usr``, ``/etc``, ``/bin``, ``/lib*``, ``/sbin``, plus
  :attr:`Jail.ro_paths`), a private ``/tmp`` (tmpfs), a ``/proc`` (below) and a minimal ``/dev``;
- the sandbox's working tree, read-write, at its own absolute path (so paths the tree records,
  such as a worktree's ``.git`` file, keep their meaning);
- for a ``git_worktree`` sandbox, a private copy of the repository's metadata mounted where the
  original's ``.git`` is (:func:`git_shadow`): the worktree's index and HEAD, the refs, the
  config, empty hooks, and a private object directory that borrows the original's objects
  read-only (``objects/info/alternates``). ``git checkout``, ``git commit``, ``git config`` or a
  hook written by the command change that copy, never the original's refs, config, hooks or
  index; the copy is made fresh for each command and dropped after it;
- for a tree holding a repository of its own (a ``.git`` directory: a ``none`` sandbox of a
  repository writes it in place, a copy of a main worktree carries a copy), its ``config``,
  ``config.worktree``, ``hooks/`` and ``info/`` read-only (:func:`git_control_binds`): a
  command may commit there, never plant a ``core.fsmonitor`` or a hook that runs at the next
  ``git status`` (docs/security.md, "Control paths").

Nothing else exists in the jail: not the agent's token file, its state directory (records,
request journal, audit log), other sandboxes, the original's working tree, nor the agent's
processes' insides. The command runs as :attr:`Jail.uid` inside a user namespace whose only
mapping is that uid to the agent's own: it owns the sandbox's files, has no capability in the
agent's namespaces (``--cap-drop ALL``), may not create user namespaces, and the environment is
cleared (``--clearenv``) before the request's own is set.

``/proc`` comes in one of two ways (:attr:`Jail.proc`; ``"auto"`` lets :meth:`Jail.check`'s
probe choose, once per process, and logs the choice):

- ``"fresh"``: a new ``proc`` for the jail's PID namespace (``--proc``): only the jail's PIDs
  exist; ``--disable-userns`` refuses user namespaces.
- ``"bound"``: where the kernel refuses a new ``proc`` (a container's runtime masks parts of its
  ``/proc``: "Can't mount proc on /newroot/proc"), the container's ``/proc`` read-only
  (``--ro-bind /proc /proc``). The command then sees the container's PIDs, but everything of
  another process that matters (``environ``, ``root``, ``cwd``, ``exe``, ``fd/*``, ``mem``,
  ``maps``) is behind the kernel's ptrace access check, which a process in a child user
  namespace without capabilities fails for every process outside it (``cap_ptrace_access_check``
  in ``security/commoncap.c``); a signal or a pidfd reaches only PIDs of its own namespace.
  ``--disable-userns`` needs a writable ``/proc/sys``, so :mod:`sandbox_core.actor.userns_filter`
  (``--seccomp``) refuses user namespaces instead. ``tests/core/actor/test_bound_proc.py``
  attacks this mode under an emulated masked ``/proc``. The network is shared unless
``network=False`` (``--unshare-net``): tests and package managers need it, and the agent answers
only its token.

Why bubblewrap: it builds the jail without a privileged helper (a user namespace is enough, so
the workspace Pod's agent needs no extra capability where the node allows user namespaces), it
is a small, audited, packaged C program, and one argv states the whole file system the command
sees. ``unshare(1)`` could build the same with a dozen mount calls of our own; a second container
per command would cost a Pod start.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sandbox_core.actor.userns_filter import UnsupportedArchitectureError, program
from sandbox_core.errors import SandboxError

__all__ = [
    "BASE_ENV",
    "OBJECTS_MOUNT",
    "Jail",
    "JailUnavailableError",
    "ProcMode",
    "git_shadow",
]

OBJECTS_MOUNT = "/run/sandbox-actor/objects"
"""Where a git_worktree jail sees the original's object directory (read-only)."""
BASE_ENV: dict[str, str] = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",  # noqa: S108 - the jail's own private tmpfs
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",  # noqa: S108 - the jail's own private tmpfs
}
"""The environment of every command before the request's own (which may override it)."""
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
GIT_COPIED_FILES = ("config", "HEAD", "packed-refs", "shallow", "description", "FETCH_HEAD")
GIT_COPIED_DIRS = ("refs", "info", "logs")


class JailUnavailableError(SandboxError):
    """No jail can be built here (no ``bwrap``, or it cannot create its namespaces); commands
    are refused, never run unjailed."""


PROBE_TIMEOUT_SECONDS = 30.0
ProcMode = Literal["fresh", "bound"]
# (bwrap path, uid, gid, asked mode) whose empty jail ran in this process -> the mode it ran in.
_WORKING: dict[tuple[str, int, int, str], ProcMode] = {}
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Jail:
    """How commands are jailed (module docstring).

    Attributes:
        bwrap: the ``bwrap`` executable (a name looked up on PATH, or a path).
        uid / gid: the identity inside the jail (mapped to the agent's own outside).
        ro_paths: further directories shown read-only at their own paths (a toolchain).
        network: share the network namespace (True) or give the command none (False).
        proc: ``"fresh"`` (a new ``proc``), ``"bound"`` (the container's ``/proc`` read-only,
            user namespaces refused by a seccomp filter) or ``"auto"`` (``fresh`` where the
            kernel allows it, else ``bound``); module docstring.
    """

    bwrap: str = "bwrap"
    uid: int = 1000
    gid: int = 1000
    ro_paths: tuple[str, ...] = ()
    network: bool = True
    proc: Literal["auto", "fresh", "bound"] = "auto"

    def executable(self) -> str:
        """The absolute path of ``bwrap``.

        Raises:
            JailUnavailableError: it is not installed.
        """
        found = shutil.which(self.bwrap)
        if found is None:
            raise JailUnavailableError(
                f"cannot isolate commands: {self.bwrap!r} (Debian package bubblewrap) is not "
                "installed; commands are never run without isolation"
            )
        return found

    def spawn(
        self,
        work_tree: str,
        cwd: str,
        command: Sequence[str],
        env: Mapping[str, str],
        binds: Sequence[tuple[str, str, str]] = (),
        network: bool | None = None,
        **popen: Any,
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` in the jail.

        Args:
            work_tree: the sandbox's directory (absolute), bound read-write.
            cwd: the command's directory (absolute, inside ``work_tree``).
            command: what to run (``argv[0]`` looked up on the jail's PATH).
            env: the whole environment of the command.
            binds: more mounts, ``("bind" | "ro-bind", source, destination)``, after the
                work tree (a git shadow).
            network: overrides :attr:`network`.
            popen: passed to :class:`subprocess.Popen` (pipes, session; ``pass_fds`` and
                ``env``, empty for ``bwrap`` itself, are the jail's own).

        Returns:
            The ``bwrap`` process (its first child is the jail's PID 1).

        Raises:
            JailUnavailableError: no ``bwrap``, or it cannot build its namespaces here
                (:meth:`check`).
            OSError: the process could not be started.
        """
        mode = self.check()
        return self._popen(mode, work_tree, cwd, command, env, binds, network, **popen)

    def check(self) -> ProcMode:
        """Build one jail running ``true`` (once per ``bwrap``, identity and :attr:`proc` in
        this process, when it works): a ``bwrap`` that is installed but cannot create its
        namespaces (a container whose seccomp profile refuses ``unshare``/``clone`` of a user
        namespace, a node without user namespaces) refuses every command with its own
        message, rather than letting each command fail with ``bwrap``'s exit status as if the
        command had. With :attr:`proc` ``"auto"``, a jail with a fresh ``/proc`` is tried
        first, then one with the container's ``/proc`` bound read-only; the choice is logged
        once.

        Returns:
            The ``/proc`` mode commands run with.

        Raises:
            JailUnavailableError: no ``bwrap``, or every probe failed (their stderr in the
                message; docs/security.md says what a workspace Pod needs).
        """
        key = (self.executable(), self.uid, self.gid, self.proc)
        if key in _WORKING:
            return _WORKING[key]
        modes: tuple[ProcMode, ...] = ("fresh", "bound") if self.proc == "auto" else (self.proc,)
        said: list[str] = []
        for mode in modes:
            failure = self._probe(mode)
            if failure is None:
                if self.proc == "auto" and mode == "bound":
                    _log.warning(
                        "a fresh /proc cannot be mounted here (%s); commands see this "
                        "container's /proc read-only, user namespaces refused by a seccomp "
                        "filter (docs/security.md)",
                        said[0],
                    )
                _WORKING[key] = mode
                return mode
            said.append(failure)
        raise JailUnavailableError(
            f"cannot isolate commands: bwrap cannot build its namespaces here "
            f"({'; '.join(said)}); a container needs user namespaces, mount and pivot_root "
            "allowed by its seccomp profile (docs/security.md, the Localhost profile); "
            "commands are never run without isolation"
        )

    def _probe(self, mode: ProcMode) -> str | None:
        """Run ``true`` in an empty jail of ``mode``: None when it worked, else why not."""
        with tempfile.TemporaryDirectory(prefix="jail-probe-") as where:
            try:
                probe = self._popen(
                    mode,
                    where,
                    where,
                    ["true"],
                    dict(BASE_ENV),
                    network=False,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            except (OSError, JailUnavailableError) as exc:
                return f"{mode} /proc: {exc}"
            try:
                _, stderr = probe.communicate(timeout=PROBE_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                probe.kill()
                probe.communicate()
                return f"{mode} /proc: no empty jail within {PROBE_TIMEOUT_SECONDS:.0f} s"
        if probe.returncode == 0:
            return None
        return f"{mode} /proc: " + stderr.decode("utf-8", "replace").strip()[-300:]

    def _popen(
        self,
        mode: ProcMode,
        work_tree: str,
        cwd: str,
        command: Sequence[str],
        env: Mapping[str, str],
        binds: Sequence[tuple[str, str, str]] = (),
        network: bool | None = None,
        **popen: Any,
    ) -> subprocess.Popen[bytes]:
        if mode == "fresh":
            argv = self._argv(mode, None, work_tree, cwd, command, env, binds, network)
            return subprocess.Popen(argv, env={}, **popen)
        try:
            bpf = program()
        except UnsupportedArchitectureError as exc:
            raise JailUnavailableError(
                f"cannot isolate commands with a bound /proc: {exc}"
            ) from exc
        # bwrap reads the filter from a descriptor to its end: a pipe of its own per command
        # (the program is a few hundred bytes, far below a pipe's buffer).
        read, write = os.pipe()
        try:
            os.write(write, bpf)
            os.close(write)
            write = -1
            argv = self._argv(mode, read, work_tree, cwd, command, env, binds, network)
            return subprocess.Popen(argv, env={}, pass_fds=(read,), **popen)
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)

    def _argv(
        self,
        mode: ProcMode,
        seccomp_fd: int | None,
        work_tree: str,
        cwd: str,
        command: Sequence[str],
        env: Mapping[str, str],
        binds: Sequence[tuple[str, str, str]] = (),
        network: bool | None = None,
    ) -> list[str]:
        share_net = self.network if network is None else network
        args = [
            self.executable(),
            "--unshare-user", "--uid", str(self.uid), "--gid", str(self.gid),
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--cap-drop", "ALL", "--die-with-parent", "--hostname", "sandbox",
        ]  # fmt: skip
        if mode == "fresh":
            args.append("--disable-userns")
        else:
            args += ["--seccomp", str(seccomp_fd)]
        if not share_net:
            args.append("--unshare-net")
        for path in (*SYSTEM_DIRS, *self.ro_paths):
            if Path(path).is_symlink():
                args += ["--symlink", str(Path(path).readlink()), path]
            elif Path(path).is_dir():
                args += ["--ro-bind", path, path]
        private = ["--tmpfs", "/tmp", "--tmpfs", "/run"]  # noqa: S108 - new tmpfs in the jail
        proc = ["--proc", "/proc"] if mode == "fresh" else ["--ro-bind", "/proc", "/proc"]
        args += [*proc, "--dev", "/dev", *private]
        args += ["--bind", work_tree, work_tree]
        for kind, source, destination in binds:
            args += [f"--{kind}", source, destination]
        args += ["--remount-ro", "/", "--chdir", cwd, "--clearenv"]
        for name, value in env.items():
            args += ["--setenv", name, value]
        return [*args, "--", *command]


def _linked_admin_dir(work_tree: Path) -> Path | None:
    try:
        content = (work_tree / ".git").read_text(encoding="utf-8")
    except OSError:
        return None
    if not content.startswith("gitdir:"):
        return None
    admin = Path(content[len("gitdir:") :].strip())
    return admin if admin.is_absolute() else (work_tree / admin).resolve()


def git_shadow(work_tree: str | Path, into: Path) -> list[tuple[str, str, str]]:
    """A private copy of a linked worktree's git metadata, and the mounts that show it.

    ``work_tree``'s ``.git`` file names its admin directory ``<common>/worktrees/<name>``.
    Into ``into`` (an empty directory of the agent's, never shown to the command) this copies
    what git writes: ``config``, ``HEAD``, ``packed-refs``, ``refs/``, ``info/``, ``logs/`` and
    the worktree's own admin directory (its ``HEAD`` and ``index``); ``hooks/`` is empty (no hook
    of the original runs, case 27); ``objects/`` is empty but borrows the original's objects
    read-only through ``objects/info/alternates`` -> :data:`OBJECTS_MOUNT`.

    Returns:
        The mounts for :meth:`Jail.spawn`: the copy read-write at ``<common>``, the original's
        objects read-only at :data:`OBJECTS_MOUNT`; ``[]`` when ``work_tree`` is not a linked
        worktree (nothing of git is outside it).

    Raises:
        SandboxError: the metadata cannot be read or copied.
    """
    admin = _linked_admin_dir(Path(work_tree))
    if admin is None:
        return []
    try:
        commondir = (admin / "commondir").read_text(encoding="utf-8").strip()
        common = (admin / commondir).resolve() if commondir else admin.parent.parent
        copy = into / "common"
        into.mkdir(parents=True, mode=0o700)
        copy.mkdir()
        for name in GIT_COPIED_FILES:
            if (common / name).is_file():
                shutil.copy2(common / name, copy / name)
        for name in GIT_COPIED_DIRS:
            if (common / name).is_dir():
                shutil.copytree(common / name, copy / name, symlinks=True)
        (copy / "hooks").mkdir()
        (copy / "objects" / "info").mkdir(parents=True)
        (copy / "objects" / "info" / "alternates").write_text(OBJECTS_MOUNT + "\n")
        ignore = shutil.ignore_patterns("*.lock")
        shutil.copytree(admin, copy / "worktrees" / admin.name, symlinks=True, ignore=ignore)
    except OSError as exc:
        raise SandboxError(f"cannot copy the git metadata of {work_tree}: {exc}") from exc
    return [("bind", str(copy), str(common)), ("ro-bind", str(common / "objects"), OBJECTS_MOUNT)]


# What of a repository's own ``.git`` directory runs commands: never writable by a command.
GIT_CONTROL_ENTRIES = ("config", "config.worktree", "hooks", "info")


def git_control_binds(work_tree: str | Path) -> list[tuple[str, str, str]]:
    """Read-only mounts over the command-running parts of ``work_tree``'s own repository.

    Returns:
        ``("ro-bind", path, path)`` for each of :data:`GIT_CONTROL_ENTRIES` that exists (not a
        symlink) under ``<work_tree>/.git`` when that is a directory; ``[]`` otherwise (no
        repository, or a linked worktree's ``.git`` file: :func:`git_shadow` covers it).
    """
    dotgit = Path(work_tree) / ".git"
    if dotgit.is_symlink() or not dotgit.is_dir():
        return []
    binds = []
    for name in GIT_CONTROL_ENTRIES:
        path = dotgit / name
        if path.exists() and not path.is_symlink():
            binds.append(("ro-bind", str(path), str(path)))
    return binds
