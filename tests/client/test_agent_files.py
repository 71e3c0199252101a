"""The client's file operations on pod-executor Sandboxes: a real workspace agent process
(``sandbox-core serve-workspace``) reached (1) straight at its address through the transport seam
and (2) through the real tier-2 kube-apiserver's pod proxy, with the client's kubeconfig
credentials and the token read from the Sandbox's Secret (issue 10, section 1).

Tier 2 has no kubelet: the test plays its part (it runs the Pod's process and reports the Pod's
status with ``podIP``). The API server refuses to proxy to loopback addresses, so the agent
listens on this machine's first non-loopback IPv4 address, which the API server dials like a
Pod IP. Errors carry the same types and reasons as LocalFileOperations.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from sandbox_operator.executors.agent_client import AgentClient

from sandbox_client import SandboxClient, aio
from sandbox_client.actor import AgentActor
from sandbox_client.agent_files import (
    AgentFileOperations,
    AgentReply,
    AsyncAgentFileOperations,
    AsyncDirectTransport,
    DirectTransport,
    error_of,
    secret_name,
)
from sandbox_client.errors import NotFoundError, OperationFailedError, RefusedError
from sandbox_client.files import operations_for
from sandbox_client.kubectl_plugin import cli as plugin_cli
from sandbox_client.models import SandboxInfo
from tests.support.apiserver.harness import free_port
from tests.support.client_agent import (
    POD,
    SANDBOX_ID,
    TOKEN,
    Agent,
    pod_manifest,
    sandbox_info,
)
from tests.support.gitrepo import make_repo
from tests.support.operator import Cluster


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, Path]]:
    """A running agent with one Active git_worktree sandbox of a real repository."""
    repo = make_repo(tmp_path / "repo", {"README.md": "r0\n", "src/app.py": "print('v0')\n"})
    work = tmp_path / "agent"
    work.mkdir()
    process = Agent(work).start()
    body = {
        "plan_id": "plan-a", "resource_id": "repo", "strategy": "git_worktree",
        "original": str(repo), "sandbox_id": SANDBOX_ID,
    }  # fmt: skip
    calls = AgentClient(process.url, TOKEN, timeout_seconds=30)
    calls.call("POST", "/v1/sandboxes", body, request_id="create-1")
    calls.call("POST", f"/v1/sandboxes/{SANDBOX_ID}/activate", request_id="activate-1")
    yield process, repo
    process.stop()
    assert TOKEN not in (work / "agent.log").read_text()


def exercise(files: AgentFileOperations, info: SandboxInfo, repo: Path) -> None:
    """The FileOperations contract against the agent; the original is never touched."""
    files.write_file(info, "src/new/deep.txt", b"hello\x00bytes")
    files.write_file(info, "README.md", b"r1\n")
    assert files.read_file(info, "src/new/deep.txt") == b"hello\x00bytes"
    assert files.read_file(info, "README.md") == b"r1\n"
    assert files.list_files(info) == ["README.md", "src/app.py", "src/new/deep.txt"]
    assert files.list_files(info, "src") == ["src/app.py", "src/new/deep.txt"]
    assert files.list_files(info, "src/app.py") == ["src/app.py"]
    diff = files.diff(info)
    assert "+r1" in diff and "src/new/deep.txt" in diff
    assert (repo / "README.md").read_text() == "r0\n"
    for bad in ("../escape.txt", "/etc/passwd", "src/../../x", "a\x00b"):
        with pytest.raises(RefusedError) as refused:
            files.write_file(info, bad, b"x")
        assert refused.value.reason == "PathTraversal"
        with pytest.raises(RefusedError) as refused:
            files.read_file(info, bad)
        assert refused.value.reason == "PathTraversal"
    with pytest.raises(RefusedError) as reserved:
        files.read_file(info, ".git/config")
    assert reserved.value.reason == "ReservedPath"
    with pytest.raises(NotFoundError) as missing:
        files.read_file(info, "no/such.txt")
    assert missing.value.reason == "NotFound"
    with pytest.raises(NotFoundError):
        files.list_files(info, "no/such/dir")
    with pytest.raises(RefusedError) as finished:
        files.write_file(sandbox_info(info.namespace, phase="Committed"), "x.txt", b"x")
    assert finished.value.reason == "InvalidState"


def test_agent_file_operations_straight_to_a_real_agent(agent: tuple[Agent, Path]) -> None:
    process, repo = agent
    files = AgentFileOperations(DirectTransport(process.url, TOKEN, timeout_seconds=30))
    exercise(files, sandbox_info(), repo)


def test_the_agent_refuses_a_symlink_out_of_the_sandbox(agent: tuple[Agent, Path]) -> None:
    """A symlink resolving outside passes the client's lexical check: the agent refuses it."""
    process, _ = agent
    sandbox_dir = next((process.work / "sandboxes").rglob("README.md")).parent
    (sandbox_dir / "out").symlink_to("/etc")
    files = AgentFileOperations(DirectTransport(process.url, TOKEN, timeout_seconds=30))
    with pytest.raises(RefusedError) as refused:
        files.read_file(sandbox_info(), "out/hostname")
    assert refused.value.reason == "PathTraversal"
    assert "out" in files.list_files(sandbox_info())


