"""Properties of the actor's file operations, searched by hypothesis (issue "The actor's door",
item 2; case 44's property for the actor):

- paths: whatever path an actor names (absolute, ``..``, empty components, ``.git``, through a
  symlink to the outside, to ``..`` or to ``/``), nothing outside the sandbox's root is written,
  moved or removed; an absolute path or a ``..`` component is always refused, and so is a path
  with a symlink before its last component;
- edit: the result is ``text.replace(old, new)`` when ``old`` occurs once (or every time with
  ``replace_all``), and the file is untouched when ``old`` is absent or ambiguous (Deep Agents'
  ``edit``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_core.actor import search
from sandbox_core.actor.files import SandboxFiles
from sandbox_core.errors import SandboxError, SandboxFileOperationError, SandboxPathError

COMPONENTS = ["a", "b", "f", "..", ".", "", "out", "up", "root", "flink", ".git", "new"]
paths = st.builds(
    lambda leading, parts: ("/" if leading else "") + "/".join(parts),
    st.booleans(),
    st.lists(st.sampled_from(COMPONENTS), min_size=1, max_size=4),
)
OPERATIONS = ["write", "append", "read", "edit", "delete", "move", "mkdir", "stat", "grep", "glob"]


def snapshot(top: Path) -> dict[str, Any]:
    """Every entry under ``top``: type, content digest or link target (never followed)."""
    seen: dict[str, Any] = {}
    for directory, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(directory) / name
            rel = str(path.relative_to(top))
            if path.is_symlink():
                seen[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                seen[rel] = ("dir",)
            else:
                seen[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return seen


def build(work: Path) -> tuple[Path, Path]:
    """A root with a directory, a file and links out of it (to a directory, to a file, to
    ``..``, to ``/``), and the outside with a file in it."""
    root, outside = work / "root", work / "outside"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "f").write_text("in\n")
    outside.mkdir()
    (outside / "f").write_text("OUTSIDE\n")
    (root / "out").symlink_to(outside)
    (root / "a" / "flink").symlink_to(outside / "f")
    (root / "up").symlink_to("..")
    (root / "root").symlink_to("/")
    return root, outside


def symlink_on_the_way(root: Path, rel: str) -> bool:
    """Whether a component before the last of ``rel`` is a symlink (looked up lexically)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    current = root
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink():
            return True
        if not current.is_dir():
            return False
    return False


def operation(files: SandboxFiles, name: str, rel: str, other: str) -> Callable[[], Any]:
    return {
        "write": lambda: files.write(rel, b"pwned\n"),
        "append": lambda: files.write(rel, b"pwned\n", append=True),
        "read": lambda: files.read(rel),
        "edit": lambda: files.edit(rel, "OUTSIDE", "pwned"),
        "delete": lambda: files.delete(rel, recursive=True),
        "move": lambda: files.move(rel, other, overwrite=True),
        "mkdir": lambda: files.mkdir(rel),
        "stat": lambda: files.stat(rel),
        "grep": lambda: search.grep(files.root, "OUTSIDE", path=rel),
        "glob": lambda: search.glob(files.root, "**", path=rel),
    }[name]


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(OPERATIONS), rel=paths, other=paths)
def test_no_path_reaches_outside_the_root(name: str, rel: str, other: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = build(Path(tmp))
        before = snapshot(outside)
        files = SandboxFiles(root)
        named = [rel, other] if name == "move" else [rel]
        escapes = any(
            p.startswith("/") or ".." in p.split("/") or symlink_on_the_way(root, p) for p in named
        )
        try:
            result = operation(files, name, rel, other)()
        except SandboxPathError:
            result = "refused"
        except SandboxError:
            result = "failed"
        if escapes:
            assert result == "refused", (name, rel, other, result)
        if name == "grep" and isinstance(result, dict):
            assert all("OUTSIDE" not in m["text"] for m in result["matches"])
        if name == "read" and isinstance(result, bytes):
            assert result != b"OUTSIDE\n"
        assert snapshot(outside) == before
        assert (root / "out").is_symlink() or name in ("delete", "move")


texts = st.text(alphabet="ab\n", max_size=30)


@settings(max_examples=300, deadline=None)
@given(text=texts, old=st.text(alphabet="ab\n", max_size=4), new=texts, replace_all=st.booleans())
def test_edit_is_an_exact_match_replacement(
    text: str, old: str, new: str, replace_all: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        files = SandboxFiles(tmp)
        files.write("t.txt", text)
        count = text.count(old) if old else 0
        if count == 0 or (count > 1 and not replace_all):
            try:
                files.edit("t.txt", old, new, replace_all=replace_all)
            except SandboxFileOperationError:
                pass
            else:
                raise AssertionError(f"edit of {old!r} in {text!r} was not refused")
            assert files.read("t.txt").decode() == text
        else:
            reply = files.edit("t.txt", old, new, replace_all=replace_all)
            assert reply == {"path": "t.txt", "occurrences": count}
            assert files.read("t.txt").decode() == text.replace(old, new)
