"""The test tree mirrors the source and holds together without test modules importing each other.

- A test module never imports another test module (``test_*`` or ``tests.<...>.test_*``), not
  even inside a function or in the source of a child process: what tests share lives in
  ``tests/support/`` (helpers, and fixtures loaded as pytest plugins) or in a ``conftest.py``.
- A file is named for the behaviour it checks: no file or folder name under ``tests/`` names an
  issue, a session, a review round or a case number (those go in docstrings).
- ``tests/support/`` holds no tests, and every folder under ``tests/`` is a package, so two test
  modules of one name in different folders never clash.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
# "issue8", "session_14", "verify7", "round-3", "case43", "pr12": the work that produced a file.
WORK_NAME = re.compile(r"(issue|session|verify|round|case|pr|bug)[_-]?\d+", re.I)
# An import statement naming a test module, as written in a child process's source.
IMPORT_IN_TEXT = re.compile(r"^\s*(from|import)\s+(tests\.)?([\w.]*\.)?test_\w+", re.M)


def python_files() -> Iterator[Path]:
    for path in sorted(TESTS.rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield path


def is_test_module(name: str) -> bool:
    """True when the dotted module name ends in a ``test_*`` module (or names one in a package)."""
    return any(part.startswith("test_") for part in name.split("."))


def imported_test_modules(path: Path) -> list[str]:
    """Every test module ``path`` imports, by statement or in the text of a string literal."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if is_test_module(module):
                found.append(f"{'.' * node.level}{module}")
            found += [
                f"{'.' * node.level}{module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("test_")
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [match.group(0).strip() for match in IMPORT_IN_TEXT.finditer(node.value)]
    return found


def test_no_module_under_tests_imports_a_test_module() -> None:
    offenders = {
        str(path.relative_to(TESTS)): imported
        for path in python_files()
        if (imported := imported_test_modules(path))
    }
    assert offenders == {}, "move what is shared to tests/support/ or a conftest.py"


def test_no_name_under_tests_names_the_work_that_produced_it() -> None:
    named = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*")
        if "__pycache__" not in path.parts and WORK_NAME.search(path.stem)
    ]
    assert named == [], "name the file for the behaviour it checks"


def test_support_holds_no_tests() -> None:
    assert [p.name for p in SUPPORT.rglob("test_*.py")] == []
    for path in SUPPORT.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        assert [name for name in tests if name.lower().startswith("test")] == [], path


def test_every_folder_under_tests_is_a_package() -> None:
    folders = {path.parent for path in python_files()}
    missing = [f for f in folders if not (f / "__init__.py").exists()]
    assert sorted(str(f.relative_to(TESTS)) for f in missing) == []


def test_the_framework_adapters_tier_runs_in_the_test_command() -> None:
    # tests/conftest.py leaves tests/integrations out unless SANDBOX_INTEGRATIONS is set: the
    # test command must set it and run that folder, or the adapters' conformance never runs.
    script = (TESTS.parent / "hack" / "test.sh").read_text()
    assert "SANDBOX_INTEGRATIONS=1 .venv-integrations/bin/python -m pytest" in script
    assert "tests/integrations" in script
