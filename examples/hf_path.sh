#!/usr/bin/env bash
# examples/hf_path.sh: the path a user takes with a Hugging Face model, end to end, offline:
#   1. a Llama-family teacher in Hugging Face layout (here a tiny random one with Llama 3's
#      vocabulary, written by tests/hf/make_hf_llama.py; a downloaded model directory works the
#      same) is imported with engine_convert (or used directly as teacher.checkpoint);
#   2. the corpus is tokenized with the teacher's tokenizer (Llama 3's tokenizer.json, in
#      ../shared/fixtures/llama3-tokenizer beside the checkout, or $LLAMA3_TOKENIZER);
#   3. a student with a sliding window is distilled from the teacher (logits + LM loss);
#   4. the student is exported back to Hugging Face safetensors.
# Usage: examples/hf_path.sh [WORK_DIR]   (about two minutes on 2 cores after the build)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-runs/hf_path}"
build="${RETORT_BUILD:-build}"
tokenizer="${LLAMA3_TOKENIZER:-../shared/fixtures/llama3-tokenizer}"
vocab=128256  # Llama 3: 128000 merges' tokens + 256 added tokens
rm -rf "$work" && mkdir -p "$work"

tools/python tests/hf/make_hf_llama.py "$work/teacher_hf" llama_gqa_tied "$vocab"
"$build/tools/engine_convert" import "$work/teacher_hf" "$work/teacher_ckpt"
"$build/tools/engine_prepare_data" --tokenizer "$tokenizer" -o "$work/sotu_llama3" examples/data/sotu

# The student: the teacher's shape with a 16-token sliding window, initialised from the teacher.
"$build/tools/engine_train" configs/tiny.yaml run.dir="$work/student" \
  data.paths="[$work/sotu_llama3]" data.seq_len=64 \
  model.vocab_size=$vocab model.hidden=32 model.layers=2 model.heads=4 model.kv_heads=2 \
  model.ffn_hidden=48 model.rope_theta=5000 model.tied_embeddings=true model.sliding_window=16 \
  model.init.from="$work/teacher_hf" teacher.checkpoint="$work/teacher_hf" \
  distill.lm_weight=0.5 distill.logit_weight=1.0 distill.temperature=2 \
  training.steps=20 training.micro_batch=4 training.global_batch=8 training.log_every=5 \
  training.eval_every=0 checkpoint.save_at_end=true

"$build/tools/engine_convert" export "$work/student/checkpoints/$(cat "$work/student/checkpoints/latest")" \
  "$work/student_hf" --dtype BF16
ls -l "$work/student_hf"
