"""Moved to :mod:`sandbox_core.plan.journal`; this alias is kept for one release."""

from sandbox_core.plan.journal import *  # noqa: F403
from sandbox_core.plan.journal import __all__  # noqa: F401
