"""Adversarial inputs against the fidelity (issue 7) and two-phase (issue 9) promises of the
directory strategies: a directory swapped for a symlink, names of 255 bytes and with leading
dashes, type swaps, holes, symlink loops, immutable and append-only originals (chattr), paths at
PATH_MAX, an original named through a symlink. The repository shapes of git_worktree, the
database inputs and the plans over overlapping directories found in the same search are in
``core/strategies/git_worktree/test_repository_shapes.py``,
``core/strategies/transaction/test_triggers_and_pragmas.py`` and
``core/plan/test_overlapping_sources.py``.

Each input is derived from a public report of the same kind of fault in a comparable tool
(named in the test's docstring). Property checked, on real directories, real git repositories,
real SQLite files and the real PostgreSQL server:

- after commit the original equals the sandbox's intended tree (metadata-complete, see
  :func:`tests.support.fidelity_tree.tree_state`), after rollback from COMMITTED the tree before;
- a refused or failed commit touches nothing and never leaves the sandbox ERRORED with its
  edits stuck; nothing is ever written outside the original;
- two-phase leaves no staged file and no prepared transaction.

Inputs that still break the product are ``xfail(strict=True)`` with the fault in one line.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_core.errors import SandboxCommitError, SandboxCreationError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.base import BaseSandbox
from tests.support.directory_sandboxes import STRATEGIES, new_sandbox
from tests.support.fidelity_tree import differences, tree_state
from tests.support.landing import TXID, base_tree, land, no_staging, two_phase_or_not
from tests.support.long_paths import KINDS as LONG_KINDS
from tests.support.long_paths import deep_edit, deep_original, long_sandbox, long_state

Edit = Callable[[Path, Path], None]


@pytest.fixture
def flagged() -> Iterator[list[Path]]:
    """Paths given chattr flags by a test; cleared at teardown so tmp_path can be removed."""
    made: list[Path] = []
    yield made
    for path in made:
        subprocess.run(["chattr", "-i", "-a", str(path)], check=False)


def chattr(flag: str, path: Path, made: list[Path]) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)
    made.append(path)


@pytest.fixture
def make(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[Path], BaseSandbox]]:
    made: list[BaseSandbox] = []

    def factory(src: Path) -> BaseSandbox:
        sandbox = new_sandbox(request.param, src, tmp_path / "root")
        sandbox.create("s14")
        made.append(sandbox)
        return sandbox

    yield factory
    for sandbox in made:
        sandbox.cleanup()


def strategies(func: Callable[..., None]) -> Callable[..., None]:
    return pytest.mark.parametrize("make", STRATEGIES, indirect=True)(func)


def commit_and_roll_back(sandbox: BaseSandbox, src: Path, two_phase: bool) -> None:
    """The core oracle: commit lands exactly the view, rollback restores exactly the tree."""
    view = Path(sandbox.get_path(""))
    before, intended = tree_state(src, top=True), tree_state(view, top=True)
    land(sandbox, two_phase)
    assert differences(tree_state(src, top=True), intended) == []
    no_staging(src)
    sandbox.rollback()
    assert differences(tree_state(src, top=True), before) == []
    no_staging(src)


# -- rsync --keep-dirlinks / git CVE-2021-21300 kind: a directory became a symlink -----------------


SWAPS = ["symlink-outside", "symlink-inside", "file"]


@strategies
@two_phase_or_not
@pytest.mark.parametrize("swap", SWAPS)
def test_commit_never_writes_through_a_symlink_that_replaced_a_directory(
    tmp_path: Path, make: Callable[[Path], BaseSandbox], two_phase: bool, swap: str
) -> None:
    """Inspired by "symlinks that become directories" (rsync list, 2007-10,
    https://lists.samba.org/archive/rsync/2007-October/018992.html: with --keep-dirlinks rsync
    writes through the receiver's symlink). After create, the original's ``d`` is replaced by a
    symlink to a folder outside the tree, by a symlink to another folder of the tree, or by a
    file; the sandbox edited ``d/c.txt``. Found: the overlay fallback wrote the sandbox's
    ``c.txt`` through the symlink (outside the original, or into the wrong folder), and failed
    (ERRORED) on the file (fixed in ``_fs_utils._plan``: an ancestor that is no longer a real
    directory is replaced whole). copy_on_write refuses it as a conflict; the overlay modes land
    the sandbox's ``d`` (the sandbox wins, as in the merged view)."""
    src = base_tree(tmp_path)
    (src / "e").mkdir()
    (src / "e" / "c.txt").write_text("e\n")
    sandbox = make(src)
    view = Path(sandbox.get_path(""))
    (view / "d" / "c.txt").write_text("from the sandbox\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "c.txt").write_text("outside\n")
    shutil.rmtree(src / "d")
    if swap == "symlink-outside":
        os.symlink(outside, src / "d")
    elif swap == "symlink-inside":
        os.symlink("e", src / "d")
    else:
        (src / "d").write_text("a file now\n")
    outside_before, before = tree_state(outside), tree_state(src, top=True)
    if sandbox.strategy == "copy_on_write":
        with pytest.raises(SandboxCommitError) as refused:
            land(sandbox, two_phase)
        assert refused.value.conflicts
        assert sandbox.status is SandboxStatus.ACTIVE
        assert tree_state(src, top=True) == before
    else:
        commit_and_roll_back(sandbox, src, two_phase)
        assert (src / "e" / "c.txt").read_text() == "e\n"
    assert tree_state(outside) == outside_before
    no_staging(src)


@strategies
def test_a_directory_swapped_for_a_symlink_between_prepare_and_apply(
    tmp_path: Path, make: Callable[[Path], BaseSandbox]
) -> None:
    """Same kind, in the window between prepare and apply (the rsync non-atomic symlink
    replacement report, https://bugzilla.samba.org/show_bug.cgi?id=5820). Whatever the apply
    decides, nothing is written outside the original, and the original is either untouched or
    exactly the sandbox's tree."""
    src = base_tree(tmp_path)
    sandbox = make(src)
    view = Path(sandbox.get_path(""))
    (view / "d" / "c.txt").write_text("from the sandbox\n")
    (view / "d" / "new.txt").write_text("new\n")
    intended = tree_state(view, top=True)
    sandbox.prepare(TXID)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "c.txt").write_text("outside\n")
    shutil.rmtree(src / "d")
    os.symlink(outside, src / "d")
    outside_before, before = tree_state(outside), tree_state(src, top=True)
    try:
        sandbox.apply_prepared(TXID)
    except SandboxCommitError:
        assert tree_state(src, top=True) == before
        sandbox.abort_prepared(TXID)
        assert sandbox.status is SandboxStatus.ACTIVE
    else:
        assert differences(tree_state(src, top=True), intended) == []
    assert tree_state(outside) == outside_before
    no_staging(src)


# -- names, type swaps, holes, loops: inputs that pass (regressions) -------------------------------


LONG = "L" * 255  # NAME_MAX: a staged name built from it must not exceed it


def long_and_dash_names(view: Path, src: Path) -> None:
    (view / LONG).write_text("changed\n")
    (view / ("N" * 255)).write_text("added\n")
    for name in ("-rf", "--help", "-", "-n", "--new"):
        (view / name).write_text(name + " new\n")


def dir_to_file(view: Path, src: Path) -> None:
    shutil.rmtree(view / "d")
    (view / "d").write_text("now a file\n")


def file_to_dir(view: Path, src: Path) -> None:
    os.unlink(view / "a.txt")
    (view / "a.txt").mkdir()
    (view / "a.txt" / "in").write_text("in\n")


def file_to_symlink_to_dir(view: Path, src: Path) -> None:
    os.unlink(view / "a.txt")
    os.symlink("d", view / "a.txt")


def dir_to_symlink_to_dir(view: Path, src: Path) -> None:
    (view / "e").mkdir()
    (view / "e" / "c.txt").write_text("e\n")
    shutil.rmtree(view / "d")
    os.symlink("e", view / "d")


def symlink_to_dir_becomes_dir(view: Path, src: Path) -> None:
    os.unlink(view / "ln")
    (view / "ln").mkdir()
    (view / "ln" / "y").write_text("y\n")


def sparse_ends(view: Path, src: Path) -> None:
    with open(view / "tail", "wb") as handle:
        handle.truncate(8 << 20)
        handle.seek((8 << 20) - 1)
        handle.write(b"Z")
    with open(view / "hole", "wb") as handle:
        handle.truncate(4 << 20)


def symlink_loops(view: Path, src: Path) -> None:
    os.unlink(view / "loop")
    os.symlink("loop2", view / "loop")
    os.symlink("z", view / "z")


def seed_extra(src: Path) -> None:
    (src / LONG).write_text("old\n")
    for name in ("-rf", "--help", "-", "-n"):
        (src / name).write_text(name)
    (src / "e0").mkdir()
    os.symlink("e0", src / "ln")
    os.symlink("loop", src / "loop")
    os.symlink("y", src / "x")
    os.symlink("x", src / "y")


EDITS: dict[str, Edit] = {
    "names-255-bytes-and-leading-dashes": long_and_dash_names,
    "dir-to-file": dir_to_file,
    "file-to-dir": file_to_dir,
    "file-to-symlink-to-dir": file_to_symlink_to_dir,
    "dir-to-symlink-to-dir": dir_to_symlink_to_dir,
    "symlink-to-dir-becomes-dir": symlink_to_dir_becomes_dir,
    "sparse-data-only-at-the-end-and-all-hole": sparse_ends,
    "symlink-loops": symlink_loops,
}


@strategies
@two_phase_or_not
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_tricky_inputs_commit_and_roll_back_exactly(
    tmp_path: Path, make: Callable[[Path], BaseSandbox], two_phase: bool, edit: str
) -> None:
    """Names of 255 bytes and with leading dashes (rsync "mkstemp failed: File name too long",
    https://github.com/bit-team/backintime/issues/1112; temp names capped by NAME_MAX,
    https://github.com/oferchen/rsync/pull/6905), type swaps in both directions and through
    symlinks to directories (rsync --copy-dirlinks/--keep-dirlinks man page), sparse files with
    data only at the end or no data, symlink loops. All pass: kept as regressions."""
    src = base_tree(tmp_path)
    seed_extra(src)
    sandbox = make(src)
    EDITS[edit](Path(sandbox.get_path("")), src)
    commit_and_roll_back(sandbox, src, two_phase)


# -- immutable and append-only originals (chattr) --------------------------------------------------


def block_with_flags(view: Path, src: Path, made: list[Path], kind: str) -> None:
    (view / "a.txt").write_text("A from the sandbox\n")
    if kind == "immutable-file":
        (view / "d" / "c.txt").write_text("c from the sandbox\n")
        chattr("+i", src / "d" / "c.txt", made)
    elif kind == "append-only-dir":
        (view / "d" / "c.txt").write_text("c from the sandbox\n")
        chattr("+a", src / "d", made)
    else:
        (view / "d" / "new.txt").write_text("new\n")
        chattr("+i", src / "d", made)


FLAGS = ["immutable-file", "append-only-dir", "immutable-dir"]


@strategies
@pytest.mark.parametrize("kind", FLAGS)
def test_one_shot_commit_blocked_by_chattr_touches_nothing(
    tmp_path: Path, make: Callable[[Path], BaseSandbox], flagged: list[Path], kind: str
) -> None:
    """restic "restore fails to restore files in a read-only directory"
    (https://github.com/restic/restic/issues/656) and "cannot rewrite files that are readonly"
    (https://github.com/restic/restic/issues/4757): a rename the kernel refuses part-way. The
    journaled undo holds: the original is exactly as it was, nothing is staged."""
    src = base_tree(tmp_path)
    sandbox = make(src)
    block_with_flags(Path(sandbox.get_path("")), src, flagged, kind)
    before = tree_state(src, top=True)
    with pytest.raises(SandboxCommitError):
        sandbox.commit()
    assert tree_state(src, top=True) == before
    no_staging(src)


@strategies
@pytest.mark.parametrize("kind", FLAGS)
def test_one_shot_commit_blocked_by_chattr_keeps_the_sandbox_active_for_a_retry(
    tmp_path: Path, make: Callable[[Path], BaseSandbox], flagged: list[Path], kind: str
) -> None:
    """Found: the refused commit left the sandbox ERRORED, its edits stuck (git_worktree keeps
    it ACTIVE, test_refused_commit_and_file_modes.py). Fixed: refused before anything is written,
    ACTIVE, the flagged paths are the conflicts; once the flag is cleared the commit lands."""
    src = base_tree(tmp_path)
    sandbox = make(src)
    block_with_flags(Path(sandbox.get_path("")), src, flagged, kind)
    with pytest.raises(SandboxCommitError) as refused:
        sandbox.commit()
    assert refused.value.conflicts  # the flagged paths, named
    assert sandbox.status is SandboxStatus.ACTIVE
    for path in flagged:
        subprocess.run(["chattr", "-i", "-a", str(path)], check=True)
    commit_and_roll_back(sandbox, src, two_phase=False)


@strategies
@pytest.mark.parametrize("kind", FLAGS)
def test_two_phase_prepare_finds_an_immutable_or_append_only_target(
    tmp_path: Path, make: Callable[[Path], BaseSandbox], flagged: list[Path], kind: str
) -> None:
    """Issue 9: prepare does all the work that can fail; apply is only renames. Found: prepare
    did not look at inode flags, so apply renamed ``a.txt`` into the original and then failed
    on the flagged path, after the decision (fixed: ``_fs_utils.refuse_flagged`` in
    ``stage_sync`` and ``sync_tree``). Now prepare is refused, nothing touched, ACTIVE."""
    src = base_tree(tmp_path)
    sandbox = make(src)
    block_with_flags(Path(sandbox.get_path("")), src, flagged, kind)
    before = tree_state(src, top=True)
    with pytest.raises(SandboxCommitError) as refused:
        sandbox.prepare(TXID)
    assert refused.value.conflicts and "chattr" in str(refused.value)
    assert sandbox.status is SandboxStatus.ACTIVE
    assert tree_state(src, top=True) == before
    no_staging(src)
    for path in flagged:
        subprocess.run(["chattr", "-i", "-a", str(path)], check=True)
    commit_and_roll_back(sandbox, src, two_phase=True)


@pytest.mark.parametrize("kind", LONG_KINDS)
@two_phase_or_not
def test_overlay_kernel_commit_of_a_deep_path(
    tmp_path: Path, kind: str, two_phase: bool, git_identity: None
) -> None:
    """The rsync report of temp paths past MAXPATHLEN under deep directories
    (https://github.com/oferchen/rsync/pull/6905). Found: the overlay kernel one-shot commit of
    a path near PATH_MAX failed with ENAMETOOLONG in its stage mirror (a longer path than the
    view's) and left the sandbox ERRORED. Fixed (stage mirror named by a short alias,
    ``_path_limits``); every strategy and mode lands it (more in ``test_long_paths.py``)."""
    src, root, parts = deep_original(kind, tmp_path)
    sandbox = long_sandbox(kind, src, root)
    try:
        sandbox.create("s14")
        view = Path(sandbox.get_path(""))
        deep_edit(view, parts)
        keep = {b".git"} if kind == "git_worktree" else set()
        before, intended = long_state(src, keep), long_state(view, keep)
        land(sandbox, two_phase)
        assert sandbox.status is SandboxStatus.COMMITTED
        assert differences(long_state(src, keep), intended) == []
        sandbox.rollback()
        assert differences(long_state(src, keep), before) == []
    finally:
        sandbox.cleanup()


# -- the original named through a symlink -------------------------------------------------------


@pytest.mark.parametrize("kind", [p.id for p in STRATEGIES])
@two_phase_or_not
def test_original_given_as_a_symlink_to_a_directory(
    tmp_path: Path, kind: str, two_phase: bool
) -> None:
    """An original path that is a symlink to the real directory (rsync's "src/ vs src" and
    --keep-dirlinks reports: the top of a transfer reached through a link). Found: overlay
    kernel mode read the top's metadata from the link itself (mode 0777), so rollback from
    COMMITTED made the real directory world-writable and two-phase apply always reported the
    top as "changed since prepare" (fixed: ``_fs_utils.root_meta`` and ``_root_ops`` read the
    top through the link, as the ops write it). The overlay fallback refuses such an original at
    create, nothing touched; the other modes commit and roll back exactly."""
    real = base_tree(tmp_path)
    os.chmod(real, 0o755)  # noqa: S103 (the usual mode of a directory, asserted after)
    link = tmp_path / "link"
    os.symlink("src", link)
    before = tree_state(real, top=True)
    sandbox = new_sandbox(kind, link, tmp_path / "root")
    try:
        try:
            sandbox.create("s14")
        except SandboxCreationError:
            assert kind == "overlay-fallback"
            assert tree_state(real, top=True) == before
            return
        view = Path(sandbox.get_path(""))
        (view / "a.txt").write_text("A\n")
        (view / "new.txt").write_text("new\n")
        commit_and_roll_back(sandbox, real, two_phase)
        assert os.path.islink(link) and stat.S_IMODE(os.stat(real).st_mode) == 0o755
    finally:
        sandbox.cleanup()
    assert tree_state(real, top=True) == before

