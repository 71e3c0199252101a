"""Fixtures of the framework adapters' tier: sandboxes on local paths, made by the core."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_core.actor.actions import LocalActions
from tests.support.adapters import local_actions


@pytest.fixture
def actions(tmp_path: Path) -> Iterator[LocalActions]:
    yield from local_actions(tmp_path)