def test_a_wrong_token_is_an_io_error_that_does_not_show_the_token(
    agent: tuple[Agent, Path],
) -> None:
    process, _ = agent
    wrong = "f" * 64
    files = AgentFileOperations(DirectTransport(process.url, wrong, timeout_seconds=30))
    with pytest.raises(OperationFailedError) as refused:
        files.read_file(sandbox_info(), "README.md")
    assert refused.value.reason == "IOError"
    assert wrong not in str(refused.value) and TOKEN not in str(refused.value)


def test_an_unreachable_agent_is_an_io_error() -> None:
    files = AgentFileOperations(DirectTransport(f"http://127.0.0.1:{free_port()}", TOKEN, 5))
    with pytest.raises(OperationFailedError) as failed:
        files.read_file(sandbox_info(), "README.md")
    assert failed.value.reason == "IOError"


def test_async_agent_file_operations_straight_to_a_real_agent(agent: tuple[Agent, Path]) -> None:
    process, _ = agent
    files = AsyncAgentFileOperations(AsyncDirectTransport(DirectTransport(process.url, TOKEN)))
    info = sandbox_info()

    async def flow() -> None:
        await files.write_file(info, "a/b.txt", b"async\n")
        assert await files.read_file(info, "a/b.txt") == b"async\n"
        assert "a/b.txt" in await files.list_files(info)
        assert "a/b.txt" in await files.diff(info)
        with pytest.raises(RefusedError):
            await files.read_file(info, "../x")

    asyncio.run(flow())


def test_operations_for_picks_the_agent_for_the_pod_executor() -> None:
    agent_ops = AgentFileOperations(DirectTransport("http://127.0.0.1:1", TOKEN))
    assert operations_for(sandbox_info(), agent_ops) is agent_ops
    with pytest.raises(RefusedError) as refused:
        operations_for(sandbox_info())
    assert refused.value.reason == "NoFileOperations"


# -- through the API server's pod proxy ---------------------------------------------------------


