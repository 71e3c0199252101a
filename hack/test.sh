#!/usr/bin/env bash
# Run every test tier that can run on this machine: lint, types, the core (real git, real
# directories, real OverlayFS, real PostgreSQL), the real API server tier, the multi-node tier
# (real kube-scheduler and kube-controller-manager on fake Nodes), and, when no pytest
# arguments are given, the real-cluster tier (hack/e2e.sh).
# This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# shellcheck source=hack/env.sh
source hack/env.sh

echo "== ruff"
ruff check .
echo "== mypy (strict: sandbox_core, sandbox_operator)"
mypy
echo "== lint-imports (the layers: who may import what, .importlinter)"
# The operator lives in operator/: both roots on the path, so this tree is what is analysed.
PYTHONPATH="$PWD:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}" lint-imports --no-cache --no-logo
echo "== unasync: the blocking client is generated from the async one" && python hack/unasync.py --check
echo "== pytest (tiers 1 and 2, and the multi-node tier)"
# A kernel-overlay sandbox an earlier run left mounted under pytest's temporary root would make
# pytest's pruning of old runs fail (EBUSY); the suite unmounts its own at the end (tests/conftest.py).
python -c 'import getpass, pathlib, tempfile; from tests.support.mounts import unmount_beneath
unmount_beneath(pathlib.Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}")'
python -m pytest -p no:cacheprovider "$@"
if [ "$#" -eq 0 ]; then
  echo "== framework adapters (their own virtualenv: the frameworks' conformance suites)"
  # The suites' own settings: pytest-asyncio runs their async tests; langchain-tests declares
  # class-scoped fixtures as methods, which pytest 9 deprecates.
  SANDBOX_INTEGRATIONS=1 .venv-integrations/bin/python -m pytest -p no:cacheprovider \
    -o asyncio_mode=auto -o asyncio_default_fixture_loop_scope=function \
    -W "ignore:Class-scoped fixtures defined as instance methods:pytest.PytestRemovedIn10Warning" \
    tests/integrations
  echo "== e2e (tier 3: a real single-node cluster)"
  hack/e2e.sh
fi
