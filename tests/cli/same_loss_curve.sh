#!/usr/bin/env bash
# tests/cli/same_loss_curve.sh: engine_train under mpirun with TP2 + sequence parallel
# (2 ranks), TP2 x DP2 with sequence parallel (4 ranks) and TP2 x PP2 with sequence parallel
# (4 ranks) follows the one-process loss curve: every logged loss within 1e-4 relative over
# 20 steps of configs/tiny.yaml.
# Usage: same_loss_curve.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(data.paths="[$corpus]" training.steps=20 training.log_every=1 training.eval_every=0
        checkpoint.save_at_end=false runtime.peak_gflops=100 runtime.threads=1)
run() {  # run NAME RANKS OVERRIDES...
  local name=$1 ranks=$2
  shift 2
  mpirun --oversubscribe -np "$ranks" "$train" "$configs/tiny.yaml" "${common[@]}" \
    run.dir="$work/$name" "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
run one 1
run stp2 2 parallel.tensor=2 parallel.sequence_parallel=true
run stp2dp2 4 parallel.tensor=2 parallel.sequence_parallel=true
run stp2pp2 4 parallel.tensor=2 parallel.pipeline=2 parallel.sequence_parallel=true
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{work}/{name}/metrics.jsonl")]
ref = losses("one")
ok = len(ref) == 20
for name in ("stp2", "stp2dp2", "stp2pp2"):
    other = losses(name)
    worst = max(abs(a - b) / b for a, b in zip(other, ref))
    print(f"{name}: {len(other)} steps, first loss {other[0]:.6f} last {other[-1]:.6f} "
          f"(one rank: {ref[0]:.6f} .. {ref[-1]:.6f}), worst relative difference {worst:.2e}")
    ok &= len(other) == len(ref) and worst <= 1e-4
sys.exit(0 if ok else 1)
PY
