"""Private helpers: run git with explicit locations, a fixed identity, and no repository code.

Every command names its repository explicitly (``-C <dir>``, or ``--git-dir``/``--work-tree`` for a
sandbox worktree), so a missing directory can never make git fall back to the process's current
directory, and a tampered ``.git`` file inside a worktree cannot redirect the product's own
commands. Failures surface as :class:`GitFailure`; strategies translate it into the sandbox_core
error of the phase they are in (:func:`failure_kind` tells a leftover lock and a permission
problem from the rest; GitPython errors never leave this module).

The repository is the user's: the product's commands run **no code the repository controls**
(cases 27 and 29). Every command gets, as command-scope configuration
(``GIT_CONFIG_COUNT``, which child git processes inherit and which wins over every config file):

- ``core.hooksPath=/dev/null``: no hook runs (post-checkout at create, reference-transaction on
  every ref update, pre-auto-gc, ...);
- ``core.fsmonitor=false``: no file-system monitor hook;
- every filter, diff and merge driver named in any configuration file git would read (system,
  global, the repository's ``config`` and ``config.worktree``, and every file they include, under
  any ``includeIf`` condition) is neutralised: filters get empty ``clean``/``smudge``/``process``
  and ``required=false`` (content is stored and checked out as it is in the repository), diff
  drivers get no ``command``/``textconv``, and merge drivers are replaced by git's own three-way
  text merge (``git merge-file``), so a conflict is still a conflict;
- no credential helper, no transport (``protocol.allow=never``: everything is local), no signing
  program (``commit.gpgSign=false``), no automatic gc/maintenance, no submodule recursion.

The environment is cleaned of variables that would run programs (``GIT_EXTERNAL_DIFF``,
``GIT_SSH_COMMAND``, ``GIT_ASKPASS``, editors, pager) or re-point the repository
(``GIT_NAMESPACE``, inherited ``GIT_CONFIG_*``), and messages are in the C locale so that
failures can be classified.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

# The product commits under its own name so that no global git identity is needed; git's own
# precedence still lets GIT_AUTHOR_* / GIT_COMMITTER_* in the environment override it.
PRODUCT_IDENTITY: Mapping[str, str] = {
    "user.name": "sandbox-core",
    "user.email": "sandbox-core@localhost",
}

# Configuration that keeps the repository's code (and the network) out of the product's commands.
HARDENING: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("credential.helper", ""),
    ("protocol.allow", "never"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("submodule.recurse", "false"),
    ("diff.external", ""),
    ("core.pager", "cat"),
    ("advice.detachedHead", "false"),
)

# How long a command that writes the index waits for another git's index.lock to go away.
INDEX_LOCK_WAIT_SECONDS = 2.0

# Variables that would make git run a program or look at another repository or namespace.
_DROPPED_VARIABLES = (
    "GIT_EXTERNAL_DIFF",
    "GIT_DIFF_OPTS",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_PAGER",
    "GIT_NAMESPACE",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_PREFIX",
)

# Variables through which an enclosing git process (a hook, ``git rebase --exec``) would redirect
# our commands to its own repository; those without a command-line option are pinned explicitly.
_LOCATION_VARIABLES = ("GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


class GitFailure(Exception):  # noqa: N818 - private; translated to a SandboxError by callers
    """A git command failed or could not be started. ``stderr`` holds git's own words."""

    def __init__(self, args: Iterable[str], status: int, stderr: str) -> None:
        self.args_run = list(args)
        self.status = status
        self.stderr = stderr.strip()
        super().__init__(f"git {' '.join(self.args_run)} failed ({status}): {self.stderr}")


@dataclass(frozen=True)
class GitResult:
    """Exit status and decoded output of one git command (stdout not stripped)."""

    status: int
    stdout: str
    stderr: str

    @property
    def out(self) -> str:
        """stdout without the trailing newline."""
        return self.stdout.rstrip("\n")

    def nul_fields(self) -> list[str]:
        """stdout of a ``-z`` command split on NUL, empty fields dropped."""
        return [field for field in self.stdout.split("\0") if field]


