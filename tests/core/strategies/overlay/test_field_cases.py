"""Field cases for the overlay strategy: 11, 12 (overlay), 05 step 2, 06 and 08 (with overlay),
plus reopen across processes and the unprivileged paths (user namespace, no mount permission).

Every kernel-mode test makes real OverlayFS mounts; the autouse fixture unmounts whatever a test
leaves under its tmp_path (even on failure) and fails the test if it had to.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from sandbox_core.errors import SandboxCommitError, SandboxCreationError, SandboxStateError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.overlay import OverlaySandbox
from sandbox_core.strategies.overlay import mount as _overlay_mount
from sandbox_core.tree import sync

REPO_ROOT = Path(__file__).resolve().parents[4]
NOBODY = 65534

KERNEL = pytest.param({"mode": "kernel"}, id="kernel", marks=pytest.mark.overlay_kernel)
FALLBACK = pytest.param({"mode": "fallback"}, id="fallback")


def overlay_mounts_under(root: Path) -> list[str]:
    """Overlay mount points at or below ``root`` in this mount namespace."""
    prefix = os.path.realpath(root)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        point = head.split()[4].replace("\\040", " ")
        if tail.startswith("overlay ") and (point == prefix or point.startswith(prefix + "/")):
            found.append(point)
    return found


@pytest.fixture(autouse=True)
def no_leftover_mounts(tmp_path: Path) -> Iterator[None]:
    yield
    leftovers = overlay_mounts_under(tmp_path)
    for point in leftovers:
        _overlay_mount.unmount(Path(point))
    assert leftovers == [], f"mounts left behind: {leftovers}"


@pytest.fixture
def sandboxes() -> Iterator[list[OverlaySandbox]]:
    made: list[OverlaySandbox] = []
    yield made
    for sandbox in made:
        sandbox.cleanup()


@pytest.fixture
def make(tmp_path: Path, sandboxes: list[OverlaySandbox]) -> Any:
    def factory(src: Path, **options: Any) -> OverlaySandbox:
        sandbox = OverlaySandbox("res", str(src), sandbox_root=str(tmp_path / "root"), **options)
        sandboxes.append(sandbox)
        return sandbox

    return factory


def sh(script: str, cwd: Path, **env: str) -> str:
    done = subprocess.run(
        ["sh", "-ec", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    return done.stdout


def overlay_artefacts(root: Path) -> list[str]:
    """Character devices, ``.wh.*`` names and ``*.overlay.*`` xattrs below ``root``."""
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            if stat.S_ISCHR(os.lstat(path).st_mode) or name.startswith(".wh."):
                found.append(path)
            found += [f"{path}:{x}" for x in os.listxattr(path, follow_symlinks=False)]
    return [item for item in found if ":" not in item or ".overlay." in item]


# -- case 11: delete-and-recreate a directory (opaque dir) and whiteout reuse -----------------


def case11_setup(work: Path) -> Path:
    src = work / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "oldfile").write_text("old\n")
    (src / "a.txt").write_text("A\n")
    return src


CASE11_STEPS = (
    "rm -r d && mkdir d && touch d/newfile\n"
    "mv a.txt a2.txt && echo B > a3.txt && ln -s a3.txt a.txt\n"
)


def assert_case11_outcome(src: Path) -> None:
    assert sorted(os.listdir(src / "d")) == ["newfile"]
    assert (src / "a.txt").is_symlink()
    assert os.readlink(src / "a.txt") == "a3.txt"
    assert (src / "a2.txt").read_text() == "A\n"
    assert (src / "a3.txt").read_text() == "B\n"
    assert overlay_artefacts(src) == []


@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_case11_opaque_dir_commit(tmp_path: Path, make: Any, options: dict[str, Any]) -> None:
    src = case11_setup(tmp_path)
    sandbox = make(src, **options)
    sandbox.create("plan-11")
    merged = Path(sandbox.get_path(""))
    sh(CASE11_STEPS, merged)
    if options["mode"] == "kernel":
        # The fault this case is about: the upper d is opaque (trusted.* as root).
        assert os.getxattr(sandbox.upper_dir / "d", "trusted.overlay.opaque") == b"y"
    result = sandbox.commit("case 11")
    assert_case11_outcome(src)
    assert result.deleted_files == ["d/oldfile"]
    assert result.added_files == ["a2.txt", "a3.txt", "d/newfile"]
    assert result.changed_files == ["a.txt"]


USERNS_SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pathlib import Path
    from sandbox_core.strategies.overlay import OverlaySandbox
    work = Path(sys.argv[1])
    sandbox = OverlaySandbox("res", str(work / "src"), sandbox_root=str(work / "root"),
                             mode="kernel")
    context = sandbox.create("plan-11-userns")
    merged = Path(sandbox.get_path(""))
    subprocess.run(["sh", "-ec", sys.argv[2]], cwd=merged, check=True)
    xattrs = {name: os.getxattr(sandbox.upper_dir / "d", name).decode()
              for name in os.listxattr(sandbox.upper_dir / "d")}
    result = sandbox.commit("case 11 in a user namespace")
    sandbox.cleanup()
    print(json.dumps({"metadata": context.metadata, "upper_d_xattrs": xattrs,
                      "uid": os.getuid(), "uid_map": Path("/proc/self/uid_map").read_text(),
                      "added": result.added_files}))
    """
)


