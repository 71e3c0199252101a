"""The actor's door: what an AI plan's tools do inside a sandbox (docs/actor.md).

- :mod:`~sandbox_core.actor.jail`: the bubblewrap jail a command runs in (sees only its sandbox).
- :mod:`~sandbox_core.actor.exec`: commands (argv or shell line, cwd, env, stdin, timeout,
  streamed output, caps, cancel and signals, a limit per sandbox).
- :mod:`~sandbox_core.actor.audit`: the audit log of each sandbox.
- :mod:`~sandbox_core.actor.local`: the same operations on local paths (the CLI, the local
  executor); the workspace agent serves them over HTTP (``sandbox_core.agent``).
- :mod:`~sandbox_core.actor.beneath`: paths resolved beneath a sandbox's root through directory
  descriptors (``O_NOFOLLOW`` per component): never a symlink, never ``..``, never absolute.
- :mod:`~sandbox_core.actor.files`: the file operations (bytes, ranges, write, append, delete,
  move, mkdir, stat, exact-match edit, batch upload and download) (docs/actor-files.md).
- :mod:`~sandbox_core.actor.search`: grep (regex) and glob, capped, with a cursor to continue.
- :mod:`~sandbox_core.actor.sql`: SQL through a ``transaction_rollback`` sandbox.
- :mod:`~sandbox_core.actor.door`: :class:`~sandbox_core.actor.door.ActorDoor`, files, search and
  SQL on one open sandbox, audited; the agent's routes and local callers use it alike.

Layers (``.importlinter``): ``local > exec > jail | audit``, and ``door > files | search | sql >
beneath``; the package sits above ``host`` and below ``agent``.
"""