def _decode(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    # surrogateescape keeps non-UTF-8 file names round-trippable.
    return data.decode("utf-8", "surrogateescape")


# -- failure classification --------------------------------------------------------------------

_LOCK_EXISTS = re.compile(r"Unable to create '([^']+\.lock)': File exists")
_PERMISSION = re.compile(
    r"Permission denied|insufficient permission|Operation not permitted|Read-only file system"
    r"|dubious ownership",
    re.IGNORECASE,
)


# A full file system or quota (ENOSPC, EDQUOT), in git's words and the C library's.
_NO_SPACE = re.compile(
    r"No space left on device|Out of diskspace|Disk quota exceeded", re.IGNORECASE
)


@dataclass(frozen=True)
class FailureKind:
    """What a :class:`GitFailure` is: ``"lock"``, ``"permission"``, ``"space"`` (a full file
    system or quota) or ``"other"``.

    ``lock_path`` is the lock file git found (``"lock"`` only).
    """

    kind: str
    lock_path: str | None = None


def failure_kind(failure: GitFailure) -> FailureKind:
    """Classify ``failure`` by git's message (commands run in the C locale).

    A lock that cannot be *created* for lack of permission is a permission problem; a lock file
    that already exists (left by a running or crashed git) is a lock.
    """
    text = failure.stderr
    if _NO_SPACE.search(text):
        return FailureKind("space")
    if _PERMISSION.search(text):
        return FailureKind("permission")
    found = _LOCK_EXISTS.search(text)
    if found:
        return FailureKind("lock", found.group(1))
    return FailureKind("other")


# -- configuration scan ------------------------------------------------------------------------

_DRIVER_SECTIONS = ("filter", "diff", "merge")
_INCLUDE_SECTIONS = ("include", "includeif")
_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\\n]|\\.)*)")?\s*\](.*)$')
_PATH_KEY = re.compile(r"^\s*path\s*=\s*(.*)$", re.IGNORECASE)
_MAX_CONFIG_BYTES = 1 << 20
_MAX_INCLUDE_DEPTH = 10


def _config_value(raw: str) -> str:
    """A config value without quotes, escapes and trailing comment (good enough for paths)."""
    out: list[str] = []
    quoted = False
    chars = iter(raw.strip())
    for char in chars:
        if char == "\\":
            out.append(next(chars, ""))
        elif char == '"':
            quoted = not quoted
        elif char in "#;" and not quoted:
            break
        else:
            out.append(char)
    return "".join(out).strip()


def _scan_config(path: Path, names: dict[str, set[str]], seen: set[Path], depth: int) -> None:
    """Add the driver names defined in ``path`` (and every file it includes) to ``names``."""
    try:
        info = path.stat()
    except OSError:
        return
    # Never read a FIFO or device named by an include; never loop.
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_CONFIG_BYTES or path in seen:
        return
    seen.add(path)
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return
    section = ""
    for line in text.splitlines():
        header = _SECTION.match(line)
        if header:
            name, sub, rest = header.group(1), header.group(2), header.group(3)
            base, dot, legacy = name.partition(".")
            section = base.lower()
            subsection = re.sub(r"\\(.)", r"\1", sub) if sub is not None else None
            if subsection is None and dot:
                subsection = legacy.lower()  # deprecated [section.sub] form: git lowercases it
            if section in _DRIVER_SECTIONS and subsection:
                names[section].add(subsection)
            line = rest
        key = _PATH_KEY.match(line)
        if key and section in _INCLUDE_SECTIONS and depth < _MAX_INCLUDE_DEPTH:
            value = _config_value(key.group(1))
            if value:
                target = Path(value).expanduser()
                if not target.is_absolute():
                    target = path.parent / target
                _scan_config(target, names, seen, depth + 1)


