#!/usr/bin/env bash
# tests/cli/bad_input.sh: bad input through the real binaries. Each case must end with
# exactly one line on stderr, starting "error:" and naming the culprit, exit code 2, and
# no crash, abort or stack dump. A checkpoint saved before is left untouched.
# Usage: bad_input.sh ENGINE_TRAIN ENGINE_PREPARE_DATA CORPUS_PREFIX CONFIGS_DIR
set -u
train=$1 prepare=$2 corpus=$3 configs=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect NAME CULPRIT -- COMMAND...: the command fails cleanly and its error names CULPRIT.
expect() {
  local name=$1 culprit=$2
  shift 3
  "$@" >"$work/out" 2>"$work/err"
  local code=$?
  local lines
  lines=$(wc -l <"$work/err")
  if [ "$code" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -q "^error: " "$work/err" ||
     ! grep -qF -- "$culprit" "$work/err" || grep -qiE "terminate|abort|core dumped|backtrace" "$work/err"; then
    echo "FAIL $name: exit $code, stderr:"; sed 's/^/    /' "$work/err"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(cat "$work/err")"
  fi
}

base=(data.paths="[$corpus]" run.dir="$work/run" runtime.peak_gflops=100)

printf 'training:\n  stpes: 5\n' >"$work/unknown.yaml"
expect "unknown key" "did you mean 'training.steps'" -- "$train" "$work/unknown.yaml" "${base[@]}"

printf 'optimizer:\n  lr: fast\n' >"$work/type.yaml"
expect "wrong type" "type.yaml:2: optimizer.lr expects a number, got 'fast'" -- "$train" "$work/type.yaml" "${base[@]}"

expect "profile steps" "logging.profile_steps must be [first, last]" -- "$train" "$configs/tiny.yaml" \
  "${base[@]}" "logging.profile_steps=[5]"

printf 'optimizer:\n  schedule: # cosine\n' >"$work/empty_choice.yaml"
expect "empty choice (found by fuzz_config)" "optimizer.schedule = '' is not one of: cosine" -- \
  "$train" "$work/empty_choice.yaml" "${base[@]}"

expect "missing config" "cannot open config file '$work/none.yaml'" -- "$train" "$work/none.yaml"

expect "missing data file" "$work/absent.idx" -- "$train" "$configs/tiny.yaml" "${base[@]}" \
  data.paths="[$work/absent]"

cp "$corpus.bin" "$work/magic.bin"
printf 'NOTMAGIC!' | cat - <(tail -c +10 "$corpus.idx") >"$work/magic.idx"
expect "corrupt idx (wrong magic)" "corrupt index file '$work/magic.idx': wrong magic" -- \
  "$train" "$configs/tiny.yaml" "${base[@]}" data.paths="[$work/magic]"

cp "$corpus.bin" "$work/short.bin"
head -c 100 "$corpus.idx" >"$work/short.idx"
expect "corrupt idx (truncated)" "corrupt index file '$work/short.idx': truncated" -- \
  "$train" "$configs/tiny.yaml" "${base[@]}" data.paths="[$work/short]"

expect "malformed override" "malformed override 'training.steps'" -- \
  "$train" "$configs/tiny.yaml" "${base[@]}" training.steps
expect "override of unknown key" "did you mean 'optimizer.lr'" -- \
  "$train" "$configs/tiny.yaml" "${base[@]}" optimizer.lrr=1
expect "override with wrong type" "training.steps expects an integer, got 'ten'" -- \
  "$train" "$configs/tiny.yaml" "${base[@]}" training.steps=ten
expect "unknown flag" "unrecognised option '--fast'" -- "$train" "$configs/tiny.yaml" --fast
expect "invalid layout" "world size 1 is not divisible by tensor x pipeline = 3 x 1" -- \
  "$train" "$configs/tiny.yaml" "${base[@]}" parallel.tensor=3
expect "cuda on a machine without a GPU" "runtime.device=cuda: no GPU is visible to this process" -- \
  "$train" "$configs/tiny.yaml" "${base[@]}" runtime.device=cuda
expect "pipeline split" "parallel.pipeline_split sums to 3 layers but model.layers=2" -- \
  mpirun -q --oversubscribe -np 2 "$train" "$configs/tiny.yaml" "${base[@]}" parallel.pipeline=2 \
  model.layers=2 "parallel.pipeline_split=[1,2]"
expect "distillation pairs crossing stages" "cannot be split over 2 pipeline stages" -- \
  mpirun -q --oversubscribe -np 2 "$train" "$configs/tiny.yaml" "${base[@]}" parallel.pipeline=2 \
  model.layers=2 distill.activation_weight=0.1 \
  "distill.activation_pairs=[layers.0.block_output=layers.1.block_output,layers.1.block_output=layers.0.block_output]"
expect "missing checkpoint" "checkpoint.load: '$work/nowhere'" -- \
  "$train" "$configs/tiny.yaml" "${base[@]}" checkpoint.load="$work/nowhere"
expect "prepare: missing input" "input '$work/nothing.txt' does not exist" -- \
  "$prepare" -o "$work/out" "$work/nothing.txt"

# A checkpoint saved earlier survives a later run that fails on bad input.
small=(model.layers=1 model.hidden=32 model.heads=2 model.kv_heads=1 model.ffn_hidden=64
       data.seq_len=16 training.micro_batch=2 training.global_batch=2 training.eval_every=0)
if "$train" "$configs/tiny.yaml" "${base[@]}" "${small[@]}" training.steps=2 >/dev/null 2>&1; then
  saved="$work/run/checkpoints/step_00000002"
  sum_before=$(cat "$saved"/* | md5sum)
  expect "bad resume keeps checkpoint" "seed" -- "$train" "$configs/tiny.yaml" "${base[@]}" \
    "${small[@]}" training.steps=4 seed=99 checkpoint.load="$work/run"
  if [ "$(cat "$saved"/* | md5sum)" != "$sum_before" ]; then
    echo "FAIL: the saved checkpoint changed"; failures=$((failures + 1))
  fi
else
  echo "FAIL: the small training run did not complete"; failures=$((failures + 1))
fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
