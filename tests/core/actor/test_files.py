"""The actor's file operations on local paths, in every strategy (issue "The actor's door",
item 2): bytes and text, ranges, write, append, edit, delete, move, mkdir, stat, grep, glob,
batch upload and download, each change in the audit log; symlinks never followed out of the
sandbox (case 44: a directory swapped for a symlink is refused, never written through) and no
write under ``.git``; what the actor wrote is what the commit applies."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core.actor import search
from sandbox_core.actor.audit import AuditLog
from sandbox_core.errors import (
    SandboxFileNotFoundError,
    SandboxFileOperationError,
    SandboxPathError,
    SandboxStateError,
)
from tests.support.actor_files import KINDS, TREE_KINDS, Opened, opened_sandbox

every_strategy = pytest.mark.parametrize("opened", KINDS, indirect=True)


@pytest.fixture
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    """The sandbox of the strategy the test is parametrized with (``indirect``)."""
    with opened_sandbox(request.param, tmp_path) as made:
        yield made


@every_strategy
def test_bytes_and_text_ranges_write_append_and_stat(opened: Opened) -> None:
    files = opened.door.files()
    blob = bytes(range(256)) * 10
    assert files.write("bin/blob", blob) == {"path": "bin/blob", "size": 2560, "appended": False}
    assert files.read("bin/blob") == blob
    assert files.read("bin/blob", 250, 10) == blob[250:260]
    assert files.read("bin/blob", 2555) == blob[2555:]
    assert files.read("bin/blob", 9999, 5) == b""
    with files.open_range("bin/blob", 100, 2000) as opened_range:
        chunks = list(opened_range.chunks(512))
    assert [len(c) for c in chunks] == [512, 512, 512, 464]
    assert b"".join(chunks) == blob[100:2100]
    text = files.read_text("bin/blob", 250, 4)
    assert text["encoding"] == "base64" and text["size"] == 2560
    files.write("notes.md", "one\n")
    files.write("notes.md", "two\n", append=True)
    assert files.read_text("notes.md") == {
        "path": "notes.md", "offset": 0, "length": 8, "size": 8,
        "encoding": "utf-8", "content": "one\ntwo\n",
    }  # fmt: skip
    stat = files.stat("notes.md")
    assert stat["type"] == "file" and stat["size"] == 8
    assert files.stat("bin")["type"] == "dir"
    with pytest.raises(SandboxFileNotFoundError):
        files.read("missing.txt")
    with pytest.raises(SandboxFileOperationError):
        files.read("bin")
    with pytest.raises(SandboxFileOperationError):
        files.read("notes.md", -1)


@every_strategy
def test_edit_replaces_exactly_and_refuses_absent_or_ambiguous_text(opened: Opened) -> None:
    files = opened.door.files()
    files.write("src/app.py", "x = 1\ny = 1\nx = 1\n")
    with pytest.raises(SandboxFileOperationError, match="occurs 2 times"):
        files.edit("src/app.py", "x = 1", "x = 2")
    with pytest.raises(SandboxFileOperationError, match="not found"):
        files.edit("src/app.py", "z = 1", "z = 2")
    with pytest.raises(SandboxFileOperationError, match="non-empty"):
        files.edit("src/app.py", "", "z")
    assert files.read("src/app.py") == b"x = 1\ny = 1\nx = 1\n"  # nothing written when refused
    assert files.edit("src/app.py", "y = 1", "y = 2") == {"path": "src/app.py", "occurrences": 1}
    assert files.edit("src/app.py", "x = 1", "x = 3", replace_all=True)["occurrences"] == 2
    assert files.read("src/app.py") == b"x = 3\ny = 2\nx = 3\n"
    files.write("bin.dat", b"\xff\xfe\x00")
    with pytest.raises(SandboxFileOperationError, match="not UTF-8"):
        files.edit("bin.dat", "a", "b")
    # Every descriptor an edit opened is closed, refused or not: a writable one left open makes
    # the process look busy to a later rollback or restore of the sandbox.
    assert open_descriptors_of(Path(opened.door.root())) == []


def open_descriptors_of(tree: Path) -> list[str]:
    """This process's open descriptors on files beneath ``tree``."""
    root = str(tree.resolve()) + "/"
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root):
            found.append(target)
    return found