def _config_files(git_dir: str, common_dir: str, env: Mapping[str, str]) -> list[Path]:
    """Every configuration file git may read for this repository (before includes)."""
    files: list[Path] = []
    if not env.get("GIT_CONFIG_NOSYSTEM"):
        files.append(Path(env.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig"))
    if env.get("GIT_CONFIG_GLOBAL"):
        files.append(Path(env["GIT_CONFIG_GLOBAL"]))
    else:
        home = Path(env.get("HOME") or "/")
        xdg = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        files += [xdg / "git" / "config", home / ".gitconfig"]
    files += [
        Path(common_dir) / "config",
        Path(common_dir) / "config.worktree",
        Path(git_dir) / "config.worktree",
    ]
    return files


def driver_overrides(
    git_dir: str, common_dir: str, env: Mapping[str, str] | None = None
) -> tuple[tuple[str, str], ...]:
    """Command-scope settings that disable every filter/diff/merge driver the config names.

    A superset is harmless (a name no attribute uses changes nothing), so ``includeIf``
    conditions are not evaluated: every included file is read (a few small files, no process).
    """
    names: dict[str, set[str]] = {section: set() for section in _DRIVER_SECTIONS}
    seen: set[Path] = set()
    for path in _config_files(git_dir, common_dir, os.environ if env is None else env):
        _scan_config(path, names, seen, 0)
    merge_file = f"{shlex.quote(_git_program())} merge-file --marker-size=%L %A %O %B"
    settings: list[tuple[str, str]] = []
    for name in sorted(names["filter"]):
        settings += [(f"filter.{name}.{k}", "") for k in ("clean", "smudge", "process")]
        settings.append((f"filter.{name}.required", "false"))
    for name in sorted(names["diff"]):
        settings += [(f"diff.{name}.{k}", "") for k in ("command", "textconv")]
    for name in sorted(names["merge"]):
        settings.append((f"merge.{name}.driver", merge_file))
    return tuple(settings)


# -- running git -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunAs:
    """Run git as this user (the repository's owner) instead of the current one (root only)."""

    uid: int
    gid: int


_PROGRAM: list[str] = []


def _git_program() -> str:
    """git's absolute path, looked up once (saves a PATH search per command)."""
    if not _PROGRAM:
        _PROGRAM.append(shutil.which("git") or "git")
    return _PROGRAM[0]


class GitCommand:
    """Runs git against one explicitly located repository, with no repository code.

    Args:
        git_dir: the (per-worktree) git directory.
        common_dir: the repository's common directory (objects, refs).
        work_tree: the working tree, or None for ref-only commands.
        trusted: the repository's owner is trusted although it is not this process's user
            (``safe.directory`` is set for these commands only).
        run_as: run git as this user (root only; see :func:`repository_owner`).
    """

    def __init__(
        self,
        git_dir: str,
        common_dir: str,
        work_tree: str | None = None,
        *,
        trusted: bool = False,
        run_as: RunAs | None = None,
    ) -> None:
        prefix = ["--git-dir", git_dir]
        if work_tree is not None:
            prefix += ["--work-tree", work_tree, "-C", work_tree]
        self._prefix = prefix
        self.git_dir = git_dir
        self.common_dir = common_dir
        self.work_tree = work_tree
        self.run_as = run_as
        self.trusted = trusted
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_VARIABLES}
        if run_as is not None:
            # The owner's own global configuration, not this process's (often unreadable).
            env.pop("XDG_CONFIG_HOME", None)
            env["HOME"] = _home_of(run_as.uid)
        settings = [
            *PRODUCT_IDENTITY.items(),
            *HARDENING,
            *driver_overrides(git_dir, common_dir, env),
        ]
        if trusted:
            settings.append(("safe.directory", "*"))
        for key in [k for k in env if k.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))]:
            del env[key]
        pinned = {
            "GIT_INDEX_FILE": str(Path(git_dir) / "index"),
            "GIT_OBJECT_DIRECTORY": str(Path(common_dir) / "objects"),
            "GIT_COMMON_DIR": common_dir,
        }
        for key in _LOCATION_VARIABLES:
            if key in env:
                env[key] = pinned[key]
        env.update(
            {
                "GIT_CONFIG_COUNT": str(len(settings)),
                "GIT_TERMINAL_PROMPT": "0",
                "GIT_PAGER": "cat",
                "LC_ALL": "C",
                "LANGUAGE": "C",
            }
        )
        for index, (key, value) in enumerate(settings):
            env[f"GIT_CONFIG_KEY_{index}"] = key
            env[f"GIT_CONFIG_VALUE_{index}"] = value
        self._env = env

    def with_work_tree(self, git_dir: str, work_tree: str) -> GitCommand:
        """Commands for another worktree of the same repository, with the same trust."""
        return GitCommand(
            git_dir, self.common_dir, work_tree, trusted=self.trusted, run_as=self.run_as
        )

    def with_index_file(self, index_file: str) -> GitCommand:
        """The same commands reading and writing the index ``index_file`` instead of the
        worktree's own (a throw-away index: nothing the worktree's git sees changes)."""
        other = copy.copy(self)
        other._env = {**self._env, "GIT_INDEX_FILE": index_file}
        return other

    def run(
        self,
        *args: str,
        ok: Iterable[int] = (0,),
        stdin: str | None = None,
        wait_index_lock: bool = False,
    ) -> GitResult:
        """Run ``git <prefix> <args>``; an exit status outside ``ok`` raises :class:`GitFailure`.

        ``wait_index_lock``: the command writes the index; while it fails only because
        ``index.lock`` exists (a ``git status`` of the user refreshing the index holds it for
        milliseconds), it is run again, for at most :data:`INDEX_LOCK_WAIT_SECONDS`. git checks
        the lock before writing anything, so a retry never repeats a write. A lock that stays
        (a crashed git) is reported as before, after the wait.

        Raises:
            GitFailure: git exited with an unexpected status or could not be started.
        """
        deadline = time.monotonic() + INDEX_LOCK_WAIT_SECONDS
        pause = 0.005
        while True:
            result = self._run_once(args, stdin)
            if not (wait_index_lock and result.status != 0 and time.monotonic() < deadline):
                break
            found = _LOCK_EXISTS.search(result.stderr)
            if found is None or not found.group(1).endswith("index.lock"):
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        if result.status not in tuple(ok):
            raise GitFailure(args, result.status, result.stderr or result.stdout)
        return result

    def _run_once(self, args: tuple[str, ...], stdin: str | None) -> GitResult:
        """One run of ``git <prefix> <args>``, whatever its exit status."""
        command = [_git_program(), *self._prefix, *args]
        run_as = self.run_as
        try:
            done = subprocess.run(
                command,
                input=stdin.encode("utf-8", "surrogateescape") if stdin is not None else b"",
                capture_output=True,
                env=self._env,
                check=False,
                user=run_as.uid if run_as else None,
                group=run_as.gid if run_as else None,
                extra_groups=[] if run_as else None,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise GitFailure(args, -1, str(exc)) from exc
        return GitResult(done.returncode, _decode(done.stdout), _decode(done.stderr))


def worktree_entry(path: Path, id_length: int) -> tuple[str, str] | None:
    """(git mode, object id) that ``git add`` would record for ``path``, computed without git.

    ``id_length`` is the repository's object id length in hex (40: SHA-1, 64: SHA-256). A
    regular file is ``100644``/``100755`` (owner's executable bit), a symlink ``120000`` (its
    target as the blob); None for a missing path or any other file type. Content only: no
    filter runs (the product runs none, ``HARDENING``).
    """
    try:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            mode, data = "120000", os.fsencode(path.readlink())
        elif stat.S_ISREG(info.st_mode):
            mode = "100755" if info.st_mode & stat.S_IXUSR else "100644"
            data = path.read_bytes()
        else:
            return None
    except OSError:
        return None
    digest = hashlib.sha256 if id_length == 64 else hashlib.sha1
    return mode, digest(b"blob %d\0" % len(data) + data).hexdigest()


def _home_of(uid: int) -> str:
    """The home directory of ``uid`` when it has one that exists, else ``/``."""
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"
    return home if Path(home).is_dir() else "/"


def open_repo(repo_dir: str | os.PathLike[str]) -> git.Repo:
    """Open the repository of the checkout at ``repo_dir`` with GitPython (no git process).

    Raises:
        GitFailure: not a git checkout, or unreadable.
    """
    try:
        return git.Repo(str(repo_dir), search_parent_directories=True)
    except (git.GitError, OSError, ValueError) as exc:
        raise GitFailure(["open", str(repo_dir)], -1, f"not a git repository: {exc}") from exc


def repository_owner(*paths: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(uid, gid) owning ``paths`` when that is not this process's user, else None.

    The first existing path whose owner differs decides. Used for the owner policy:
    a foreign repository is refused unless trusted, and then git runs as its owner when this
    process is root.

    Raises:
        OSError: a path cannot be inspected.
    """
    me = os.geteuid()
    for path in paths:
        try:
            info = Path(path).stat()
        except FileNotFoundError:
            continue  # e.g. a source worktree removed since (cleanup still works)
        if info.st_uid != me:
            return info.st_uid, info.st_gid
    return None


def read_gitdir_file(work_tree: str | os.PathLike[str]) -> str | None:
    """The admin directory a linked worktree's ``.git`` file points at, or None if unreadable."""
    try:
        content = (Path(work_tree) / ".git").read_text(encoding="utf-8")
    except OSError:
        return None
    prefix = "gitdir:"
    if not content.startswith(prefix):
        return None
    target = content[len(prefix) :].strip()
    if not os.path.isabs(target):  # noqa: PTH117 - str path from git's own file
        target = str(Path(work_tree) / target)
    return target


def registrations_of(common_dir: str | os.PathLike[str], work_tree: Path) -> list[Path]:
    """Admin dirs under ``<common_dir>/worktrees`` registered for exactly ``work_tree``.

    The path-filtered counterpart of ``git worktree prune`` (which has no filter and would
    unregister other people's worktrees whose directory is away for a moment, case 02).
    """
    admin_root = Path(common_dir) / "worktrees"
    try:
        entries = list(admin_root.iterdir())
    except OSError:
        return []
    # git records the real path; compare real paths (the sandbox root may be a symlink).
    wanted = os.path.realpath(work_tree / ".git")
    found = []
    for entry in entries:
        try:
            target = (entry / "gitdir").read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if target and os.path.realpath(target) == wanted:
            found.append(entry)
    return found


_STORE_INTERNALS = frozenset({"objects", "refs", "logs", "hooks", "info", "lfs"})


def registrations_below(common_dir: str | os.PathLike[str], top: Path) -> list[Path]:
    """Admin dirs of the submodule stores under ``<common_dir>/modules`` (nested ones too)
    registered for a work tree strictly inside ``top``: the submodule worktrees a sandbox
    checked out there, found without its record."""
    inside = os.path.realpath(top) + os.sep
    found = []
    for folder, dirs, _files in os.walk(Path(common_dir) / "modules"):
        if Path(folder).name != "worktrees":
            dirs[:] = [d for d in dirs if d not in _STORE_INTERNALS]
            continue
        dirs.clear()  # admin dirs hold no module store
        for entry in sorted(Path(folder).iterdir()):
            try:
                target = (entry / "gitdir").read_text(encoding="utf-8").strip()
            except OSError:
                continue
            if target and os.path.realpath(target).startswith(inside):
                found.append(entry)
    return found


def head_branch(admin_dir: Path) -> str | None:
    """The branch (``refs/heads/...``) a worktree admin dir's HEAD is on, or None."""
    try:
        head = (admin_dir / "HEAD").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return head[len("ref: ") :] if head.startswith("ref: refs/heads/") else None


@contextmanager
def repository_lock(common_dir: str) -> Iterator[None]:
    """Serialise the product's own updates of one repository across threads and processes.

    An exclusive ``flock`` on ``<common_dir>/sandbox-core.lock`` (the common dir, never a linked
    worktree's ``.git`` file). git's own commands do not take it; they are guarded by git's
    index and ref locks, which the product's updates also respect.

    Raises:
        GitFailure: the lock file can neither be made nor opened (its words say why: a
            read-only file system, permission denied).
    """
    path = Path(common_dir) / "sandbox-core.lock"
    try:
        fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        # A read-only file system: an existing lock file still locks (flock needs no write);
        # none there means nothing can be written anyway, which git would report as it does.
        try:
            fd = os.open(str(path), os.O_RDONLY)
        except OSError:
            raise GitFailure(["lock", str(path)], -1, f"cannot create {path}: {exc}") from exc
    try:
        owner = Path(common_dir).stat()
        if os.geteuid() == 0 and os.fstat(fd).st_uid != owner.st_uid:
            os.fchown(fd, owner.st_uid, owner.st_gid)  # the repository's files stay its owner's
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock
