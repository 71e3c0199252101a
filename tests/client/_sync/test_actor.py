# Generated from tests/client/_async/test_actor.py by hack/unasync.py: do not edit.
"""The Sandbox's actor operations from the engine's client against the real API server and the
operator (tier 2, local executor: the core's door on its state directory): a streamed command,
its signal, file changes, search, a batch, the audit log; the original untouched until the
plan commits. Written once, for the async client; hack/unasync.py generates the blocking
client's copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_client import NotFoundError, RefusedError
from sandbox_client.client import Plan, SandboxClient
from tests.support.client import ClientEnv, make_repo

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@pytest.fixture
def client(env: ClientEnv) -> Iterator[SandboxClient]:
    with SandboxClient(
        kubeconfig=env.kubeconfig, namespace=env.namespace, local_state_dir=env.state_dir
    ) as connected:
        yield connected


def test_a_sandbox_runs_commands_and_changes_files_until_the_plan_commits(
    client: SandboxClient, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "r0\n", "src/a.py": "a = 0\n"})
    with Plan(client, "act-plan", client.namespace) as plan:
        code = plan.add_sandbox("code", "git_worktree", str(repo))
        plan.wait_ready(timeout=90)

        script = "trap 'echo stopped; exit 9' TERM; echo ready; sleep 20 & wait"
        seen = []
        for chunk in code.exec_stream(script):
            seen.append(chunk)
            if chunk.kind == "stdout" and b"ready" in chunk.data:
                assert code.signal(chunk.exec_id, "SIGTERM")
        last = seen[-1].result
        assert last is not None and last.exit_code == 9
        assert b"stopped" in b"".join(c.data for c in seen)

        assert (code.edit("src/a.py", "a = 0", "a = 1")).occurrences == 1
        code.append("README.md", "r1\n")
        assert code.read_range("README.md", 3, 2) == b"r1"
        code.mkdir("docs")
        code.move("README.md", "docs/README.md")
        with pytest.raises(NotFoundError):
            code.stat("README.md")
        results = code.upload({"docs/x.txt": "x", "../y.txt": "y"})
        assert [r.ok for r in results] == [True, False]
        [down] = code.download(["docs/x.txt"])
        assert down.data == b"x"
        assert [m.line for m in (code.grep("a = 1")).matches] == [1]
        assert [e.path for e in (code.glob("docs/*")).paths] == [
            "docs/README.md",
            "docs/x.txt",
        ]
        code.delete_path("docs/x.txt")
        with pytest.raises(RefusedError) as refused:
            code.edit("src/a.py", "absent", "b")
        assert refused.value.reason == "InvalidOperation"
        ops = [e["op"] for e in (code.audit()).entries]
        assert ops == ["exec", "edit", "write", "mkdir", "move", "write", "delete"]
        assert (repo / "README.md").read_text() == "r0\n"  # the original, untouched

        result = plan.commit()
        assert result.committed
    assert (repo / "docs" / "README.md").read_text() == "r0\nr1\n"
    assert (repo / "src" / "a.py").read_text() == "a = 1\n" and not (repo / "docs/x.txt").exists()
