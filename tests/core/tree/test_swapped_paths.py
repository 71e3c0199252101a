"""No write through a swapped path (case 44) and no write of another writer lost during a
commit (case 43 A): every change to an original goes through directory descriptors opened
without following symlinks, and each replaced path's stamp is compared right before its rename.

Case 44: a folder of the original swapped for a symlink to a folder outside it while the commit
runs: nothing outside the original is written, renamed or removed; the commit either refuses
(a conflict naming the folder, nothing of the original lost, the sandbox ACTIVE) or writes only
inside the original. Case 43 A: the application appends to a file while the commit runs: its
line is still there afterwards, the commit refused as a conflict naming the file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox_core.errors import SandboxCommitError
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.overlay import mount as _overlay_mount
from sandbox_core.tree import beneath, staging
from sandbox_core.tree.guards import ChangedMeanwhileError, SwappedPathError
from sandbox_core.tree.original_lock import LOCK_SUFFIX
from sandbox_core.tree.scan import scan_tree
from sandbox_core.tree.snapshot import compute_changes
from sandbox_core.tree.sync import sync_tree
from tests.support.directory_sandboxes import STRATEGIES, Make
from tests.support.tree_generators import PROPERTY

BULK = 500  # the case has 3,000; the staging area only needs to live while the watcher looks


def _contents(root: Path) -> dict[str, str]:
    """Every path below ``root`` with its kind and content (file text, link target)."""
    out: dict[str, str] = {}
    for rel, entry in scan_tree(root).items():
        if entry.kind == "file":
            out[rel] = "f:" + (root / rel).read_text()
        else:
            out[rel] = f"{entry.kind}:{entry.target}"
    return out


class Watcher:
    """A thread that, as soon as a new entry appears in one of ``dirs``, runs ``action`` once
    (the watcher of cases 43 and 44: another process reacting to the commit's first write).
    The original's lock file, made before the commit reads anything, is not a write of it."""

    def __init__(self, dirs: list[Path], action: Callable[[], None]) -> None:
        self.dirs = dirs
        self.action = action
        self.fired = threading.Event()
        self._stop = threading.Event()
        self._before = {d: set(os.listdir(d)) for d in dirs}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for directory in self.dirs:
                new = set(os.listdir(directory)) - self._before[directory]
                if {name for name in new if not name.endswith(LOCK_SUFFIX)}:
                    self.action()
                    self.fired.set()
                    return
            time.sleep(0.0005)  # leave the commit thread the interpreter between looks

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """Case 44's setup: ``vol/src`` with ``bulk/`` (3,000 files) and ``sub/f``; ``outside/f``."""
    w = tmp_path / "w"
    (w / "vol" / "src" / "bulk").mkdir(parents=True)
    (w / "vol" / "src" / "sub").mkdir()
    (w / "outside").mkdir()
    for i in range(BULK):
        (w / "vol" / "src" / "bulk" / f"{i:04d}").write_text("old\n")
    (w / "vol" / "src" / "sub" / "f").write_text("sub old\n")
    (w / "outside" / "f").write_text("OUTSIDE\n")
    return w


def _swap_sub(w: Path) -> None:
    os.rename(w / "vol" / "src" / "sub", w / "sub.moved")
    os.symlink(w / "outside", w / "vol" / "src" / "sub")


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_case_44_a_folder_swapped_for_a_symlink_during_commit_is_never_written_through(
    make: Make, world: Path
) -> None:
    """Case 44: the watcher swaps ``sub`` for a symlink to ``outside`` as the commit's first
    entry appears; ``outside/f`` stays ``OUTSIDE``, and a refusal loses nothing."""
    w = world
    sandbox = make(w / "vol" / "src")
    sandbox.create("plan")
    view = Path(sandbox.get_path(""))
    for i in range(BULK):
        (view / "bulk" / f"{i:04d}").write_text("new\n")
    (view / "sub" / "f").write_text("sub new (sandbox)\n")
    outside_before = _contents(w / "outside")
    with Watcher([w / "vol", w / "vol" / "src"], lambda: _swap_sub(w)) as watcher:
        try:
            sandbox.commit()
        except SandboxCommitError as exc:
            assert exc.conflicts, exc
            assert sandbox.status is SandboxStatus.ACTIVE
            assert (w / "sub.moved" / "f").read_text() == "sub old\n"
            assert all(
                (w / "vol" / "src" / "bulk" / f"{i:04d}").read_text() == "old\n"
                for i in range(BULK)
            )
        else:
            # Committed into the original only: sub/f went into the real folder (moved away
            # after the commit wrote it) or nowhere.
            assert (w / "sub.moved" / "f").read_text() in ("sub old\n", "sub new (sandbox)\n")
    assert watcher.fired.is_set()
    assert _contents(w / "outside") == outside_before
    assert (w / "outside" / "f").read_text() == "OUTSIDE\n"
    assert sorted(os.listdir(w / "outside")) == ["f"]


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_case_44_a_folder_swapped_right_before_its_rename_is_refused(
    make: Make, world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 44, at the worst moment: ``sub`` is swapped right before the commit's first call
    that reaches it; the commit refuses naming ``sub``, the original is as it was."""
    w = world
    sandbox = make(w / "vol" / "src")
    sandbox.create("plan")
    (Path(sandbox.get_path("")) / "sub" / "f").write_text("sub new (sandbox)\n")

    def swap_once(call: str, rel: str) -> None:
        if rel.startswith("sub") and not (w / "sub.moved").exists():
            _swap_sub(w)

    monkeypatch.setattr(beneath, "fault_hook", swap_once)
    with pytest.raises(SandboxCommitError) as caught:
        sandbox.commit()
    assert "sub" in caught.value.conflicts
    assert sandbox.status is SandboxStatus.ACTIVE
    assert (w / "outside" / "f").read_text() == "OUTSIDE\n"
    assert sorted(os.listdir(w / "outside")) == ["f"]
    assert (w / "sub.moved" / "f").read_text() == "sub old\n"


@pytest.fixture
def ledger_world(tmp_path: Path) -> Path:
    """Case 43's setup: ``vol/src`` with ``bulk/`` (3,000 files) and ``ledger`` = ``seed``."""
    w = tmp_path / "w"
    (w / "vol" / "src" / "bulk").mkdir(parents=True)
    for i in range(BULK):
        (w / "vol" / "src" / "bulk" / f"{i:04d}").write_text("old\n")
    (w / "vol" / "src" / "ledger").write_text("seed\n")
    return w


APP_LINE = "app line written while the commit ran\n"


@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_case_43_a_the_applications_write_during_a_commit_is_kept(
    make: Make, ledger_world: Path
) -> None:
    """Case 43 A: the application appends to ``ledger`` as the commit's first entry appears:
    the commit is a conflict naming ``ledger``, nothing written (``bulk/*`` old), the sandbox
    ACTIVE, and the application's line is in ``ledger``."""
    w = ledger_world
    src = w / "vol" / "src"
    sandbox = make(src)
    sandbox.create("plan")
    view = Path(sandbox.get_path(""))
    for i in range(BULK):
        (view / "bulk" / f"{i:04d}").write_text("new\n")
    with (view / "ledger").open("a") as handle:
        handle.write("sandbox line\n")

    def app_writes() -> None:
        with (src / "ledger").open("a") as handle:
            handle.write(APP_LINE)

    with (
        Watcher([w / "vol", src], app_writes) as watcher,
        pytest.raises(SandboxCommitError) as caught,
    ):
        sandbox.commit()
    assert watcher.fired.is_set()
    assert "ledger" in caught.value.conflicts
    assert sandbox.status is SandboxStatus.ACTIVE
    assert (src / "ledger").read_text() == "seed\n" + APP_LINE
    assert all((src / "bulk" / f"{i:04d}").read_text() == "old\n" for i in range(BULK))
    assert not [name for name in os.listdir(w / "vol") if name != "src"]


def test_case_43_a_write_between_the_check_and_the_rename_is_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 43 A at the tree level: a write that lands after the sync planned (the check) and
    before the rename of that path refuses the sync naming it, and undoes the renames already
    made: the target is exactly as the other writer left it."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    for root in (src, dst):
        (root / "d").mkdir(parents=True)
        (root / "a").write_text("a old\n")
        (root / "d" / "ledger").write_text("seed\n")
    (src / "a").write_text("a new\n")
    (src / "d" / "ledger").write_text("seed\nsandbox\n")

    def app_writes(call: str, rel: str) -> None:
        if call == "stat" and rel == "d/ledger" and "app" not in (dst / "d" / "ledger").read_text():
            with (dst / "d" / "ledger").open("a") as handle:
                handle.write("app\n")

    monkeypatch.setattr(beneath, "fault_hook", app_writes)
    with pytest.raises(ChangedMeanwhileError) as caught:
        sync_tree(src, dst)
    assert caught.value.paths == ["d/ledger"]
    assert _contents(dst) == {"a": "f:a old\n", "d": "dir:None", "d/ledger": "f:seed\napp\n"}
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]


def test_a_file_created_by_another_writer_is_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path the sync creates that another writer created after the check is a conflict
    (``RENAME_NOREPLACE``): their file stays."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "new").write_text("ours\n")

    def app_creates(call: str, rel: str) -> None:
        if call == "rename" and rel == "new" and not (dst / "new").exists():
            (dst / "new").write_text("theirs\n")

    monkeypatch.setattr(beneath, "fault_hook", app_creates)
    with pytest.raises(ChangedMeanwhileError) as caught:
        sync_tree(src, dst)
    assert caught.value.paths == ["new"]
    assert (dst / "new").read_text() == "theirs\n"


def test_two_phase_apply_refuses_a_swap_after_verify_and_puts_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two-phase apply compares each stamp right before its rename too: a folder swapped
    after ``verify_staged`` refuses (case 44), what was renamed is put back, and the area is
    staged again (abortable)."""
    src, dst, outside = tmp_path / "src", tmp_path / "dst", tmp_path / "outside"
    for root in (src, dst):
        (root / "sub").mkdir(parents=True)
        (root / "a").write_text("a old\n")
        (root / "sub" / "f").write_text("sub old\n")
    outside.mkdir()
    (outside / "f").write_text("OUTSIDE\n")
    (src / "a").write_text("a new\n")
    (src / "sub" / "f").write_text("sub new\n")
    staging.stage_sync(src, dst, "k1", changes=compute_changes(dst, src))
    assert staging.verify_staged(dst, "k1") == []

    def swap(call: str, rel: str) -> None:
        if rel.startswith("sub") and not (tmp_path / "sub.moved").exists():
            os.rename(dst / "sub", tmp_path / "sub.moved")
            os.symlink(outside, dst / "sub")

    monkeypatch.setattr(beneath, "fault_hook", swap)
    with pytest.raises(SwappedPathError) as caught:
        staging.apply_staged(dst, "k1")
    monkeypatch.setattr(beneath, "fault_hook", None)
    assert caught.value.paths == ["sub"]
    assert (outside / "f").read_text() == "OUTSIDE\n"
    assert (dst / "a").read_text() == "a old\n"
    assert (tmp_path / "sub.moved" / "f").read_text() == "sub old\n"
    assert staging.staged_state(dst, "k1") == "staged-two-phase"
    assert staging.abort_staged(dst, "k1")


# -- property: a random component swapped at a random step ---------------------------------------

NAMES = ["a", "b", "c"]


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, str | None], str, int]:
    """A small tree (files in nested folders), the sandbox's edits (new text, or None to
    delete), the folder to swap, and the k-th descriptor call at which it is swapped."""
    dirs = draw(st.lists(st.sampled_from(["d", "d/e", "d/e/g", "h", "h/i"]), min_size=1,
                         unique=True))  # fmt: skip
    folders = sorted({p for d in dirs for p in _with_parents(d)})
    files = {
        f"{folder}/{name}": f"{folder}/{name} old\n"
        for folder in folders
        for name in draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
    }
    files["top"] = "top old\n"
    edited = draw(st.lists(st.sampled_from(sorted(files)), min_size=1, unique=True))
    edits: dict[str, str | None] = {
        rel: (None if draw(st.booleans()) and rel != "top" else f"{rel} new\n") for rel in edited
    }
    for folder in draw(st.lists(st.sampled_from(folders), max_size=2, unique=True)):
        edits[f"{folder}/added"] = f"{folder}/added new\n"
    swapped = draw(st.sampled_from(folders))
    k = draw(st.integers(min_value=0, max_value=40))
    return files, edits, swapped, k


def _with_parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


@pytest.mark.parametrize("protocol", ["one-shot", "two-phase"])
@PROPERTY
@given(world=worlds())
def test_property_a_component_swapped_at_any_step_never_redirects_a_write(
    protocol: str,
    world: tuple[dict[str, str], dict[str, str | None], str, int],
) -> None:
    """Case 44, every step: a folder of the target is swapped for a symlink to a folder
    outside at the k-th descriptor call of a sync (one-shot ``sync_tree`` or the two-phase
    ``apply_staged``). Whatever happens, nothing outside the target changes; a refusal (the
    only error allowed) leaves the swapped folder's content (moved away) exactly as it was."""
    files, edits, swapped, k = world
    base = Path(tempfile.mkdtemp(prefix="swapped-"))
    src, dst, outside = base / "src", base / "dst", base / "outside"
    for root in (src, dst):
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    for rel, edit in edits.items():
        if edit is None:
            (src / rel).unlink()
        else:
            (src / rel).write_text(edit)
    outside.mkdir()
    (outside / "f").write_text("OUTSIDE\n")
    for name in [*NAMES, "added", "e", "g", "i"]:
        (outside / name).write_text(f"outside {name}\n")
    outside_before = _contents(outside)
    dst_before = _contents(dst)
    moved = base / "moved"
    calls = iter(range(1_000_000))

    def swap_at_k(call: str, rel: str) -> None:
        if next(calls) == k and not moved.exists():
            os.rename(dst / swapped, moved)
            os.symlink(outside, dst / swapped)

    changes = compute_changes(dst, src)
    if protocol == "two-phase":
        staging.stage_sync(src, dst, "k", changes=changes)
    beneath.fault_hook = swap_at_k
    try:
        if protocol == "one-shot":
            sync_tree(src, dst, changes=changes)
        else:
            staging.apply_staged(dst, "k")
        if not moved.exists():
            assert _contents(dst) == _contents(src)
    except (ChangedMeanwhileError, SwappedPathError) as exc:
        assert exc.paths
        if moved.exists():
            expected_moved = {
                rel.removeprefix(swapped + "/"): value
                for rel, value in dst_before.items()
                if rel.startswith(swapped + "/")
            }
            assert _contents(moved) == expected_moved
        rest = {
            rel: value
            for rel, value in _contents(dst).items()
            if rel != swapped and not rel.startswith(swapped + "/")
        }
        assert rest == {
            rel: value
            for rel, value in dst_before.items()
            if rel != swapped and not rel.startswith(swapped + "/")
        }
    finally:
        beneath.fault_hook = None
    assert _contents(outside) == outside_before
    shutil.rmtree(base)


