"""pytest plugin for tier 2: one real etcd + kube-apiserver for the whole test session.

Loaded by ``pytest_plugins`` in ``tests/conftest.py``, so every test under ``tests/`` may ask for
``local_apiserver`` without importing it; every test that asks for it (directly or through
another fixture) is marked ``apiserver`` here, once, so ``-m apiserver`` / ``-m "not apiserver"``
select the tier without a marker on each test.

The server is shared through `shared_apiserver`, so registering the fixture from more than one
place (the BDD steps of ``features/operator`` import it too) still starts only one server per
process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.apiserver.harness import LocalApiServer

FIXTURE = "local_apiserver"

_lock = threading.Lock()
_server: LocalApiServer | None = None
_users = 0


@contextmanager
def shared_apiserver() -> Iterator[LocalApiServer]:
    """Yield the process-wide `LocalApiServer`, starting it for the first user.

    The last user to leave stops it. Raises what `LocalApiServer.start` raises
    (`BinariesNotFoundError`, `StartupError`).
    """
    global _server, _users  # one server per process is the point
    with _lock:
        if _server is None:
            server = LocalApiServer()
            server.start()
            _server = server
        _users += 1
        current = _server
    try:
        yield current
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _server is not None:
                _server.stop()
                _server = None


@pytest.fixture(scope="session")
def local_apiserver() -> Iterator[LocalApiServer]:
    """A running etcd + kube-apiserver on 127.0.0.1 (tier 2), shared by the whole session.

    Use its ``kubeconfig_path``, ``server_url``, ``env()`` and ``kubectl(...)``. The binaries are
    built on first use by ``hack/build-k8s-binaries.sh`` unless ``SANDBOX_K8S_BIN`` names them.
    Tests share one server: create objects under unique names or in their own namespace (nothing
    deletes namespaces here - no controller-manager runs - so do not wait for that).
    """
    with shared_apiserver() as server:
        yield server


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``apiserver`` every test that uses :func:`local_apiserver`."""
    for item in items:
        if FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.apiserver)
