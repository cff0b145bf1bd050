#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, its own torch, CMake and nvcc, and no network:
#   bash benchmarks/device_check.sh OUT_DIR [DEPS_DIR]
# DEPS_DIR may hold Debian packages fetched beforehand on a networked machine
# (scripts/fetch_device_deps.sh: nlohmann-json3-dev, liburing-dev, liburing2); they are unpacked
# there, not installed. Builds the extension against the machine's torch, runs the GPU tests,
# then benchmarks tmpfs -> GPU and disk -> GPU (benchmarks/device_bench.py). Results in OUT_DIR.
set -euo pipefail
OUT=${1:?usage: device_check.sh OUT_DIR [DEPS_DIR]}
DEPS=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
PREFIX=""
if [ -n "$DEPS" ] && ls "$DEPS"/*.deb >/dev/null 2>&1; then
  mkdir -p "$DEPS/root"
  for deb in "$DEPS"/*.deb; do dpkg-deb -x "$deb" "$DEPS/root"; done
  PREFIX="$DEPS/root/usr"
fi
TORCH_PREFIX=$(python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
echo "== build against torch $(python -c 'import torch; print(torch.__version__)')"
cmake -S "$ROOT" -B "$ROOT/build-device" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$PREFIX;$PREFIX/share/cmake" \
  -DCMAKE_INCLUDE_PATH="$PREFIX/include" -DCMAKE_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu" \
  -DINSTANTTENSOR_BUILD_TESTS=OFF -DINSTANTTENSOR_BUILD_EXAMPLES=OFF -DINSTANTTENSOR_WERROR=OFF
cmake --build "$ROOT/build-device" -j "$(nproc)"
cp "$ROOT/build-device/libinstanttensor.so" "$ROOT/python_shim/instanttensor/"
python -c "import torch; print(f'TORCH_VERSION = {torch.__version__!r}')" \
  > "$ROOT/python_shim/instanttensor/_build_info.py"
export PYTHONPATH="$ROOT/python_shim:${PYTHONPATH:-}"
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
python -c "import instanttensor, torch; print('cuda', torch.cuda.is_available(), torch.ops.instanttensor.build_info())"
echo "== GPU tests"
if python -c "import pytest, safetensors" 2>/dev/null; then
  (cd "$ROOT/tests/python" && python -m pytest -q -p no:cacheprovider test_device.py test_vllm.py \
    test_borrow.py --junitxml="$OUT/pytest.xml") || echo "GPU TESTS FAILED"
else
  echo "pytest or safetensors missing: the benchmark's byte check stands in for the tests"
fi
echo "== benchmark"
timeout 300 python "$ROOT/benchmarks/device_bench.py" "$OUT" --size-gb "${SIZE_GB:-3}" --samples 3
