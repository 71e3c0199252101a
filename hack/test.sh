#!/usr/bin/env bash
# Run every test tier that can run on this machine: lint, types, the core (real git, real
# directories, real OverlayFS, real PostgreSQL) and the real API server tier.
# This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# shellcheck source=hack/env.sh
source hack/env.sh

echo "== ruff"
ruff check .
echo "== mypy (strict, sandbox_core)"
mypy
echo "== pytest"
python -m pytest -p no:cacheprovider "$@"
