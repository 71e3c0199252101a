"""BDD scenarios of the operator against the real API server (tier 2); steps in conftest.py."""

from pytest_bdd import scenarios

from tests.support.apiserver.fixtures import local_apiserver  # noqa: F401 - pytest fixture

scenarios("operator.feature")