@pytest.fixture
def proxied(
    local_apiserver: Any,
    agent: tuple[Agent, Path],
) -> tuple[Cluster, Agent, Path]:
    """A namespace with the Sandbox's token Secret and its workspace Pod (status reported
    Ready at the agent's address, as a kubelet would)."""
    process, repo = agent
    cluster = Cluster.fresh(local_apiserver, prefix="cli-agent")
    cluster.kubectl("create", "serviceaccount", "default", check=False)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_name(sandbox_info())},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
    }
    cluster.create(secret)
    cluster.create(pod_manifest(process.port))
    status = {
        "status": {
            "phase": "Running",
            "podIP": process.host,
            "podIPs": [{"ip": process.host}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    cluster.kubectl(
        "patch", "pod", POD, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )
    return cluster, process, repo


@pytest.mark.apiserver
def test_agent_file_operations_through_the_pod_proxy(
    proxied: tuple[Cluster, Agent, Path],
    local_apiserver: Any,
) -> None:
    cluster, _, repo = proxied
    info = sandbox_info(cluster.namespace)
    with SandboxClient(kubeconfig=str(local_apiserver.kubeconfig_path)) as client:
        files = client.files_for(info)
        assert files is client.agent_files
        exercise(client.agent_files, info, repo)


@pytest.mark.apiserver
def test_a_renewed_token_is_read_again_after_the_agent_refuses_the_cached_one(
    proxied: tuple[Cluster, Agent, Path],
    local_apiserver: Any,
) -> None:
    """The operator renews agent tokens (docs/operations.md, "Agent tokens expire"): a client
    that cached the old one gets the agent's 401, reads the Secret again and is served, sync and
    async, with no error on the way."""
    cluster, process, _ = proxied
    info = sandbox_info(cluster.namespace)

    def renew(token: str) -> None:
        encoded = base64.b64encode(token.encode()).decode()
        cluster.kubectl(
            "patch", "secret", secret_name(info), "--type=merge",
            "-p", json.dumps({"data": {"token": encoded}}),
        )  # fmt: skip
        process.token_file.write_text(token)

    with SandboxClient(kubeconfig=str(local_apiserver.kubeconfig_path)) as client:
        client.agent_files.write_file(info, "r.txt", b"one\n")  # the token is cached now
        renew("v2.1.86400." + "a" * 64)
        assert client.agent_files.read_file(info, "r.txt") == b"one\n"

    async def flow() -> None:
        async with aio.SandboxClient(kubeconfig=str(local_apiserver.kubeconfig_path)) as client:
            files = await client.files_for(info)
            assert await files.read_file(info, "r.txt") == b"one\n"
            renew("v2.2.86400." + "b" * 64)
            assert await files.read_file(info, "r.txt") == b"one\n"

    asyncio.run(flow())


@pytest.mark.apiserver
def test_async_agent_file_operations_through_the_pod_proxy(
    proxied: tuple[Cluster, Agent, Path],
    local_apiserver: Any,
) -> None:
    cluster, _, _ = proxied
    info = sandbox_info(cluster.namespace)

    async def flow() -> None:
        async with aio.SandboxClient(kubeconfig=str(local_apiserver.kubeconfig_path)) as client:
            files = await client.files_for(info)
            await files.write_file(info, "x/y.txt", b"proxied\n")
            assert await files.read_file(info, "x/y.txt") == b"proxied\n"
            assert "x/y.txt" in await files.list_files(info, "x")
            assert "x/y.txt" in await files.diff(info)
            with pytest.raises(NotFoundError):
                await files.read_file(info, "nope.txt")

    asyncio.run(flow())


@pytest.mark.apiserver
def test_pod_proxy_errors_are_typed(
    proxied: tuple[Cluster, Agent, Path],
    local_apiserver: Any,
) -> None:
    """No workspace Pod, no Secret: InvalidState, never a raw ApiException."""
    cluster, _, _ = proxied
    with SandboxClient(kubeconfig=str(local_apiserver.kubeconfig_path)) as client:
        gone = sandbox_info(cluster.namespace).model_copy(update={"workspace_pod": "no-such-pod"})
        with pytest.raises(RefusedError) as no_pod:
            client.agent_files.read_file(gone, "README.md")
        assert no_pod.value.reason == "InvalidState"
        other = SandboxInfo.from_object(
            {**sandbox_info(cluster.namespace).raw, "metadata": {
                "name": "other", "namespace": cluster.namespace, "uid": "u2"}}
        )  # fmt: skip
        with pytest.raises(RefusedError) as no_secret:
            client.agent_files.read_file(other, "README.md")
        assert no_secret.value.reason == "InvalidState"
        assert TOKEN not in str(no_secret.value)


def exercise_actor(actor: AgentActor, info: SandboxInfo, repo: Path) -> None:
    """The actor's operations through the pod proxy: a streamed command (its first line before
    its end), an edit, search, a batch download (a repeated query name), the audit log."""
    started = time.monotonic()
    first_output = None
    chunks = []
    for chunk in actor.exec_stream(info, "echo early; sleep 1.5; echo late"):
        if chunk.kind == "stdout" and first_output is None:
            first_output = time.monotonic() - started
        chunks.append(chunk)
    assert chunks[-1].result is not None and chunks[-1].result.exit_code == 0
    assert b"".join(c.data for c in chunks) == b"early\nlate\n"
    assert first_output is not None and first_output < 1.2  # streamed, not buffered to the end
    assert actor.exec(info, ["cat", "README.md"]).stdout == b"r0\n"
    assert actor.edit(info, "README.md", "r0", "r1").occurrences == 1
    assert [m.path for m in actor.grep(info, "r1").matches] == ["README.md"]
    down = actor.download(info, ["README.md", "src/app.py"])
    assert [(r.path, r.data) for r in down] == [
        ("README.md", b"r1\n"),
        ("src/app.py", b"print('v0')\n"),
    ]
    assert [e["op"] for e in actor.audit(info).entries][-3:] == ["exec", "exec", "edit"]
    assert (repo / "README.md").read_text() == "r0\n"


@pytest.mark.apiserver
def test_actor_operations_through_the_pod_proxy(
    proxied: tuple[Cluster, Agent, Path],
    local_apiserver: Any,
    tmp_path: Path,
) -> None:
    """Commands, edits, search and downloads reach the agent through the API server's pod
    proxy, streamed, as the documented Role's ServiceAccount (a proxied POST is ``create``)."""
    cluster, _, repo = proxied
    info = sandbox_info(cluster.namespace)
    engine = engine_kubeconfig(cluster, local_apiserver, tmp_path, documented_role()["rules"])
    with SandboxClient(kubeconfig=str(engine)) as client:
        actor = client.actor_for(info)
        assert actor is client.agent_actor
        exercise_actor(client.agent_actor, info, repo)

    async def flow() -> list[str]:
        async with aio.SandboxClient(kubeconfig=str(local_apiserver.kubeconfig_path)) as client:
            kinds = [c.kind async for c in client.agent_actor.exec_stream(info, ["true"])]
            assert (await client.agent_actor.stat(info, "README.md")).size == 3
            return kinds

    assert asyncio.run(flow()) == ["started", "exit"]


@pytest.mark.apiserver
def test_the_plugin_execs_through_the_pod_proxy(
    proxied: tuple[Cluster, Agent, Path],
    local_apiserver: Any,
) -> None:
    """``kubectl sandbox exec`` on a pod-executor Sandbox: the output streamed from the real
    agent through the pod proxy, the command's exit code as the plugin's."""
    cluster, _, repo = proxied
    raw = sandbox_info(cluster.namespace).raw
    manifest = {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": raw["metadata"]["name"]},
        "spec": raw["spec"],
    }
    cluster.create(manifest)
    cluster.kubectl(
        "patch", "sandbox", manifest["metadata"]["name"], "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": raw["status"]}),
    )  # fmt: skip
    common = ["-n", cluster.namespace, "--kubeconfig", str(local_apiserver.kubeconfig_path)]
    ran = CliRunner().invoke(
        plugin_cli,
        ["exec", manifest["metadata"]["name"], *common, "--", "sh", "-c",
         "cat README.md; echo to-err >&2; exit 6"],
        catch_exceptions=False,
    )  # fmt: skip
    assert ran.exit_code == 6, ran.output
    assert (ran.stdout, ran.stderr) == ("r0\n", "to-err\n")
    assert (repo / "README.md").read_text() == "r0\n"


DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def documented_role() -> dict[str, Any]:
    """The engine's Role exactly as docs/client.md ("RBAC") shows it."""
    section = DOC.read_text().split("### RBAC", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    role = yaml.safe_load(block)
    assert role["kind"] == "Role"
    return dict(role)


def engine_kubeconfig(
    cluster: Cluster, server: Any, work: Path, rules: list[dict[str, Any]]
) -> Path:
    """A kubeconfig of a ServiceAccount bound to a Role with ``rules`` (bearer token auth: the
    API server consumes ``Authorization``, so the agent token must travel in its own header)."""
    name = f"engine-{len(rules)}"
    role = {**documented_role(), "metadata": {"name": name}, "rules": rules}
    cluster.create(role)
    cluster.kubectl("create", "serviceaccount", name)
    cluster.kubectl(
        "create", "rolebinding", name, f"--role={name}",
        f"--serviceaccount={cluster.namespace}:{name}",
    )  # fmt: skip
    token = cluster.kubectl("create", "token", name).stdout.strip()
    admin = yaml.safe_load(Path(server.kubeconfig_path).read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": "c", "user": name, "namespace": cluster.namespace},
            }
        ],
        "current-context": name,
    }
    path = work / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.mark.apiserver
