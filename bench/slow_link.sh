#!/usr/bin/env bash
# bench/slow_link.sh: how much of the DP gradient sum overlap hides across a slow link, and
# how close the planner's step time comes. Two simulated hosts (tools/sim_hosts.sh, one rank
# each) joined by a link of DELAY_MS one way and RATE_MBIT per host (tools/sim_wire.cpp) run
# the bench model (hidden 512, 8 layers, vocab 32000 tied, sequence 256, micro-batch 4) in
# DP2 with engine_train, alternating:
#   overlapped:   the gradients in 4 MB buckets, each reduced as soon as backward fills it;
#   head blocks:  the same with parallel.dp_head_blocks (the tied head's gradient formed in
#                 backward, each block of rows reduced as it forms);
#   unoverlapped: one bucket of everything, reduced after backward (parallel.dp_bucket_mb
#                 larger than the model), so its whole all-reduce shows;
#   one rank:     the same model on one rank alone (its share of the batch), no communication:
#                 the compute rate the planner is given.
# Each run's exposed communication per step (the time blocked in communication, metrics'
# exposed_comm_s) is the median over its steps after the first; the table gives the medians
# over rounds, their spread, and the share of the all-reduce that overlap hides. The
# unoverlapped run still streams the tied head's reduction during backward, so the reference
# for that share is the all-reduce of the whole gradient alone on the link (bench_allreduce,
# best of 3), measured in the same session. The planner (engine_train --plan, device cpu) is
# given the one-rank run's FLOP rate (--tflops, --efficiency 1) and the link's rate
# (--inter-gbps) and predicts the DP2 step of both overlapped modes.
# Usage: bench/slow_link.sh [rounds=3] [steps=6] [delay_ms=1] [rate_mbit=1000]   (as root)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds=${1:-3} steps=${2:-6} delay=${3:-1} rate=${4:-1000}
build="$root/${RETORT_BUILD:-build}"
corpus="$build/test_data/sotu_bytes"
[ -f "$corpus.idx" ] || "$build/tools/engine_prepare_data" -o "$corpus" "$root/examples/data/sotu" >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(model.vocab_size=32000 model.hidden=512 model.layers=8 model.heads=8 model.kv_heads=4
       model.ffn_hidden=1376 model.tied_embeddings=true data.seq_len=256 training.micro_batch=4)
cat >"$work/rounds.sh" <<INNER
set -euo pipefail
for round in \$(seq $rounds); do
  for mode in overlapped blocks unoverlapped single; do
    ranks=2 batch=8 bucket=4 blocks=false
    [ \$mode = unoverlapped ] && bucket=100000
    [ \$mode = blocks ] && blocks=true
    [ \$mode = single ] && ranks=1 batch=4
    \$SIM_MPIRUN -np \$ranks "$build/tools/engine_train" "$root/configs/tiny.yaml" \
      data.paths=[$corpus] ${model[*]} training.global_batch=\$batch training.steps=$steps \
      training.log_every=1 training.eval_every=0 runtime.threads=1 checkpoint.save_at_end=false \
      parallel.dp_bucket_mb=\$bucket parallel.dp_head_blocks=\$blocks run.dir="$work/\$mode.\$round" >"$work/\$mode.\$round.log" 2>&1
  done
done
INNER
elements=$("$build/tools/engine_train" "$root/configs/tiny.yaml" "${model[@]}" --dry-run |
           awk '/^parameters:/ { print $2 }')
echo "\$SIM_MPIRUN -np 2 $build/bench/bench_allreduce 3 $elements > $work/allreduce.txt" >>"$work/rounds.sh"
"$root/tools/sim_hosts.sh" run 2 1 --wire "$delay" "$rate" -- bash "$work/rounds.sh"
grep -h "dp gradient sum" "$work"/overlapped.1.log || true
plan() {  # plan NODES TFLOPS KEY=VALUE...: the planner's step time in seconds
  local nodes=$1 tflops=$2
  shift 2
  "$build/tools/engine_train" "$root/configs/tiny.yaml" "${model[@]}" "$@" --plan --device cpu \
    --nodes "$nodes" --gpus-per-node 1 --tflops "$tflops" --efficiency 1 \
    --inter-gbps "$(awk -v r="$rate" 'BEGIN { print r / 8000 }')" |
    awk '/^time per step:/ { print $4 }'
}
# The one-rank run's step at 1 TFLOP/s: its measured step gives the rate it reached.
single_at_one=$(plan 1 1 training.global_batch=4)
"$root/tools/python" - "$work" "$rounds" "$delay" "$rate" "$elements" "$single_at_one" \
  >"$work/table.py.out" <<'PY'
