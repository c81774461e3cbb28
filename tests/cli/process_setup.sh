#!/usr/bin/env bash
# tests/cli/process_setup.sh: engine_train sets up its own process. Started without
# OMP_WAIT_POLICY it runs with OpenMP's idle workers sleeping after a spin of 10000 (it
# re-executes itself with OMP_WAIT_POLICY=passive and GOMP_SPINCOUNT=10000 set), OpenBLAS's idle workers spin 2^10 cycles before sleeping (as OpenBLAS itself
# reports what it read at load) instead of its 2^28, and its BLAS threads equal its intra-op threads (runtime.threads=1 here, 2
# ranks under mpirun); it runs on jemalloc with freed pages kept (preloaded in the same
# re-execution; setup.sh installs libjemalloc2), or on glibc with RETORT_ALLOCATOR=glibc; a
# policy the user set is kept; RETORT_PROCESS_TUNING=0 turns it all off. The banner names
# OpenBLAS's kernels and, on a CPU with AVX-512 F/CD/BW/DQ/VL, warns when a user's
# OPENBLAS_CORETYPE holds them to AVX2 ones (kept, as the user's other values are).
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
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OPENBLAS_THREAD_TIMEOUT -u OPENBLAS_CORETYPE "$@" mpirun --oversubscribe -np "$ranks" "$train" "$configs/tiny.yaml" \
    data.paths="[$corpus]" training.steps=1 training.eval_every=0 checkpoint.save_at_end=false \
    runtime.peak_gflops=100 runtime.threads="$threads" run.dir="$work/$name" \
    >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  grep '^retort: ' "$work/$name.log"
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
avx512=true
for flag in avx512f avx512cd avx512bw avx512dq avx512vl; do
  grep -qw "$flag" /proc/cpuinfo || avx512=false
done
line=$(run unset 2 1 OMP_DISPLAY_ENV=verbose)
expect_huge_pages unset
expect "$line" "OpenMP wait policy passive, OpenMP idle spin 10000"
spins=$(grep "GOMP_SPINCOUNT" "$work/unset.log" | tail -1)
expect "$spins" "GOMP_SPINCOUNT = '10000'"
expect "$line" "BLAS threads 1"
expect "$line" "BLAS idle spin 2^10 cycles"
expect "$line" "allocator jemalloc [0-9.]* (freed pages kept, huge pages asked)"
expect "$line" "BLAS kernels [A-Za-z]"
refuse "$line" "OPENBLAS_CORETYPE"
line=$(run three 1 3)
expect "$line" "BLAS threads 3"
line=$(run user 1 2 OMP_WAIT_POLICY=active OPENBLAS_THREAD_TIMEOUT=20 OPENBLAS_CORETYPE=Haswell \
  OMP_DISPLAY_ENV=verbose)
expect "$line" "BLAS kernels Haswell"
if $avx512; then
  expect "$line" "BLAS kernels Haswell (OPENBLAS_CORETYPE=Haswell holds them below this CPU's AVX-512"
else
  refuse "$line" "OPENBLAS_CORETYPE"
fi
expect "$line" "OpenMP wait policy active, BLAS"
spins=$(grep "GOMP_SPINCOUNT" "$work/user.log" | tail -1)
expect "$spins" "GOMP_SPINCOUNT = '30000000000'"
expect "$line" "BLAS idle spin 2^20 cycles"
expect "$line" "allocator jemalloc"
line=$(run glibc 1 2 RETORT_ALLOCATOR=glibc)
expect "$line" "OpenMP wait policy passive"
expect_huge_pages glibc
expect "$line" "allocator glibc malloc (huge pages asked)"
line=$(run off 1 2 RETORT_PROCESS_TUNING=0 OMP_DISPLAY_ENV=verbose)
expect "$line" "OpenMP wait policy default"
expect "$line" "BLAS idle spin 2^28 cycles"
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
echo "process set-up: OpenMP idle spin 10000, short BLAS idle spin and jemalloc with huge pages (THP mode ${thp_mode:-absent}) by default, BLAS threads follow runtime.threads, BLAS kernels named (AVX-512 CPU: $avx512)"
