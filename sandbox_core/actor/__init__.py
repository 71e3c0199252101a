"""The actor's door: what an AI plan's tools do inside a sandbox (docs/actor.md).

- :mod:`~sandbox_core.actor.jail`: the bubblewrap jail a command runs in (sees only its sandbox).
- :mod:`~sandbox_core.actor.exec`: commands (argv or shell line, cwd, env, stdin, timeout,
  streamed output, caps, cancel and signals, a limit per sandbox).
- :mod:`~sandbox_core.actor.audit`: the audit log of each sandbox.
- :mod:`~sandbox_core.actor.local`: the same operations on local paths (the CLI, the local
  executor); the workspace agent serves them over HTTP (``sandbox_core.agent``).

Layers (``.importlinter``): ``local > exec > jail | audit``; the package sits above ``host`` and
below ``agent``.
"""
