"""pytest configuration of tests/: the support plugins, whose fixtures every test may ask for.

Helpers and fixtures live in ``tests/support/`` (never tests); a fixture used by one folder
only lives in that folder's ``conftest.py``. A test module never imports another test module
(``tests/test_layout.py`` checks it). The tier of a test is a marker set once: by the fixture
that starts the API server (``tests/support/apiserver/fixtures.py`` marks its users
``apiserver``) or by the folder (``tests/operator/apiserver/conftest.py``).
"""

import os
from collections.abc import Iterator

import pytest

from tests.support.mounts import unmount_beneath

# In import order: a plugin is listed before any plugin that imports it (pytest rewrites the
# asserts of a plugin only when it is not imported yet).
pytest_plugins = [
    "tests.support.gitrepo",
    "tests.support.postgres",
    "tests.support.apiserver.fixtures",
    "tests.support.chart",
    "tests.support.dbkit",
    "tests.support.directory_sandboxes",
    "tests.support.pg",
]

# The framework adapters' tier needs the frameworks, installed in .venv-integrations only;
# hack/test.sh runs it there with SANDBOX_INTEGRATIONS=1 (tests/test_layout.py checks that).
if not os.environ.get("SANDBOX_INTEGRATIONS"):
    collect_ignore = ["integrations"]


@pytest.fixture(scope="session", autouse=True)
def _no_mount_outlives_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Sandboxes a test leaves mounted (a rolled-back overlay is still mounted) are unmounted
    when the session ends, so a later run can prune this run's temporary directory."""
    yield
    unmount_beneath(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """The async tests run on asyncio only (the client is built on ``kubernetes_asyncio`` and
    ``aiohttp``): trio, when installed (selenium brings it), must not add a second run."""
    return "asyncio"
