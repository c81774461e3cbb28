#!/usr/bin/env bash
# tests/cli/process_setup.sh: engine_train sets up its own process. Started without
# OMP_WAIT_POLICY it runs with OpenMP's idle workers sleeping after a spin of 10000 (it
# re-executes itself with OMP_WAIT_POLICY=passive and GOMP_SPINCOUNT=10000 set); the BLAS
# (MKL) runs on as many threads as the intra-op pool (runtime.threads=1 here, 2 ranks under
# mpirun; 3 below); it runs on jemalloc with freed pages kept (preloaded in the same
# re-execution; setup.sh installs libjemalloc2), or on glibc with RETORT_ALLOCATOR=glibc; a
# policy the user set is kept; RETORT_PROCESS_TUNING=0 turns it all off. The banner's second
# line names the build: Retort's commit, libtorch 2.x, the CUDA/NCCL state, the BLAS.
# The allocator asks for transparent huge pages (jemalloc's thp:always; glibc's hugetlb
# tunable): where the kernel gives them only on request (mode madvise), the kernel's own count
# in metrics.jsonl (huge_page_bytes, from smaps_rollup) must be above zero with the engine's
# set-up and zero with it off.
# The environment alone proves nothing (libgomp reads it when loaded): libgomp's own display
# (OMP_DISPLAY_ENV=verbose) must show its spin count at 10000 in the process that trains.
# Usage: process_setup.sh ENGINE_TRAIN CORPUS_PREFIX CONFIGS_DIR
set -euo pipefail
train=$1 corpus=$2 configs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # run NAME RANKS THREADS [env assignments...]: prints the banner line
  local name=$1 ranks=$2 threads=$3
  shift 3
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@" mpirun --oversubscribe -np "$ranks" "$train" "$configs/tiny.yaml" \
    data.paths="[$corpus]" training.steps=1 training.eval_every=0 checkpoint.save_at_end=false \
    runtime.peak_gflops=100 runtime.threads="$threads" run.dir="$work/$name" \
    >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  grep '^retort: ' "$work/$name.log" | tr '\n' ' '
}
expect() {  # expect LINE PATTERN
  if ! grep -q -- "$2" <<<"$1"; then
    echo "FAIL: expected '$2' in: $1"
    exit 1
  fi
}
refuse() {  # refuse LINE PATTERN
  if grep -q -- "$2" <<<"$1"; then
    echo "FAIL: did not expect '$2' in: $1"
    exit 1
  fi
}
huge_pages() {  # huge_pages NAME: huge_page_bytes of the run's last metrics line
  grep -o '"huge_page_bytes":[0-9]*' "$work/$1/metrics.jsonl" | tail -1 | cut -d: -f2
}
thp_mode=$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || true)
expect_huge_pages() {  # expect_huge_pages NAME: the kernel gave the run some huge pages
  [[ $thp_mode == never || -z $thp_mode ]] && return 0
  local bytes
  bytes=$(huge_pages "$1")
  if [[ -z $bytes || $bytes -le 0 ]]; then
    echo "FAIL: run $1 had no memory in huge pages (huge_page_bytes '$bytes', THP mode $thp_mode)"
    exit 1
  fi
}
line=$(run unset 2 1 OMP_DISPLAY_ENV=verbose)
expect_huge_pages unset
expect "$line" "OpenMP wait policy passive, OpenMP idle spin 10000"
spins=$(grep "GOMP_SPINCOUNT" "$work/unset.log" | tail -1)
expect "$spins" "GOMP_SPINCOUNT = '10000'"
expect "$line" "BLAS threads 1,"
expect "$line" "allocator jemalloc [0-9.]* (freed pages kept, huge pages asked)"
expect "$line" "retort: retort [0-9a-f]\{7,\}.*, libtorch 2\.[0-9]*\.[0-9]*, CUDA .*, BLAS MKL"
line=$(run three 1 3)
expect "$line" "BLAS threads 3,"
line=$(run user 1 2 OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=verbose)
expect "$line" "OpenMP wait policy active, BLAS"
spins=$(grep "GOMP_SPINCOUNT" "$work/user.log" | tail -1)
expect "$spins" "GOMP_SPINCOUNT = '30000000000'"
expect "$line" "allocator jemalloc"
line=$(run glibc 1 2 RETORT_ALLOCATOR=glibc)
expect "$line" "OpenMP wait policy passive"
expect_huge_pages glibc
expect "$line" "allocator glibc malloc (huge pages asked)"
line=$(run off 1 2 RETORT_PROCESS_TUNING=0 OMP_DISPLAY_ENV=verbose)
expect "$line" "OpenMP wait policy default"
expect "$line" "allocator glibc malloc"
refuse "$line" "huge pages asked"
spins=$(grep "GOMP_SPINCOUNT" "$work/off.log" | tail -1)
expect "$spins" "GOMP_SPINCOUNT = '300000'"
if [[ $thp_mode == madvise ]]; then
  bytes=$(huge_pages off)
  if [[ $bytes != 0 ]]; then
    echo "FAIL: with the set-up off (nobody asks) the run had '$bytes' bytes in huge pages"
    exit 1
  fi
fi
echo "process set-up: OpenMP idle spin 10000 and jemalloc with huge pages (THP mode ${thp_mode:-absent}) by default, BLAS threads follow runtime.threads, the build named"
