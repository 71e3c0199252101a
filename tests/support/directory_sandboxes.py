"""The directory strategies and modes the fidelity tests run on, and the ``make`` fixture.

:data:`STRATEGIES` are the ids copy_on_write, overlay on a real OverlayFS mount (kernel, marked
``overlay_kernel``) and the overlay's userspace fallback; :func:`new_sandbox` makes a sandbox for
one of them. ``make`` (fixture, parametrized indirectly with :data:`STRATEGIES`) makes sandboxes
of one mode for a test, cleans them up after it, and fails the test if a mount was left behind.
Loaded as a pytest plugin (``tests/conftest.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_core.strategies.base import BaseSandbox
from sandbox_core.strategies.copy_on_write import CopyOnWriteSandbox
from sandbox_core.strategies.overlay import OverlaySandbox
from sandbox_core.strategies.overlay import mount as _overlay_mount

STRATEGIES = [
    pytest.param("copy_on_write", id="copy_on_write"),
    pytest.param("overlay-kernel", id="overlay-kernel", marks=pytest.mark.overlay_kernel),
    pytest.param("overlay-fallback", id="overlay-fallback"),
]

Make = Callable[[Path], BaseSandbox]


def new_sandbox(kind: str, src: Path, root: Path) -> BaseSandbox:
    """A sandbox of ``src`` for one strategy/mode id of :data:`STRATEGIES`."""
    if kind == "copy_on_write":
        return CopyOnWriteSandbox("res", str(src), sandbox_root=str(root))
    mode = kind.removeprefix("overlay-")
    return OverlaySandbox("res", str(src), sandbox_root=str(root), mode=mode)


@pytest.fixture
def make(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Make]:
    made: list[BaseSandbox] = []
    kind: str = request.param

    def factory(src: Path) -> BaseSandbox:
        sandbox = new_sandbox(kind, src, tmp_path / "root")
        made.append(sandbox)
        return sandbox

    yield factory
    for sandbox in made:
        sandbox.cleanup()
    root = os.path.realpath(tmp_path)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(root + "/"):
            _overlay_mount.unmount(Path(point))
            pytest.fail(f"mount left behind: {point}")
