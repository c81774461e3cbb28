#!/usr/bin/env bash
# tests/cli/teacher_cache.sh: engine_teacher_cache and students reading its cache, end to end.
#  1. A float64 cache written under TP2; the student of configs/consistency_distill.yaml (logit,
#     LM and activation losses) trained from it under TP1, TP2, STP2, PP2 and DP2 equals the same
#     student distilled online with the same top k (TP1), every step's loss, terms, gradients
#     and activations within 1e-12 (engine_consistency --reference-key).
#  2. The ghost tail: the same student from the cache agrees with itself across those layouts.
#  3. A cache written under DP2, killed (kill -9) midway and resumed, is byte for byte the cache
#     written in one go; --info tells its size and bytes per token.
#  4. A student from the cache alone says it loads no teacher weights (bench_distill measures
#     its peak: no teacher weights there).
#  5. The validation samples' entries (DIR/valid): a student equal to its teacher (the same
#     seed and shape, learning rate 0) with the whole vocabulary cached in float64 has a logit
#     loss, training and held-out (valid_logit_loss), of zero within 1e-12 under TP1 and TP2; a
#     sample read from the wrong place would not be.
#  6. A teacher from a checkpoint with activation losses: the student from the cache (its
#     teacher built headless, up to its last captured layer, from the checkpoint) equals the
#     same student distilled online, float64, within 1e-12 under TP1 and PP2.
# Usage: teacher_cache.sh BIN_DIR CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
bin=$1 corpus=$2 configs=$3
cache=$bin/engine_teacher_cache consistency=$bin/engine_consistency train=$bin/engine_train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
config=$configs/consistency_distill.yaml
mpi=(mpirun -q --oversubscribe)
exact=(data.paths="[$corpus]" model.dtype=float64 distill.teacher_top_k=20)

echo "== 1. float64 cache (TP2) against online top-k distillation (TP1)"
"${mpi[@]}" -np 2 "$cache" "$config" "${exact[@]}" parallel.tensor=2 --out "$work/c64" \
  --values float64 --samples-per-shard 4 >"$work/write64.log"
"${mpi[@]}" -np 2 "$consistency" "$config" "${exact[@]}" teacher.cache="$work/c64" \
  --reference-key teacher.cache= --layouts TP1,TP1,TP2,STP2,PP2,DP2 --tolerance 1e-12 \
  --out "$work/cons64" | tee "$work/cons64.log"

echo "== 2. the ghost tail across layouts"
"${mpi[@]}" -np 2 "$consistency" "$config" "${exact[@]}" teacher.cache="$work/c64" \
  distill.top_k_tail=ghost --layouts TP1,TP2,STP2,PP2,DP2 --out "$work/ghost" | tee "$work/ghost.log"

echo "== 3. killed midway and resumed equals written in one go"
args=("$config" data.paths="[$corpus]" distill.teacher_top_k=8 parallel.data=2 --samples 3000
      --samples-per-shard 6)
"${mpi[@]}" -np 2 "$cache" "${args[@]}" --out "$work/whole" >"$work/whole.log"
shards=$(ls "$work/whole"/shard_*.bin | wc -l)
"${mpi[@]}" -np 2 "$cache" "${args[@]}" --out "$work/killed" >"$work/killed.log" 2>&1 &
for _ in $(seq 2000); do
  [ "$(ls "$work/killed"/shard_*.bin 2>/dev/null | wc -l)" -ge 4 ] && break
  sleep 0.01
done
pkill -9 -f "engine_teacher_cache .*--out $work/killed" || true
wait || true
written=$(ls "$work/killed"/shard_*.bin 2>/dev/null | wc -l)
echo "killed with $written of $shards shards written"
if [ "$written" -lt 1 ] || [ "$written" -ge "$shards" ]; then
  echo "FAIL: the writer was not stopped midway ($written of $shards shards)"
  exit 1
fi
"${mpi[@]}" -np 2 "$cache" "${args[@]}" --out "$work/killed" --resume >"$work/resumed.log"
diff -r "$work/whole" "$work/killed"
echo "ok   the resumed cache is byte for byte the one written in one go"
"$cache" --info "$work/whole" | tee "$work/info.log"
grep -q "shards $shards of $shards written" "$work/info.log"
grep -q "bytes per token" "$work/info.log"

echo "== 4. a student from the cache alone"
"$train" "$config" data.paths="[$corpus]" distill.teacher_top_k=8 distill.activation_weight=0 \
  teacher.cache="$work/whole" run.dir="$work/student" training.steps=2 >"$work/student.log"
grep -q "no teacher weights are loaded" "$work/student.log"
echo "== 5. the held-out logit loss of a student equal to its teacher"
same=("$configs/tiny.yaml" data.paths="[$corpus]" model.layers=1 model.hidden=32 model.heads=2
      model.kv_heads=1 model.ffn_hidden=64 data.seq_len=16 training.micro_batch=2
      training.global_batch=4 training.steps=2 training.eval_every=1 training.eval_batches=2
      training.log_every=1 model.dtype=float64 distill.logit_weight=1 distill.teacher_top_k=256
      optimizer.lr=0 optimizer.min_lr=0 optimizer.warmup_steps=0 runtime.peak_gflops=1)
"$cache" "${same[@]}" --out "$work/same" --values float64 >"$work/same.log"
[ -e "$work/same/valid/cache.json" ] || { echo "FAIL: no validation entries written"; exit 1; }
for np in 1 2; do
  "${mpi[@]}" -np $np "$train" "${same[@]}" parallel.tensor=$np teacher.cache="$work/same" \
    run.dir="$work/same_tp$np" >"$work/same_tp$np.log"
  python3 - "$work/same_tp$np/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
held = [r["valid_logit_loss"] for r in rows if "valid_logit_loss" in r]
trained = [r["logit_loss"] for r in rows if "logit_loss" in r]
assert len(held) == 2 and len(trained) == 2, (held, trained)
assert all(abs(x) < 1e-12 for x in held + trained), (held, trained)
print("ok   valid_logit_loss", held, "logit_loss", trained)
PY
done
echo "== 6. a checkpoint teacher, its logits cached, its activations online"
"$train" "$configs/consistency.yaml" data.paths="[$corpus]" model.vocab_size=300 model.hidden=96 \
  model.layers=3 model.ffn_hidden=192 "model.layer_windows=[]" model.dtype=float64 \
  training.steps=1 run.dir="$work/teacher_run" >"$work/teacher_run.log"
checkpointed=(data.paths="[$corpus]" model.dtype=float64 distill.teacher_top_k=20
              teacher.checkpoint="$work/teacher_run")
"${mpi[@]}" -np 2 "$cache" "$config" "${checkpointed[@]}" parallel.pipeline=2 \
  --out "$work/ckpt_cache" --values float64 >"$work/ckpt_cache.log"
grep -q "retort checkpoint, index.json crc32c" "$work/ckpt_cache/cache.json"
"${mpi[@]}" -np 2 "$consistency" "$config" "${checkpointed[@]}" teacher.cache="$work/ckpt_cache" \
  --reference-key teacher.cache= --layouts TP1,TP1,PP2 --tolerance 1e-12 --out "$work/cons_ckpt" |
  tee "$work/cons_ckpt.log"

echo "ok   every check passed"
