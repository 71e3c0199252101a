#!/usr/bin/env bash
# The README's first command: set up this machine (idempotent) and run the main job on real input.
#   1. the core on a real git repository built from a real source tree (sandbox-core demo);
#   2. the operator end to end on a local kube-apiserver (hack/operator-demo.sh), when present.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# shellcheck source=hack/env.sh
source hack/env.sh
echo "=================== sandbox_core on a real repository ==================="
sandbox-core demo "$@"
if [ -x hack/operator-demo.sh ]; then
  echo "=================== the operator on a local API server ==================="
  hack/operator-demo.sh
fi
