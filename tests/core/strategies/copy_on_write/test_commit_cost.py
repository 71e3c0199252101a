"""O(changes) behaviour of commits and rollbacks, asserted by counting operations, not timing.

Issue 2 targets: a commit of a few changed files in a large tree copies only those files and
walks each tree once; a rollback after commit copies only what the commit changed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from sandbox_core import SandboxFactory
from sandbox_core.tree import baseline, copy, scan, snapshot, textdiff

FILES = 300
EDITED = ("d0/f0.txt", "d1/f5.txt", "d2/f9.txt")


@pytest.fixture
def big_tree(tmp_path: Path) -> Path:
    root = tmp_path / "original"
    for index in range(FILES):
        path = root / f"d{index % 10}" / f"f{index // 10}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {index}\n")
    os.symlink("d0/f0.txt", root / "link")
    return root


class Counter:
    """Calls of one wrapped function (the function still runs); ``copy_file`` counts every file
    copied, by ``_fs_utils`` and by the overlay strategy alike."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []


@pytest.fixture
def counted() -> Iterator[dict[str, Counter]]:
    counters = {"copy_file": Counter(), "snapshot_tree": Counter(), "scan_tree": Counter()}
    originals: dict[str, Any] = {
        "copy_file": copy.copy_file,
        "snapshot_tree": snapshot.snapshot_tree,
        "scan_tree": scan.scan_tree,
    }

    def wrap(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counters[name].calls.append(args)
            return originals[name](*args, **kwargs)

        return call

    with (
        mock.patch.object(copy, "copy_file", wrap("copy_file")),
        mock.patch.object(snapshot, "snapshot_tree", wrap("snapshot_tree")),
        mock.patch.object(baseline, "snapshot_tree", wrap("snapshot_tree")),
        mock.patch.object(scan, "scan_tree", wrap("scan_tree")),
        mock.patch.object(textdiff, "scan_tree", wrap("scan_tree")),
    ):
        yield counters


def _edit(root: str | Path) -> None:
    for rel in EDITED:
        with open(Path(root) / rel, "a", encoding="utf-8") as handle:
            handle.write("edited\n")


def test_snapshot_with_find_equals_the_python_walk(big_tree: Path) -> None:
    os.mkfifo(big_tree / "fifo")
    (big_tree / "d3").chmod(0o1750)
    (big_tree / ".git").mkdir()
    (big_tree / ".git" / "HEAD").write_text("ref\n")
    with mock.patch.object(snapshot.shutil, "which", return_value=None):
        by_python = snapshot.snapshot_tree(big_tree, exclude=[".git"])
    by_find = snapshot.snapshot_tree(big_tree, exclude=[".git"])
    assert by_find == by_python
    uid, gid = os.getuid(), os.getgid()
    assert by_find["d3"] == f"d 1750 {uid} {gid}"
    assert by_find["link"] == f"l 777 {uid} {gid} d0/f0.txt"
    assert by_find["fifo"].startswith("p ")
    stamped = snapshot.snapshot_tree(big_tree, exclude=[".git"], stamps=True)
    with mock.patch.object(snapshot.shutil, "which", return_value=None):
        assert snapshot.snapshot_tree(big_tree, exclude=[".git"], stamps=True) == stamped
    assert not any(rel.startswith(".git") for rel in by_find)


def test_copy_on_write_commit_copies_only_changed_files_and_walks_only_the_copy(
    big_tree: Path, tmp_path: Path, counted: dict[str, Counter]
) -> None:
    sandbox = SandboxFactory().create(
        "copy_on_write", "res", str(big_tree), sandbox_root=str(tmp_path / "sb")
    )
    sandbox.create("plan")
    _edit(sandbox.get_path(""))
    for counter in counted.values():
        counter.calls.clear()

    result = sandbox.commit()

    assert sorted(result.changed_files) == sorted(EDITED)
    assert len(counted["copy_file"].calls) == len(EDITED)
    walked = sorted(os.path.basename(os.fspath(args[0])) for args in counted["snapshot_tree"].calls)
    assert walked == ["tree"]  # the original is only lstat-ed at the changed paths
    assert counted["scan_tree"].calls == []
    assert (big_tree / EDITED[0]).read_text() == "file 0\nedited\n"


@pytest.mark.parametrize(
    ("strategy", "options"),
    [("copy_on_write", {}), ("overlay", {"mode": "fallback"})],
)
def test_rollback_after_commit_copies_only_what_the_commit_changed(
    big_tree: Path,
    tmp_path: Path,
    counted: dict[str, Counter],
    strategy: str,
    options: dict[str, Any],
) -> None:
    sandbox = SandboxFactory().create(
        strategy, "res", str(big_tree), sandbox_root=str(tmp_path / "sb"), **options
    )
    sandbox.create("plan")
    _edit(sandbox.get_path(""))
    sandbox.commit()
    counted["copy_file"].calls.clear()

    sandbox.rollback()

    # The undo of the original plus the reset of the sandbox copy: both O(changes).
    assert len(counted["copy_file"].calls) <= 2 * len(EDITED)
    assert (big_tree / EDITED[0]).read_text() == "file 0\n"
    assert Path(sandbox.get_path(EDITED[0])).read_text() == "file 0\n"
    assert snapshot.compute_changes(big_tree, sandbox.get_path("")).is_empty
