"""``python -m sandbox_core.cli``: the same as the ``sandbox-core`` console script."""

from sandbox_core.cli.main import run

run()
