"""Landing a sandbox one-shot or in two phases, and the small tree the adversarial-input tests
start from.

:data:`two_phase_or_not` parametrizes a test with ``two_phase`` False (``commit()``) and True
(``prepare`` + ``apply_prepared`` of :data:`TXID`); :func:`land` does the one the test got.
:func:`no_staging` asserts that no staging area (one-shot or two-phase) is left beside or inside
an original.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_core.strategies.base import BaseSandbox

TXID = "s14.1"


def base_tree(root: Path) -> Path:
    src = root / "src"
    (src / "d").mkdir(parents=True)
    (src / "a.txt").write_text("a\n")
    (src / "d" / "c.txt").write_text("c\n")
    return src


two_phase_or_not = pytest.mark.parametrize("two_phase", [False, True], ids=["one-shot", "2pc"])


def land(sandbox: BaseSandbox, two_phase: bool) -> None:
    if two_phase:
        sandbox.prepare(TXID)
        sandbox.apply_prepared(TXID)
    else:
        sandbox.commit()


def no_staging(src: Path) -> None:
    left = [n for n in os.listdir(src.parent) if n.startswith(f".{src.name}.sandbox-")]
    left += [n for n in os.listdir(src) if n.startswith(".sandbox-staging-")]
    assert left == []
