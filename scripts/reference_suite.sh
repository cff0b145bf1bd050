#!/usr/bin/env bash
# The drop-in's test: safetensors' own Python suite (its torch, numpy, threading, pread-backend,
# model and file-handle files), fetched for the installed safetensors version, run once on the
# reference and once with instanttensor, instanttensor.torch and instanttensor.numpy standing in
# for safetensors, safetensors.torch and safetensors.numpy. Fails unless every test that passes
# on the reference passes on us.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
SUITE=$("$PYTHON" tests/reference/fetch_reference_suite.py "$ROOT/build/reference-suite")
FILES=(tests/test_pt_comparison.py tests/test_pt_model.py tests/test_simple.py
  tests/test_threadable.py tests/test_multithreaded.py tests/test_pread_backend.py
  tests/test_handle.py)
RESULTS="$ROOT/build/reference-suite"
cd "$SUITE"
echo "== safetensors' suite on safetensors"
"$PYTHON" -m pytest -q -p no:cacheprovider --junit-xml="$RESULTS/reference.xml" "${FILES[@]}" || true
echo "== safetensors' suite on instanttensor"
PYTHONPATH="$ROOT/tests/reference" "$PYTHON" -m pytest -q -p no:cacheprovider \
  -p instanttensor_as_safetensors --junit-xml="$RESULTS/instanttensor.xml" "${FILES[@]}" || true
# The verdict: every test that passed on the reference passed on us (a test failing on both, or
# a run that collected nothing, is judged here, not by pytest's exit status).
"$PYTHON" "$ROOT/tests/reference/compare_runs.py" "$RESULTS/reference.xml" "$RESULTS/instanttensor.xml"
