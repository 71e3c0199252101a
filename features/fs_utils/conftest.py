"""Step definitions for the fs_utils area (features/fs_utils/fs_utils.feature), on real trees."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, then, when

from sandbox_core.tree.ops import backup_directory, safe_restore
from sandbox_core.tree.scan import scan_tree
from sandbox_core.tree.snapshot import compute_changes
from sandbox_core.tree.sync import sync_tree
from sandbox_core.tree.textdiff import compute_diff

State = dict[str, Any]
SHM = Path("/dev/shm")


def tree_state(root: Path) -> dict[str, tuple[str, int, int, str | None]]:
    """Kind, mode, mtime and content (file bytes hex / link target) of every path."""
    out: dict[str, tuple[str, int, int, str | None]] = {}
    for rel, entry in scan_tree(root).items():
        content = entry.target
        if entry.kind == "file":
            content = (root / rel).read_bytes().hex()
        mtime = entry.mtime_ns if entry.kind != "dir" else 0
        out[rel] = (entry.kind, entry.mode, mtime, content)
    return out


@pytest.fixture
def fsu(tmp_path: Path) -> Iterator[State]:
    """Scenario state; removes the tmpfs directory it may have used."""
    state: State = {"tmp": tmp_path, "src": tmp_path / "src", "error": None}
    yield state
    shm = state.get("shm")
    if shm is not None:
        subprocess.run(["rm", "-rf", str(shm)], check=True)


# -- Given ------------------------------------------------------------------------------------


@given("a fsu tree with a symlink loop, a dangling link and a relative link")
def fsu_links_tree(fsu: State) -> None:
    src: Path = fsu["src"]
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "f").write_text("hi\n")
    (src / "a" / "b" / "up").symlink_to("../..")
    (src / "dangling").symlink_to("/nonexistent/target")
    (src / "a" / "rel").symlink_to("b/f")
    fsu["initial"] = tree_state(src)


@given("a fsu tree with an executable, an empty directory and an old timestamp")
def fsu_modes_tree(fsu: State) -> None:
    src: Path = fsu["src"]
    (src / "empty").mkdir(parents=True)
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "old.txt").write_text("old\n")
    os.utime(src / "old.txt", ns=(1_000_000_000, 1_234_567_890_123))
    fsu["initial"] = tree_state(src)


def _pair(fsu: State) -> tuple[Path, Path]:
    a, b = fsu["tmp"] / "a", fsu["tmp"] / "b"
    a.mkdir()
    b.mkdir()
    fsu["a"], fsu["b"] = a, b
    return a, b


@given(parsers.parse('fsu trees where "{name}" goes from "{old}" to "{new}"'))
def fsu_text_pair(fsu: State, name: str, old: str, new: str) -> None:
    a, b = _pair(fsu)
    (a / name).write_text("".join(f"{line}\n" for line in old.split(",")))
    (b / name).write_text("".join(f"{line}\n" for line in new.split(",")))


@given(parsers.parse('fsu trees where "{gone}" is deleted and "{new}" is added with "{content}"'))
def fsu_add_delete_pair(fsu: State, gone: str, new: str, content: str) -> None:
    a, b = _pair(fsu)
    (a / gone).write_text("bye\n")
    (b / new).write_text(f"{content}\n")


@given(parsers.parse('fsu trees where binary file "{name}" changes'))
def fsu_binary_pair(fsu: State, name: str) -> None:
    a, b = _pair(fsu)
    (a / name).write_bytes(b"\x00\x01\x02")
    (b / name).write_bytes(b"\x00\x01\x03")


@given(parsers.parse('fsu trees where symlink "{name}" goes from "{old}" to "{new}"'))
def fsu_link_pair(fsu: State, name: str, old: str, new: str) -> None:
    a, b = _pair(fsu)
    (a / name).symlink_to(old)
    (b / name).symlink_to(new)


@given(parsers.parse('fsu trees where "{name}" goes from mode "{old}" to mode "{new}"'))
def fsu_mode_pair(fsu: State, name: str, old: str, new: str) -> None:
    a, b = _pair(fsu)
    for root, mode in ((a, old), (b, new)):
        (root / name).write_text("echo hi\n")
        (root / name).chmod(int(mode, 8))


@given(
    parsers.parse(
        'fsu trees where directory "{x}" becomes a file and file "{y}" becomes a directory'
    )
)
def fsu_type_swap_pair(fsu: State, x: str, y: str) -> None:
    a, b = _pair(fsu)
    (a / x).mkdir()
    (a / x / "inner.txt").write_text("inner\n")
    (a / y).write_text("y\n")
    (b / x).write_text("now-a-file\n")
    (b / y).mkdir()
    (b / y / "child.txt").write_text("child\n")


# -- When -------------------------------------------------------------------------------------


@when(parsers.parse('the fsu tree is backed up to "{name}"'))
def fsu_backup(fsu: State, name: str) -> None:
    try:
        backup_directory(fsu["src"], fsu["tmp"] / name)
    except OSError as exc:
        fsu["error"] = exc


@when("the fsu tree is backed up to tmpfs")
def fsu_backup_tmpfs(fsu: State) -> None:
    # Unique per run: two test runs on one machine share /dev/shm.
    shm = Path(tempfile.mkdtemp(prefix=f"fsu-{fsu['tmp'].name}-", dir=SHM))
    fsu["shm"] = shm
    assert os.stat(shm).st_dev != os.stat(fsu["tmp"]).st_dev
    backup_directory(fsu["src"], shm / "backup")


@when(parsers.parse('the fsu tree file "{name}" is changed to "{content}"'))
def fsu_change(fsu: State, name: str, content: str) -> None:
    (fsu["src"] / name).write_text(content)


@when(parsers.parse('the fsu backup "{name}" is restored onto the tree'))
def fsu_restore(fsu: State, name: str) -> None:
    safe_restore(fsu["tmp"] / name, fsu["src"])


@when("the fsu tmpfs backup is restored onto the tree")
def fsu_restore_tmpfs(fsu: State) -> None:
    safe_restore(fsu["shm"] / "backup", fsu["src"])


@when("the fsu diff is computed")
def fsu_diff(fsu: State) -> None:
    fsu["diff"] = compute_diff(fsu["a"], fsu["b"])


@when("the fsu changes are computed")
def fsu_changes(fsu: State) -> None:
    fsu["changes"] = compute_changes(fsu["a"], fsu["b"])


@when("the fsu original tree is synced from the modified tree")
def fsu_sync(fsu: State) -> None:
    fsu["changes"] = sync_tree(fsu["b"], fsu["a"])


# -- Then -------------------------------------------------------------------------------------


@then(parsers.parse('the fsu backup "{name}" should hold link "{link}" to "{target}"'))
def fsu_backup_link(fsu: State, name: str, link: str, target: str) -> None:
    path = fsu["tmp"] / name / link
    assert path.is_symlink()
    assert os.readlink(path) == target


@then(parsers.parse('the fsu backup "{name}" should have {count:d} directories'))
def fsu_backup_dirs(fsu: State, name: str, count: int) -> None:
    entries = scan_tree(fsu["tmp"] / name)
    assert sum(1 for entry in entries.values() if entry.kind == "dir") == count


@then(parsers.parse('the fsu backup "{name}" should equal the tree exactly'))
def fsu_backup_equal(fsu: State, name: str) -> None:
    assert tree_state(fsu["tmp"] / name) == tree_state(fsu["src"])


@then(parsers.parse('the fsu backup "{name}" path "{path}" should have mode "{mode}"'))
def fsu_backup_mode(fsu: State, name: str, path: str, mode: str) -> None:
    assert stat.S_IMODE((fsu["tmp"] / name / path).lstat().st_mode) == int(mode, 8)


@then(parsers.parse('the fsu backup "{name}" path "{path}" should have mtime {mtime:d} ns'))
def fsu_backup_mtime(fsu: State, name: str, path: str, mtime: int) -> None:
    assert (fsu["tmp"] / name / path).lstat().st_mtime_ns == mtime


@then("a fsu FileExistsError should be raised")
def fsu_file_exists(fsu: State) -> None:
    assert isinstance(fsu["error"], FileExistsError)


@then("the fsu tree should be exactly as initialised")
def fsu_tree_initial(fsu: State) -> None:
    assert tree_state(fsu["src"]) == fsu["initial"]


@then(parsers.parse('the fsu backup "{name}" should not exist'))
def fsu_backup_gone(fsu: State, name: str) -> None:
    assert not (fsu["tmp"] / name).exists()


@then("no fsu staging directory should be left beside the tree")
@then("no fsu staging directory should be left beside the original tree")
def fsu_no_leftovers(fsu: State) -> None:
    assert [p.name for p in fsu["tmp"].iterdir() if ".sandbox-" in p.name] == []


@then("the fsu diff should be")
def fsu_diff_is(fsu: State, docstring: str) -> None:
    assert fsu["diff"] == docstring + "\n"


@then("the fsu diff should be empty")
def fsu_diff_empty(fsu: State) -> None:
    assert fsu["diff"] == ""


@then(
    parsers.parse(
        'the fsu changes should be added "{added}", changed "{changed}", deleted "{deleted}"'
    )
)
def fsu_changes_are(fsu: State, added: str, changed: str, deleted: str) -> None:
    changes = fsu["changes"]
    assert changes.added == added.split(",")
    assert changes.changed == changed.split(",")
    assert changes.deleted == deleted.split(",")


@then("the fsu original tree should equal the modified tree")
def fsu_synced(fsu: State) -> None:
    def content(root: Path) -> dict[str, tuple[str, int, str | None]]:
        return {rel: (kind, mode, data) for rel, (kind, mode, _, data) in tree_state(root).items()}

    assert content(fsu["a"]) == content(fsu["b"])
