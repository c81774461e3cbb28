#!/usr/bin/env bash
# tests/cli/dead_or_frozen_rank.sh: under `mpirun -np 4 engine_train` (TP2 x DP2), one rank
# frozen with SIGSTOP, and in a second job one killed with SIGKILL: each job ends, with a
# non-zero exit code, within runtime.collective_timeout_s (plus a few seconds for the abort
# to reach every process), and its output names the rank at fault; nobody hangs.
# Usage: dead_or_frozen_rank.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
timeout_s=8
common=(data.paths="[$corpus]" model.layers=2 model.hidden=64 model.ffn_hidden=172
        data.seq_len=32 training.global_batch=8 training.micro_batch=2 training.steps=1000000
        training.log_every=1 training.eval_every=0 runtime.peak_gflops=100 runtime.threads=1
        parallel.tensor=2 parallel.sequence_parallel=true checkpoint.save_at_end=false
        runtime.collective_timeout_s=$timeout_s)
descendants() {  # descendants PID: every process below PID
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}
# rank_pid JOB RANK: the process of that world rank in this job (not in another test's job)
rank_pid() {
  for pid in $(descendants "$1"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
      return
    fi
  done
}
# check NAME SIGNAL RANK EXPECTED_REGEX: signal one rank of a running job, then time its end.
check() {
  local name=$1 signal=$2 rank=$3 expected=$4
  timeout 120 mpirun --oversubscribe -np 4 "$train" "$configs/tiny.yaml" "${common[@]}" \
    run.dir="$work/$name" >"$work/$name.log" 2>&1 &
  local job=$!
  for _ in $(seq 600); do
    [ "$(cat "$work/$name/metrics.jsonl" 2>/dev/null | wc -l)" -ge 5 ] && break
    sleep 0.05
  done
  local pid=""
  # The process tree is read from /proc while the job runs; on a loaded machine one pass can
  # miss a process, so look again for a few seconds before giving up.
  for _ in $(seq 50); do
    pid=$(rank_pid "$job" "$rank")
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] || { echo "FAIL: no process for rank $rank"; cat "$work/$name.log"; exit 1; }
  kill -"$signal" "$pid"
  local start=$SECONDS status=0
  wait $job || status=$?
  local took=$((SECONDS - start))
  echo "$name: SIG$signal to rank $rank; the job ended after $took s with exit code $status"
  grep -E "$expected" "$work/$name.log" | head -3
  [ $status -ne 0 ] && [ $status -ne 124 ] || { echo "FAIL: exit code $status"; cat "$work/$name.log"; exit 1; }
  [ $took -le $((timeout_s + 5)) ] || { echo "FAIL: took $took s, timeout $timeout_s s"; exit 1; }
  grep -qE "$expected" "$work/$name.log" || { echo "FAIL: rank $rank not named"; cat "$work/$name.log"; exit 1; }
}
check frozen STOP 2 "No answer from rank\(s\) 2 "
check killed KILL 1 "rank 1 .*(exited|killed|signal 9)"
