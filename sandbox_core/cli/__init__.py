"""``sandbox-core``, the command-line application of the core (click is imported only here).

- :mod:`~sandbox_core.cli.main`: the click group, the commands on one sandbox, ``serve-workspace``,
  ``demo`` and :func:`run`, the console entry point (``sandbox-core = "sandbox_core.cli:run"``).
- :mod:`~sandbox_core.cli.plan`: the commands on a whole plan.
- :mod:`~sandbox_core.cli.context`: the exit codes and what every command shares.
- :mod:`~sandbox_core.cli.demo`: ``sandbox-core demo``, the core on real input.
"""

from sandbox_core.cli.main import main, run

# Defined here until the CLI became a package; it lives in sandbox_core.describe now, and this
# name is kept for one release for callers outside the repository.
from sandbox_core.describe import sandbox_diff

__all__ = ["main", "run", "sandbox_diff"]
