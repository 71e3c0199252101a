"""Moved to :mod:`sandbox_core.strategies.base`; this alias is kept for one release."""

from sandbox_core.strategies.base import *  # noqa: F403
from sandbox_core.strategies.base import __all__  # noqa: F401
