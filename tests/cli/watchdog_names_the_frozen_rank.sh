#!/usr/bin/env bash
# tests/cli/watchdog_names_the_frozen_rank.sh: a frozen rank is named even when a rank of
# another group times out first (tests/mpi/watchdog_chain_main.cpp): the job ends with a
# non-zero exit code, within 1.5 timeouts, and its report says "No answer from rank(s) 2",
# not that every member answered.
# Usage: watchdog_names_the_frozen_rank.sh MPIEXEC WATCHDOG_CHAIN
set -uo pipefail
mpiexec=$1 chain=$2
timeout_s=4
start=$SECONDS
output=$(timeout 60 "$mpiexec" --oversubscribe -np 3 "$chain" $timeout_s 2>&1)
status=$?
took=$((SECONDS - start))
grep "^retort:" <<<"$output"
echo "the job ended after $took s with exit code $status"
[ $status -ne 0 ] && [ $status -ne 124 ] || { echo "FAIL: exit code $status"; exit 1; }
[ $took -le $((timeout_s * 3 / 2 + 5)) ] || { echo "FAIL: took $took s"; exit 1; }
grep -q "No answer from rank(s) 2 " <<<"$output" || { echo "FAIL: rank 2 not named"; exit 1; }
echo "PASS"