@pytest.mark.parametrize("event", ["case 43: a write", "case 44: a swapped folder"])
@pytest.mark.parametrize("make", STRATEGIES, indirect=True)
def test_two_phase_apply_of_every_mode_refuses_a_change_met_right_before_a_rename(
    make: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, event: str
) -> None:
    """Cases 43 and 44 on the two-phase path: after ``prepare`` (and after ``apply_prepared``'s
    own check), the application appends to ``sub/ledger`` or swaps ``sub`` for a symlink right
    before the apply reaches it: the apply is a conflict naming it, the original is as the
    application left it, nothing outside is written, the sandbox stays ACTIVE (the kernel
    overlay mounted again)."""
    w = tmp_path / "w"
    src, outside = w / "vol" / "src", w / "outside"
    (src / "sub").mkdir(parents=True)
    outside.mkdir()
    (src / "a").write_text("a old\n")
    (src / "sub" / "ledger").write_text("seed\n")
    (outside / "ledger").write_text("OUTSIDE\n")
    sandbox = make(src)
    sandbox.create("plan")
    view = Path(sandbox.get_path(""))
    (view / "a").write_text("a new\n")
    (view / "sub" / "ledger").write_text("seed\nsandbox\n")
    sandbox.prepare("tx1")
    swap = event.startswith("case 44")

    def meanwhile(call: str, rel: str) -> None:
        if not rel.startswith("sub") or (w / "done").exists():
            return
        (w / "done").touch()
        if swap:
            os.rename(src / "sub", w / "sub.moved")
            os.symlink(outside, src / "sub")
        else:
            with (src / "sub" / "ledger").open("a") as handle:
                handle.write("app\n")

    monkeypatch.setattr(beneath, "fault_hook", meanwhile)
    with pytest.raises(SandboxCommitError) as caught:
        sandbox.apply_prepared("tx1")
    monkeypatch.setattr(beneath, "fault_hook", None)
    assert caught.value.conflicts == (["sub"] if swap else ["sub/ledger"])
    assert sandbox.status is SandboxStatus.ACTIVE
    assert (outside / "ledger").read_text() == "OUTSIDE\n"
    assert (src / "a").read_text() == "a old\n"
    kept = (w / "sub.moved") if swap else (src / "sub")
    assert (kept / "ledger").read_text() == ("seed\n" if swap else "seed\napp\n")
    if getattr(sandbox, "overlay_mode", None) == "kernel":
        assert _overlay_mount.is_overlay_mounted(view)
    sandbox.abort_prepared("tx1")
