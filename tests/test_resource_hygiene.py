"""Directory scans are closed by the code that opens them.

``filterwarnings = error`` turns an unclosed ``os.scandir`` into a failure, but only when the
garbage collector happens to run inside a test. These checks do not depend on that moment:
every ``os.scandir`` in the product is opened by a ``with``, and the one warning the suite
excuses (pytest's own numbered-directory scan) is excused for pytest's generator alone.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ["sandbox_core", "sandbox_api", "sandbox_client", "operator/sandbox_operator"]


def scandir_calls_outside_with(path: Path) -> list[int]:
    """Line numbers of ``os.scandir(...)`` calls that are not a ``with`` item's context."""
    tree = ast.parse(path.read_text(), filename=str(path))
    in_with = {
        id(item.context_expr)
        for node in ast.walk(tree)
        if isinstance(node, ast.With | ast.AsyncWith)
        for item in node.items
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "scandir"
        and id(node) not in in_with
    ]


def test_every_scandir_in_the_product_is_closed_by_a_with() -> None:
    offenders = {
        str(path.relative_to(ROOT)): lines
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := scandir_calls_outside_with(path))
    }
    assert offenders == {}


def test_the_check_sees_a_bare_scandir(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\n"
        "def first(d):\n"
        "    for entry in os.scandir(d):\n"
        "        return entry\n"
        "def closed(d):\n"
        "    with os.scandir(d) as it:\n"
        "        return next(it)\n"
    )
    assert scandir_calls_outside_with(sample) == [3]


def test_only_pytests_own_scan_is_excused(pytestconfig: pytest.Config) -> None:
    filters = pytestconfig.getini("filterwarnings")
    excused = [entry for entry in filters if entry.startswith("ignore:") and "Scandir" in entry]
    assert len(excused) == 1 and "find_prefixed" in excused[0]
    message = "Exception ignored in: <posix.ScandirIterator object at 0x1>\n\nTraceback:\n"
    elsewhere = message + '  File "/x/sandbox_core/tree/scan.py", line 3, in walk\n'
    in_pytest = message + '  File "/x/_pytest/pathlib.py", line 221, in find_prefixed\n'
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("error")
        _action, pattern, category = excused[0].split(":", 2)
        assert category == "pytest.PytestUnraisableExceptionWarning"
        warnings.filterwarnings("ignore", pattern, pytest.PytestUnraisableExceptionWarning)
        with pytest.raises(pytest.PytestUnraisableExceptionWarning):
            warnings.warn(pytest.PytestUnraisableExceptionWarning(elsewhere), stacklevel=1)
        warnings.warn(pytest.PytestUnraisableExceptionWarning(in_pytest), stacklevel=1)


def test_mounts_left_beneath_a_directory_are_found_and_unmounted(tmp_path: Path) -> None:
    import subprocess

    from tests.support.mounts import mounts_beneath, unmount_beneath

    inner = tmp_path / "a b" / "merged"
    inner.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inner)], check=True)
    assert mounts_beneath(tmp_path) == [str(inner.resolve())]
    assert unmount_beneath(tmp_path) == [str(inner.resolve())]
    assert mounts_beneath(tmp_path) == []
