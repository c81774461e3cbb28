#!/usr/bin/env bash
# tools/test.sh: the README's test command. Installs what is missing, builds, and runs the
# whole suite (unit, MPI and CLI tests) with CTest, then the whole suite again with every
# operation routed to ATen (RETORT_KERNELS=aten, kernels/dispatch.h), so the ATen paths are
# tested rather than assumed; the second pass leaves out the tests labelled kernel_free
# (parsers, tokenizers, error paths, the GPU check's dry run), which route no operation. Both
# passes run even when the first has failures; each prints its summary, and the script exits
# non-zero if either failed. The suite sets what each test needs itself, so `ctest` run
# directly in the build folder passes as well.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build="${RETORT_BUILD:-build}"
first=passed aten=passed
ctest --test-dir "$build" --output-on-failure --timeout 1200 || first=FAILED
echo "== the suite again with every operation by ATen (RETORT_KERNELS=aten)"
RETORT_KERNELS=aten ctest --test-dir "$build" --output-on-failure --timeout 1200 \
  -j "$(nproc)" --label-exclude kernel_free || aten=FAILED
echo "== tools/test.sh: first pass $first, ATen pass $aten"
[ "$first" = passed ] && [ "$aten" = passed ]
