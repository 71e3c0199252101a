"""The synchronous client: :class:`SandboxClient`, :class:`Plan` and :class:`Sandbox`.

Built on the official ``kubernetes`` client. Every wait is a *watch* (list, then watch from the
list's resourceVersion, re-listing after a 410 Gone), never a polling loop. The asynchronous API
in :mod:`sandbox_client.aio` has the same classes and method names. Typical use::

    client = SandboxClient()
    with Plan(client, "plan-1", "default") as plan:
        repo = plan.add_sandbox("repo", "git_worktree", "/src/repo")
        plan.wait_ready(timeout=120)
        repo.write_file("README.md", "hello\\n")
        result = plan.commit()

This module is the public face of :mod:`sandbox_client._sync.client`, which ``hack/unasync.py``
generates from the one hand-written source, :mod:`sandbox_client._async.client`.
"""

from sandbox_client._sync.client import (
    DEFAULT_COMMIT_TIMEOUT,
    DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_READY_TIMEOUT,
    Plan,
    ProgressCallback,
    Sandbox,
    SandboxClient,
)

__all__ = [
    "DEFAULT_COMMIT_TIMEOUT",
    "DEFAULT_OPERATION_TIMEOUT",
    "DEFAULT_READY_TIMEOUT",
    "Plan",
    "ProgressCallback",
    "Sandbox",
    "SandboxClient",
]
