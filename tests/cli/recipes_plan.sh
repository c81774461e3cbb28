#!/usr/bin/env bash
# tests/cli/recipes_plan.sh ENGINE_TRAIN CONFIGS: the distillation recipes of configs/recipes/
# resolve (--dry-run: the student's parameter count equals the model's public figure) and plan
# on one node of 8 H100 (--plan: a layout that fits, its memory and step time printed).
set -euo pipefail
train=$1 configs=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
check() {  # RECIPE PARAMETERS
  local recipe=$configs/recipes/$1.yaml out
  out=$("$train" "$recipe" --dry-run) || fail "$1 --dry-run exited $?"
  grep -q "^parameters: *$2 " <<<"$out" || fail "$1: $(grep '^parameters' <<<"$out"), want $2"
  out=$("$train" "$recipe" --plan --nodes 1 --gpus-per-node 8 --device h100) || fail "$1 --plan"
  grep -q "^plan: TP1 x PP1 x DP8 on 1 node(s) x 8 h100" <<<"$out" || fail "$1: no plan line"
  grep -qE "^memory per rank .*: [0-9.]+ GB of 80 GB" <<<"$out" || fail "$1: no memory line"
  grep -qE "^  teacher: [0-9.]+ GB" <<<"$out" || fail "$1: the teacher is not counted"
  grep -qE "^time per step: [0-9.]+ s" <<<"$out" || fail "$1: no step time"
  echo "ok $1"
}
check llama31_8b_to_llama32_1b 1235814400  # Llama 3.2 1B: 1.24B
check qwen3_8b_to_qwen3_0.6b 596049920     # Qwen3 0.6B: 0.6B, 0.44B outside the embedding
