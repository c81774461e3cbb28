#!/usr/bin/env bash
# tests/cli/preemption.sh: SIGTERM to one rank of `mpirun -np 4 engine_train` (TP2 x DP2 with
# sequence parallel) mid-run: every rank finishes the step, one checkpoint is saved, mpirun
# exits 0; resuming with checkpoint.load=auto gives, step for step, bitwise the loss and
# gradient norm of the same run left uninterrupted. A second signal ends the job at once
# with a non-zero exit code.
# Usage: preemption.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
python="$(cd "$(dirname "$0")/../.." && pwd)/tools/python"  # .venv's, tools/setup.sh
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
steps=300
common=(data.paths="[$corpus]" model.layers=2 model.hidden=64 model.ffn_hidden=172
        data.seq_len=32 training.global_batch=8 training.micro_batch=2 training.steps=$steps
        training.log_every=1 training.eval_every=0 runtime.peak_gflops=100 runtime.threads=1
        parallel.tensor=2 parallel.sequence_parallel=true checkpoint.load=auto)
launch() {  # launch NAME: mpirun in the background, its pid in $job
  mpirun --oversubscribe -np 4 "$train" "$configs/tiny.yaml" "${common[@]}" \
    run.dir="$work/$1" >"$work/$1.log" 2>&1 &
  job=$!
}
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
wait_for_steps() {  # wait_for_steps NAME N: until metrics.jsonl has N lines
  for _ in $(seq 600); do
    [ "$(cat "$work/$1/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$2" ] && return
    sleep 0.05
  done
  echo "FAIL: $1 never logged $2 steps"; cat "$work/$1.log"; exit 1
}

# The reference: the same run, uninterrupted.
launch straight
wait $job || { cat "$work/straight.log"; exit 1; }

# Pre-empted: SIGTERM to rank 2 once the run is under way.
launch preempted
wait_for_steps preempted 5
kill -TERM "$(rank_pid "$job" 2)"
status=0
wait $job || status=$?
cat "$work/preempted.log" | grep -E "stop signal|stopped by|saved checkpoint" || true
[ $status -eq 0 ] || { echo "FAIL: mpirun exited $status after SIGTERM"; cat "$work/preempted.log"; exit 1; }
saved=$(ls "$work/preempted/checkpoints" | grep '^step_' || true)
[ "$(echo "$saved" | wc -w)" -eq 1 ] || { echo "FAIL: expected one checkpoint, found: $saved"; exit 1; }
stopped_at=$((10#${saved#step_}))
[ $stopped_at -lt $steps ] || { echo "FAIL: the run was not interrupted"; exit 1; }
echo "pre-empted at step $stopped_at of $steps, checkpoint $saved"

# Resumed to the end from that checkpoint.
launch preempted
wait $job || { cat "$work/preempted.log"; exit 1; }
grep "resumed from" "$work/preempted.log"

"$python" "$(dirname "$0")"/resumed_equals_straight.py "$work/straight" "$work/preempted" "$steps"

# A second signal: the job ends at once, without saving.
launch twice
wait_for_steps twice 5
pid=$(rank_pid "$job" 1)
kill -TERM "$pid"
# Signals of one kind do not queue: send the second once the first has been handled.
for _ in $(seq 200); do
  grep -q "stop signal received" "$work/twice.log" && break
  sleep 0.05
done
kill -TERM "$pid"
start=$SECONDS
status=0
wait $job || status=$?
grep -q "second stop signal" "$work/twice.log" || { echo "FAIL: no second-signal message"; cat "$work/twice.log"; exit 1; }
[ $status -ne 0 ] || { echo "FAIL: exit 0 after a second signal"; exit 1; }
echo "second signal: mpirun exited $status after $((SECONDS - start)) s"
