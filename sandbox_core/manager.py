"""Moved to :mod:`sandbox_core.host.manager`; this alias is kept for one release."""

from sandbox_core.host.manager import *  # noqa: F403
from sandbox_core.host.manager import __all__  # noqa: F401