@every_strategy
def test_delete_move_and_mkdir(opened: Opened) -> None:
    files = opened.door.files()
    assert files.mkdir("a/b/c") == {"path": "a/b/c", "created": True}
    assert files.mkdir("a/b/c") == {"path": "a/b/c", "created": False}
    with pytest.raises(SandboxFileOperationError, match="exists"):
        files.mkdir("a/b/c", exist_ok=False)
    with pytest.raises(SandboxFileNotFoundError):
        files.mkdir("x/y", parents=False)
    files.write("a/b/c/f", b"1")
    with pytest.raises(SandboxFileOperationError, match="not empty"):
        files.delete("a")
    files.write("m1", b"m")
    assert files.move("m1", "moved/m2") == {"path": "m1", "to": "moved/m2"}
    assert not files.exists("m1") and files.read("moved/m2") == b"m"
    files.write("m3", b"three")
    with pytest.raises(SandboxFileOperationError, match="overwrite"):
        files.move("m3", "moved/m2")
    files.move("m3", "moved/m2", overwrite=True)
    assert files.read("moved/m2") == b"three"
    with pytest.raises(SandboxFileOperationError):
        files.move("a", "a/b/inside")
    with pytest.raises(SandboxFileNotFoundError):
        files.move("nothing", "else")
    assert files.delete("a", recursive=True) == {"path": "a", "type": "dir"}
    assert files.delete("moved/m2") == {"path": "moved/m2", "type": "file"}
    with pytest.raises(SandboxFileNotFoundError):
        files.delete("moved/m2")
    assert "a" not in [e["name"] for e in files.listdir(".")]


@every_strategy
def test_grep_and_glob_are_capped_and_continue_with_a_cursor(opened: Opened) -> None:
    files = opened.door.files()
    for index in range(5):
        files.write(f"s/m{index}.py", f"# TODO {index}\nok\n# todo lower\n")
    files.write("s/data.bin", b"TODO\x00binary")
    root = opened.door.root()
    seen: list[tuple[str, int]] = []
    cursor = None
    pages = 0
    while True:
        page = search.grep(root, r"TODO \d", path="s", max_matches=2, cursor=cursor)
        seen += [(m["path"], m["line"]) for m in page["matches"]]
        pages += 1
        if not page["truncated"]:
            assert page["next_cursor"] is None
            break
        cursor = page["next_cursor"]
    assert seen == [(f"s/m{i}.py", 1) for i in range(5)] and pages == 3
    every = opened.door.grep("todo", path="s", ignore_case=True, glob_pattern="m[0-1].py")
    assert [(m["path"], m["line"]) for m in every["matches"]] == [
        ("s/m0.py", 1), ("s/m0.py", 3), ("s/m1.py", 1), ("s/m1.py", 3),
    ]  # fmt: skip
    with pytest.raises(SandboxFileOperationError, match="regular expression"):
        opened.door.grep("(", path="s")
    with pytest.raises(SandboxFileOperationError, match="another search"):
        opened.door.grep("other", path="s", cursor=cursor)
    names: list[str] = []
    cursor = None
    while True:
        page = opened.door.glob("**/*.py", path="s", max_results=2, cursor=cursor)
        names += [p["path"] for p in page["paths"]]
        if not page["truncated"]:
            break
        cursor = page["next_cursor"]
    assert names == [f"s/m{i}.py" for i in range(5)]
    assert [p["path"] for p in opened.door.glob("s/*.bin")["paths"]] == ["s/data.bin"]


@every_strategy
def test_batch_upload_and_download_report_each_file(opened: Opened) -> None:
    files = opened.door.files()
    big = os.urandom(3 * 1024 * 1024 + 5)
    results = files.upload(
        [("up/a", b"A"), ("../escape", b"x"), (".git/hooks/x", b"x"), ("up/big", big)]
    )
    assert [r["ok"] for r in results] == [True, False, False, True]
    assert results[1]["error"]["type"] == results[2]["error"]["type"] == "SandboxPathError"
    events = list(files.download(["up/a", "up/none", "up/big"]))
    done = [e for e in events if "ok" in e]
    assert [(e["path"], e["ok"]) for e in done] == [
        ("up/a", True), ("up/none", False), ("up/big", True),
    ]  # fmt: skip
    chunks = [e["data"] for e in events if e["path"] == "up/big" and "data" in e]
    assert max(len(c) for c in chunks) <= 1024 * 1024 and b"".join(chunks) == big
    assert done[1]["error"]["type"] == "SandboxFileNotFoundError"


@every_strategy
def test_every_change_is_in_the_audit_log_without_contents(opened: Opened) -> None:
    files = opened.door.files()
    files.write("w.txt", "secret-content")
    files.write("w.txt", "more", append=True)
    files.edit("w.txt", "more", "less")
    files.mkdir("dir")
    files.move("w.txt", "dir/w.txt")
    files.delete("dir", recursive=True)
    log = AuditLog(opened.audit, opened.sandbox.sandbox_id)
    records = log.read()["entries"]
    assert [(r["op"], r["path"]) for r in records] == [
        ("write", "w.txt"), ("write", "w.txt"), ("edit", "w.txt"),
        ("mkdir", "dir"), ("move", "w.txt"), ("delete", "dir"),
    ]  # fmt: skip
    assert [r.get("append") for r in records[:2]] == [False, True]
    assert records[0]["bytes"] == len("secret-content") and records[4]["to"] == "dir/w.txt"
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5, 6] and all(r["time"] for r in records)
    assert "secret-content" not in log.path.read_text()


