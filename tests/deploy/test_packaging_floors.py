"""The dependency floors in pyproject.toml work (issue 11, "A releasable package").

Every ``>=`` floor of the build system, the core and the ``operator`` extra is turned into an
``==`` constraint (what ``uv pip compile --resolution lowest-direct`` resolves: direct
dependencies at their floors, transitive ones at their newest compatible release). A fresh
virtualenv then builds and installs the project under those constraints (the constraint file also
pins the isolated build environment, so the setuptools floor is what builds the wheel) and imports
every module of both packages. Downloads go through pip's own cache, so only a cold run is slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())

pytestmark = pytest.mark.slow


def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    raw = [
        *PYPROJECT["build-system"]["requires"],
        *project["dependencies"],
        *project["optional-dependencies"]["operator"],
    ]
    return [Requirement(text) for text in raw]


def floor_constraints() -> dict[str, str]:
    """``{distribution name: floor version}`` of every direct runtime and build requirement.

    Raises:
        AssertionError: a requirement has no ``>=`` floor (an unbounded dependency cannot be
            tested at its lowest version).
    """
    floors: dict[str, str] = {}
    for requirement in _requirements():
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert len(lower) == 1, f"{requirement} needs exactly one '>=' floor"
        floors[canonicalize_name(requirement.name)] = lower[0]
    return floors


def test_every_direct_dependency_has_a_floor() -> None:
    floors = floor_constraints()
    assert Version(floors["setuptools"]) >= Version("77"), "PEP 639 license: setuptools 77"
    assert Version(floors["python-json-logger"]) >= Version("3.1"), "pythonjsonlogger.json: 3.1"
    assert {"kopf", "kubernetes", "pydantic", "pydantic-settings", "gitpython"} <= set(floors)


def _copy_sources(target: Path) -> Path:
    """The files a wheel is built from (building in the worktree would leave build/ there)."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, target / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # Every package pyproject.toml's [tool.setuptools.packages.find] includes.
    for package in ("sandbox_core", "sandbox_api", "sandbox_client", "operator"):
        shutil.copytree(REPO_ROOT / package, target / package, ignore=ignore)
    return target


IMPORT_ALL = """
import importlib, json, pkgutil, sys
import sandbox_api, sandbox_core, sandbox_operator
names = []
for package in (sandbox_core, sandbox_api, sandbox_operator):
    names.append(package.__name__)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        names.append(info.name)
for name in names:
    importlib.import_module(name)
# The kopf tuning the startup handler applies exists at kopf's floor too.
import kopf
from sandbox_operator.main import tune
tune(kopf.OperatorSettings())
print(json.dumps({"modules": names, "version": sandbox_operator.__version__}))
"""


def test_floors_install_and_import_everything(tmp_path: Path) -> None:
    floors = floor_constraints()
    constraints = tmp_path / "floors.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in floors.items()))
    (tmp_path / "src").mkdir()
    source = _copy_sources(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_CONSTRAINT", "PIP_NO_CACHE"))
    }
    # The constraint file reaches pip's isolated build environment only through the variable.
    env["PIP_CONSTRAINT"] = str(constraints)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"{source}[operator]"],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-5000:]
    check = subprocess.run(
        [str(python), "-m", "pip", "check"], capture_output=True, text=True, env=env, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    installed = {
        canonicalize_name(item["name"]): item["version"] for item in json.loads(listed.stdout)
    }
    for name, version in floors.items():
        if name == "setuptools":
            continue  # a build requirement: it lives in the isolated build environment only
        got = installed.get(name)
        assert got is not None and Version(got) == Version(version), f"{name}: installed {got}"
    # Import from outside the source tree so that the installed wheel is what gets imported.
    imported = subprocess.run(
        [str(python), "-c", IMPORT_ALL],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-5000:]
    report = json.loads(imported.stdout)
    assert "sandbox_operator.main" in report["modules"]
    assert "sandbox_core.strategies.git_worktree" in report["modules"]
    assert report["version"] == PYPROJECT["project"]["version"]
