"""Moved to :mod:`sandbox_core.strategies.factory`; this alias is kept for one release."""

from sandbox_core.strategies.factory import *  # noqa: F403
from sandbox_core.strategies.factory import __all__  # noqa: F401
