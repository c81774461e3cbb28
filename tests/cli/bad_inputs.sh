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
#   groups: config data output checkpoint convert prepare generate consistency plan tools
#           teacher_cache
#   (default: all)
set -u
bin=$1 corpus=$2 configs=$3
shift 3
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(config data output checkpoint convert prepare generate consistency plan tools teacher_cache)
train=$bin/engine_train prepare=$bin/engine_prepare_data convert=$bin/engine_convert
generate=$bin/engine_generate consistency=$bin/engine_consistency cache=$bin/engine_teacher_cache
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tools=$(cd "$configs/../tools" && pwd)
work=$(mktemp -d)
mounted=()
trap 'for m in "${mounted[@]}"; do umount "$m" 2>/dev/null; done; rm -rf "$work"' EXIT
failures=0
rows=()
declare -A damaged_sum

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

# says NAME TEXT -- COMMAND...: runs to the end (exit 0) and says TEXT (stdout or stderr).
says() {
  local name=$1 text=$2
  shift 2
  run "$name" "$@" || return 1
  if [ "$code" -ne 0 ] || ! cat "$work/out" "$work/err" | grep -qF -- "$text"; then
    fail "$name: exit $code, expected 0 and output holding '$text'; stdout and stderr:"
    sed 's/^/    /' "$work/out" "$work/err" | tail -n 20
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
  expect "llama3 RoPE without its original context" "model.rope_scaling=llama3 needs model.rope_original_context" -- \
    "$train" "$configs/tiny.yaml" "${base[@]}" model.rope_scaling=llama3 model.rope_factor=8
  expect "odd own head_dim" "model.head_dim=15 must be even for RoPE" -- \
    "$train" "$configs/tiny.yaml" "${base[@]}" model.head_dim=15
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
  expect "model.freeze with a glob that matches nothing" "model.freeze: pattern 'layers.*.mpl.*' matches no parameter" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/freeze" training.steps=1 "model.freeze=[layers.*.mpl.*]"
  [ -e "$work/freeze/metrics.jsonl" ] && fail "a freeze typo trained: $work/freeze/metrics.jsonl exists"
  expect "distill.teacher_top_k above the vocabulary" "distill.teacher_top_k=1000 is above the vocabulary" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/topk" distill.logit_weight=1 distill.teacher_top_k=1000
  expect "a micro-batch the machine cannot hold" "this run (the memory estimate engine_train --dry-run prints) needs" -- \
    "$train" "$configs/tiny.yaml" "${base[@]}" training.micro_batch=200000 training.global_batch=200000
  # Keys without effect in the run's setting are said once at start-up.
  says "model.fp32_residual in fp32" "model.fp32_residual has no effect" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/noeffect1" training.steps=1 model.fp32_residual=true
  says "runtime.gpus_per_node on the CPU" "runtime.gpus_per_node has no effect" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/noeffect2" training.steps=1 runtime.gpus_per_node=2
  says "parallel.gpu_transport=nccl on the CPU" "parallel.gpu_transport=nccl has no effect" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/noeffect3" training.steps=1 parallel.gpu_transport=nccl
  says "dp_reduce_dtype where the DP sum runs in shared memory" "parallel.dp_reduce_dtype=bfloat16 has no effect: the DP sum runs in shared memory" -- \
    mpirun -q --oversubscribe -np 2 "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/noeffect4" \
    training.steps=1 training.global_batch=4 parallel.data=2 model.dtype=bfloat16 parallel.dp_reduce_dtype=bfloat16
  says "activation_pairs with activation_weight 0" "distill.activation_pairs / activation_points have no effect" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/noeffect5" training.steps=1 \
    distill.logit_weight=1 "distill.activation_pairs=[layers.0.block_output=layers.0.block_output]"
  says "a model.lr_scales glob that matches nothing" "model.lr_scales: 'layers.*.mpl.*=2' matches no parameter" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/noeffect6" training.steps=1 "model.lr_scales=[layers.*.mpl.*=2]"
  says "model.freeze of everything" "leave no parameter to train" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/noeffect7" training.steps=1 "model.freeze=['*']"
fi

if wanted plan; then
  expect "--search without --plan" "--search is a --plan flag" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/search" --search
  [ -e "$work/search" ] && fail "--search without --plan started a run: $work/search exists"
  expect "--nodes without --plan" "--nodes is a --plan flag" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/nodes" --nodes 2
  [ -e "$work/nodes" ] && fail "--nodes without --plan started a run: $work/nodes exists"
  expect "--plan --search where no layout fits" "--plan --search: no layout of 1 ranks fits" -- \
    "$train" "$configs/tiny.yaml" --plan --search --memory-gb 0.000001
  expect "--plan where the layout does not fit" "--plan: the layout does not fit: stage 0 needs" -- \
    "$train" "$configs/tiny.yaml" --plan --memory-gb 0.000001
  expect "--plan --efficiency 2" "--efficiency 2: a fraction of the device's peak, at most 1" -- \
    "$train" "$configs/tiny.yaml" --plan --efficiency 2
  expect "--plan --tflops inf" "--tflops inf: must be a positive finite number" -- \
    "$train" "$configs/tiny.yaml" --plan --tflops inf
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
  # A .bin paired with another dataset's .idx.
  cp "$corpus.bin" "$work/mixed.bin"
  cp "$work/ascii.idx" "$work/mixed.idx"
  expect "a .bin with another dataset's .idx" "data file '$work/mixed.bin' holds" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/mixed_run" data.paths="[$work/mixed]"
  grep -qF "the two files are not one dataset" "$work/err" || fail "the .bin/.idx mismatch does not say so"
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
  # A run folder belongs to one run: a fresh run over another run's checkpoints and metrics
  # is refused and leaves them byte for byte; run.overwrite=true replaces them, saying what.
  small_run "$work/first" 2
  sum=$(tree_sum "$work/first")
  expect "a rerun into another run's folder" "run.dir '$work/first' holds another run" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/first" training.steps=2 model.hidden=64 model.heads=4
  same_files "a rerun into another run's folder" "$work/first" "$sum"
  expect "a rerun into another run's folder, TP2" "run.dir '$work/first' holds another run" -- \
    mpirun -q --oversubscribe -np 2 "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/first" \
    training.steps=1 parallel.tensor=2
  same_files "a rerun into another run's folder, TP2" "$work/first" "$sum"
  expect "a run from another folder's checkpoint into this one" "run.dir '$work/first' holds another run" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/first" training.steps=1 \
    checkpoint.load="$work/exportable/checkpoints/step_00000001"
  same_files "a run from another folder's checkpoint into this one" "$work/first" "$sum"
  grep -q "checkpoint.load=''" "$work/err" && fail "the rerun error advises a fresh start over the folder"
  says "run.overwrite=true replaces the old run and says what goes" "run.overwrite: removing $work/first/checkpoints/step_00000002" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/first" training.steps=1 run.overwrite=true
  [ -e "$work/first/checkpoints/step_00000002" ] && fail "run.overwrite left the old run's step 2"
  [ "$(grep -c '"step"' "$work/first/metrics.jsonl")" -eq 1 ] || fail "run.overwrite appended to the old metrics.jsonl"
  # A full disk and a read-only run folder: the reason named, no .partial folder left behind.
  if mkdir -p "$work/small_disk" && mount -t tmpfs -o size=64k tmpfs "$work/small_disk" 2>/dev/null; then
    mounted+=("$work/small_disk")
    expect "a full disk at the checkpoint" "no space left" -- \
      "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/small_disk/run" training.steps=1
    ls "$work/small_disk/run/checkpoints" 2>/dev/null | grep -q partial &&
      fail "a failed save left its .partial folder: $(ls "$work/small_disk/run/checkpoints")"
    mkdir -p "$work/ro_disk" && mount -t tmpfs -o size=16m tmpfs "$work/ro_disk" && mounted+=("$work/ro_disk")
    small_run "$work/ro_disk/run" 1
    mount -o remount,ro "$work/ro_disk"
    expect "a read-only run folder" "not writable" -- \
      "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/ro_disk/run" training.steps=2 checkpoint.load=auto
  else
    echo "skip a full disk and a read-only folder: cannot mount a tmpfs here"
  fi
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
  expect "resume with another data.seed" "read its data in the order of data seed 1234 but this run's is 5" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/saved" training.steps=4 data.seed=5 \
    checkpoint.load="$work/saved"
  same_files "resume with another data.seed" "$work/saved" "$sum"
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
  # A fresh start over them is refused too: it would write over that run.
  expect "a fresh start over a damaged run" "run.dir '$work/damaged' holds another run" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/damaged" training.steps=1 checkpoint.load=
  same_files "a fresh start over a damaged run" "$work/damaged" "$sum"
  # A profile window before the step a run resumes at: warned, not silently traceless.
  warns "profile steps before the resumed step" "starts before step 3, where this run resumes" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/saved" training.steps=3 \
    checkpoint.load=auto "logging.profile_steps=[1,2]"
  # A checkpoint records the dtype it was trained in; resuming in another says so.
  small_run "$work/dtype" 1
  says "resume in another dtype" "was trained in float32; this run goes on in bfloat16" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/dtype" training.steps=2 checkpoint.load=auto \
    model.dtype=bfloat16
  # A resume whose shape does not match: the reason on the error line.
  small_run "$work/shape" 1
  expect "load auto with another model shape" "the newest: checkpoint" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/shape" training.steps=2 checkpoint.load=auto \
    model.ffn_hidden=96
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
  # Hugging Face configs with values no model has: one line naming the key.
  edit_config() {  # DIR KEY VALUE (a JSON literal): a copy of $work/hf with config.json changed
    rm -rf "$1" && cp -r "$work/hf" "$1"
    "$tools/python" -c "import json,sys; p=sys.argv[1]+'/config.json'; c=json.load(open(p)); c[sys.argv[2]]=json.loads(sys.argv[3]); open(p,'w').write(json.dumps(c))" "$1" "$2" "$3"
  }
  edit_config "$work/hf_huge" vocab_size 1e12
  expect "import: vocab_size 1e12" "vocab_size 1e+12 is outside [1, 1e+09] (as model.vocab_size)" -- \
    "$convert" import "$work/hf_huge" "$work/imported_huge"
  [ -e "$work/imported_huge" ] && fail "a refused import wrote $work/imported_huge"
  expect "generate: vocab_size 1e12" "vocab_size 1e+12 is outside" -- \
    "$generate" "$work/hf_huge" --prompt "The" --max-tokens 2 --tokenizer bytes
  edit_config "$work/hf_big" vocab_size 1000000000
  expect "import: vocab_size 1e9 (more memory than the machine has)" "GB per process, but the machine has" -- \
    "$convert" import "$work/hf_big" "$work/imported_big"
  expect "generate: vocab_size 1e9 (more memory than the machine has)" "GB per process, but the machine has" -- \
    "$generate" "$work/hf_big" --prompt "The" --max-tokens 2 --tokenizer bytes
  edit_config "$work/hf_heads" num_attention_heads -2
  expect "import: negative heads" "num_attention_heads -2 is outside" -- \
    "$convert" import "$work/hf_heads" "$work/imported_heads"
  edit_config "$work/hf_layers" num_hidden_layers 0
  expect "import: no layers" "num_hidden_layers 0 is outside" -- \
    "$convert" import "$work/hf_layers" "$work/imported_layers"
  edit_config "$work/hf_longrope" rope_scaling '{"rope_type": "longrope", "factor": 4.0}'
  expect "import: a RoPE scaling Retort cannot compute" "rope_scaling.rope_type 'longrope' is not supported" -- \
    "$convert" import "$work/hf_longrope" "$work/imported_longrope"
  edit_config "$work/hf_partial" partial_rotary_factor 0.75
  expect "import: RoPE on part of each head (Phi-4-mini)" "partial_rotary_factor (RoPE on part of each head) is not supported" -- \
    "$convert" import "$work/hf_partial" "$work/imported_partial"
  rm -rf "$work/hf_nan" && cp -r "$work/hf" "$work/hf_nan"
  sed -i 's/"rms_norm_eps": [^,}]*/"rms_norm_eps": NaN/' "$work/hf_nan/config.json"
  expect "import: NaN in config.json" "config.json' is not valid JSON at byte" -- \
    "$convert" import "$work/hf_nan" "$work/imported_nan"
  # The exported config names the weights' type, so transformers' torch_dtype="auto" keeps it.
  succeeds "export --dtype BF16" -- "$convert" export "$ckpt" "$work/hf_bf16" --dtype BF16
  grep -q '"torch_dtype": "bfloat16"' "$work/hf_bf16/config.json" ||
    fail "export --dtype BF16 wrote $(grep torch_dtype "$work/hf_bf16/config.json")"
  # A tied model loaded into an untied student names the key.
  small_run "$work/tied" 1 model.tied_embeddings=true
  succeeds "export a tied model" -- "$convert" export "$work/tied/checkpoints/step_00000001" "$work/hf_tied"
  expect "a tied model into an untied student" "set model.tied_embeddings: true" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" run.dir="$work/untied" training.steps=1 model.init.from="$work/hf_tied"
fi

if wanted prepare; then
  printf 'Some text.\n' >"$work/some.txt"
  expect "prepare: --workers -1" "--workers -1: a count of processes" -- \
    "$prepare" -o "$work/out_w" --workers -1 "$work/some.txt"
  expect "prepare: --chunk-mb 0" "--chunk-mb 0: a size in MB above 0" -- \
    "$prepare" -o "$work/out_c" --chunk-mb 0 "$work/some.txt"
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

if wanted generate; then
  # Under mpirun, an error every rank finds shows its one line every time, once, exit 2, and
  # the ranks end cleanly: no MPI_ABORT banner (mpirun without -q, as a user runs it).
  for np in 2 4; do
    shown=0
    for _ in $(seq 20); do
      mpirun --oversubscribe -np "$np" "$generate" "$work/nowhere" --prompt "The" --max-tokens 2 \
        --tokenizer bytes >/dev/null 2>"$work/gen_err"
      gen_code=$?
      [ "$gen_code" -eq 2 ] && [ "$(grep -c "^error: " "$work/gen_err")" -eq 1 ] &&
        ! grep -q "MPI_ABORT" "$work/gen_err" && shown=$((shown + 1))
    done
    rows+=("| generate under mpirun -np $np, 20 runs | \`mpirun -np $np engine_generate WORK/nowhere ...\` | 2 | the line in $shown of 20 |")
    if [ "$shown" -eq 20 ]; then echo "ok   generate under mpirun -np $np: the error line in 20 of 20 runs"; else
      fail "generate under mpirun -np $np: exit 2 with one error line in $shown of 20 runs; the last stderr:"
      sed 's/^/    /' "$work/gen_err"
    fi
  done
fi

if wanted tools; then
  expect "sim_hosts --wire 1ms 1gbit" "--wire DELAY_MS '1ms' is not a number" -- \
    "$tools/sim_hosts.sh" run 2 1 --wire 1ms 1gbit -- true
  expect "sim_hosts --wire abc 1000" "--wire DELAY_MS 'abc' is not a number" -- \
    "$tools/sim_hosts.sh" run 2 1 --wire abc 1000 -- true
  expect "sim_hosts without arguments" "the first argument is run, agent or kill" -- "$tools/sim_hosts.sh"
  expect "sim_hosts run without HOSTS" "run needs HOSTS SLOTS" -- "$tools/sim_hosts.sh" run
  expect "sim_hosts run with 0 hosts" "HOSTS '0' is not a positive whole number" -- "$tools/sim_hosts.sh" run 0 1 -- true
  expect "gpu_check --pack without a folder" "--pack needs a folder" -- "$tools/gpu_check.sh" --pack
fi

if wanted consistency; then
  expect "consistency: a bad layout after a good one" "parallel.pipeline_split" -- \
    mpirun -q --oversubscribe -np 4 "$consistency" "$configs/consistency.yaml" data.paths="[$corpus]" --out "$work/cons" \
    --layouts TP1,PP4:1-2
  grep -q "^ran TP1" "$work/out" && fail "engine_consistency ran TP1 before rejecting PP4:1-2"
  expect "consistency: a layout on an unknown device" "layout 'TP2@tpu': the device after '@' is cpu or cuda" -- \
    mpirun -q --oversubscribe -np 2 "$consistency" "$configs/consistency.yaml" data.paths="[$corpus]" --out "$work/cons" \
    --layouts TP1,TP2@tpu
  expect "consistency: no micro-batch a step" "--accumulation 0: a step takes at least one micro-batch" -- \
    mpirun -q --oversubscribe -np 2 "$consistency" "$configs/consistency.yaml" data.paths="[$corpus]" --out "$work/cons" \
    --layouts TP1,TP2 --accumulation 0
fi

if wanted teacher_cache; then
  # A teacher cache of 6 samples (3 shards) for the small student; every wrong use of it stops
  # with its line before a step where it can, and leaves the cache as it was.
  distill=(distill.logit_weight=1 distill.teacher_top_k=4 training.steps=3)
  "$cache" "$configs/tiny.yaml" "${small[@]}" "${distill[@]}" --out "$work/tc" --samples-per-shard 2 \
    >"$work/tc.log" 2>&1 || { cat "$work/tc.log"; fail "writing the teacher cache"; }
  sum=$(tree_sum "$work/tc")
  student=("$train" "$configs/tiny.yaml" "${small[@]}" "${distill[@]}" teacher.cache="$work/tc")
  succeeds "cache: a student reads it" -- "${student[@]}" run.dir="$work/tc_student"
  expect "cache: another data seed" "was made for another data_seed" -- \
    "${student[@]}" run.dir="$work/tc_run1" data.seed=99
  [ -e "$work/tc_run1/checkpoints" ] && fail "a refused cache left checkpoints"
  expect "cache: another temperature" "was made for another temperature" -- \
    "${student[@]}" run.dir="$work/tc_run2" distill.temperature=2
  expect "cache: more samples than it holds" "holds samples 0 to 5; this run draws samples up to 7" -- \
    "${student[@]}" run.dir="$work/tc_run3" training.steps=4
  expect "cache: a k larger than cached" "distill.teacher_top_k=5, but teacher.cache '$work/tc' holds the teacher's top 4" -- \
    "${student[@]}" run.dir="$work/tc_run4" distill.teacher_top_k=5
  expect "cache: reverse_kl" "distill.logit_loss=reverse_kl is undefined" -- \
    "${student[@]}" run.dir="$work/tc_run5" distill.logit_loss=reverse_kl distill.teacher_top_k=0
  expect "cache: another seq_len" "holds samples of 16 tokens; this run's data.seq_len is 8" -- \
    "${student[@]}" run.dir="$work/tc_run6" data.seq_len=8
  expect "cache: not a cache" "teacher cache '$work/tc_student': no cache.json" -- \
    "${student[@]}" run.dir="$work/tc_run7" teacher.cache="$work/tc_student"
  says "cache: without a logit loss" "teacher.cache has no effect: there is no logit loss" -- \
    "${student[@]}" run.dir="$work/tc_run11" distill.logit_weight=0 distill.lm_weight=1
  says "cache: a tail mode without a cache" "distill.top_k_tail has no effect" -- \
    "$train" "$configs/tiny.yaml" "${small[@]}" "${distill[@]}" run.dir="$work/tc_run12" \
    distill.top_k_tail=ghost
  same_files "cache: the refused runs" "$work/tc" "$sum"
  # Damaged copies: a shard missing, one cut short, one byte flipped.
  for damage in missing truncated flipped; do cp -r "$work/tc" "$work/tc_$damage"; done
  rm "$work/tc_missing/shard_0000000002.bin"
  truncate -s -3 "$work/tc_truncated/shard_0000000004.bin"
  printf '\xff' | dd of="$work/tc_flipped/shard_0000000000.bin" bs=1 seek=60 conv=notrunc 2>/dev/null
  for damage in missing truncated flipped; do damaged_sum[$damage]=$(tree_sum "$work/tc_$damage"); done
  expect "cache: a shard missing" "shard '$work/tc_missing/shard_0000000002.bin' is missing" -- \
    "${student[@]}" run.dir="$work/tc_run8" teacher.cache="$work/tc_missing"
  [ -e "$work/tc_run8/metrics.jsonl" ] && grep -q '"step"' "$work/tc_run8/metrics.jsonl" &&
    fail "a missing shard was found only after a step"
  expect "cache: a shard cut short" "shard '$work/tc_truncated/shard_0000000004.bin' has" -- \
    "${student[@]}" run.dir="$work/tc_run9" teacher.cache="$work/tc_truncated"
  expect "cache: a flipped byte" "shard '$work/tc_flipped/shard_0000000000.bin' fails its checksum at sample" -- \
    "${student[@]}" run.dir="$work/tc_run10" teacher.cache="$work/tc_flipped"
  for damage in missing truncated flipped; do
    same_files "cache: the $damage shard's folder" "$work/tc_$damage" "${damaged_sum[$damage]}"
  done
  # The writer: an existing cache without --resume, a resume with other settings, no k.
  expect "cache: write over an existing cache" "teacher cache '$work/tc' exists; add --resume" -- \
    "$cache" "$configs/tiny.yaml" "${small[@]}" "${distill[@]}" --out "$work/tc" --samples-per-shard 2
  expect "cache: resume with another k" "was made with another top_k" -- \
    "$cache" "$configs/tiny.yaml" "${small[@]}" "${distill[@]}" --out "$work/tc" --samples-per-shard 2 \
    --resume --top-k 3
  expect "cache: resume with another data seed" "was made with another fingerprint.data_seed" -- \
    "$cache" "$configs/tiny.yaml" "${small[@]}" "${distill[@]}" --out "$work/tc" --samples-per-shard 2 \
    --resume data.seed=5
  same_files "cache: the refused writers" "$work/tc" "$sum"
  expect "cache: no k" "give --top-k K or distill.teacher_top_k" -- \
    "$cache" "$configs/tiny.yaml" "${small[@]}" distill.logit_weight=1 --out "$work/tc_nok"
  expect "cache: unknown value type" "--values: value type 'bfloat16' is not float16 or float64" -- \
    "$cache" "$configs/tiny.yaml" "${small[@]}" "${distill[@]}" --out "$work/tc_bf" --values bfloat16
  expect "cache: --info on a folder without a cache" "no cache.json" -- "$cache" --info "$work/tc_student"
fi

echo
echo "| case | command | exit | first line of stderr |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
