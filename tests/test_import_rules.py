"""The import rules (shared/ARCHITECTURE.md, "Layers: what may import what") catch a wrong arrow.

- ``lint-imports`` (the contracts in ``.importlinter``) keeps every contract on a copy of the four
  packages, and breaks the right contract, naming it, once one wrong import is planted in the
  copy: an upward import in the core's layers, an operator layer importing the one above it, the
  API contract or the client reaching the core through its facade, product code importing an
  alias module kept for one release, GitPython imported outside its one module.
- ``import sandbox_core`` alone loads no git, database driver, web server or CLI library: the
  package resolves its public names lazily (PEP 562). The client's own rule (no git, psycopg,
  ``aiohttp.web``, operator or kopf) is tests/client/test_imports.py.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The packages lint-imports analyses, as laid out in the repository.
PACKAGES = ("sandbox_core", "sandbox_api", "sandbox_client", "operator/sandbox_operator")
# The console script installed beside this interpreter (the test extra brings it).
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# (the file the wrong import is added to, the import, the id of the contract it breaks,
#  a line of the report that names the arrow)
PLANTED = [
    pytest.param(
        "sandbox_core/tree/scan.py",
        "import sandbox_core.host",
        "core-layers",
        "sandbox_core.tree is not allowed to import sandbox_core.host",
        id="tree-imports-host",
    ),
    pytest.param(
        "sandbox_core/plan/saga.py",
        "import sandbox_core.strategies.base",
        "core-layers",
        "sandbox_core.plan is not allowed to import sandbox_core.strategies",
        id="plan-imports-a-strategy",
    ),
    pytest.param(
        "sandbox_core/strategies/none.py",
        "import sandbox_core.strategies.overlay",
        "core-strategies",
        "sandbox_core.strategies.none is not allowed to import sandbox_core.strategies.overlay",
        id="one-strategy-imports-another",
    ),
    pytest.param(
        "operator/sandbox_operator/kube/events.py",
        "import sandbox_operator.errors",
        "operator-layers",
        "sandbox_operator.kube is not allowed to import sandbox_operator.errors",
        id="operator-kube-imports-errors",
    ),
    pytest.param(
        "sandbox_api/naming.py",
        "import sandbox_core",
        "api",
        "sandbox_api is not allowed to import sandbox_core.host",
        id="api-imports-the-core-facade",
    ),
    pytest.param(
        "sandbox_client/errors.py",
        "import sandbox_core.host.store",
        "client",
        "sandbox_client is not allowed to import sandbox_core.host",
        id="client-imports-the-host",
    ),
    pytest.param(
        "sandbox_core/cli/demo.py",
        "import sandbox_core.manager",
        "core-aliases",
        "- sandbox_core.cli.demo -> sandbox_core.manager",
        id="product-code-imports-an-alias",
    ),
    pytest.param(
        "sandbox_core/strategies/git_worktree/merge.py",
        "import git",
        "behind-one-module-git",
        "- sandbox_core.strategies.git_worktree.merge -> git",
        id="git-outside-its-module",
    ),
]


def copy_packages(target: Path) -> Path:
    """The four packages and ``.importlinter`` under ``target``, in the repository's layout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, target / package, ignore=ignore)
    shutil.copy2(REPO_ROOT / ".importlinter", target / ".importlinter")
    return target


def copy_env(copy: Path) -> dict[str, str]:
    """The environment that makes the copy, not the repository or an installed tree, importable.

    ``PYTHONPATH`` entries come before site-packages, and an editable install's finder comes
    after the path finder, so the copy wins for every root package; ``COLUMNS`` keeps each line
    of the report on one line.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env["PYTHONPATH"] = f"{copy}{os.pathsep}{copy / 'operator'}"
    env["COLUMNS"] = "400"
    return env


def lint_imports(copy: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        capture_output=True, text=True, cwd=copy, env=copy_env(copy), timeout=300, check=False,
    )  # fmt: skip


def contract_name(contract_id: str) -> str:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / ".importlinter")
    return config[f"importlinter:contract:{contract_id}"]["name"]


def test_the_copy_is_what_lint_imports_analyses(tmp_path: Path) -> None:
    """Each root package of the contracts resolves to the copy (the check below would prove
    nothing if lint-imports read the repository or an installed tree instead)."""
    copy = copy_packages(tmp_path)
    code = (
        "import importlib.util, json\n"
        "names = ['sandbox_core', 'sandbox_api', 'sandbox_client', 'sandbox_operator']\n"
        "print(json.dumps([importlib.util.find_spec(n).origin for n in names]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, cwd=copy, env=copy_env(copy), check=True,
    )  # fmt: skip
    origins = [Path(origin) for origin in json.loads(done.stdout)]
    assert all(origin.is_relative_to(copy) for origin in origins), origins


def test_the_repository_keeps_every_contract(tmp_path: Path) -> None:
    done = lint_imports(copy_packages(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    kept = re.search(r"Contracts: (\d+) kept, 0 broken\.", done.stdout)
    assert kept is not None, done.stdout
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / ".importlinter")
    contracts = [s for s in config.sections() if s.startswith("importlinter:contract:")]
    assert int(kept.group(1)) == len(contracts)


@pytest.mark.parametrize(("source", "planted", "contract", "arrow"), PLANTED)
def test_a_planted_wrong_import_breaks_its_contract(
    tmp_path: Path, source: str, planted: str, contract: str, arrow: str
) -> None:
    copy = copy_packages(tmp_path)
    target = copy / source
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    done = lint_imports(copy)
    assert done.returncode != 0, done.stdout
    assert f"{contract_name(contract)} BROKEN" in done.stdout, done.stdout
    assert arrow in done.stdout, done.stdout


NEVER_WITH_THE_CORE = ("git", "psycopg", "aiohttp", "click", "kopf", "kubernetes")
NEVER_WITH_THE_CORE += ("sandbox_operator", "sandbox_client")

PROBE = """
import json, sys
def loaded():
    return sorted(
        n for n in json.loads(sys.argv[1]) for m in sys.modules if m == n or m.startswith(n + ".")
    )
import sandbox_core
report = {"import": loaded()}
sandbox_core.SandboxStatus, sandbox_core.SandboxError, sandbox_core.resolve_inside
report["light names"] = loaded()
print(json.dumps(report))
"""


def test_importing_the_core_loads_no_git_database_web_server_or_cli() -> None:
    """``import sandbox_core`` in a fresh interpreter, then its light public names (the status,
    the errors, ``resolve_inside``): none of them loads a strategy's library, the agent's web
    server, the CLI library, or anything of the layers above the core."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(NEVER_WITH_THE_CORE)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'operator'}"},
    )
    assert json.loads(done.stdout) == {"import": [], "light names": []}
