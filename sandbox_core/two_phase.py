"""Moved to :mod:`sandbox_core.plan.two_phase`; this alias is kept for one release."""

from sandbox_core.plan.two_phase import *  # noqa: F403
from sandbox_core.plan.two_phase import __all__  # noqa: F401
