#!/usr/bin/env bash
# Every test: installs, checks formatting, builds with warnings as errors, runs the C++ tests
# (ctest), the sanitizer builds and the fuzzers (scripts/sanitize.sh), the Python tests (pytest)
# against the installed package, and the callers' released loaders (scripts/test_callers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
bash scripts/install_deps.sh
echo "== clang-format"
find include ops tests/cpp tests/fuzz examples -name '*.h' -o -name '*.cpp' | xargs clang-format --dry-run --Werror
bash scripts/build.sh
echo "== ctest"
(cd build && ctest --output-on-failure -j 2)
FUZZ_SECONDS=${FUZZ_SECONDS:-30} bash scripts/sanitize.sh
echo "== pytest"
cd tests/python  # so `import instanttensor` finds the installed package, not python_shim/
INSTANTTENSOR_CMAKE_BUILD_DIR="$ROOT/build" "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider \
  --ignore=test_callers.py .
cd "$ROOT"
bash scripts/test_callers.sh
