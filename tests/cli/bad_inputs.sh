#!/usr/bin/env bash
# tests/cli/bad_inputs.sh: the bad-input sweep. Mistakes a new user could make, run through the
# real programs (engine_train, engine_prepare_data, engine_convert, engine_generate,
# engine_consistency). A bad input must end with exactly one line on stderr, starting "error:"
# and naming the key, file or number at fault, and exit code 2; a doubtful one runs and warns.
# Where a command could lose work, the files on disk are checked after it. Any exit code above
# 2, or an abort, backtrace or uncaught exception, fails the sweep whatever the case expects.
# Prints a table of command, exit code and first line of stderr.
# In the table, BASE and SMALL stand for the common overrides (the data, a run folder; a small
# model) defined below, WORK for the sweep's temporary folder.
# Usage: bad_inputs.sh BIN_DIR CORPUS_PREFIX CONFIGS_DIR [GROUP ...]
#   groups: config data output checkpoint convert prepare generate consistency (default: all)
set -u
bin=$1 corpus=$2 configs=$3
shift 3
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(config data output checkpoint convert prepare generate consistency)
train=$bin/engine_train prepare=$bin/engine_prepare_data convert=$bin/engine_convert
generate=$bin/engine_generate consistency=$bin/engine_consistency
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
rows=()

fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}

