"""``python -m sandbox_core.cli``: the same as the ``sandbox-core`` console script."""

from sandbox_core.cli.main import run

# Run only as ``-m``: importing the module (pkgutil.walk_packages, tests/test_packaging_floors.py)
# must not run the CLI.
if __name__ == "__main__":
    run()
