"""Pass-through strategy "none" (seed 002, NoSandbox); steps in conftest.py."""

from pytest_bdd import scenarios

scenarios("none.feature")