def test_the_documented_engine_role_is_enough_and_needed(
    proxied: tuple[Cluster, Agent, Path],
    local_apiserver: Any,
    tmp_path: Path,
) -> None:
    """As a ServiceAccount with the Role of docs/client.md: the file operations work through
    the pod proxy. Without ``pods/proxy`` they are refused with ``Forbidden``."""
    cluster, _, repo = proxied
    info = sandbox_info(cluster.namespace)
    rules = documented_role()["rules"]
    engine = engine_kubeconfig(cluster, local_apiserver, tmp_path, rules)
    with SandboxClient(kubeconfig=str(engine)) as client:
        exercise(client.agent_files, info, repo)
    without_proxy = [r for r in rules if "pods/proxy" not in r["resources"]]
    limited = engine_kubeconfig(cluster, local_apiserver, tmp_path, without_proxy)
    with SandboxClient(kubeconfig=str(limited)) as client, pytest.raises(RefusedError) as forbidden:
        client.agent_files.read_file(info, "README.md")
    assert forbidden.value.reason == "Forbidden"
    assert TOKEN not in str(forbidden.value)


def agent_error(status: int, type_: str, message: str) -> AgentReply:
    return AgentReply(status, json.dumps({"error": {"type": type_, "message": message}}).encode())


def api_status(status: int, reason: str) -> AgentReply:
    body = {"kind": "Status", "status": "Failure", "reason": reason, "message": f"m {reason}"}
    return AgentReply(status, json.dumps(body).encode())


