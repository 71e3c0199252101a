"""Adapters that plug a sandbox into the frameworks agents are built with.

Each adapter is an optional extra and imports its framework only in its own module:

- :mod:`sandbox_client.integrations.deepagents`: a LangChain Deep Agents backend
  (``deepagents``' ``SandboxBackendProtocol``), extra ``deepagents``;
- :mod:`sandbox_client.integrations.openai_agents`: an OpenAI Agents SDK sandbox client
  (``openai-agents``), extra ``openai-agents``.

Both speak to a sandbox through :class:`~sandbox_client.integrations.actions.SandboxActions`
(run a shell line, upload and download files), so the same adapter serves every door: a
Sandbox resource through the engine's client
(:class:`~sandbox_client.integrations.client_actions.ClientActions`: its workspace agent through
the API server's pod proxy, or the local executor's state directory), and sandboxes a process
keeps on local paths (``sandbox_core.actor.actions.LocalActions``). Every write lands in the
sandbox and reaches the original only through the plan's commit.
"""
