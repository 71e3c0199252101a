"""Moved to :mod:`sandbox_core.host.checkpoint`; this alias is kept for one release."""

from sandbox_core.host.checkpoint import *  # noqa: F403
from sandbox_core.host.checkpoint import __all__  # noqa: F401
