#!/usr/bin/env bash
# examples/precision_curves.sh: bf16 mixed precision against fp32 on the same seed and data.
# (a) configs/tiny.yaml for its 300 steps on one rank, fp32 then model.dtype=bfloat16;
# (b) the demo's distillation (configs/distill.yaml: TP2 x PP2 x DP2 with sequence
#     parallelism, 8 ranks, from the demo's teacher in runs/teacher, trained first if absent),
#     fp32 then bf16, every step logged.
# Then examples/compare_precision.py checks every loss term at every logged step after step
# 50 (at most 2% apart), prints the table and plots both pairs into
# examples/results/precision.png.
# Usage: examples/precision_curves.sh   (about 6 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${RETORT_BUILD:-build}
out=runs/precision
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f examples/data/sotu_bytes.idx ] ||
  "$build"/tools/engine_prepare_data -o examples/data/sotu_bytes examples/data/sotu
[ -d runs/teacher/checkpoints ] ||
  mpirun --oversubscribe -np 2 "$build"/tools/engine_train configs/tiny.yaml run.dir=runs/teacher
rm -rf "$out"
for dtype in float32 bfloat16; do
  echo "== tiny, $dtype"
  "$build"/tools/engine_train configs/tiny.yaml run.dir="$out/tiny_$dtype" \
    model.dtype="$dtype" | grep -E "^step" | tail -3
  echo "== distillation TP2 x PP2 x DP2, $dtype"
  mpirun --oversubscribe -np 8 "$build"/tools/engine_train configs/distill.yaml \
    run.dir="$out/distill_$dtype" model.dtype="$dtype" training.log_every=1 |
    grep -E "^step" | tail -3
done
tools/python examples/compare_precision.py --after 50 --limit 0.02 \
  --pair tiny "$out/tiny_float32" "$out/tiny_bfloat16" \
  --pair distillation "$out/distill_float32" "$out/distill_bfloat16" \
  --plot examples/results/precision.png
