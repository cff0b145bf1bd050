#!/usr/bin/env bash
# The wheel as users get it (scripts/test.sh runs this): builds it (scripts/build_wheel.sh) and
# checks what it says and carries (tests/wheel/check_wheel_contents.py); pip refuses to pair it
# with another torch minor version; installed into a fresh virtual environment holding only
# torch, it loads checkpoints in every mode with no compiler or CMake on PATH and, as root, the
# system's liburing hidden in a mount namespace (tests/wheel/check_installed_wheel.py); the C++
# example builds with find_package(instanttensor) against the wheel's CMake files and reads the
# same bytes; the sdist holds what a source build needs and nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
ROOT=$(pwd)
TORCH_PIN=${TORCH_PIN:-2.13.0}

bash scripts/build_wheel.sh dist
wheel=$(ls -t dist/instanttensor-*.whl | head -1)
"$PYTHON" tests/wheel/check_wheel_contents.py "$wheel" "$ROOT"
version=$(basename "$wheel" | cut -d- -f2)

echo "== a fresh virtual environment: torch $TORCH_PIN, then the wheel"
venv=$ROOT/build/wheel-venv
rm -rf "$venv"
"$PYTHON" -m venv "$venv"  # no system site packages: only what is installed below
"$venv/bin/python" -m pip install -q torch=="$TORCH_PIN"
"$venv/bin/python" -m pip install -q "$wheel"
if "$venv/bin/python" -m pip install -q --dry-run "$wheel" torch==2.14.1 >"$venv/other-torch.log" 2>&1; then
  echo "pip would pair $wheel with torch 2.14.1" >&2
  exit 1
fi
grep -q "conflict" "$venv/other-torch.log" || { cat "$venv/other-torch.log" >&2; exit 1; }
echo "pip refuses to pair it with torch 2.14.1 (a dependency conflict)"

echo "== the wheel alone: PATH without compilers or CMake, the system's liburing hidden"
check=(env -i HOME="$HOME" PATH="$venv/bin" "$venv/bin/python" "$ROOT/tests/wheel/check_installed_wheel.py"
  "$version")
if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
  # Each liburing the system has becomes an empty file in a private mount namespace: a library
  # that needed one could not load.
  mapfile -t liburings < <(find /usr/lib /usr/local/lib /lib -name 'liburing.so*' -type f 2>/dev/null)
  unshare -m bash -c 'for f in "${@:2:$1}"; do mount --bind /dev/null "$f"; done; shift $(($1 + 1)); exec "$@"' \
    _ "${#liburings[@]}" "${liburings[@]}" "${check[@]}" --liburing-hidden
else
  echo "(not root: the system's liburing is not hidden; the check reads /proc/self/maps only)"
  "${check[@]}"
fi

echo "== the C++ example against the wheel's CMake package config"
prefixes=$("$venv/bin/python" -c 'import instanttensor, torch.utils
print(instanttensor.cmake_prefix_path + ";" + torch.utils.cmake_prefix_path)')
example=$ROOT/build/wheel-example
rm -rf "$example"
cmake -S examples -B "$example" -G Ninja -DCMAKE_PREFIX_PATH="$prefixes" >/dev/null
cmake --build "$example" >/dev/null
"$venv/bin/python" tests/wheel/check_example_output.py "$example/load_checkpoint" "$venv"

echo "== the sdist"
"$PYTHON" -m pip install -q build==1.6.1
rm -rf build/sdist
"$PYTHON" -m build --sdist -o build/sdist . >/dev/null
"$PYTHON" tests/wheel/check_sdist.py build/sdist/instanttensor-0.2.2.tar.gz "$ROOT"
