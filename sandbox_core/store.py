"""Moved to :mod:`sandbox_core.host.store`; this alias is kept for one release."""

from sandbox_core.host.store import *  # noqa: F403
from sandbox_core.host.store import __all__  # noqa: F401
