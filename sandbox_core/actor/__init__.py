"""The actor's door: what an AI plan's tools do inside their sandbox, one implementation for
the workspace agent (pod executor) and for local paths (the local executor, the CLI, a library
user).

- :mod:`~sandbox_core.actor.beneath`: paths resolved beneath a sandbox's root through directory
  descriptors (``O_NOFOLLOW`` per component): never a symlink, never ``..``, never absolute.
- :mod:`~sandbox_core.actor.files`: :class:`~sandbox_core.actor.files.SandboxFiles`, the file
  operations (bytes, ranges, write, append, delete, move, mkdir, stat, exact-match edit, batch).
- :mod:`~sandbox_core.actor.search`: grep (regex) and glob, capped, with a cursor to continue.
- :mod:`~sandbox_core.actor.sql`: SQL through a ``transaction_rollback`` sandbox.
- :mod:`~sandbox_core.actor.door`: :class:`~sandbox_core.actor.door.ActorDoor`, the above on one
  open sandbox, audited.
- :mod:`~sandbox_core.actor.audit`: :class:`~sandbox_core.actor.audit.AuditLog`, one durable line
  per actor operation (shared with the command runner).

Nothing here knows HTTP; the agent's routes (:mod:`sandbox_core.agent.wire`) call it.
"""
