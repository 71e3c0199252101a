"""Tier 1: how the client is built, checked without a cluster.

- ``import sandbox_client`` (and each public module) loads no git, no database driver, no web
  server, no operator and no kopf; the package, the two clients, the models and the errors load
  no Kubernetes client either (that happens on the first call to the API server).
- The client imports, of the repository, only ``sandbox_api`` and the core's vocabulary; the
  core imports neither the client nor the operator (shared/ARCHITECTURE.md, "Layers").
- The blocking client is generated from the async one and is current (``hack/unasync.py``),
  so the two have the same names and signatures.
- The client's calls to the workspace agent use the agent's own wire table; it keeps no copy.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import sandbox_client
from sandbox_client import agent_files, aio
from sandbox_core.agent import wire
from tests.support.client_agent import sandbox_info

REPO_ROOT = Path(__file__).resolve().parents[2]

# Never loaded by the client: the core's git and database strategies, the agent's web server,
# the operator.
NEVER = ("git", "psycopg", "aiohttp.web", "sandbox_operator", "kopf", "sandbox_core.actor")
# Loaded on the first call to the API server, not by these modules.
ON_FIRST_CALL = ("kubernetes", "kubernetes_asyncio", "aiohttp", "urllib3")
LIGHT = ["sandbox_client", "sandbox_client.client", "sandbox_client.aio", "sandbox_client.models"]
LIGHT += ["sandbox_client.errors", "sandbox_client.files", "sandbox_client.agent_files"]
LIGHT += ["sandbox_client.actor", "sandbox_client.local_actor"]

# What of the repository the client may import (shared/ARCHITECTURE.md, "Layers").
ALLOWED_CORE = {"sandbox_core", "sandbox_core.paths", "sandbox_core.agent.wire"}
ALLOWED_CORE |= {"sandbox_core.tree.scan", "sandbox_core.tree.textdiff", "sandbox_core.errors"}
# The local door runs the core's own actor on the local executor's state directory; it imports
# it inside its functions (.importlinter, contract "client", names the same three).
LOCAL_DOOR = REPO_ROOT / "sandbox_client" / "local_actor.py"
LOCAL_DOOR_CORE = {"sandbox_core.actor.door", "sandbox_core.actor.exec", "sandbox_core.actor.local"}
FORBIDDEN_TOP = {"sandbox_operator", "kopf"}

PROBE = """
import importlib, json, sys
def loaded(names):
    return sorted(n for n in names for m in sys.modules if m == n or m.startswith(n + "."))
report = []
for module, forbidden in json.loads(sys.argv[1]):
    importlib.import_module(module)
    report.append([module, loaded(forbidden)])
print(json.dumps(report))
"""


def public_modules() -> list[str]:
    """Every public module of the package (a new one is checked without editing this test)."""
    found = sorted(p.stem for p in (REPO_ROOT / "sandbox_client").glob("*.py"))
    return [f"sandbox_client.{name}" for name in found if not name.startswith("_")]


def test_importing_the_client_loads_no_server_git_database_or_operator() -> None:
    """In a fresh interpreter: the light modules first (checked for the Kubernetes clients as
    well), then every other public module; after each import, nothing forbidden is loaded."""
    plan = [[m, [*NEVER, *ON_FIRST_CALL]] for m in LIGHT]
    plan += [[m, list(NEVER)] for m in public_modules() if m not in LIGHT]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(plan)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": f"{REPO_ROOT}/operator:{REPO_ROOT}"},
    )
    report = json.loads(done.stdout)
    assert [m for m, _ in report] == [m for m, _ in plan]
    assert {"sandbox_client.kubectl_plugin", "sandbox_client.mcp_server"} <= {m for m, _ in plan}
    assert [(module, bad) for module, bad in report if bad] == []


def imported_modules(package: str) -> Iterator[tuple[Path, str]]:
    """(source file, module name) of every absolute import in ``package``'s sources."""
    for source in sorted((REPO_ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                yield from ((source, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield source, node.module


def test_the_client_imports_only_the_layers_below_it() -> None:
    for source, name in imported_modules("sandbox_client"):
        assert name.split(".")[0] not in FORBIDDEN_TOP, (source, name)
        if name.split(".")[0] == "sandbox_core":
            allowed = ALLOWED_CORE | (LOCAL_DOOR_CORE if source == LOCAL_DOOR else set())
            assert name in allowed, (source, name)


def test_sandbox_core_imports_none_of_the_layers_above_it() -> None:
    """The import rule (shared/DESIGN.md, "Layers"), now with the client among the layers."""
    forbidden = {"kopf", "kubernetes", "kubernetes_asyncio", "sandbox_operator", "sandbox_client"}
    for source, name in imported_modules("sandbox_core"):
        assert name.split(".")[0] not in forbidden, (source, name)


def test_the_sync_client_is_generated_from_the_async_one_and_current() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "hack" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    generated = (REPO_ROOT / "sandbox_client" / "_sync" / "client.py").read_text()
    assert generated.startswith("# Generated from sandbox_client/_async/client.py")


def test_sync_and_async_apis_have_the_same_names() -> None:
    for sync_cls, async_cls in (
        (sandbox_client.SandboxClient, aio.SandboxClient),
        (sandbox_client.Plan, aio.Plan),
        (sandbox_client.Sandbox, aio.Sandbox),
    ):
        sync_names = {n for n in vars(sync_cls) if not n.startswith("_")}
        async_names = {n for n in vars(async_cls) if not n.startswith("_")}
        assert sync_names == async_names, sync_cls
        for name in sync_names:
            sync_attr, async_attr = getattr(sync_cls, name), getattr(async_cls, name)
            assert type(sync_attr) is type(async_attr), name  # both methods, or properties
            if not inspect.iscoroutinefunction(async_attr):
                continue  # plain constructors of handles (sandbox(), plan()), properties
            assert list(inspect.signature(sync_attr).parameters) == list(
                inspect.signature(async_attr).parameters
            ), name


def test_the_clients_agent_calls_use_the_agents_wire_table() -> None:
    """Each file operation's first request is a route of ``sandbox_core.agent.wire`` filled in,
    with the table's header and query names; no source of the client spells a route or header
    of the agent itself."""
    info = sandbox_info()
    flows = [
        (wire.READ, agent_files.read_flow(info, "a/b.txt")),
        (wire.WRITE, agent_files.write_flow(info, "a/b.txt", b"x")),
        (wire.LIST, agent_files.list_flow(info, "a")),
        (wire.DIFF, agent_files.diff_flow(info)),
    ]
    for route, flow in flows:
        request = next(flow)
        assert (request.method, request.path) == (route.method, route.path(sid=info.sandbox_id))
        assert request.path.startswith("/v1/sandboxes/")
        headers = request.headers("t0ken")
        assert headers[wire.TOKEN_HEADER] == "t0ken"
        assert (wire.REQUEST_ID_HEADER in headers) is route.changes
        assert set(request.query) == (set() if route is wire.DIFF else {wire.PATH_QUERY})
    spelled = {wire.TOKEN_HEADER, wire.REQUEST_ID_HEADER}
    own = [
        (source.name, node.value)
        for source in sorted((REPO_ROOT / "sandbox_client").rglob("*.py"))
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value.startswith("/v1") or node.value in spelled)
    ]
    assert own == []
