"""Makes the tier-2 fixtures available to the tests in this package.

``tests/conftest.py`` may import the same fixture for the other packages; `shared_apiserver`
keeps that to one server per test session.
"""

from tests.apiserver.fixtures import local_apiserver

__all__ = ["local_apiserver"]
