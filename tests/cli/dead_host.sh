#!/usr/bin/env bash
# tests/cli/dead_host.sh: a dead host. `engine_train` runs TP2 x DP2 on two simulated hosts
# (tools/sim_hosts.sh; TP within a host, DP across), saving a checkpoint every 10 steps.
# Killing every process of the second host's namespace ends the job, with a non-zero exit
# code, within runtime.collective_timeout_s + 10 s; the output names that host (mpirun's
# message) and its ranks (a survivor's wait, interrupted by mpirun's SIGTERM, names the ranks
# it waits for and their host). The checkpoints saved before stay whole, and
# checkpoint.load=auto resumes from the last one to the end with, step for step, bitwise the
# loss and gradient norm of the same run left uninterrupted. Skips (77) where namespaces
# cannot be made.
# Usage: dead_host.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ "${SIM_HOSTS:-}" = "" ]; then  # first, make the hosts and come back inside them
  exec "$root/tools/sim_hosts.sh" run 2 2 -- "$0" "$@"
fi
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
steps=60 timeout_s=8
common=(data.paths="[$corpus]" model.layers=2 model.hidden=64 model.ffn_hidden=172
        data.seq_len=32 training.global_batch=8 training.micro_batch=2 training.steps=$steps
        training.log_every=1 training.eval_every=0 runtime.peak_gflops=100 runtime.threads=1
        parallel.tensor=2 checkpoint.save_every=10 checkpoint.load=auto
        runtime.collective_timeout_s=$timeout_s)
launch() {  # launch NAME: the job in the background, its pid in $job
  $SIM_MPIRUN -np 4 "$train" "$configs/tiny.yaml" "${common[@]}" run.dir="$work/$1" \
    >>"$work/$1.log" 2>&1 &
  job=$!
}

launch straight
wait $job || { echo "FAIL: the uninterrupted run"; cat "$work/straight.log"; exit 1; }
grep -E "^retort: (hosts|tp groups|dp groups|dp gradient sum):" "$work/straight.log"
grep -qE "^retort: hosts: host0 \[0,1\] host1 \[2,3\]" "$work/straight.log" ||
  { echo "FAIL: the banner does not map hosts to ranks"; exit 1; }

launch dead
for _ in $(seq 1200); do
  [ "$(cat "$work/dead/metrics.jsonl" 2>/dev/null | wc -l)" -ge 25 ] && break
  sleep 0.05
done
before=$(ls "$work/dead/checkpoints" | grep '^step_' | tr '\n' ' ')
"$root/tools/sim_hosts.sh" kill host1
start=$SECONDS status=0
wait $job || status=$?
took=$((SECONDS - start))
echo "killed host1 after $(wc -l <"$work/dead/metrics.jsonl") logged steps; the job ended after" \
  "$took s with exit code $status; checkpoints before: $before"
awk '!/^retort: / && /host1/' "$work/dead.log" | head -3 || true
[ $status -ne 0 ] || { echo "FAIL: exit code 0 after a host died"; exit 1; }
[ $took -le $((timeout_s + 10)) ] || { echo "FAIL: took $took s"; exit 1; }
# awk, not grep -v | grep -q: with pipefail, -q's early exit can fail the first grep (SIGPIPE).
awk '!/^retort: / && /host1/ { found = 1 } END { exit !found }' "$work/dead.log" ||
  { echo "FAIL: the end of the job does not name host1"; cat "$work/dead.log"; exit 1; }
grep -E "^retort: rank [01] got a stop signal while waiting .* for rank\(s\) [23](, [23])? on host1" \
  "$work/dead.log" || { echo "FAIL: no survivor names host1's ranks"; cat "$work/dead.log"; exit 1; }
after=$(ls "$work/dead/checkpoints" | grep '^step_' | tr '\n' ' ')
[ "$before" = "$after" ] || { echo "FAIL: checkpoints were $before, now $after"; exit 1; }

launch dead  # resumed, on the same hosts (host1's namespace is empty again, not gone)
wait $job || { echo "FAIL: the resumed run"; tail -20 "$work/dead.log"; exit 1; }
grep "resumed from" "$work/dead.log"
"$root/tools/python" "$(dirname "$0")"/resumed_equals_straight.py "$work/straight" "$work/dead" "$steps"
