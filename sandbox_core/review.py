"""Moved to :mod:`sandbox_core.plan.review`; this alias is kept for one release."""

from sandbox_core.plan.review import *  # noqa: F403
from sandbox_core.plan.review import __all__  # noqa: F401
