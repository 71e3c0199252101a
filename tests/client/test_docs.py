"""docs/client.md is a tutorial that runs: its Python blocks, in order, against the real API
server and the operator with the local executor (tier 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.client import ClientEnv, python_blocks, run_tutorial

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_tutorial_runs_end_to_end(env: ClientEnv, tmp_path: Path) -> None:
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 10
    out = run_tutorial(blocks, env, tmp_path)
    assert "Committed True" in out and "Failed False" in out
    assert "PathTraversal - Path traversal not allowed" in out
    assert "AlreadyExists" in out and "NotFound" in out
    # The actor's door: a command's exit code, then the reviewed plan approved and committed.
    assert "exit 0 b'hello\\n'" in out and "exit 3 b'oops\\n'" in out
    assert "actor plan Committed True" in out
    # Everything the tutorial made was cleaned up by it.
    listed = env.cluster.kubectl("get", "sandboxes", "-o", "name").stdout.strip()
    assert listed == ""


def test_the_readme_example_is_five_lines_of_the_real_api() -> None:
    section = README.read_text().split("## The engine's client", 1)[1].split("\n## ", 1)[0]
    blocks = python_blocks(section)
    assert len(blocks) == 1
    lines = [
        line for line in blocks[0].splitlines() if line.strip() and not line.startswith("from ")
    ]
    assert len(lines) == 5
    compile(blocks[0], "README.md", "exec")  # valid Python
    for name in ("SandboxClient", "Plan", "add_sandbox", "wait_ready", "write_file", "commit"):
        assert name in blocks[0]
