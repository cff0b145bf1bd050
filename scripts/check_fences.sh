#!/usr/bin/env bash
# Proof that the device tests can fail: runs tests/python/test_accelerator.py on the simulated
# device with random delays once per fence of the device path, that fence dropped
# (INSTANTTENSOR_TESTING_DROP_FENCE, ops/loader/transfer/stream_fences.h), and fails unless every such
# run goes red (a failed test, a copy into freed device memory counted by the simulated device,
# or a crash: a copy reading freed memory). Prints what caught each.
set -uo pipefail
cd "$(dirname "$0")/../tests/python"
BUILD=${INSTANTTENSOR_CMAKE_BUILD_DIR:-$(cd ../.. && pwd)/build}
# load_into_done is not listed: load_into waits on the host for every copy before it returns
# (its contract), which orders the consumer's later work too; the fence is belt and braces.
FENCES=(staging_reuse release retained_reads landed load_into_start materialize owned_free)
# Two runs at a time: the simulated device's delays are sleeps, so two runs share the cores
# (one after another they took 150 s of CI's time).
JOBS=${FENCE_JOBS:-2}
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
  echo "FENCE_JOBS must be a whole number of at least 1, not '$JOBS'"
  exit 2
fi
logs=$(mktemp -d) || exit 2
trap 'rm -rf "$logs"' EXIT
# Interrupted, the runs stop too: each job is a subshell whose child is `timeout`, which passes
# the signal on to its pytest; killing the subshell alone would leave them running.
stop_runs() {
  for job in $(jobs -p); do
    pkill -TERM -P "$job" 2>/dev/null
    kill -TERM "$job" 2>/dev/null
  done
  exit 130
}
trap stop_runs INT TERM
run_dropped() {  # run_dropped FENCE: the suite's output in $logs/FENCE.out, its status in .rc
  INSTANTTENSOR_TESTING_DROP_FENCE=$1 INSTANTTENSOR_SIMDEV_DELAY=1 \
    INSTANTTENSOR_CMAKE_BUILD_DIR=$BUILD timeout 600 "${PYTHON:-python3}" -m pytest -q \
    -p no:cacheprovider test_accelerator.py >"$logs/$1.out" 2>&1
  echo $? >"$logs/$1.rc"
}
for fence in "${FENCES[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  run_dropped "$fence" &
done
wait
uncaught=()
for fence in "${FENCES[@]}"; do
  out=$(cat "$logs/$fence.out")
  rc=$(cat "$logs/$fence.rc" 2>/dev/null)
  caught=$(echo "$out" | grep -E "^(FAILED|ERROR)" | sed -e 's/^[A-Z]* test_accelerator.py:://' -e 's/ - .*//' | paste -sd, -)
  crash=$(echo "$out" | grep -oE "Fatal Python error: [A-Za-z ]+" | head -1)
  # Caught means a test failed or the process crashed: a timeout, a missing status or a run
  # that never got to its tests proves nothing and counts as not caught.
  if [ "$rc" = 0 ]; then
    uncaught+=("$fence")
    echo "fence $fence dropped: NOT caught (the suite stayed green)"
  elif [ -z "$caught" ] && [ -z "$crash" ]; then
    uncaught+=("$fence")
    echo "fence $fence dropped: NOT caught (the run ended with status '${rc}' and no failed test)"
    echo "$out" | tail -5
  else
    where=$(echo "$out" | grep -m1 -oE 'line [0-9]+ in test_[a-z_]+' | sed 's/.* in //')
    echo "fence $fence dropped: caught by ${caught}${crash:+ ${crash} in ${where}}"
  fi
done
if [ ${#uncaught[@]} -gt 0 ]; then
  echo "fences no test catches: ${uncaught[*]}"
  exit 1
fi
echo "every fence is caught"
