#!/usr/bin/env bash
# Print the project's version: pyproject.toml's [project] version is the one source;
# the chart's Chart.yaml is checked against it by tests/deploy/test_packaging_release.py, the image label
# is built from this output.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])'