# run NAME -- COMMAND...: runs it, keeps stdout/stderr in $work/out, $work/err, its exit code in
# $code, adds a table row, and fails on a crash whatever the case expects.
run() {
  local name=$1
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  code=$?
  local first shown
  first=$(head -n 1 "$work/err")
  shown="$*"
  shown=${shown//"${small[*]}"/SMALL}
  shown=${shown//"${base[*]}"/BASE}
  shown=${shown//$work/WORK}
  shown=${shown//$bin\//}
  rows+=("| $name | \`${shown:0:160}\` | $code | ${first//$work/WORK} |")
  if [ "$code" -gt 2 ] || grep -qiE "terminate called|abort|core dumped|backtrace|filesystem_error" "$work/err"; then
    fail "$name: exit $code or a crash:"
    sed 's/^/    /' "$work/err"
    return 1
  fi
}

# expect NAME CULPRIT -- COMMAND...: one "error:" line naming CULPRIT, exit code 2.
expect() {
  local name=$1 culprit=$2
  shift 2
  run "$name" "$@" || return 1
  if [ "$code" -ne 2 ] || [ "$(wc -l <"$work/err")" -ne 1 ] || ! grep -q "^error: " "$work/err" ||
     ! grep -qF -- "$culprit" "$work/err"; then
    fail "$name: exit $code, expected 2 and one error line naming '$culprit'; stderr:"
    sed 's/^/    /' "$work/err"
    return 1
  fi
  echo "ok   $name"
}

# warns NAME TEXT -- COMMAND...: runs to the end (exit 0) with a "warning:" line holding TEXT.
warns() {
  local name=$1 text=$2
  shift 2
  run "$name" "$@" || return 1
  if [ "$code" -ne 0 ] || ! grep "^warning: " "$work/err" "$work/out" | grep -qF -- "$text"; then
    fail "$name: exit $code, expected 0 and a warning holding '$text'; stderr:"
    sed 's/^/    /' "$work/err"
    return 1
  fi
  echo "ok   $name"
}

# succeeds NAME -- COMMAND...: exit 0.
succeeds() {
  local name=$1
  shift
  run "$name" "$@" || return 1
  if [ "$code" -ne 0 ]; then
    fail "$name: exit $code, expected 0; stderr:"
    sed 's/^/    /' "$work/err"
    return 1
  fi
  echo "ok   $name"
}

# same_files NAME DIR SUM: DIR's files still have checksum SUM (from tree_sum).
tree_sum() { (cd "$1" && find . -type f | sort | xargs md5sum) | md5sum; }
same_files() {
  if [ "$(tree_sum "$2")" != "$3" ]; then fail "$1: the files of $2 changed"; else echo "ok   $1: files unchanged"; fi
}

base=(data.paths="[$corpus]" run.dir="$work/run" runtime.peak_gflops=100)
small=(model.layers=1 model.hidden=32 model.heads=2 model.kv_heads=1 model.ffn_hidden=64
       data.seq_len=16 training.micro_batch=2 training.global_batch=2 training.eval_every=0
       runtime.peak_gflops=100 data.paths="[$corpus]")
# small_run DIR STEPS [key=value ...]: a small model trained STEPS steps into run directory DIR.
small_run() {
  local dir=$1 steps=$2
  shift 2
  "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$dir" training.steps="$steps" "$@" \
    >"$work/small.log" 2>&1 || { cat "$work/small.log"; fail "the small training run into $dir"; }
}
wanted() { [[ " ${groups[*]} " == *" $1 "* ]]; }

if wanted config; then
  printf 'training:\n  stpes: 5\n' >"$work/unknown.yaml"
  expect "unknown key" "did you mean 'training.steps'" -- "$train" "$work/unknown.yaml" "${base[@]}"
  printf 'optimizer:\n  lr: fast\n' >"$work/type.yaml"
  expect "wrong type" "type.yaml:2: optimizer.lr expects a number, got 'fast'" -- \
    "$train" "$work/type.yaml" "${base[@]}"
  printf 'optimizer:\n  schedule: # cosine\n' >"$work/empty_choice.yaml"
  expect "empty choice (found by fuzz_config)" "optimizer.schedule = '' is not one of: cosine" -- \
    "$train" "$work/empty_choice.yaml" "${base[@]}"
  expect "missing config" "cannot open config file '$work/none.yaml'" -- "$train" "$work/none.yaml"
  expect "bf16 DP sums without bf16" "parallel.dp_reduce_dtype: bfloat16 needs model.dtype: bfloat16" -- \
    "$train" "$configs/tiny.yaml" "${base[@]}" parallel.dp_reduce_dtype=bfloat16
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
  expect "profile steps, one entry" "logging.profile_steps must be [first, last] (steps count from 1) or empty; it has 1 entries" -- \
    "$train" "$configs/tiny.yaml" "${base[@]}" "logging.profile_steps=[5]"
  expect "profile steps, first after last" "logging.profile_steps = [5, 2]: must be [first, last] with 1 <= first <= last" -- \
    "$train" "$configs/tiny.yaml" "${base[@]}" "logging.profile_steps=[5,2]"
  expect "profile steps beyond training.steps" "logging.profile_steps = [50, 60] starts after the last step (training.steps=5)" -- \
    "$train" "$configs/tiny.yaml" "${base[@]}" training.steps=5 "logging.profile_steps=[50,60]"
  expect "pipeline split" "parallel.pipeline_split sums to 3 layers but model.layers=2" -- \
    mpirun -q --oversubscribe -np 2 "$train" "$configs/tiny.yaml" "${base[@]}" parallel.pipeline=2 \
    model.layers=2 "parallel.pipeline_split=[1,2]"
  expect "distillation pairs crossing stages" "cannot be split over 2 pipeline stages" -- \
    mpirun -q --oversubscribe -np 2 "$train" "$configs/tiny.yaml" "${base[@]}" parallel.pipeline=2 \
    model.layers=2 distill.activation_weight=0.1 \
    "distill.activation_pairs=[layers.0.block_output=layers.1.block_output,layers.1.block_output=layers.0.block_output]"
fi

if wanted data; then
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
  # The shipped byte-level corpus holds ids up to 122 ('z'): a 100-id model cannot take them,
  # on one rank or two (where the TP2 vocabulary shards used to take them silently).
  expect "token ids above model.vocab_size" "data file '$corpus.bin' holds token ids up to" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/vocab1" model.vocab_size=100
  grep -qF "but model.vocab_size is 100" "$work/err" || fail "the vocabulary error does not name model.vocab_size=100"
  expect "token ids above model.vocab_size under TP2" "data file '$corpus.bin' holds token ids up to" -- \
    mpirun -q --oversubscribe -np 2 "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/vocab2" \
    model.vocab_size=100 parallel.tensor=2
  [ -e "$work/vocab2/metrics.jsonl" ] && fail "TP2 trained on out-of-range ids: $work/vocab2/metrics.jsonl exists"
  # A teacher with a smaller vocabulary than the student's: its limit names the teacher.
  printf 'The quick brown fox.\n' >"$work/ascii.txt"
  "$prepare" --quiet -o "$work/ascii" "$work/ascii.txt" >/dev/null
  small_run "$work/teacher" 1 model.vocab_size=121 data.paths="[$work/ascii]"  # 'x' is 120
  expect "token ids above the teacher's vocabulary" "but the teacher's vocab_size is 121" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/student" \
    teacher.checkpoint="$work/teacher" distill.activation_weight=1 "distill.activation_points=[mixer_output]"
fi

if wanted output; then
  printf 'a file\n' >"$work/afile"
  expect "run.dir under a file" "cannot create '$work/afile/run'" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/afile/run" training.steps=1
  expect "run.dir in /proc" "cannot create '/proc/retort_run'" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir=/proc/retort_run training.steps=1
  expect "run.dir under a file, TP2" "cannot create '$work/afile/run2'" -- \
    mpirun -q --oversubscribe -np 2 "$train" "$configs/tiny.yaml" "${small[@]}" \
    run.dir="$work/afile/run2" training.steps=1 parallel.tensor=2
  expect "prepare output under a file" "cannot create '$work/afile/data'" -- \
    "$prepare" --quiet -o "$work/afile/data/out" "$work/afile"
  small_run "$work/exportable" 1
  expect "export into /proc" "cannot create '/proc/retort_export'" -- \
    "$convert" export "$work/exportable/checkpoints/step_00000001" /proc/retort_export
fi

if wanted checkpoint; then
  expect "missing checkpoint" "checkpoint.load: '$work/nowhere'" -- \
    "$train" "$configs/tiny.yaml" "${base[@]}" checkpoint.load="$work/nowhere"
  # A checkpoint saved earlier survives a later run that fails on bad input.
  small_run "$work/saved" 2
  sum=$(tree_sum "$work/saved")
  expect "bad resume keeps checkpoint" "seed" -- "$train" "$configs/tiny.yaml" "${small[@]}" \
    run.dir="$work/saved" training.steps=4 seed=99 checkpoint.load="$work/saved"
  same_files "bad resume keeps checkpoint" "$work/saved" "$sum"
  # A checkpoint folder without its index.json is reported, never taken for "no checkpoint".
  small_run "$work/damaged" 2
  rm "$work/damaged/checkpoints/step_00000002/index.json"
  sum=$(tree_sum "$work/damaged")
  expect "load auto, index.json missing" "no checkpoint of '$work/damaged' loads" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/damaged" training.steps=4 \
    checkpoint.load=auto
  grep -qF "step_00000002: checkpoint '$work/damaged/checkpoints/step_00000002': no index.json" "$work/out" ||
    fail "load auto did not report the folder without index.json"
  same_files "load auto, index.json missing" "$work/damaged" "$sum"
  succeeds "load auto, fresh start chosen with checkpoint.load=''" -- "$train" "$configs/tiny.yaml" \
    "${small[@]}" run.dir="$work/damaged" training.steps=1 checkpoint.load=
  # A profile window before the step a run resumes at: warned, not silently traceless.
  warns "profile steps before the resumed step" "starts before step 3, where this run resumes" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/saved" training.steps=3 \
    checkpoint.load=auto "logging.profile_steps=[1,2]"
fi

if wanted convert; then
  small_run "$work/c" 2
  ckpt=$work/c/checkpoints/step_00000002
  succeeds "export, sharded" -- "$convert" export "$ckpt" "$work/hf" --shard-size 20000
  ls "$work/hf" | grep -q "model-00001-of-" || fail "the first export is not sharded"
  # 1. Import never overwrites a trained checkpoint unless asked.
  sum=$(tree_sum "$ckpt")
  expect "import over an existing checkpoint" "'$ckpt' is an existing checkpoint" -- \
    "$convert" import "$work/hf" "$ckpt"
  same_files "import over an existing checkpoint" "$ckpt" "$sum"
  sum=$(tree_sum "$work/c")
  expect "import over a run directory" "'$work/c' exists and is not a Retort checkpoint" -- \
    "$convert" import "$work/hf" "$work/c" --force
  same_files "import over a run directory" "$work/c" "$sum"
  # Import beside a run's checkpoints leaves `latest` alone unless --set-latest.
  succeeds "import beside a run's checkpoints" -- "$convert" import "$work/hf" "$work/c/checkpoints/imported"
  [ "$(cat "$work/c/checkpoints/latest")" = step_00000002 ] || fail "import moved checkpoints/latest"
  grep -qF "naming 'step_00000002'" "$work/out" || fail "import did not say where latest points"
  succeeds "import --force --set-latest" -- "$convert" import "$work/hf" "$work/c/checkpoints/imported" \
    --force --set-latest
  [ "$(cat "$work/c/checkpoints/latest")" = imported ] || fail "--set-latest did not move latest"
  # 2. Export over an earlier export: what is read back is exactly what was written.
  succeeds "export over an earlier sharded export" -- "$convert" export "$ckpt" "$work/hf"
  files=$(cd "$work/hf" && ls | tr '\n' ' ')
  [ "$files" = "config.json model.safetensors " ] || fail "the export folder holds '$files'"
  "$convert" export "$ckpt" "$work/fresh" >/dev/null
  cmp -s "$work/hf/model.safetensors" "$work/fresh/model.safetensors" ||
    fail "the export over an earlier one differs from a fresh export"
  expect "export --shard-size -5" "--shard-size: must be a positive number of bytes, got -5" -- \
    "$convert" export "$ckpt" "$work/hf2" --shard-size -5
  expect "export --shard-size 0" "--shard-size: must be a positive number of bytes, got 0" -- \
    "$convert" export "$ckpt" "$work/hf2" --shard-size 0
fi

if wanted prepare; then
  expect "prepare: missing input" "input '$work/nothing.txt' does not exist" -- \
    "$prepare" -o "$work/out" "$work/nothing.txt"
  : >"$work/empty.txt"
  warns "prepare: an empty file" "1 of the 1 documents are empty" -- \
    "$prepare" --quiet -o "$work/empty" "$work/empty.txt"
  printf '{"text": "one"}\n{"text": "  "}\n{"text": "three"}\n' >"$work/docs.jsonl"
  warns "prepare: an empty document in a .jsonl" "1 of the 3 documents are empty" -- \
    "$prepare" --quiet -o "$work/docs" "$work/docs.jsonl"
  cp "$prepare" "$work/program.txt"
  expect "prepare: a binary file" "input '$work/program.txt' is not text (a NUL byte at offset" -- \
    "$prepare" --quiet -o "$work/binary" "$work/program.txt"
  [ -e "$work/binary.bin" ] && fail "prepare wrote a dataset from a binary file"
  head -c 4096 "$prepare" >"$work/small_program.txt"
  succeeds "prepare: a binary file with --allow-binary" -- \
    "$prepare" --quiet --allow-binary -o "$work/binary" "$work/small_program.txt"
fi

if wanted generate; then
  small_run "$work/g" 1
  long=$(printf 'The state of the union is strong. %.0s' 1 2 3)  # 102 bytes, 16 trained positions
  warns "generate: a prompt longer than the trained context" \
    "the prompt is 102 tokens, longer than the 16 positions the model was trained on" -- \
    "$generate" "$work/g" --prompt "$long" --max-tokens 2 --tokenizer bytes
  succeeds "generate: the same prompt with --context" -- \
    "$generate" "$work/g" --prompt "$long" --max-tokens 2 --tokenizer bytes --context 16
  grep -q "^warning:" "$work/err" && fail "generate warned although --context was given"
  expect "generate: cuda on a machine without a GPU" "--device cuda: no GPU is visible to this process" -- \
    "$generate" "$work/g" --prompt "The" --max-tokens 2 --tokenizer bytes --device cuda
  expect "generate: an unknown device" "--device 'tpu': cpu or cuda" -- \
    "$generate" "$work/g" --prompt "The" --max-tokens 2 --tokenizer bytes --device tpu
fi

if wanted consistency; then
  expect "consistency: a bad layout after a good one" "parallel.pipeline_split" -- \
    mpirun -q --oversubscribe -np 4 "$consistency" "$configs/consistency.yaml" data.paths="[$corpus]" --out "$work/cons" \
    --layouts TP1,PP4:1-2
  grep -q "^ran TP1" "$work/out" && fail "engine_consistency ran TP1 before rejecting PP4:1-2"
  expect "consistency: a layout on an unknown device" "layout 'TP2@tpu': the device after '@' is cpu or cuda" -- \
    mpirun -q --oversubscribe -np 2 "$consistency" "$configs/consistency.yaml" data.paths="[$corpus]" --out "$work/cons" \
    --layouts TP1,TP2@tpu
fi

echo
echo "| case | command | exit | first line of stderr |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