import json, re, statistics, sys
work, rounds, delay, rate, elements = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
single_at_one = float(sys.argv[6])
row = [l for l in open(f"{work}/allreduce.txt") if l.startswith("| ") and "MB" in l][0]
alone = elements * 4 / (float(row.split("|")[2]) * 1e9)  # seconds
def run(mode, r, tokens=8 * 256):
    records = [json.loads(l) for l in open(f"{work}/{mode}.{r}/metrics.jsonl")]
    steps = [x for x in records if x.get("step", 0) > 1 and "tokens_per_s" in x]
    return (statistics.median(x.get("exposed_comm_s", 0) for x in steps),
            statistics.median(tokens / x["tokens_per_s"] for x in steps))
over = [run("overlapped", r) for r in range(1, rounds + 1)]
blocks = [run("blocks", r) for r in range(1, rounds + 1)]
full = [run("unoverlapped", r) for r in range(1, rounds + 1)]
single = [run("single", r, 4 * 256)[1] for r in range(1, rounds + 1)]
hidden = [1 - o[0] / alone for o in over]
hidden_blocks = [1 - b[0] / alone for b in blocks]
med = statistics.median
tflops = single_at_one / med(single)
print(f"TFLOPS {tflops:.6f}")
print(f"| DP2 across 2 hosts, {delay} ms one way, {rate} Mbit/s | median | spread |")
print("|---|---|---|")
print(f"| exposed communication per step, overlapped | {med(o[0] for o in over):.3f} s | "
      f"{min(o[0] for o in over):.3f}-{max(o[0] for o in over):.3f} |")
print(f"| exposed communication per step, overlapped, head in blocks | "
      f"{med(b[0] for b in blocks):.3f} s | {min(b[0] for b in blocks):.3f}-{max(b[0] for b in blocks):.3f} |")
print(f"| exposed communication per step, unoverlapped (one bucket after backward) | "
      f"{med(u[0] for u in full):.3f} s | {min(u[0] for u in full):.3f}-{max(u[0] for u in full):.3f} |")
print(f"| the whole gradient's all-reduce alone ({elements * 4 / 1e6:.0f} MB, best of 3) | "
      f"{alone:.3f} s | |")
print(f"| share of it hidden by overlap | {med(hidden):.1%} | "
      f"{min(hidden):.1%}-{max(hidden):.1%} |")
print(f"| share of it hidden, head in blocks | {med(hidden_blocks):.1%} | "
      f"{min(hidden_blocks):.1%}-{max(hidden_blocks):.1%} |")
print(f"| step time, overlapped / head in blocks / unoverlapped | {med(o[1] for o in over):.2f} / "
      f"{med(b[1] for b in blocks):.2f} / {med(u[1] for u in full):.2f} s | |")
print(f"| step time on one rank alone (its share of the batch; the planner's rate: "
      f"{tflops * 1e3:.0f} GFLOP/s) | {med(single):.2f} s | {min(single):.2f}-{max(single):.2f} |")
print(f"MEASURED {med(o[1] for o in over):.6f} {med(b[1] for b in blocks):.6f}")
PY
tflops=$(awk '/^TFLOPS/ { print $2 }' "$work/table.py.out")
read -r over_measured blocks_measured < <(awk '/^MEASURED/ { print $2, $3 }' "$work/table.py.out")
over_planned=$(plan 2 "$tflops" training.global_batch=8)
blocks_planned=$(plan 2 "$tflops" training.global_batch=8 parallel.dp_head_blocks=true)
grep '^|' "$work/table.py.out"
awk -v om="$over_measured" -v op="$over_planned" -v bm="$blocks_measured" -v bp="$blocks_planned" 'BEGIN {
  printf "| planner: step, overlapped (measured %.2f s) | %.2f s | %+.1f%% |\n", om, op, 100 * (op / om - 1)
  printf "| planner: step, head in blocks (measured %.2f s) | %.2f s | %+.1f%% |\n", bm, bp, 100 * (bp / bm - 1)
}'
