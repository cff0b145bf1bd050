#!/usr/bin/env bash
# Builds the CMake project (library with the testing hooks, tests, example) into build/ and
# installs the Python package as users get it: a release library, no test switch inside.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v "$PYTHON")" \
  -DINSTANTTENSOR_TESTING_HOOKS=ON -DINSTANTTENSOR_BUILD_TESTS=ON
cmake --build build -j "$(nproc)"
"$PYTHON" -m pip install -q --no-build-isolation .
