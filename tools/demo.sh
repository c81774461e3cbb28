#!/usr/bin/env bash
# tools/demo.sh: the README's main job, a distillation demo on data the repo ships.
# Installs what is missing, builds, turns the shipped State of the Union corpus into a
# Megatron dataset, trains the teacher (configs/tiny.yaml, 2 data-parallel ranks), then
# distills a sliding-window student from it at TP2 x PP2 x DP2 with sequence parallelism on
# 8 ranks (configs/distill.yaml) and plots both runs into runs/distill/curves.png. Between
# the two it prints a sample of the teacher's text (engine_generate).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
build=${RETORT_BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$build"/tools/engine_prepare_data -o examples/data/sotu_bytes examples/data/sotu
rm -rf runs/teacher runs/distill
mpirun --oversubscribe -np 2 "$build"/tools/engine_train configs/tiny.yaml run.dir=runs/teacher
# What the teacher learnt: a sample from its last checkpoint (KV cache, 2 TP ranks; the
# window slides past the 128 bytes it was trained on).
mpirun --oversubscribe -np 2 "$build"/tools/engine_generate runs/teacher \
  --prompt "Fellow-Citizens of the Senate and House of Representatives: " --max-tokens 400 \
  --temperature 0.5 --context 128
mpirun --oversubscribe -np 8 "$build"/tools/engine_train configs/distill.yaml "$@"
tools/python tools/plot_metrics.py runs/teacher runs/distill runs/distill/curves.png
