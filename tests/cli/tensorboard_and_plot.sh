#!/usr/bin/env bash
# tests/cli/tensorboard_and_plot.sh: two runs of engine_train (LM only, and distilling with
# logit and activation losses and evaluation) each write a TensorBoard event file whose
# every record passes its CRCs and which holds every scalar of metrics.jsonl
# (read_tensorboard.py, an independent reader, and TensorBoard's own reader,
# read_tensorboard_official.py); tools/plot_metrics.py draws both runs into one PNG.
# Usage: tensorboard_and_plot.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR PLOT_SCRIPT
set -euo pipefail
python="$(cd "$(dirname "$0")/../.." && pwd)/tools/python"  # .venv's, tools/setup.sh
train=$1 corpus=$2 configs=$3 plot=$4
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(data.paths="[$corpus]" model.layers=2 model.hidden=64 model.ffn_hidden=172
        model.vocab_size=300 data.seq_len=32 training.global_batch=8 training.micro_batch=4
        training.steps=20 training.log_every=2 training.eval_every=10 training.eval_batches=1
        runtime.peak_gflops=100 runtime.threads=1 checkpoint.save_at_end=false)
"$train" "$configs/tiny.yaml" "${common[@]}" run.dir="$work/lm_only" >"$work/lm.log" 2>&1 ||
  { cat "$work/lm.log"; exit 1; }
"$train" "$configs/tiny.yaml" "${common[@]}" run.dir="$work/distilled" teacher.seed=99 \
  teacher.hidden=96 distill.lm_weight=0.5 distill.logit_weight=1 distill.activation_weight=0.1 \
  "distill.activation_pairs=[layers.1.mixer_output=layers.1.mixer_output]" \
  >"$work/distill.log" 2>&1 || { cat "$work/distill.log"; exit 1; }
"$python" "$here/read_tensorboard.py" "$work/lm_only"
"$python" "$here/read_tensorboard.py" "$work/distilled"
"$python" "$here/read_tensorboard_official.py" "$work/lm_only"
"$python" "$here/read_tensorboard_official.py" "$work/distilled"
"$python" "$plot" "$work/lm_only" "$work/distilled" "$work/curves.png"
head -c 8 "$work/curves.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" ||
  { echo "FAIL: curves.png is not a PNG"; exit 1; }
echo "curves.png: $(stat -c %s "$work/curves.png") bytes"
