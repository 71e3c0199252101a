"""docs/forks.md is a tutorial that runs: its Python blocks, in order, against the real API
server and the operator with the local executor (tier 2): three forks of one sandbox, checks in
each, the approver sees the results, one fork is committed, the others are gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.client import ClientEnv, python_blocks, run_tutorial

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[2] / "docs" / "forks.md"


def test_the_forks_tutorial_runs_end_to_end(env: ClientEnv, tmp_path: Path) -> None:
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) == 5
    out = run_tutorial(blocks, env, tmp_path)
    assert "forks ['attempt-1', 'attempt-2', 'attempt-3']" in out
    assert "limits-attempt-3 exit 1" in out
    assert "  limits-attempt-2 attempt-2 exit 0" in out
    assert "committed True" in out
    assert "discarded ['attempt-1', 'attempt-3', 'explore-service']" in out
    assert "left ['attempt-2']" in out
    listed = env.cluster.kubectl("get", "sandboxes", "-o", "name").stdout.strip()
    assert listed == ""
