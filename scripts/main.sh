#!/usr/bin/env bash
# The main job on a built-in default: installs, builds the Python package only (the library,
# no tests: scripts/build.sh builds those), writes a model-like checkpoint and loads it, printing
# what was loaded and how fast. Extra arguments go to `python -m instanttensor`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
bash scripts/install_deps.sh
"${PYTHON:-python3}" -m pip install -q --no-build-isolation .
cd /tmp  # import the installed package, not the source tree
exec "${PYTHON:-python3}" -m instanttensor "$@"
