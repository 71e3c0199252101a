"""Shell writes land in the sandbox like any other write (issue "The actor's door", item 1): a
``sed -i``, a build output, a ``rm`` and a ``mv`` made by a command are in the sandbox's review,
its diff and its commit, for every strategy with a working tree; under ``none`` a command writes
the original directly (that strategy's definition), yet still sees none of the agent's state."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_core.actor.exec import ExecRequest
from sandbox_core.describe import sandbox_diff
from tests.support.actor import FILES, KINDS, TOKEN, Layout, MakeSandbox
from tests.support.gitrepo import GIT_ENV

BUILD = (
    "sed -i s/base/edited/ f.txt && mkdir -p build && printf 'out\\n' > build/o.txt "
    "&& rm gone.txt && mv d/g.txt d/h.txt && chmod +x d/h.txt"
)


@pytest.mark.parametrize("kind", KINDS)
def test_a_commands_writes_are_in_the_review_the_diff_and_the_commit(
    layout: Layout, make_sandbox: MakeSandbox, kind: str
) -> None:
    sandbox = make_sandbox(kind)
    original = Path(sandbox.original_path)
    _, err, result = layout.runner().run(sandbox, ExecRequest(shell_line=BUILD, env=GIT_ENV))
    assert result.exit_code == 0, err
    assert (original / "f.txt").read_text() == "base\n"  # nothing reached the original yet
    review = sandbox.review()
    assert "f.txt" in review.changed
    assert {"build/o.txt", "d/h.txt"} <= set(review.added)
    assert {"gone.txt", "d/g.txt"} <= set(review.deleted)
    assert "+edited" in sandbox_diff(sandbox)
    assert sandbox.commit("actor's build").success
    assert (original / "f.txt").read_text() == "edited\n"
    assert (original / "build" / "o.txt").read_text() == "out\n"
    assert not (original / "gone.txt").exists() and not (original / "d" / "g.txt").exists()
    assert (original / "d" / "h.txt").read_text() == FILES["d/g.txt"]
    assert (original / "d" / "h.txt").stat().st_mode & 0o111


@pytest.mark.parametrize("kind", KINDS)
def test_a_commands_writes_are_gone_after_a_rollback(
    layout: Layout, make_sandbox: MakeSandbox, kind: str
) -> None:
    sandbox = make_sandbox(kind)
    layout.runner().run(sandbox, ExecRequest(shell_line=BUILD))
    sandbox.rollback()
    sandbox.activate()
    out, _, _ = layout.runner().run(sandbox, ExecRequest(shell_line="cat f.txt; ls build 2>&1"))
    assert out.decode().startswith("base\n") and "No such file" in out.decode()


def test_under_none_a_command_writes_the_original_directly_and_still_sees_no_agent_state(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("none")
    line = f"sed -i s/base/edited/ f.txt; cat {layout.token} 2>&1; true"
    out, _, result = layout.runner().run(sandbox, ExecRequest(shell_line=line))
    assert (Path(sandbox.original_path) / "f.txt").read_text() == "edited\n"
    assert TOKEN not in out.decode() and result.exit_code == 0
