#!/usr/bin/env bash
# tools/behaviour_fingerprint.sh OUT: records what a build computes, to hold a refactoring to
# "behaviour unchanged": the gradient-consistency suite's per-layout records (every step's
# loss and every tensor's gradient, HDF5) in float32 and in float64, the demo's losses (the
# teacher on 2 DP ranks, the distillation at TP2 x PP2 x DP2 with STP on 8 ranks, both short)
# and examples/distill_experiments.sh's losses at 10 steps. Run it on the build before a change
# and on the build after, then compare the two folders bitwise:
#   tools/behaviour_fingerprint.sh /tmp/before   # on the old commit's build
#   tools/behaviour_fingerprint.sh /tmp/after
#   tools/python tools/compare_fingerprints.py /tmp/before /tmp/after
# Uses the build in build/ (or $RETORT_BUILD); takes about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/behaviour_fingerprint.sh OUT}
build=${RETORT_BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f examples/data/sotu_bytes.idx ] ||
  "$build"/tools/engine_prepare_data -o examples/data/sotu_bytes examples/data/sotu >/dev/null
run=(mpirun --oversubscribe)

# The consistency suite's layouts, in both exact types: its own on 4 ranks, and the pipeline
# layouts on 8.
pipeline_layouts=(--layouts TP1,PP2,PP4:1-2-1-1,PP2xTP2,PP2xSTP2xDP2 --accumulation 4)
for dtype in float32 float64; do
  for ranks in 4 8; do
    name=consistency_${dtype}_np$ranks
    layouts=()
    [ "$ranks" = 8 ] && layouts=("${pipeline_layouts[@]}")
    "${run[@]}" -np $ranks "$build"/tools/engine_consistency configs/consistency.yaml \
      model.dtype=$dtype "${layouts[@]}" --out "$out/$name" >"$out/$name.log"
    rm -rf "$out/$name/runs" "$out/$name/runs_float64"
  done
done

# The demo, shortened.
"${run[@]}" -np 2 "$build"/tools/engine_train configs/tiny.yaml run.dir="$work/teacher" \
  training.steps=20 >/dev/null
"${run[@]}" -np 8 "$build"/tools/engine_train configs/distill.yaml run.dir="$work/distill" \
  teacher.checkpoint="$work/teacher" model.init.from="$work/teacher" training.steps=6 >/dev/null
cp "$work/teacher/metrics.jsonl" "$out/demo_teacher.jsonl"
cp "$work/distill/metrics.jsonl" "$out/demo_distill.jsonl"

# The distillation experiments, shortened (their teacher trains its whole config).
RETORT_EXPERIMENTS_OUT="$work/experiments" RETORT_EXPERIMENTS_RESULTS="$work/results" \
  examples/distill_experiments.sh 10 >/dev/null
for run_dir in "$work"/experiments/*/; do
  cp "$run_dir/metrics.jsonl" "$out/experiment_$(basename "$run_dir").jsonl"
done
echo "behaviour fingerprint in $out"
