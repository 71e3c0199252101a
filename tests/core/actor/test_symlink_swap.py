"""Case 44's race for the actor: a directory of the sandbox swapped for a symlink to the outside
again and again while the actor writes, appends, edits and moves beneath it. Walking through
directory descriptors opened ``O_NOFOLLOW`` never follows the swapped-in link: the outside is
never written, whatever the timing; each operation either lands inside or is refused."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from sandbox_core.actor.files import SandboxFiles
from sandbox_core.errors import SandboxError


def test_a_directory_swapped_for_a_symlink_mid_operation_is_never_written_through(
    tmp_path: Path,
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "f").write_text("OUTSIDE\n")
    files = SandboxFiles(root)
    stop = threading.Event()

    def put(source: Path) -> None:
        """Rename ``source`` to ``root/sub``, clearing what the actor made there meanwhile."""
        while True:
            try:
                os.rename(source, root / "sub")
            except OSError:  # the actor made a new sub (parents are made on demand)
                shutil.rmtree(root / "sub", ignore_errors=True)
            else:
                return

    def swapper() -> None:
        moved, link = tmp_path / "sub.moved", tmp_path / "sub.link"
        while not stop.is_set():
            try:
                os.rename(root / "sub", moved)
            except OSError:
                continue
            os.symlink(outside, link)
            put(link)  # sub is now a symlink to the outside
            os.rename(root / "sub", link)
            os.unlink(link)
            put(moved)

    thread = threading.Thread(target=swapper)
    thread.start()
    outcomes = {"done": 0, "refused": 0}
    try:
        for index in range(3000):
            try:
                files.write("sub/f", f"inside {index}\n")
                files.write("sub/f", "more\n", append=True)
                files.edit("sub/f", "more", "less")
                files.move("sub/f", "sub/g", overwrite=True)
                files.move("sub/g", "sub/f", overwrite=True)
                outcomes["done"] += 1
            except SandboxError:
                outcomes["refused"] += 1
    finally:
        stop.set()
        thread.join()
    assert sorted(os.listdir(outside)) == ["f"]
    assert (outside / "f").read_text() == "OUTSIDE\n"
    assert outcomes["refused"] > 0  # the swap did happen under the operations
