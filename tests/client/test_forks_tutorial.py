"""docs/forks.md is a tutorial that runs: its Python blocks, in order, against the real API
server and the operator with the local executor (tier 2): three forks of one sandbox, checks in
each, the approver sees the results, one fork is committed, the others are gone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.approvals import grant_plancommit_rights
from tests.support.client import ClientEnv

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[2] / "docs" / "forks.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_forks_tutorial_runs_end_to_end(env: ClientEnv, tmp_path: Path) -> None:
    blocks = BLOCK.findall(DOC.read_text())
    assert len(blocks) == 5
    grant_plancommit_rights(env.cluster)  # alice, the tutorial's approver
    script = tmp_path / "forks_tutorial.py"
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
    assert "forks ['attempt-1', 'attempt-2', 'attempt-3']" in out
    assert "limits-attempt-3 exit 1" in out
    assert "  limits-attempt-2 attempt-2 exit 0" in out
    assert "committed True" in out
    assert "discarded ['attempt-1', 'attempt-3', 'explore-service']" in out
    assert "left ['attempt-2']" in out
    listed = env.cluster.kubectl("get", "sandboxes", "-o", "name").stdout.strip()
    assert listed == ""
