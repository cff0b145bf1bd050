#!/usr/bin/env bash
# Builds the CMake project (library, tests, example) into build/ and installs the Python package.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v "$PYTHON")"
cmake --build build -j "$(nproc)"
"$PYTHON" -m pip install -q --no-build-isolation .
