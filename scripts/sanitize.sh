#!/usr/bin/env bash
# Sanitizer and fuzzing checks over the torch-free layers (libtorch is not instrumented, so the
# layers below it are checked on their own):
#   ASan + UBSan over the format/plan/io/pool tests, TSan over the io/pool tests (worker
#   threads), ASan and TSan over the host-memory keeper (its blocks come back from any thread;
#   built against the installed, uninstrumented libtorch), and each libFuzzer target for
#   FUZZ_SECONDS with the seed corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/step_clock.sh
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
export CC=clang CXX=clang++
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1

step "ASan + UBSan (torch-free tests)"
cmake -S . -B build-asan -G Ninja -DINSTANTTENSOR_CORE_ONLY=ON -DINSTANTTENSOR_TESTING_HOOKS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" >/dev/null
cmake --build build-asan
(cd build-asan && ctest --output-on-failure -j 2)

step "TSan (worker threads of the io layer)"
cmake -S . -B build-tsan -G Ninja -DINSTANTTENSOR_CORE_ONLY=ON -DINSTANTTENSOR_TESTING_HOOKS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread" >/dev/null
cmake --build build-tsan --target test_plan_io_pool
TSAN_OPTIONS=halt_on_error=1 build-tsan/test_plan_io_pool

step "ASan and TSan (host blocks: own mappings and recycling)"
torch_dir=$("${PYTHON:-python3}" -c "import os, torch; print(os.path.dirname(torch.__file__))")
abi=$("${PYTHON:-python3}" -c "import torch; print(int(torch.compiled_with_cxx11_abi()))")
mkdir -p build-sanitize-host
for sanitizer in address thread; do
  $CXX -std=c++17 -O1 -g -fsanitize=$sanitizer -D_GLIBCXX_USE_CXX11_ABI=$abi -Iops -Iinclude \
    -isystem "$torch_dir/include" tests/cpp/test_host_memory.cpp ops/pool/recycled_blocks.cpp \
    ops/pool/host_buffer.cpp ops/io/memory_advice.cpp ops/io/fault_injection.cpp ops/format/error.cpp -L"$torch_dir/lib" -lc10 -ltorch_cpu \
    -lgtest -lgtest_main -lpthread -Wl,-rpath,"$torch_dir/lib" \
    -o build-sanitize-host/test_host_memory_$sanitizer
  TSAN_OPTIONS=halt_on_error=1 build-sanitize-host/test_host_memory_$sanitizer
done

step "libFuzzer, ${FUZZ_SECONDS}s per target"
cmake -S . -B build-fuzz -G Ninja -DINSTANTTENSOR_CORE_ONLY=ON -DINSTANTTENSOR_FUZZ=ON \
  -DINSTANTTENSOR_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all" >/dev/null
cmake --build build-fuzz
for target in fuzz_header fuzz_read_path; do
  work=$(mktemp -d)  # new finds land here; tests/fuzz/corpus holds the committed seeds
  build-fuzz/$target -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$work" tests/fuzz/corpus 2>&1 | tail -4
  rm -rf "$work"
done
echo "sanitizers and fuzzing: clean"
