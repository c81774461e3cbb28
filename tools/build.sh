#!/usr/bin/env bash
# tools/build.sh: configures (Ninja, Release) and builds Retort into build/ (or $RETORT_BUILD).
# Extra arguments go to CMake, e.g. tools/build.sh -DRETORT_BENCH=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${RETORT_BUILD:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$build"
