"""git_worktree runs no code the repository controls (issue 7, section 2; case 27 is the sample).

Every test configures a real repository so that a hook, a driver or a helper would append to a
marker file (and leave a file behind) if git ran it, then drives the whole lifecycle: create,
edit, diff, checkpoint, restore, a real merge (the original moved on), commit, rollback of the
commit, cleanup. The marker must never appear, and nothing the code would have written may be in
the sandbox or committed to the original.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_core import GitWorktreeSandbox, SandboxStatus
from tests.support.gitrepo import GIT_ENV, git, make_repo

HOOKS = (
    "post-checkout",
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "post-merge",
    "pre-merge-commit",
    "post-rewrite",
    "reference-transaction",
    "post-index-change",
    "pre-auto-gc",
    "fsmonitor-watchman",
    "pre-push",
    "push-to-checkout",
)
LINES = "".join(f"line {i}\n" for i in range(1, 11))


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


# The tests' own commits on the original must not run the code either (that would be the test's
# doing, not the product's).
QUIET = (
    "-c",
    f"core.hooksPath={os.devnull}",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "commit.gpgSign=false",
    *("-c", "filter.evil.clean=", "-c", "filter.evil.smudge=", "-c", "filter.evil.process="),
    *("-c", "filter.evil.required=false"),
)


def quiet_git(repo: Path, *args: str) -> str:
    return git(repo, *QUIET, *args)


def script(path: Path, marker: Path, body: str = "") -> str:
    """An executable that records its run in ``marker`` (and does ``body``); returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{path.name} $*" >> {marker}\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def lifecycle(repo: Path, root: Path) -> GitWorktreeSandbox:
    """Create, edit, diff, checkpoint, restore, merge-commit, roll back the commit, clean up."""
    sandbox = GitWorktreeSandbox("res", str(repo), sandbox_root=str(root))
    sandbox.create("plan")
    files = sorted(p.name for p in Path(sandbox.get_path("")).iterdir() if p.name != ".git")
    assert "generated.txt" not in files
    assert Path(sandbox.get_path("f")).read_text() == LINES, "checked out exactly as stored"
    f = Path(sandbox.get_path("f"))
    f.write_text("sandbox 1\n" + LINES.split("\n", 1)[1])
    Path(sandbox.get_path("new.txt")).write_text("new\n")
    assert "+sandbox 1" in sandbox.diff()
    sandbox.create_checkpoint_ref("c1")
    Path(sandbox.get_path("scratch.txt")).write_text("scratch\n")
    sandbox.restore_checkpoint_ref("c1")
    assert not Path(sandbox.get_path("scratch.txt")).exists()
    # The original moves on in another line of the same file: commit is a real merge.
    (repo / "f").write_text(LINES.replace("line 10", "original 10"))
    quiet_git(repo, "commit", "-qam", "original moved")
    result = sandbox.commit("apply")
    assert result.metadata["landed_as"] == "merge"
    assert result.added_files == ["new.txt"] and result.changed_files == ["f"]
    assert (repo / "f").read_text().splitlines()[0] == "sandbox 1"
    assert (repo / "f").read_text().splitlines()[-1] == "original 10"
    committed = git(repo, "ls-tree", "-r", "--name-only", "HEAD").split()
    assert "generated.txt" not in committed
    sandbox.rollback()
    assert sandbox.status is SandboxStatus.ROLLED_BACK
    assert not (repo / "new.txt").exists()
    sandbox.cleanup()
    return sandbox


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"f": LINES, "g": "g\n"})


def install_hooks(where: Path, marker: Path) -> None:
    for name in HOOKS:
        script(where / name, marker, "echo generated > generated.txt\nexit 1")


