#!/usr/bin/env bash
# tests/cli/two_hosts_consistency.sh: the consistency suite on two simulated hosts of two
# ranks each (tools/sim_hosts.sh: network namespaces, TCP between them). TP2xDP2 (TP within a
# host, DP across), PP2xDP2 (DP within a host, PP across) and DP4 (two DP ranks per host)
# agree with TP1 within the suite's tolerances, and the DP sum runs as the hosts dictate:
# MPI across hosts, shared memory within one, both for DP4. Skips (77) where namespaces
# cannot be made.
# Usage: two_hosts_consistency.sh ENGINE_CONSISTENCY CORPUS_PREFIX CONFIGS_DIR OUT_DIR
set -euo pipefail
consistency=$1 corpus=$2 configs=$3 out=$4
tools="$(cd "$(dirname "$0")/../../tools" && pwd)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$tools/sim_hosts.sh" run 2 2 -- sh -c "\$SIM_MPIRUN -np 4 '$consistency' \
  '$configs/consistency.yaml' data.paths=[$corpus] --layouts TP1,TP2xDP2,PP2xDP2,DP4 \
  --out '$out'" >"$log" 2>&1 || status=$?
cat "$log"
[ $status -ne 77 ] || exit 77
[ $status -eq 0 ] || { echo "FAIL: exit code $status"; exit 1; }
expect() {  # expect LAYOUT DP_SUM_REGEX
  grep -qE "^ran $1 \(direct\): losses .*; dp sum: $2" "$log" ||
    { echo "FAIL: $1 should sum DP gradients by: $2"; exit 1; }
}
expect TP2xDP2 "MPI all-reduce over 2 ranks"
expect PP2xDP2 "shared memory \(2 ranks\)"
expect DP4 "shared memory within each of 2 hosts \(2 ranks each\), then MPI across them"
echo "ok: every layout agrees with TP1 across two hosts; DP sums by host"
