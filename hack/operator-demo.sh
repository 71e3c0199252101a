#!/usr/bin/env bash
# The operator end to end on a local kube-apiserver (see hack/operator_demo.py). Run by hack/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python hack/operator_demo.py "$@"
