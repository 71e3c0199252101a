"""Both adapters over the engine's client: a Sandbox custom resource reconciled by the real
operator (tier 2: real API server, local executor), driven through ``ClientActions``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_client import Plan, SandboxClient
from sandbox_client.integrations.client_actions import ClientActions
from sandbox_client.integrations.deepagents import SandboxBackend
from tests.support.apiserver.fixtures import local_apiserver  # noqa: F401 - pytest fixture
from tests.support.client import ClientEnv, client_env_for, make_dir

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(
    local_apiserver: Any,  # noqa: F811 - the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClientEnv]:
    yield from client_env_for(local_apiserver, tmp_path_factory.mktemp("operator"), "adapters")


def test_a_deep_agent_backend_over_a_sandbox_resource(env: ClientEnv, tmp_path: Path) -> None:
    original = make_dir(tmp_path / "docs", {"guide.md": "draft\n"})
    with SandboxClient(
        kubeconfig=env.kubeconfig, namespace=env.namespace, local_state_dir=env.state_dir
    ) as client:
        plan = Plan(client, "adapters-client")
        docs = plan.add_sandbox("docs", "copy_on_write", original)
        plan.wait_ready(timeout=90)
        backend = SandboxBackend(ClientActions(docs))
        root = backend.root
        assert re.fullmatch(r"/.+", root) and root != str(original)

        assert backend.edit(f"{root}/guide.md", "draft", "final").error is None
        ran = backend.execute("echo built > out.txt && cat guide.md")
        assert (ran.exit_code, ran.output) == (0, "final\n")
        [got] = backend.download_files([f"{root}/out.txt"])
        assert got.content == b"built\n"
        [refused] = backend.upload_files([("/etc/passwd", b"x")])
        assert refused.error == "invalid_path"
        assert sorted(p.name for p in original.iterdir()) == ["guide.md"]
        assert (original / "guide.md").read_text() == "draft\n"

        assert plan.commit().committed
        assert (original / "guide.md").read_text() == "final\n"
        assert (original / "out.txt").read_text() == "built\n"
