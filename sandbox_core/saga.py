"""Moved to :mod:`sandbox_core.plan.saga`; this alias is kept for one release."""

from sandbox_core.plan.saga import *  # noqa: F403
from sandbox_core.plan.saga import __all__  # noqa: F401