def world_executable(path: Path) -> bool:
    """True when uid 65534 can execute ``path`` (o+x on it and on every parent)."""
    return all(part.stat().st_mode & stat.S_IXOTH for part in [path, *path.parents])


@pytest.fixture(scope="module")
def nobody_python() -> tuple[str, dict[str, str]]:
    """An interpreter uid 65534 can run, with this venv's packages on its path.

    The venv's interpreter may live under a 0700 home (pyenv); then a system python of the same
    minor version is used with the venv's site-packages (pure-Python deps, same ABI).
    """
    wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (Path(os.path.realpath(sys.executable)), Path("/usr/bin/python3")):
        if not candidate.exists() or not world_executable(candidate):
            continue
        version = subprocess.run(
            [str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if version == wanted:
            path = os.pathsep.join([str(REPO_ROOT), sysconfig.get_paths()["purelib"]])
            return str(candidate), {"PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
    pytest.fail(f"no python {wanted} executable by uid {NOBODY} (venv python: {sys.executable})")


@pytest.fixture
def world_work_dir() -> Iterator[Path]:
    """A work directory the unprivileged user can reach (tmp_path's parents are 0700 root)."""
    work = Path(tempfile.mkdtemp(prefix="ovl-unpriv-"))
    work.chmod(0o755)
    yield work
    shutil.rmtree(work)


@pytest.mark.overlay_kernel
def test_case11_unprivileged_user_namespace(
    world_work_dir: Path, nobody_python: tuple[str, dict[str, str]]
) -> None:
    """Unprivileged (uid 65534) ``unshare -Urm``: the mount needs ``userxattr`` and the upper
    layer carries ``user.overlay.opaque``; the commit must read that namespace."""
    src = case11_setup(world_work_dir)
    os.chown(world_work_dir, NOBODY, NOBODY)
    for directory, dirs, files in os.walk(src):
        for name in [".", *dirs, *files]:
            os.chown(os.path.join(directory, name), NOBODY, NOBODY, follow_symlinks=False)
    command = [
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        "unshare", "-Urm",
        nobody_python[0], "-c", USERNS_SCRIPT, str(world_work_dir), CASE11_STEPS,
    ]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **nobody_python[1]},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["uid"] == 0  # root inside the namespace only
    assert report["uid_map"].split() == ["0", str(NOBODY), "1"]
    assert report["metadata"]["overlay_mode"] == "kernel"
    assert report["metadata"]["userxattr"] is True
    assert report["metadata"]["xattr_namespace"] == "user"
    assert report["upper_d_xattrs"] == {"user.overlay.opaque": "y"}
    assert report["added"] == ["a2.txt", "a3.txt", "d/newfile"]
    assert_case11_outcome(src)
    assert not (world_work_dir / "root" / "overlay").exists() or not any(
        (world_work_dir / "root" / "overlay").iterdir()
    )


def test_unprivileged_process_without_mount_permission_falls_back(
    world_work_dir: Path, nobody_python: tuple[str, dict[str, str]]
) -> None:
    """Seed 002 "falls back to copy-on-write when OverlayFS is unavailable", for real: uid 65534
    without a user namespace gets EPERM from mount(2); mode "auto" uses the userspace copy."""
    src = case11_setup(world_work_dir)
    for path in (world_work_dir, src, src / "d", src / "d" / "oldfile", src / "a.txt"):
        os.chown(path, NOBODY, NOBODY)
    script = textwrap.dedent(
        """
        import json, sys
        from sandbox_core.strategies.overlay import OverlaySandbox
        s = OverlaySandbox("res", sys.argv[1] + "/src", sandbox_root=sys.argv[1] + "/root")
        context = s.create("plan-eperm")
        s.cleanup()
        print(json.dumps(context.metadata))
        """
    )
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         nobody_python[0], "-c", script, str(world_work_dir)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **nobody_python[1]},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    metadata = json.loads(done.stdout)
    assert metadata["overlay_mode"] == "fallback"
    assert "[Errno 1] " in metadata["fallback_reason"]


# -- case 12: renaming a lower directory (redirect_dir on/off) --------------------------------


def rename_r(merged: Path) -> str:
    """Step 2 of case 12: raw rename, ``mv`` on EXDEV. Returns which one did it."""
    try:
        os.rename(merged / "r", merged / "r2")
    except OSError as exc:
        assert exc.errno == errno.EXDEV
        sh("mv r r2", merged)
        return "mv"
    return "rename"


@pytest.mark.parametrize(
    ("options", "expected_rename"),
    [
        pytest.param(
            {"mode": "kernel", "redirect_dir": "on"},
            "rename",
            id="kernel-redirect-on",
            marks=pytest.mark.overlay_kernel,
        ),
        pytest.param(
            {"mode": "kernel", "redirect_dir": "off"},
            "mv",
            id="kernel-redirect-off",
            marks=pytest.mark.overlay_kernel,
        ),
        pytest.param({"mode": "fallback"}, "rename", id="fallback"),
    ],
)
def test_case12_renamed_directory(
    tmp_path: Path, make: Any, options: dict[str, Any], expected_rename: str
) -> None:
    src = tmp_path / "src"
    (src / "r" / "sub").mkdir(parents=True)
    (src / "r" / "inner").write_text("keep\n")
    (src / "r" / "sub" / "deep.txt").write_text("deep\n")
    sandbox = make(src, **options)
    sandbox.create("plan-12")
    merged = Path(sandbox.get_path(""))
    sandbox.create_checkpoint_snapshot(tmp_path / "c0")

    assert rename_r(merged) == expected_rename
    if options.get("redirect_dir") == "on":
        upper_r2 = sandbox.upper_dir / "r2"
        assert os.listdir(upper_r2) == []  # the trap: r2 is empty in the upper layer
        assert os.getxattr(upper_r2, "trusted.overlay.redirect") == b"r"
    sandbox.restore_checkpoint_snapshot(tmp_path / "c0")
    assert (merged / "r" / "inner").read_text() == "keep\n"
    assert (merged / "r" / "sub" / "deep.txt").read_text() == "deep\n"
    assert not (merged / "r2").exists()
    assert sandbox.status is SandboxStatus.ACTIVE

    assert rename_r(merged) == expected_rename
    result = sandbox.commit("case 12")
    assert (src / "r2" / "inner").read_text() == "keep\n"
    assert (src / "r2" / "sub" / "deep.txt").read_text() == "deep\n"
    assert not (src / "r").exists()
    assert overlay_artefacts(src) == []
    assert result.added_files == ["r2", "r2/inner", "r2/sub", "r2/sub/deep.txt"]
    assert result.deleted_files == ["r", "r/inner", "r/sub", "r/sub/deep.txt"]
    assert result.changed_files == []


# -- case 05 step 2: source tree whose .git is a file -----------------------------------------


@pytest.fixture
def git_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }.items():
        monkeypatch.setenv(key, value)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.usefixtures("git_env")
