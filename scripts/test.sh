#!/usr/bin/env bash
# Every test: installs, checks formatting, builds with warnings as errors, checks the wheel
# users install (scripts/check_wheel.sh), runs the C++ tests (ctest), the sanitizer builds and the fuzzers (scripts/sanitize.sh), the Python tests (pytest)
# against the installed package (the device tests on the simulated accelerator), safetensors' own
# Python suite with instanttensor in its place (scripts/reference_suite.sh), the proof that
# each device fence is tested (scripts/check_fences.sh), and the callers' released loaders
# (scripts/test_callers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
ROOT=$(pwd)
# Every step's heading says when it started (seconds since this script began), so a run's log
# shows where CI's time goes; test_callers.sh reads the same clock.
export INSTANTTENSOR_CI_START=${INSTANTTENSOR_CI_START:-$(date +%s)}
source scripts/step_clock.sh
step "installs"
bash scripts/install_deps.sh
# The CMake build and the release install compile most sources with the same flags (only the
# files with test switches differ): ccache compiles each of them once per run.
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
fi
step "clang-format"
find include ops tests/cpp tests/aoti tests/fuzz tests/simulated_device examples -name '*.h' -o -name '*.cpp' | xargs clang-format --dry-run --Werror
step "build"
bash scripts/build.sh
step "the release install carries no test switch"
(cd tests/release && INSTANTTENSOR_RELEASE_CHECK=1 "${PYTHON:-python3}" -m pytest -q \
  -p no:cacheprovider .)
step "the wheel: built, installed alone into a venv with torch, loading; the C++ example on it"
bash scripts/check_wheel.sh
step "the testing install (test switches compiled in) for the suites below"
CMAKE_ARGS="-DINSTANTTENSOR_TESTING_HOOKS=ON" "${PYTHON:-python3}" -m pip install -q \
  --no-build-isolation .
# Root on a local filesystem (CI): every lease test, C++ and Python, takes its lease, none may
# skip for want of one. A host without leases (NFS or 9p temporary folders, leases-enable=0)
# runs the suite with INSTANTTENSOR_REQUIRE_LEASES=0.
export INSTANTTENSOR_REQUIRE_LEASES=${INSTANTTENSOR_REQUIRE_LEASES:-1}
step "ctest"
(cd build && ctest --output-on-failure --no-tests=error -j 2)
step "sanitizers"
FUZZ_SECONDS=${FUZZ_SECONDS:-30} bash scripts/sanitize.sh
step "pytest"
cd tests/python  # so `import instanttensor` finds the installed package, not python_shim/
# The device tests run on the simulated accelerator (no GPU here), every operation delayed by a
# random 0-2 ms so a misplaced fence shows as wrong bytes.
INSTANTTENSOR_SIMDEV_DELAY=1 INSTANTTENSOR_CMAKE_BUILD_DIR="$ROOT/build" "${PYTHON:-python3}" -m pytest \
  -q -p no:cacheprovider --durations=15 --ignore=test_callers.py .
cd "$ROOT"
step "safetensors' own suite with instanttensor in its place"
bash scripts/reference_suite.sh
step "fences: each one dropped must turn the device tests red"
INSTANTTENSOR_CMAKE_BUILD_DIR="$ROOT/build" bash scripts/check_fences.sh
cd "$ROOT"
bash scripts/test_callers.sh
step "done"
