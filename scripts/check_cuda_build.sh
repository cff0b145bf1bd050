#!/usr/bin/env bash
# Builds instanttensor against a CUDA build of torch on a machine without a GPU, twice:
#   hidden  - no CUDA toolkit in sight (PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda ignored),
#             as on an inference image that ships a CUDA torch wheel and nothing else;
#   visible - with whatever toolkit this machine has (here nvcc without the runtime headers and
#             libraries; on the GPU machine a full toolkit, where torch's own config is used).
# Each time: `pip install .` and the CMake build, the library's dependencies (no CUDA library
# among them: the extension uses none), loading it and its registrations into the CUDA torch
# (whose wheel brings the CUDA libraries), a CPU load through the class, and the C++ example
# built against the installed package. Exits non-zero on any failure.
#
#   bash scripts/check_cuda_build.sh
# VENV (default /tmp/instanttensor-cuda-venv) gets torch==$TORCH_CUDA_VERSION (default 2.14.1,
# a CUDA build; about 5.5 GB) the first time. Not part of .ci/run: the install alone takes
# minutes and the disk space of a CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-/tmp/instanttensor-cuda-venv}
TORCH_CUDA_VERSION=${TORCH_CUDA_VERSION:-2.14.1}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing torch==$TORCH_CUDA_VERSION (CUDA build) into $VENV"
  "$PY" -m pip install -q "torch==$TORCH_CUDA_VERSION"
fi
"$PY" -m pip install -q setuptools wheel safetensors numpy
"$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 'not a CUDA build of torch')"
TORCH_PREFIX=$("$PY" -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
TORCH_LIB=$("$PY" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
echo "torch $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"

HIDDEN_PATH=$(echo "$PATH" | tr ':' '\n' | while read -r dir; do
  [ -n "$dir" ] && [ ! -e "$dir/nvcc" ] && echo "$dir"; done | paste -sd: -)
IGNORE="/usr/local/cuda;/usr/local/cuda/bin"
for dir in /usr/local/cuda-*; do [ -d "$dir" ] && IGNORE="$IGNORE;$dir;$dir/bin"; done

in_mode() {  # in_mode MODE COMMAND...: runs COMMAND with the toolkit hidden or visible
  local mode=$1
  shift
  if [ "$mode" = hidden ]; then
    # CMAKE_ARGS reaches the CMake run of `pip install .` (setup.py passes it on).
    env -u CUDA_HOME -u CUDA_PATH -u CUDACXX PATH="$HIDDEN_PATH" \
      CMAKE_ARGS="-DCMAKE_IGNORE_PATH=$IGNORE" "$@"
  else
    "$@"
  fi
}

check_library() {  # check_library MODE LIBRARY
  local mode=$1 library=$2
  echo "-- dependencies of $library"
  readelf -d "$library" | grep NEEDED
  if readelf -d "$library" | grep NEEDED | grep -Eq 'libcuda|libcudart|libnvrtc|libtorch_cuda'; then
    echo "FAIL ($mode): the library links a CUDA library directly"
    return 1
  fi
  in_mode "$mode" "$PY" - "$library" <<'EOF'
import os, sys, tempfile
import torch
from safetensors.torch import save_file
torch.ops.load_library(sys.argv[1])
print("registrations:", torch.ops.instanttensor.build_info())
path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
tensors = {"w": torch.randn(64, 32), "b": torch.arange(7)}
save_file(tensors, path)
loader = torch.classes.instanttensor.Loader([path], torch.device("cpu"), True)
got = {}
while (item := loader.next()) is not None:
    got[item[0]] = item[1]
assert set(got) == set(tensors) and all(torch.equal(got[n], t) for n, t in tensors.items())
print("CPU load through the class: ok; CUDA available:", torch.cuda.is_available())
EOF
}

for mode in hidden visible; do
  echo "== $mode toolkit: CMake build"
  build="$ROOT/build-cuda-$mode"
  rm -rf "$build" "$build-install" "$build-example"
  mkdir -p "$build"
  ignore=()
  [ "$mode" = hidden ] && ignore=("-DCMAKE_IGNORE_PATH=$IGNORE")
  in_mode "$mode" cmake -S "$ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DPython3_EXECUTABLE="$PY" \
    -DINSTANTTENSOR_BUILD_TESTS=OFF "${ignore[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
  grep "instanttensor:" "$build/configure.log"
  in_mode "$mode" cmake --build "$build" -j "$(nproc)"
  check_library "$mode" "$build/libinstanttensor.so"

  echo "== $mode toolkit: C++ example against the installed package"
  cmake --install "$build" --prefix "$build-install" >/dev/null
  in_mode "$mode" cmake -S "$ROOT/examples" -B "$build-example" -G Ninja \
    -DCMAKE_PREFIX_PATH="$build-install;$TORCH_PREFIX" "${ignore[@]}" >/dev/null
  in_mode "$mode" cmake --build "$build-example"
  checkpoint=$(mktemp -d)/example.safetensors
  "$PY" -c "import torch, sys; from safetensors.torch import save_file; save_file({'x': torch.ones(3)}, sys.argv[1])" "$checkpoint"
  LD_LIBRARY_PATH="$build-install/lib:$TORCH_LIB" "$build-example/load_checkpoint" "$checkpoint"

  echo "== $mode toolkit: pip install ."
  in_mode "$mode" "$PY" -m pip install -q --no-build-isolation --force-reinstall --no-deps "$ROOT"
  (cd /tmp && in_mode "$mode" "$PY" -c "import instanttensor, torch; print('package:', torch.ops.instanttensor.build_info())")
done
echo "check_cuda_build: both builds against torch $TORCH_CUDA_VERSION (CUDA) passed"