@every_strategy
def test_symlinks_are_never_followed_out_of_the_sandbox(opened: Opened) -> None:
    """Case 44's property for the actor: a link to the outside, at any place on a path, is
    refused; the outside keeps its content; the link itself can be seen and removed."""
    files = opened.door.files()
    root = Path(opened.door.root())
    files.mkdir("real")
    os.symlink(opened.outside, root / "link")
    os.symlink(opened.outside / "secret", root / "real" / "filelink")
    for attempt in (
        lambda: files.write("link/secret", b"pwned"),
        lambda: files.write("link/new", b"pwned"),
        lambda: files.write("real/filelink", b"pwned"),
        lambda: files.write("real/filelink", b"pwned", append=True),
        lambda: files.read("link/secret"),
        lambda: files.read("real/filelink"),
        lambda: files.edit("real/filelink", "OUTSIDE", "pwned"),
        lambda: files.delete("link/secret"),
        lambda: files.move("link/secret", "stolen"),
        lambda: files.mkdir("link/sub"),
        lambda: files.stat("link/secret"),
        lambda: opened.door.grep("OUTSIDE", path="link"),
        lambda: opened.door.glob("*", path="link"),
    ):
        with pytest.raises(SandboxPathError, match="Path traversal not allowed"):
            attempt()
    assert opened.door.grep("OUTSIDE")["matches"] == []  # the walk never enters a link
    assert {p["path"]: p["type"] for p in opened.door.glob("**/*link")["paths"]} == {
        "link": "symlink", "real/filelink": "symlink",
    }  # fmt: skip
    assert files.stat("link")["target"] == str(opened.outside)
    files.delete("link")
    assert sorted(os.listdir(opened.outside)) == ["secret"]
    assert (opened.outside / "secret").read_text() == "OUTSIDE\n"


@every_strategy
def test_absolute_and_parent_paths_and_git_writes_are_refused(opened: Opened) -> None:
    files = opened.door.files()
    for bad in ("/etc/passwd", "../x", "a/../../x", "a/..", "nul\x00byte"):
        with pytest.raises(SandboxPathError, match="Path traversal not allowed"):
            files.write(bad, b"x")
        with pytest.raises(SandboxPathError):
            files.read(bad)
    for control in (".git/config", ".git", "sub/.git/HEAD", ".GIT/hooks/pre-commit"):
        with pytest.raises(SandboxPathError, match="control path"):
            files.write(control, b"x")
        with pytest.raises(SandboxPathError):
            files.delete(control, recursive=True)
        with pytest.raises(SandboxPathError):
            files.move("f.txt" if files.exists("f.txt") else "nope", control)
    with pytest.raises(SandboxPathError, match="root"):
        files.delete(".", recursive=True)


@pytest.mark.parametrize("opened", TREE_KINDS, indirect=True)
def test_what_the_actor_wrote_is_what_the_commit_applies(opened: Opened) -> None:
    files = opened.door.files()
    files.edit("f.txt", "base", "edited")
    files.write("new/n.txt", "new\n")
    files.move("d/g.txt", "d/h.txt")
    if opened.kind != "none":
        assert (opened.original / "f.txt").read_text() == "base\n"  # not before the commit
    assert opened.sandbox.commit("actor").success
    assert (opened.original / "f.txt").read_text() == "edited\n"
    assert (opened.original / "new/n.txt").read_text() == "new\n"
    assert not (opened.original / "d/g.txt").exists()
    assert (opened.original / "d/h.txt").read_text() == "g one\ng two\n"
    with pytest.raises(SandboxStateError):
        opened.door.files()  # a committed sandbox takes no more writes


@pytest.mark.parametrize("opened", ["transaction_rollback"], indirect=True)
def test_a_transaction_sandbox_keeps_its_statement_log_to_itself(opened: Opened) -> None:
    files = opened.door.files()
    for change in (
        lambda: files.write("statements.jsonl", b"{}\n"),
        lambda: files.delete("statements.jsonl"),
        lambda: files.move("statements.jsonl", "elsewhere"),
        lambda: files.edit("statements.jsonl", "x", "y"),
    ):
        with pytest.raises(SandboxPathError, match="bookkeeping"):
            change()
    files.write("scratch/notes.txt", b"the actor's private working area")
    assert files.read("scratch/notes.txt").startswith(b"the actor")
