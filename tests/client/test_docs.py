"""docs/client.md is a tutorial that runs: its Python blocks, in order, against the real API
server and the operator with the local executor (tier 2; issue 10, "Done means")."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.approvals import grant_plancommit_rights
from tests.support.client import ClientEnv

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The fenced ``python`` code blocks of a Markdown text, in order."""
    return BLOCK.findall(text)


def test_the_tutorial_runs_end_to_end(env: ClientEnv, tmp_path: Path) -> None:
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 10
    grant_plancommit_rights(env.cluster)  # alice, the tutorial's approver
    script = tmp_path / "tutorial.py"
    script.write_text("\n\n".join(blocks))
    process_env = env.env()
    process_env["SANDBOX_NAMESPACE"] = env.namespace
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=process_env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
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
