"""``python -m sandbox_core.cli``: the same as the ``sandbox-core`` console script."""

from sandbox_core.cli.main import run

# Run only as ``-m``: importing the module (pkgutil.walk_packages in the packaging test) must
# not run the CLI.
if __name__ == "__main__":
    run()
