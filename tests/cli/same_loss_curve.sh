#!/usr/bin/env bash
# tests/cli/same_loss_curve.sh: engine_train under mpirun with TP2 + sequence parallel
# (2 ranks), TP2 x DP2 with sequence parallel (4 ranks) and TP2 x PP2 with sequence parallel
# (4 ranks) follows the one-process run of configs/tiny.yaml: over 20 steps every logged
# loss and every gradient norm (which a gradient scaled by a constant moves, while AdamW
# hides it from the loss) within 1e-4 relative. The same for a distillation run (logit and
# activation losses through a projection, vocabulary 300 so a TP rank is partly padded),
# one process against TP2 x PP2 with sequence parallel, each loss term compared as well.
# Usage: same_loss_curve.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
python="$(cd "$(dirname "$0")/../.." && pwd)/tools/python"  # .venv's, tools/setup.sh
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
distill=(model.vocab_size=300 teacher.seed=99 teacher.hidden=192 teacher.ffn_hidden=512
         distill.lm_weight=0.5 distill.logit_weight=1 distill.temperature=2
         distill.activation_weight=0.1 "distill.activation_pairs=[layers.1.mixer_output=layers.1.mixer_output]")
run distill_one 1 "${distill[@]}"
run distill_stp2pp2 4 "${distill[@]}" parallel.tensor=2 parallel.pipeline=2 parallel.sequence_parallel=true
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def records(name):
    return [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
def relative(a, b):
    return abs(a - b) / abs(b) if a != b else 0.0
ok = True
for reference, others, keys in (
        ("one", ("stp2", "stp2dp2", "stp2pp2"), ("loss", "grad_norm")),
        ("distill_one", ("distill_stp2pp2",),
         ("loss", "grad_norm", "lm_loss", "logit_loss", "activation_loss"))):
    ref = records(reference)
    ok &= len(ref) == 20
    for name in others:
        other = records(name)
        ok &= len(other) == len(ref)
        for key in keys:
            worst = max(relative(o[key], r[key]) for o, r in zip(other, ref))
            print(f"{name} vs {reference}: {key} over {len(other)} steps from {other[0][key]:.6f} "
                  f"to {other[-1][key]:.6f} (reference {ref[0][key]:.6f} .. {ref[-1][key]:.6f}), "
                  f"worst relative difference {worst:.2e}")
            ok &= worst <= 1e-4
sys.exit(0 if ok else 1)
PY
