"""The operator half of the README's first command (``hack/demo.sh`` runs
``hack/operator_demo.py``) passes on the real API server (tier 2).

It had failed since TwoPhase became PlanCommit's default mode (issue 9) and nothing ran it:
its check for the failed plan wanted ``rolledBackIds``, which only the saga fills.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.operator import REPO_ROOT

pytestmark = pytest.mark.slow


def test_the_operator_demo_passes() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "hack" / "operator_demo.py")],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "operator demo PASSED" in done.stdout
    assert "originals unchanged after the failed PlanCommit: True" in done.stdout
