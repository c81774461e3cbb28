#!/usr/bin/env bash
# examples/distill_experiments.sh: layer-freeze, partial-reset and sliding-window
# distillation experiments on the shipped corpus. (a) trains a teacher (configs/tiny.yaml);
# (b) distills students from it:
#   scratch        same shape, random init, LM + logit distillation
#   attn-reset     teacher weights, every attention re-initialised, MLPs frozen,
#                  logits + every layer's mixer output
#   layer2-reset   teacher weights, layer 2 re-initialised and the only trainable part,
#                  logits + layer 2's block output
#   window16/64    teacher weights, sliding-window attention (16 or 64 of 128 tokens),
#                  logits + every layer's mixer output
# Every student distills the teacher's top 32 per position twice: with the teacher run online,
# and from a teacher cache written once beforehand (engine_teacher_cache; the students with
# activation losses still run the teacher up to their last captured layer).
# (c) writes examples/results/table.md (final losses, each student's time with and without the
# cache) and examples/results/*.png (curves).
# Usage: examples/distill_experiments.sh [STEPS=150]   (about 14 minutes on 2 cores)
# RETORT_EXPERIMENTS_OUT and RETORT_EXPERIMENTS_RESULTS move the runs and the results elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-150}
build=${RETORT_BUILD:-build}
out=${RETORT_EXPERIMENTS_OUT:-runs/experiments}
results=${RETORT_EXPERIMENTS_RESULTS:-examples/results}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
train() {  # train NAME OVERRIDES...: one run, its wall time in $out/NAME/wall_seconds
  local name=$1
  shift
  echo "== $name"
  local start=$(date +%s.%N)
  mpirun --oversubscribe -np 2 "$build"/tools/engine_train configs/tiny.yaml \
    run.dir="$out/$name" training.log_every=5 training.eval_every=50 "$@" | grep -E "^step|error"
  awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }' >"$out/$name/wall_seconds"
}
student() {  # student NAME OVERRIDES...: the student online, then from the teacher cache
  local name=$1
  shift
  train "$name" "${distill[@]}" "$@"
  train "$name-cached" "${distill[@]}" teacher.cache="$out/teacher_cache" "$@"
}
[ -f examples/data/sotu_bytes.idx ] ||
  "$build"/tools/engine_prepare_data -o examples/data/sotu_bytes examples/data/sotu
rm -rf "$out"
train teacher
distill=(teacher.checkpoint="$out/teacher" training.steps="$steps" optimizer.lr=1e-3
         optimizer.warmup_steps=5 distill.lm_weight=0.5 distill.logit_weight=1.0
         distill.temperature=2.0 distill.teacher_top_k=32)
echo "== teacher cache"
start=$(date +%s.%N)
mpirun --oversubscribe -np 2 "$build"/tools/engine_teacher_cache configs/tiny.yaml "${distill[@]}" \
  --out "$out/teacher_cache" | tail -n 4
awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }' >"$out/teacher_cache/wall_seconds"
student scratch
student attn-reset model.init.from="$out/teacher" "model.init.reset=[layers.*.attn.*]" \
  "model.freeze=[layers.*.mlp.*]" distill.activation_weight=0.1 "distill.activation_points=[mixer_output]"
student layer2-reset model.init.from="$out/teacher" "model.init.reset=[layers.2.*]" \
  "model.lr_scales=[layers.2.*=1]" "model.freeze=['*']" distill.activation_weight=0.1 \
  "distill.activation_pairs=[layers.2.block_output=layers.2.block_output]"
for window in 16 64; do
  student window$window model.init.from="$out/teacher" model.sliding_window=$window \
    distill.activation_weight=0.1 "distill.activation_points=[mixer_output]"
done
tools/python examples/report.py "$out" "$results"
