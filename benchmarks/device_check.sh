#!/usr/bin/env bash
# The GPU check, for a bare machine with an NVIDIA GPU, its own torch, CMake and nvcc, and no
# network or package registry:
#   bash benchmarks/device_check.sh OUT_DIR [DEPS_DIR]
# DEPS_DIR holds Debian packages fetched beforehand on a networked machine
# (scripts/fetch_device_deps.sh DIR: nlohmann-json3-dev, liburing-dev, liburing2); they are
# unpacked there, not installed. Builds the library against the machine's torch, runs the GPU
# tests, then the GPU benchmark (benchmarks/device_bench.py: tmpfs and disk -> GPU against the
# peers and the ceilings, byte-checked, a 2-process load over gloo). Results in OUT_DIR; the
# exit status is non-zero if the build, a GPU test or any instanttensor sample failed.
# Then the device pipeline's CUDA form (benchmarks/device_pipeline.py --device cuda: copy=True,
# copy=False and load_into against the slower of the read rate and a pinned copy), with one
# pass per cell on the loader's timeline beside it (device_pipeline_timeline.png and .json: what
# bounds each cell on the GPU).
# Sized for 11 minutes including the build: SIZE_GB (default 3) sets the benchmark checkpoint,
# PIPELINE_SIZE_GB (default 1) the pipeline's.
set -euo pipefail
OUT=${1:?usage: device_check.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-}
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
START=$(date +%s)
command -v "$PY" >/dev/null || { echo "FAILED: $PY not found"; exit 1; }
command -v cmake >/dev/null || { echo "FAILED: cmake not found"; exit 1; }

# Build dependencies, before anything slow: carried packages unpacked, or the system's.
PREFIX=""
if [ -n "$DEPS" ]; then
  ls "$DEPS"/*.deb >/dev/null 2>&1 || { echo "FAILED: no .deb files in $DEPS"; exit 1; }
  mkdir -p "$DEPS/root"
  for deb in "$DEPS"/*.deb; do dpkg-deb -x "$deb" "$DEPS/root"; done
  PREFIX="$DEPS/root/usr"
fi
if ! echo '#include <nlohmann/json.hpp>' | c++ -fsyntax-only -x c++ ${PREFIX:+-I"$PREFIX/include"} - 2>/dev/null; then
  echo "FAILED: nlohmann/json.hpp not found; on a networked machine run"
  echo "  bash scripts/fetch_device_deps.sh DIR   and pass DIR (carried with the tree)"
  exit 1
fi

TORCH_PREFIX=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
echo "== build against torch $("$PY" -c 'import torch; print(torch.__version__)')"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S "$ROOT" -B "$ROOT/build-device" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$PREFIX;$PREFIX/share/cmake" \
  -DCMAKE_INCLUDE_PATH="$PREFIX/include" -DCMAKE_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu" \
  -DPython3_EXECUTABLE="$(command -v "$PY")" \
  -DINSTANTTENSOR_BUILD_TESTS=OFF -DINSTANTTENSOR_BUILD_EXAMPLES=OFF -DINSTANTTENSOR_WERROR=OFF
cmake --build "$ROOT/build-device" -j "$(nproc)"
cp "$ROOT/build-device/libinstanttensor.so" "$ROOT/python_shim/instanttensor/"
"$PY" -c "import torch; print(f'TORCH_VERSION = {torch.__version__!r}')" \
  > "$ROOT/python_shim/instanttensor/_build_info.py"
export PYTHONPATH="$ROOT/python_shim:${PYTHONPATH:-}"
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
"$PY" -c "import instanttensor, torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0), torch.ops.instanttensor.build_info())"
echo "build done in $(( $(date +%s) - START )) s"

STATUS=0
echo "== GPU tests"
if (cd "$ROOT/tests/python" && timeout 150 "$PY" -m pytest -q -p no:cacheprovider \
    test_device.py test_vllm.py test_borrow.py --junitxml="$OUT/pytest.xml"); then
  echo "GPU tests: passed"
else
  echo "GPU tests: FAILED"
  STATUS=1
fi
echo "== benchmark"
if ! timeout 200 "$PY" "$ROOT/benchmarks/device_bench.py" "$OUT" --size-gb "${SIZE_GB:-3}" \
    --samples 3; then
  echo "benchmark: FAILED (see RESULT above)"
  STATUS=1
fi
echo "== device pipeline (benchmarks/device_pipeline.py, its CUDA form)"
if ! timeout 300 "$PY" "$ROOT/benchmarks/device_pipeline.py" --device cuda \
    --size-gb "${PIPELINE_SIZE_GB:-1}" --samples 3 --json "$OUT/device_pipeline.json" \
    --plot "$OUT/device_pipeline.png" --timeline "$OUT/device_pipeline_timeline.png"; then
  echo "device pipeline: FAILED"
  STATUS=1
fi
echo "device check done in $(( $(date +%s) - START )) s, status $STATUS"
exit $STATUS
