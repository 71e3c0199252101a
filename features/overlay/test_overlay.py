"""Overlay area: seed 003 verbatim (both modes) and the kernel-mode scenarios."""

import pytest
from pytest_bdd import scenarios

# conftest parametrises ovl_mode (kernel, fallback) for the seed scenarios that use it.
pytestmark = pytest.mark.usefixtures("ovl_mode")

scenarios("overlay_sandbox.feature", "overlay_kernel.feature")
