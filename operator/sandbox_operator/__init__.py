"""sandbox_operator: kopf handlers for the Sandbox, Checkpoint and PlanCommit custom resources.

``main`` holds the thin decorated handlers; the logic lives in modules that run without a
cluster (``sandbox_handlers``, ``checkpoint_handlers``, ``plancommit_handlers``, ``journal``,
``executors``). Run with ``kopf run -m sandbox_operator.main`` (issue 3, DESIGN.md).

``__version__`` is the installed distribution's version: pyproject.toml is the one place the
version is written (the chart and the image label are checked against it, issue 11).
"""

from importlib.metadata import PackageNotFoundError, version

from sandbox_operator.settings import ExecutorKind, Settings

try:
    __version__ = version("sandbox-operator")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["ExecutorKind", "Settings", "__version__"]
