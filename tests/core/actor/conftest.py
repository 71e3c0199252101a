"""The actor tests' fixtures live in tests/support/actor.py."""

from tests.support.actor import layout, make_sandbox

__all__ = ["layout", "make_sandbox"]
