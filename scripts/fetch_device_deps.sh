#!/usr/bin/env bash
# On a networked Debian machine: downloads the build dependencies the GPU machine lacks into
# DIR, for benchmarks/device_check.sh OUT DIR.
set -euo pipefail
DIR=${1:?usage: fetch_device_deps.sh DIR}
mkdir -p "$DIR" && cd "$DIR"
apt-get download nlohmann-json3-dev liburing-dev liburing2
ls -la "$DIR"
