"""Where an actor's command runs: a bubblewrap (``bwrap``) jail that sees only its sandbox.

The mechanism (docs/actor.md, "Isolation"): ``bwrap`` from Debian's ``bubblewrap`` package,
the tool Flatpak uses. Each command gets new user, mount, PID, IPC, UTS (and cgroup)
namespaces. Its file system is an empty read-only root with:

- the system directories read-only (``/usr``, ``/etc``, ``/bin``, ``/lib*``, ``/sbin``, plus
  :attr:`Jail.ro_paths`), a private ``/tmp`` (tmpfs), a fresh ``/proc`` and a minimal ``/dev``;
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
processes (``/proc`` shows only the jail's PIDs, so not the agent's environment and its DSNs).
The command runs as :attr:`Jail.uid` inside a user namespace whose only mapping is that uid to
the agent's own: it owns the sandbox's files, has no capability in the agent's namespaces
(``--cap-drop ALL``), may not create user namespaces (``--disable-userns``), and the environment
is cleared (``--clearenv``) before the request's own is set. The network is shared unless
``network=False`` (``--unshare-net``): tests and package managers need it, and the agent answers
only its token.

Why bubblewrap: it builds the jail without a privileged helper (a user namespace is enough, so
the workspace Pod's agent needs no extra capability where the node allows user namespaces), it
is a small, audited, packaged C program, and one argv states the whole file system the command
sees. ``unshare(1)`` could build the same with a dozen mount calls of our own; a second container
per command would cost a Pod start.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox_core.errors import SandboxError

__all__ = [
    "BASE_ENV",
    "OBJECTS_MOUNT",
    "Jail",
    "JailUnavailableError",
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
# (bwrap path, uid, gid) whose empty jail ran in this process: no probe again.
_WORKING: set[tuple[str, int, int]] = set()


@dataclass(frozen=True)
class Jail:
    """How commands are jailed (module docstring).

    Attributes:
        bwrap: the ``bwrap`` executable (a name looked up on PATH, or a path).
        uid / gid: the identity inside the jail (mapped to the agent's own outside).
        ro_paths: further directories shown read-only at their own paths (a toolchain).
        network: share the network namespace (True) or give the command none (False).
    """

    bwrap: str = "bwrap"
    uid: int = 1000
    gid: int = 1000
    ro_paths: tuple[str, ...] = ()
    network: bool = True

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

    def argv(
        self,
        work_tree: str,
        cwd: str,
        command: Sequence[str],
        env: Mapping[str, str],
        binds: Sequence[tuple[str, str, str]] = (),
        network: bool | None = None,
    ) -> list[str]:
        """The full argv running ``command`` in the jail.

        Args:
            work_tree: the sandbox's directory (absolute), bound read-write.
            cwd: the command's directory (absolute, inside ``work_tree``).
            command: what to run (``argv[0]`` looked up on the jail's PATH).
            env: the whole environment of the command.
            binds: more mounts, ``("bind" | "ro-bind", source, destination)``, after the
                work tree (a git shadow).
            network: overrides :attr:`network`.

        Raises:
            JailUnavailableError: no ``bwrap``, or it cannot build its namespaces here
                (:meth:`check`).
        """
        self.check()
        return self._argv(work_tree, cwd, command, env, binds, network)

    def check(self) -> None:
        """Build one jail running ``true`` (once per ``bwrap`` and identity in this process,
        when it works): a ``bwrap`` that is installed but cannot create its namespaces (a
        container whose seccomp profile refuses ``unshare``/``clone`` of a user namespace,
        whose ``/proc`` is masked so a fresh one cannot be mounted, or a node without user
        namespaces) refuses every command with its own message, rather than letting each
        command fail with ``bwrap``'s exit status as if the command had.

        Raises:
            JailUnavailableError: no ``bwrap``, or the probe failed (its stderr in the
                message; docs/security.md says what a workspace Pod needs).
        """
        key = (self.executable(), self.uid, self.gid)
        if key in _WORKING:
            return
        with tempfile.TemporaryDirectory(prefix="jail-probe-") as where:
            argv = self._argv(where, where, ["true"], dict(BASE_ENV), network=False)
            try:
                probe = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=PROBE_TIMEOUT_SECONDS,
                    check=False,
                    env={},
                )
            except subprocess.TimeoutExpired as exc:
                raise JailUnavailableError(
                    f"cannot isolate commands: bwrap did not finish an empty jail within "
                    f"{PROBE_TIMEOUT_SECONDS:.0f} s; commands are never run without isolation"
                ) from exc
        if probe.returncode != 0:
            said = probe.stderr.decode("utf-8", "replace").strip()[-500:]
            raise JailUnavailableError(
                f"cannot isolate commands: bwrap cannot build its namespaces here ({said}); "
                "a container needs user namespaces allowed by its seccomp profile and a /proc "
                "that can be mounted again (procMount: Unmasked; docs/security.md); commands "
                "are never run without isolation"
            )
        _WORKING.add(key)

    def _argv(
        self,
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
            "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
            "--hostname", "sandbox",
        ]  # fmt: skip
        if not share_net:
            args.append("--unshare-net")
        for path in (*SYSTEM_DIRS, *self.ro_paths):
            if Path(path).is_symlink():
                args += ["--symlink", str(Path(path).readlink()), path]
            elif Path(path).is_dir():
                args += ["--ro-bind", path, path]
        private = ["--tmpfs", "/tmp", "--tmpfs", "/run"]  # noqa: S108 - new tmpfs in the jail
        args += ["--proc", "/proc", "--dev", "/dev", *private]
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
        The mounts for :meth:`Jail.argv`: the copy read-write at ``<common>``, the original's
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