@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_case05_linked_worktree_source_is_refused(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    """Policy: a tree whose .git file points outside it is refused (no shared index/refs)."""
    sh(
        "git init -q -b main repo && cd repo && echo a > f && git add f && git commit -qm base\n"
        "git worktree add -q -b feature ../wt\n"
        "cd ../wt && echo feat > g && git add g && git commit -qm feat\n",
        tmp_path,
    )
    wt = tmp_path / "wt"
    main_before = git("-C", str(tmp_path / "repo"), "rev-parse", "main")
    sandbox = make(wt, **options)
    with pytest.raises(SandboxCreationError, match="git file pointing outside the tree") as caught:
        sandbox.create("plan-05")
    assert "Use the git_worktree strategy" in str(caught.value)
    assert sandbox.status is SandboxStatus.ERRORED
    assert (wt / ".git").is_file()
    assert git("-C", str(wt), "status", "--porcelain") == ""
    assert str(wt) in git("-C", str(tmp_path / "repo"), "worktree", "list")
    assert git("-C", str(tmp_path / "repo"), "rev-parse", "main") == main_before
    assert not (tmp_path / "root" / "overlay" / sandbox.sandbox_id).exists()


def test_case05_nested_external_gitfile_is_refused(tmp_path: Path, make: Any) -> None:
    src = tmp_path / "src"
    (src / "vendor" / "lib").mkdir(parents=True)
    (src / "vendor" / "lib" / ".git").write_text(f"gitdir: {tmp_path}/elsewhere/.git\n")
    with pytest.raises(SandboxCreationError, match=r"vendor/lib/\.git"):
        make(src, mode="fallback").create("plan-05b")


def test_case05_gitfile_inside_the_tree_is_allowed(tmp_path: Path, make: Any) -> None:
    """A submodule's relative git dir inside the tree is isolated by the overlay itself."""
    src = tmp_path / "src"
    (src / ".git" / "modules" / "sub").mkdir(parents=True)
    (src / "sub").mkdir()
    (src / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")
    context = make(src, mode="fallback").create("plan-05c")
    assert context.metadata["overlay_mode"] == "fallback"


@pytest.mark.usefixtures("git_env")
@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_case05_git_in_sandbox_of_plain_repo_stays_isolated(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    sh(
        "git init -q -b main repo && cd repo && echo a > f && git add f && git commit -qm base",
        tmp_path,
    )
    repo = tmp_path / "repo"
    sandbox = make(repo, **options)
    sandbox.create("plan-05d")
    merged = Path(sandbox.get_path(""))
    sh("echo x > newfile && git add newfile", merged)
    assert git("-C", str(merged), "status", "--porcelain") == "A  newfile\n"
    assert git("-C", str(repo), "status", "--porcelain") == ""
    sandbox.commit("case 05")
    assert git("-C", str(repo), "status", "--porcelain") == "A  newfile\n"


# -- case 06: symlink loop, dangling and relative links ---------------------------------------


@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_case06_symlink_loop_and_dangling(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "f").write_text("hi\n")
    os.symlink("../..", src / "a" / "b" / "up")
    os.symlink("/nonexistent/target", src / "dangling")
    os.symlink("b/f", src / "a" / "rel")
    sandbox = make(src, **options)
    started = time.monotonic()
    sandbox.create("plan-06")
    assert time.monotonic() - started < 5
    merged = Path(sandbox.get_path(""))
    links = {"a/b/up": "../..", "dangling": "/nonexistent/target", "a/rel": "b/f"}
    for name, target in links.items():
        assert (merged / name).is_symlink()
        assert os.readlink(merged / name) == target
    assert sh("find . -type d | wc -l", merged).strip() == "3"

    sh("echo more >> a/b/f && ln -sfn b/g a/rel", merged)
    result = sandbox.commit("case 06")
    assert (src / "a" / "b" / "f").read_text() == "hi\nmore\n"
    assert {name: os.readlink(src / name) for name in links} == {**links, "a/rel": "b/g"}
    assert sh("find . -type d | wc -l", src).strip() == "3"
    assert result.changed_files == ["a/b/f", "a/rel"]


# -- case 08: file <-> directory type swaps, with a checkpoint in the middle ------------------


@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_case08_type_swaps(tmp_path: Path, make: Any, options: dict[str, Any]) -> None:
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    (src / "x" / "inner.txt").write_text("inner\n")
    (src / "y").write_text("y\n")
    sandbox = make(src, **options)
    sandbox.create("plan-08")
    merged = Path(sandbox.get_path(""))
    sandbox.create_checkpoint_snapshot(tmp_path / "c0")
    swap = "rm -r x && echo now-a-file > x\nrm y && mkdir y && echo child > y/child.txt\n"
    sh(swap, merged)
    sandbox.restore_checkpoint_snapshot(tmp_path / "c0")
    assert (merged / "x" / "inner.txt").read_text() == "inner\n"
    assert (merged / "y").is_file()
    assert (merged / "y").read_text() == "y\n"
    sh(swap, merged)
    result = sandbox.commit("case 08")
    assert (src / "x").is_file()
    assert (src / "x").read_text() == "now-a-file\n"
    assert (src / "y" / "child.txt").read_text() == "child\n"
    assert sorted(os.listdir(src)) == ["x", "y"]
    assert overlay_artefacts(src) == []
    # Same path-level report as copy_on_write (_fs_utils.TreeChanges): a type swap is "changed".
    assert result.changed_files == ["x", "y"]
    assert result.added_files == ["y/child.txt"]
    assert result.deleted_files == ["x/inner.txt"]


# -- commit atomicity, rollback from COMMITTED, cleanup ---------------------------------------


def tree(root: Path) -> dict[str, bytes | str]:
    found: dict[str, bytes | str] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = "->" + os.readlink(path)
            elif path.is_dir():
                found[key] = "dir"
            else:
                found[key] = path.read_bytes()
    return found


@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_failed_swap_leaves_original_exactly_as_it_was(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    src = case11_setup(tmp_path)
    before = tree(src)
    sandbox = make(src, **options)
    sandbox.create("plan-atomic")
    sh(CASE11_STEPS, Path(sandbox.get_path("")))
    swapped: list[str] = []

    def fail_on_second_swap(path: str) -> None:
        swapped.append(path)
        if len(swapped) == 2:
            raise OSError(errno.EIO, "injected swap failure")

    with (
        mock.patch.object(sync, "fault_hook", fail_on_second_swap),
        pytest.raises(SandboxCommitError, match="injected swap failure"),
    ):
        sandbox.commit()
    assert swapped == ["a.txt", "a2.txt"]
    assert tree(src) == before
    assert sandbox.status is SandboxStatus.ERRORED
    # The sandbox still shows the uncommitted work (kernel: remounted on the old upper layer).
    assert os.readlink(sandbox.merged_dir / "a.txt") == "a3.txt"


@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_rollback_from_committed_restores_case11_tree(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    src = case11_setup(tmp_path)
    before = tree(src)
    sandbox = make(src, **options)
    sandbox.create("plan-undo")
    checkpoint = sandbox.create_checkpoint_snapshot(tmp_path / "c0")
    sh(CASE11_STEPS, Path(sandbox.get_path("")))
    sandbox.commit()
    assert sandbox.context.metadata["lower_generation"] == 1
    sandbox.rollback()
    assert sandbox.status is SandboxStatus.ROLLED_BACK
    assert tree(src) == before
    assert tree(sandbox.merged_dir) == before
    assert sandbox.context.metadata["lower_generation"] == checkpoint["lower_generation"]
    sandbox.restore_checkpoint_snapshot(tmp_path / "c0")  # valid again: same original


@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_checkpoint_of_another_sandbox_is_refused(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    """An upper-layer snapshot only means something on top of the sandbox it was taken in."""
    src = case11_setup(tmp_path)
    first = make(src, **options)
    first.create("plan-a")
    Path(first.get_path("a-only.txt")).write_text("a")
    first.create_checkpoint_snapshot(tmp_path / "c-first")
    second = make(src, **options)
    second.create("plan-b")
    with pytest.raises(SandboxStateError, match="sandbox_id differ"):
        second.restore_checkpoint_snapshot(tmp_path / "c-first")
    assert not (second.merged_dir / "a-only.txt").exists()
    assert second.status is SandboxStatus.CREATED


@pytest.mark.overlay_kernel
def test_cleanup_of_busy_mount_detaches_lazily(tmp_path: Path, make: Any) -> None:
    src = case11_setup(tmp_path)
    sandbox = make(src, mode="kernel")
    sandbox.create("plan-busy")
    holder = subprocess.Popen(["sleep", "30"], cwd=sandbox.get_path("d"))
    try:
        sandbox.cleanup()
        assert overlay_mounts_under(tmp_path) == []
        assert not sandbox.base_path.exists()
        assert sandbox.status is SandboxStatus.CLEANED_UP
    finally:
        holder.kill()
        holder.wait()
    assert (src / "d" / "oldfile").read_text() == "old\n"


def test_symlink_escaping_the_sandbox_is_refused(tmp_path: Path, make: Any) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.symlink("/etc", src / "escape")
    sandbox = make(src)
    sandbox.create("plan-esc")
    with pytest.raises(ValueError, match=r"^Path traversal not allowed$"):
        sandbox.get_path("escape/passwd")
    with pytest.raises(ValueError, match=r"^Path traversal not allowed$"):
        sandbox.get_path("../src/x")


def test_sandbox_root_inside_the_original_is_refused(tmp_path: Path) -> None:
    src = case11_setup(tmp_path)
    sandbox = OverlaySandbox("res", str(src), sandbox_root=str(src / ".sandboxes"))
    with pytest.raises(SandboxCreationError, match="lies inside the original"):
        sandbox.create("plan-inside")
    assert sorted(os.listdir(src)) == ["a.txt", "d"]


def test_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overlay mode must be one of auto, kernel, fallback"):
        OverlaySandbox("res", str(tmp_path), mode="fuse")


# -- reopen across processes ------------------------------------------------------------------

REOPEN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from sandbox_core.strategies.overlay import OverlaySandbox
    record_file, action = Path(sys.argv[1]), sys.argv[2]
    if action == "create":
        s = OverlaySandbox("res", sys.argv[3], sandbox_root=sys.argv[4], mode="kernel")
        s.create("plan-reopen")
        Path(s.get_path("from-process-1.txt")).write_text("one")
    else:
        s = OverlaySandbox.reopen(json.loads(record_file.read_text()))
        print(Path(s.get_path("from-process-1.txt")).read_text())
        if action == "commit":
            print(json.dumps(s.commit("after reopen").added_files))
    record_file.write_text(json.dumps(s.to_record()))
    """
)


def run_process(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", REOPEN_SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.overlay_kernel
def test_reopen_in_another_process_and_after_reboot(tmp_path: Path) -> None:
    src = case11_setup(tmp_path)
    record = tmp_path / "record.json"
    run_process(str(record), "create", str(src), str(tmp_path / "root"))
    merged = json.loads(record.read_text())["context"]["sandbox_path"]
    # The mount belongs to the mount namespace: it outlives process 1.
    assert overlay_mounts_under(tmp_path) == [os.path.realpath(merged)]

    assert run_process(str(record), "read").splitlines() == ["one"]
    assert overlay_mounts_under(tmp_path) == [os.path.realpath(merged)]  # not mounted twice

    _overlay_mount.unmount(Path(merged))  # what a reboot does
    assert overlay_mounts_under(tmp_path) == []
    lines = run_process(str(record), "commit").splitlines()
    assert lines == ["one", json.dumps(["from-process-1.txt"])]
    assert (src / "from-process-1.txt").read_text() == "one"
    assert overlay_mounts_under(tmp_path) == [os.path.realpath(merged)]

    sandbox = OverlaySandbox.reopen(json.loads(record.read_text()))
    assert sandbox.status is SandboxStatus.COMMITTED
    sandbox.cleanup()
    assert overlay_mounts_under(tmp_path) == []
    assert not sandbox.base_path.exists()


CRASH_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from sandbox_core.tree import sync
    from sandbox_core.strategies.overlay import OverlaySandbox
    record_file, src, root = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    s = OverlaySandbox("res", src, sandbox_root=root, mode="kernel")
    s.create("plan-crash")
    Path(s.get_path("a.txt")).write_text("changed")
    Path(s.get_path("new.txt")).write_text("new")
    record_file.write_text(json.dumps(s.to_record()))
    sync.fault_hook = lambda path: os._exit(9)  # killed after the first swap
    s.commit()
    """
)


@pytest.mark.overlay_kernel
def test_crash_mid_commit_is_recovered_on_reopen(tmp_path: Path) -> None:
    """The process dies after one path was swapped into the (unmounted) lower dir: reopening
    repairs the original first, then remounts the untouched upper layer."""
    src = case11_setup(tmp_path)
    before = tree(src)
    record = tmp_path / "record.json"
    done = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(record), str(src), str(tmp_path / "root")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )
    assert done.returncode == 9, done.stderr
    assert tree(src) != before  # the crash left a half-applied commit
    assert overlay_mounts_under(tmp_path) == []  # the lower was unmounted while written

    sandbox = OverlaySandbox.reopen(json.loads(record.read_text()))
    try:
        assert tree(src) == before
        assert overlay_mounts_under(tmp_path) == [os.path.realpath(sandbox.merged_dir)]
        assert (sandbox.merged_dir / "a.txt").read_text() == "changed"
        result = sandbox.commit("again")
        assert result.changed_files == ["a.txt"]
        assert result.added_files == ["new.txt"]
        assert (src / "a.txt").read_text() == "changed"
        assert sorted(os.listdir(src.parent)) == ["record.json", "root", "src"]
    finally:
        sandbox.cleanup()


@pytest.mark.overlay_kernel
def test_original_path_with_option_separators_mounts(tmp_path: Path, make: Any) -> None:
    """``,`` and ``:`` split overlay mount options; the lower layer is reached through a link."""
    src = tmp_path / "we,ird:dir"
    src.mkdir()
    (src / "f").write_text("1")
    sandbox = make(src, mode="kernel")
    assert sandbox.create("plan-odd").metadata["overlay_mode"] == "kernel"
    Path(sandbox.get_path("f")).write_text("2")
    sandbox.commit()
    assert (src / "f").read_text() == "2"


@pytest.mark.parametrize("options", [KERNEL, FALLBACK])
def test_directory_mode_change_is_committed(
    tmp_path: Path, make: Any, options: dict[str, Any]
) -> None:
    """A chmod of a directory kept in place (kernel: a copied-up, non-opaque upper dir)."""
    src = case11_setup(tmp_path)
    (src / "d").chmod(0o755)
    sandbox = make(src, **options)
    sandbox.create("plan-mode")
    merged = Path(sandbox.get_path(""))
    (merged / "d" / "extra").write_text("e")
    (merged / "d").chmod(0o500)
    result = sandbox.commit()
    assert stat.S_IMODE((src / "d").stat().st_mode) == 0o500
    assert (src / "d" / "extra").read_text() == "e"
    assert (src / "d" / "oldfile").read_text() == "old\n"
    assert result.changed_files == ["d"]
    assert result.added_files == ["d/extra"]
    (src / "d").chmod(0o755)
