#!/usr/bin/env bash
# tests/cli/distill_vocabularies.sh: distillation between vocabularies of one tokenizer that
# differ by padding, through engine_train. A teacher of vocabulary 160 (data.tokenizer=bytes,
# recorded in its checkpoint) teaches a student of 150, and one of 127 (padded to 128 rows
# alone, to 256 beside the teacher): each runs under TP1 and TP2 and says the logit loss runs
# over the shared ids, and TP2 follows TP1 step by step (every loss term within 1e-4
# relative; the float64 values are tests/mpi/distill_vocabulary_test.cpp's). Then what must
# stop before any step, with one "error:" line naming the key and exit code 2, leaving the
# run folder as it was: a student whose data.tokenizer is another tokenizer than the one the
# teacher's checkpoint records, a resume with another data.tokenizer than its checkpoint's,
# and a data.tokenizer that is not there.
# Usage: distill_vocabularies.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -uo pipefail
python="$(cd "$(dirname "$0")/../.." && pwd)/tools/python"  # .venv's, tools/setup.sh
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}
small=(data.paths="[$corpus]" model.layers=2 model.hidden=32 model.heads=4 model.kv_heads=2
       model.ffn_hidden=64 data.seq_len=32 training.micro_batch=2 training.global_batch=4
       training.eval_every=0 training.log_every=1 runtime.peak_gflops=100 runtime.threads=1)
run() {  # run NAME RANKS OVERRIDES...: must succeed
  local name=$1 ranks=$2
  shift 2
  mpirun --oversubscribe -np "$ranks" "$train" "$configs/tiny.yaml" "${small[@]}" \
    run.dir="$work/$name" "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name"; }
}
# expect_stop NAME CULPRIT OVERRIDES...: one "error:" line naming CULPRIT, exit code 2.
expect_stop() {
  local name=$1 culprit=$2
  shift 2
  "$train" "$configs/tiny.yaml" "${small[@]}" "$@" >"$work/out" 2>"$work/err"
  local code=$?
  if [ "$code" -ne 2 ] || [ "$(wc -l <"$work/err")" -ne 1 ] || ! grep -q "^error: .*$culprit" "$work/err"; then
    fail "$name: exit $code, stderr:"
    sed 's/^/    /' "$work/err"
  else
    echo "ok   $name: $(cat "$work/err")"
  fi
}
tree_sum() { (cd "$1" && find . -type f | sort | xargs md5sum) | md5sum; }

# Large weights: a teacher far from uniform, so the logit loss is far from 0 (a KL near 0 is
# mostly rounding, and TP1 and TP2 round differently).
run teacher 1 model.vocab_size=160 model.init_std=0.3 data.tokenizer=bytes training.steps=3
grep -q '"tokenizer": "bytes"' "$work/teacher/checkpoints/step_00000003/index.json" ||
  fail "the teacher's checkpoint does not record its tokenizer"
distill=(teacher.checkpoint="$work/teacher" data.tokenizer=bytes distill.logit_weight=1
         distill.lm_weight=0.5 distill.temperature=2 training.steps=8)
for vocab in 150 127; do
  run "student${vocab}_tp1" 1 model.vocab_size=$vocab "${distill[@]}"
  run "student${vocab}_tp2" 2 model.vocab_size=$vocab "${distill[@]}" parallel.tensor=2
  grep -q "the logit loss runs over the $vocab ids both have" "$work/student${vocab}_tp1.log" ||
    fail "student $vocab: no line on the shared ids"
done
"$python" - "$work" <<'PY' || fail "TP2 does not follow TP1"
import json, math, sys
work = sys.argv[1]
def records(name):
    return [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
ok = True
for vocab in (150, 127):
    one, two = records(f"student{vocab}_tp1"), records(f"student{vocab}_tp2")
    ok &= len(one) == len(two) == 8
    for key in ("loss", "lm_loss", "logit_loss", "grad_norm"):
        ok &= all(math.isfinite(r[key]) and r[key] > 0 for r in one)
        worst = max(abs(a[key] - b[key]) / abs(b[key]) for a, b in zip(two, one))
        print(f"student {vocab}, TP2 vs TP1: {key} from {one[0][key]:.6f} to {one[-1][key]:.6f}, "
              f"worst relative difference {worst:.2e}")
        ok &= worst <= 1e-4
sys.exit(0 if ok else 1)
PY

# Another tokenizer than the teacher's: a tokenizer.json of three tokens.
printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},\n "added_tokens": []}\n' >"$work/tokenizer.json"
expect_stop "a teacher of another tokenizer" "teacher.checkpoint: data.tokenizer '$work/tokenizer.json' (bpe:[0-9a-f]*) and checkpoint '$work/teacher/checkpoints/step_00000003' (bytes) are different tokenizers" \
  run.dir="$work/other" model.vocab_size=150 "${distill[@]}" data.tokenizer="$work/tokenizer.json"
[ -e "$work/other/metrics.jsonl" ] && fail "a teacher of another tokenizer: a step was taken"
before=$(tree_sum "$work/teacher")
expect_stop "a resume with another tokenizer" "data.tokenizer: data.tokenizer '$work/tokenizer.json' (bpe:[0-9a-f]*) and checkpoint '.*' (bytes) are different tokenizers" \
  run.dir="$work/teacher" model.vocab_size=160 training.steps=6 checkpoint.load=auto \
  data.tokenizer="$work/tokenizer.json"
[ "$(tree_sum "$work/teacher")" = "$before" ] || fail "the refused resume changed its run folder"
expect_stop "a data.tokenizer that is not there" "data.tokenizer: no such file '$work/missing.json'" \
  run.dir="$work/missing" data.tokenizer="$work/missing.json"
exit $((failures > 0))
