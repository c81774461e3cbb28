// common/process_setup.h: how a Retort program sets up its own process before any work, so
// its speed does not depend on environment variables the user would have to know about.
//  - OpenMP's idle workers sleep after a short spin (OMP_WAIT_POLICY=passive with
//    GOMP_SPINCOUNT=10000, about 0.1 ms). Torch's OpenMP pool and OpenBLAS's own threads take
//    turns on the same cores; with libgomp's default, workers spin 3 ms after every parallel
//    region and steal the cores the matrix products need (measured on 2 cores: 309 -> 450
//    tok/s); with no spin at all each short element-wise region wakes them through a futex
//    (598 -> 613 tok/s at sequence 256, 529 -> 557 at 2048). libgomp reads the variables when
//    it is loaded, before main, so when OMP_WAIT_POLICY is unset the program sets both and
//    re-executes itself once; values the user set are kept.
//  - The allocator keeps freed memory: without it, large freed blocks go back to the OS and
//    every step page-faults its activations in again. Where Debian's jemalloc is installed
//    (libjemalloc2; tools/setup.sh installs it) the program preloads it with page purging
//    off, in the same re-execution (measured fastest of glibc tuned, jemalloc and tcmalloc by
//    bench/peer/run_peer.py); the preload is removed from the environment once running, so
//    child processes do not inherit it. Otherwise, or with RETORT_ALLOCATOR=glibc, glibc is
//    tuned with mallopt. A user's own LD_PRELOAD is left alone.
//  - The allocator asks for transparent huge pages (jemalloc's thp:always, glibc's
//    glibc.malloc.hugetlb=1 tunable, set in the same re-execution), which Debian's kernels
//    give only to memory that asks: with 4 KB pages the step's operands span far more pages
//    than the TLB holds (2 data-parallel ranks on 2 cores: step 1.740 -> 1.678 s, 8 of 8
//    alternated pairs). A MALLOC_CONF or GLIBC_TUNABLES the user set is kept; metrics.jsonl
//    records how much memory the kernel did give in huge pages.
//  - OpenBLAS's idle workers sleep after a short spin (OPENBLAS_THREAD_TIMEOUT=10, 2^10
//    cycles, set in the same re-execution when unset; its default spins ~0.1 s yielding the
//    core, competing with the attention and elementwise kernels: 440 -> 470 tok/s at
//    sequence 2048, 4 of 4 alternating pairs).
//  - BLAS threads follow the engine's thread count (OpenBLAS's pthread pool otherwise takes
//    every core in every rank).
// RETORT_PROCESS_TUNING=0 turns the first three off (for measuring them).
#pragma once
#include <string>

namespace retort {

// Call first in main(), with main's arguments; may not return (re-executes the program).
void setup_process(char** argv);

// The number of threads the BLAS library runs its own products on, when it has a pool of its
// own (OpenBLAS's pthread build); returns whether it has.
bool set_blas_threads(int threads);
// The BLAS library's own thread count, or 0 without a pool of its own.
int blas_threads();
// How long OpenBLAS's idle workers spin before sleeping, as log2 of cycles, as the library
// itself read it when loaded; 0 without OpenBLAS's pthread pool.
int blas_idle_spin_log2();
// The allocator in use: "jemalloc 5.3.0 (freed pages kept, huge pages asked)" or
// "glibc malloc (huge pages asked)".
std::string allocator_summary();
// One line for the start-up banner: OpenMP's wait policy and idle spin, the BLAS threads, idle
// spin and kernels (with a warning when OPENBLAS_CORETYPE holds it below the CPU's AVX-512),
// the allocator.
std::string process_summary();

}  // namespace retort
