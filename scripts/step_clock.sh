# Sourced by test.sh and test_callers.sh: step NAME prints a step's heading with the seconds since
# INSTANTTENSOR_CI_START (set by test.sh; this shell's start when run alone).
INSTANTTENSOR_CI_START=${INSTANTTENSOR_CI_START:-$(date +%s)}
step() { echo "== $* [at $(( $(date +%s) - INSTANTTENSOR_CI_START )) s]"; }
