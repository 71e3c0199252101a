"""sandbox_operator: kopf handlers for the Sandbox, Checkpoint and PlanCommit custom resources.

Run with ``kopf run -m sandbox_operator.main`` (DESIGN.md). Layers, each importing
only the ones below it::

    main         the startup handler, kopf's tuning; imports the reconcilers (registers them)
    reconcilers  the thin decorated handlers with explicit ids, one module per resource
    runtime      the process-wide objects: SETTINGS, the executor, the logic of each resource
    resources    the logic of each resource, callable and testable without kopf running
    executors    where the core runs: in this process, or in a workspace Pod via its agent
    errors       core and API exceptions mapped to conditions and kopf's retry decisions
    kube         API access, Events, conditions, claims, leader election, metrics, logs
    settings     the one typed Settings, read from the environment

``uninstall`` (the chart's pre-delete hook) stands beside ``main`` and uses only ``kube``.
``runtime`` sits below the reconcilers, not above them: the handlers reach the runtime (and their
decorators the settings) through it, and it knows no handler. kopf is imported only by ``main``,
the reconcilers, ``errors`` and ``kube``; the resources raise kopf's ``TemporaryError`` and
``PermanentError`` by the names ``errors`` gives them.

``__version__`` is the installed distribution's version: pyproject.toml is the one place the
version is written (the chart and the image label are checked against it).
"""

from importlib.metadata import PackageNotFoundError, version

from sandbox_operator.settings import ExecutorKind, Settings

try:
    __version__ = version("sandbox-operator")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["ExecutorKind", "Settings", "__version__"]