@pytest.mark.parametrize(
    ("reply", "kind", "reason"),
    [
        (agent_error(404, "NotFound", "no file x"), NotFoundError, "NotFound"),
        (
            agent_error(422, "ValueError", "Path traversal not allowed"),
            RefusedError,
            "PathTraversal",
        ),
        (agent_error(409, "SandboxStateError", "committed"), RefusedError, "InvalidState"),
        (agent_error(500, "IsADirectoryError", "is a dir"), RefusedError, "InvalidState"),
        (agent_error(500, "OSError", "disk full"), OperationFailedError, "IOError"),
        (agent_error(401, "Unauthorized", "bad or no token"), OperationFailedError, "IOError"),
        (api_status(403, "Forbidden"), RefusedError, "Forbidden"),
        (api_status(404, "NotFound"), RefusedError, "InvalidState"),
        (api_status(400, "BadRequest"), RefusedError, "InvalidState"),
        (api_status(503, "ServiceUnavailable"), OperationFailedError, "IOError"),
        (AgentReply(502, b"<html>bad gateway</html>"), OperationFailedError, "IOError"),
    ],
)
def test_agent_and_api_server_replies_map_to_the_local_error_types(
    reply: AgentReply, kind: type[Exception], reason: str
) -> None:
    """The HTTP failures of both hops become LocalFileOperations' error types and reasons."""
    error = error_of(reply, "read x in s")
    assert type(error) is kind
    assert error.reason == reason
