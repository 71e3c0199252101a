"""The source tree, the edit and the staging check that the two-phase tests of the directory
strategies share: :func:`make_source` builds a small tree (text, binary, a folder, a symlink),
:func:`edit` changes, adds and deletes in a sandbox of it, and :func:`staged_beside` lists every
staging area (one-shot or two-phase) left beside or inside an original.
"""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_core.strategies.base import BaseSandbox


def staged_beside(src: Path) -> list[str]:
    """Every staging area of ``src`` (one-shot or two-phase), beside it or inside it."""
    found = [n for n in os.listdir(src.parent) if n.startswith(f".{src.name}.sandbox-")]
    found += [n for n in os.listdir(src) if n.startswith(".sandbox-staging-")]
    return sorted(found)


def make_source(root: Path) -> Path:
    src = root / "src"
    (src / "d").mkdir(parents=True)
    (src / "a.txt").write_text("one\ntwo\nthree\n")
    (src / "b.bin").write_bytes(b"\x00\x01binary")
    (src / "d" / "c.txt").write_text("c1\nc2\n")
    (src / "keep.txt").write_text("kept\n")
    os.symlink("a.txt", src / "link")
    return src


def edit(sandbox: BaseSandbox) -> None:
    Path(sandbox.get_path("a.txt")).write_text("one\nTWO\nthree\nfour\n")
    Path(sandbox.get_path("new.txt")).write_text("n1\nn2\n")
    os.unlink(sandbox.get_path("d/c.txt"))
