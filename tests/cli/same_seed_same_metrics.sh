#!/usr/bin/env bash
# tests/cli/same_seed_same_metrics.sh: the same config and seed run twice under TP2 x DP2
# (mpirun -np 4, sequence parallel, ZeRO-1, distilling logits and activations, with
# evaluation) writes identical metrics.jsonl, every field but the timing ones (tokens_per_s,
# mfu, eta_s, exposed_comm_s) and the kernel's resident and huge-page bytes compared exactly;
# and another seed does not.
# Usage: same_seed_same_metrics.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
python="$(cd "$(dirname "$0")/../.." && pwd)/tools/python"  # .venv's, tools/setup.sh
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(data.paths="[$corpus]" model.layers=2 model.hidden=64 model.ffn_hidden=172
        model.vocab_size=300 data.seq_len=32 training.global_batch=8 training.micro_batch=2
        training.steps=12 training.log_every=2 training.eval_every=6 training.eval_batches=1
        runtime.peak_gflops=100 runtime.threads=1 checkpoint.save_at_end=false
        parallel.tensor=2 parallel.sequence_parallel=true optimizer.zero_stage=1
        teacher.seed=99 teacher.hidden=96 distill.lm_weight=0.5 distill.logit_weight=1
        distill.temperature=2 distill.activation_weight=0.1
        "distill.activation_pairs=[layers.1.mixer_output=layers.1.mixer_output]")
run() {  # run NAME OVERRIDES...
  local name=$1
  shift
  mpirun --oversubscribe -np 4 "$train" "$configs/tiny.yaml" "${common[@]}" \
    run.dir="$work/$name" "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
run first seed=7
run second seed=7
run other seed=8
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
# Timing, and what the kernel reports of the process (where it placed huge pages varies).
timing = {"tokens_per_s", "mfu", "eta_s", "exposed_comm_s", "resident_bytes", "huge_page_bytes"}
def records(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
    return [{k: v for k, v in r.items() if k not in timing} for r in rows]
first, second, other = records("first"), records("second"), records("other")
fields = sorted(set().union(*first))
print(f"{len(first)} lines, fields compared: {', '.join(fields)}")
assert len(first) == 6 and "valid_loss" in fields and "logit_loss" in fields, fields
same = first == second
for a, b in zip(first, second):
    for k in a:
        if a[k] != b.get(k):
            print(f"step {a['step']}: {k} differs: {a[k]!r} vs {b.get(k)!r}")
print(f"same seed: identical = {same}; another seed: identical = {first == other}")
sys.exit(0 if same and first != other else 1)
PY
