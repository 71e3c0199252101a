"""The asynchronous client: the same classes and method names as :mod:`sandbox_client.client`.

Built on ``kubernetes_asyncio``. Every method that talks to the API server or the file system is
a coroutine; shapes, units and errors are those of the synchronous method of the same name. The
configuration is loaded on the first call (``kubernetes_asyncio`` loads it with a coroutine).
File operations: the workspace agent's are awaited
(:class:`~sandbox_client.agent_files.AsyncAgentFileOperations`), the local executor's run the
blocking :class:`~sandbox_client.files.FileOperations` in a worker thread. Typical use::

    async with SandboxClient() as client:
        async with Plan(client, "plan-1", "default") as plan:
            repo = await plan.add_sandbox("repo", "git_worktree", "/src/repo")
            await plan.wait_ready(timeout=120)
            await repo.write_file("README.md", "hello\\n")
            result = await plan.commit()

This module is the public face of :mod:`sandbox_client._async.client`, the one hand-written
source of both clients.
"""

from sandbox_client._async.client import Plan, Sandbox, SandboxClient

__all__ = ["Plan", "Sandbox", "SandboxClient"]
