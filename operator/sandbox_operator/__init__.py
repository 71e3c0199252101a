"""sandbox_operator: kopf handlers for the Sandbox, Checkpoint and PlanCommit custom resources.

``main`` holds the thin decorated handlers; the logic lives in modules that run without a
cluster (``sandbox_handlers``, ``checkpoint_handlers``, ``plancommit_handlers``, ``journal``,
``executors``). Run with ``kopf run -m sandbox_operator.main`` (issue 3, DESIGN.md).
"""

from sandbox_operator.settings import ExecutorKind, Settings

__all__ = ["ExecutorKind", "Settings"]
