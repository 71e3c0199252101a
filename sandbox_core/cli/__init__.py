"""``sandbox-core``, the command-line application of the core (click is imported only here)."""

from sandbox_core.cli.main import main, run, sandbox_diff

__all__ = ["main", "run", "sandbox_diff"]
