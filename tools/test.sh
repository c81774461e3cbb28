#!/usr/bin/env bash
# tools/test.sh: the README's test command. Installs what is missing, builds, and runs the
# whole suite (unit, MPI and CLI tests) with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OpenBLAS picks its own kernels for the suite. Some platforms force older ones for every
# process (this machine kind's sets OPENBLAS_CORETYPE=Haswell on a Zen 5); with those, a
# product by a block of the LM head's vocabulary rows is not bitwise the same columns of the
# product by all of them, so the streamed head of optimizer.in_backward=true no longer forms
# bitwise the gradient the plain step forms, and the tests that compare the two bitwise
# (Trainer.ResumeWithOptimizerInBackward's switched cases, memory_exactness_*) fail at
# round-off (3e-5 relative in the parameters after 8 steps). README, "Memory", says so.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
ctest --test-dir "${RETORT_BUILD:-build}" --output-on-failure --timeout 1200