@pytest.mark.parametrize("location", ["dot-git-hooks", "hooks-path-in-repo", "hooks-path-included"])
def test_no_hook_of_any_type_runs_anywhere(tmp_path: Path, repo: Path, location: str) -> None:
    marker = tmp_path / "marker"
    if location == "dot-git-hooks":
        install_hooks(repo / ".git" / "hooks", marker)
    elif location == "hooks-path-in-repo":  # husky style: the hooks live in the tree
        install_hooks(repo / ".husky", marker)
        quiet_git(repo, "add", ".husky")
        quiet_git(repo, "commit", "-qm", "husky")
        git(repo, "config", "core.hooksPath", ".husky")
    else:
        install_hooks(tmp_path / "hooks", marker)
        (tmp_path / "extra.cfg").write_text(f"[core]\n\thooksPath = {tmp_path / 'hooks'}\n")
        git(repo, "config", f"includeIf.gitdir:{repo}/.git/.path", str(tmp_path / "extra.cfg"))
    lifecycle(repo, tmp_path / "root")
    assert not marker.exists(), marker.read_text()
    assert not (repo / "generated.txt").exists()


def _filter(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    smudge = script(tmp / "smudge", marker, "sed s/^/SMUDGED/")
    clean = script(tmp / "clean", marker, "sed s/^/CLEANED/")
    return [
        ("filter.evil.smudge", smudge),
        ("filter.evil.clean", clean),
        ("filter.evil.required", "true"),
    ]


def _filter_process(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    return [
        ("filter.evil.process", script(tmp / "process", marker, "exit 1")),
        ("filter.evil.required", "true"),
    ]


def _textconv(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    return [("diff.evil.textconv", script(tmp / "textconv", marker, 'sed s/^/CONV/ "$1"'))]


def _diff_command(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    return [("diff.evil.command", script(tmp / "extdiff", marker))]


def _diff_external(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    return [("diff.external", script(tmp / "external", marker))]


def _merge_driver(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    # A driver that "resolves" by taking ours would silently drop the sandbox's change.
    return [("merge.evil.driver", script(tmp / "merge", marker, "exit 0"))]


def _fsmonitor(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    return [("core.fsmonitor", script(tmp / "fsmonitor", marker, "exit 1"))]


def _credential(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    return [("credential.helper", "!" + script(tmp / "credential", marker))]


def _gpg(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    return [
        ("commit.gpgSign", "true"),
        ("gpg.program", script(tmp / "gpg", marker, "exit 1")),
    ]


def _pager_and_editor(repo: Path, tmp: Path, marker: Path) -> list[tuple[str, str]]:
    return [
        ("core.pager", script(tmp / "pager", marker)),
        ("core.editor", script(tmp / "editor", marker)),
    ]


Driver = Callable[[Path, Path, Path], list[tuple[str, str]]]
DRIVERS: dict[str, Driver] = {
    "filter-clean-smudge": _filter,
    "filter-process": _filter_process,
    "diff-textconv": _textconv,
    "diff-command": _diff_command,
    "diff-external": _diff_external,
    "merge-driver": _merge_driver,
    "fsmonitor": _fsmonitor,
    "credential-helper": _credential,
    "gpg-signing": _gpg,
    "pager-editor": _pager_and_editor,
}


def _with_attributes(repo: Path) -> None:
    (repo / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n")
    quiet_git(repo, "add", ".gitattributes")
    quiet_git(repo, "commit", "-qm", "attributes")


def _configure(repo: Path, tmp: Path, settings: list[tuple[str, str]], where: str) -> None:
    if where == "local":
        for key, value in settings:
            git(repo, "config", key, value)
        return
    section_lines: dict[str, list[str]] = {}
    for key, value in settings:
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        header = f'[{section} "{sub}"]' if sub else f"[{section}]"
        section_lines.setdefault(header, []).append(f'\t{name} = "{value}"')
    text = "".join(f"{h}\n" + "\n".join(lines) + "\n" for h, lines in section_lines.items())
    included = tmp / "included.cfg"
    included.write_text(text)
    condition = {
        "include": "include.path",
        "includeIf-gitdir": f"includeIf.gitdir:{repo}/.git/.path",
        # Only true inside the sandbox (its HEAD is on sandbox/...): a condition the original's
        # own view of its config does not show.
        "includeIf-onbranch": "includeIf.onbranch:sandbox/**.path",
    }[where]
    git(repo, "config", condition, str(included))


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_no_driver_or_helper_from_the_config_runs(tmp_path: Path, repo: Path, driver: str) -> None:
    marker = tmp_path / "marker"
    _with_attributes(repo)
    _configure(repo, tmp_path, DRIVERS[driver](repo, tmp_path / "bin", marker), "local")
    lifecycle(repo, tmp_path / "root")
    assert not marker.exists(), marker.read_text()
    assert "SMUDGED" not in (repo / "f").read_text()
    assert "CLEANED" not in git(repo, "show", "HEAD:f")


@pytest.mark.parametrize("where", ["include", "includeIf-gitdir", "includeIf-onbranch"])
def test_included_config_cannot_bring_code_in(tmp_path: Path, repo: Path, where: str) -> None:
    marker = tmp_path / "marker"
    _with_attributes(repo)
    settings = [s for make in DRIVERS.values() for s in make(repo, tmp_path / "bin", marker)]
    settings.append(("core.hooksPath", str(tmp_path / "hooks")))
    install_hooks(tmp_path / "hooks", marker)
    _configure(repo, tmp_path, settings, where)
    lifecycle(repo, tmp_path / "root")
    assert not marker.exists(), marker.read_text()


def test_a_custom_merge_driver_is_replaced_by_the_text_merge_so_conflicts_stay_conflicts(
    tmp_path: Path, repo: Path
) -> None:
    marker = tmp_path / "marker"
    _with_attributes(repo)
    _configure(repo, tmp_path, _merge_driver(repo, tmp_path / "bin", marker), "local")
    sandbox = GitWorktreeSandbox("res", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("plan")
    Path(sandbox.get_path("f")).write_text(LINES.replace("line 5", "sandbox 5"))
    (repo / "f").write_text(LINES.replace("line 5", "original 5"))
    quiet_git(repo, "commit", "-qam", "same line")
    with pytest.raises(Exception, match="conflicts") as err:
        sandbox.commit()
    assert getattr(err.value, "conflicts", None) == ["f"]
    assert (repo / "f").read_text() == LINES.replace("line 5", "original 5")
    assert not marker.exists()


def test_case27_hook_output_is_not_in_the_sandbox_nor_committed(tmp_path: Path) -> None:
    """Case 27, variant A: a post-checkout hook that logs and generates a file."""
    repo = make_repo(tmp_path / "repo", {"f": "base\n"})
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(
        "#!/bin/sh\n"
        'echo "ran in $PWD" >> "$(git rev-parse --git-common-dir)/hook.log"\n'
        "echo generated > generated.txt\n"
    )
    hook.chmod(0o755)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p27")
    top = Path(sandbox.get_path(""))
    assert sorted(p.name for p in top.iterdir() if p.name != ".git") == ["f"]
    with Path(sandbox.get_path("f")).open("a") as handle:
        handle.write("edit\n")
    result = sandbox.commit()
    assert result.changed_files == ["f"] and result.added_files == []
    assert not (repo / ".git" / "hook.log").exists()
    assert not (repo / "generated.txt").exists()
    assert (repo / "f").read_text() == "base\nedit\n"


def test_case27_a_failing_hook_does_not_block_create(tmp_path: Path) -> None:
    """Case 27, variant B: hooks are not the product's business."""
    repo = make_repo(tmp_path / "repo", {"f": "base\n"})
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text('#!/bin/sh\necho "npm not found" >&2\nexit 1\n')
    hook.chmod(0o755)
    sandbox = GitWorktreeSandbox("r", str(repo), sandbox_root=str(tmp_path / "root"))
    sandbox.create("p27")
    assert sandbox.status is SandboxStatus.CREATED
    assert Path(sandbox.get_path("f")).read_text() == "base\n"
    sandbox.cleanup()
