"""Fixtures of the client tests: ``env``, one namespace watched by a running operator per module
(tier 2: the session's real API server, ``local_apiserver``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.apiserver.fixtures import local_apiserver  # noqa: F401 - pytest fixture
from tests.support.client import ClientEnv, client_env_for


@pytest.fixture(scope="module")
def env(
    local_apiserver: Any,  # noqa: F811 - the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[ClientEnv]:
    """A fresh namespace (named after the test module) with an operator watching it."""
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    prefix = "cl" + re.sub(r"[^a-z0-9]", "", module)[:12]
    yield from client_env_for(local_apiserver, tmp_path_factory.mktemp("operator"), prefix)
