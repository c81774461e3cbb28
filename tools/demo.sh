#!/usr/bin/env bash
# tools/demo.sh: the README's main job. Installs what is missing, builds, turns the shipped
# State of the Union corpus into a Megatron dataset and trains configs/tiny.yaml on it,
# then plots the loss curve into runs/tiny/loss.png.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
build=${RETORT_BUILD:-build}
"$build"/tools/engine_prepare_data -o examples/data/sotu_bytes examples/data/sotu
rm -rf runs/tiny
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 1 "$build"/tools/engine_train configs/tiny.yaml "$@"
/usr/bin/python3 tools/plot_metrics.py runs/tiny/metrics.jsonl runs/tiny/loss.png
