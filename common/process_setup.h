// common/process_setup.h: how a Retort program sets up its own process before any work, so
// its speed does not depend on environment variables the user would have to know about.
//  - OpenMP's idle workers sleep after a short spin (OMP_WAIT_POLICY=passive with
//    GOMP_SPINCOUNT=10000, about 0.1 ms). libgomp's default spins 3 ms after every parallel
//    region, and with no spin at all each short element-wise region wakes the workers through
//    a futex. The BLAS (MKL, linked into the wheel's libtorch_cpu) runs on the same OpenMP
//    threads, so this one setting governs both. libgomp reads the variables when it is
//    loaded, before main, so when OMP_WAIT_POLICY is unset the program sets both and
//    re-executes itself once; values the user set are kept.
//  - The allocator keeps freed memory: without it, large freed blocks go back to the OS and
//    every step page-faults its activations in again. Where Debian's jemalloc is installed
//    (libjemalloc2; tools/setup.sh installs it) the program preloads it with page purging
//    off, in the same re-execution; the preload is removed from the environment once running,
//    so child processes do not inherit it. Otherwise, or with RETORT_ALLOCATOR=glibc, glibc
//    is tuned with mallopt. A user's own LD_PRELOAD is left alone.
//  - The allocator asks for transparent huge pages (jemalloc's thp:always, glibc's
//    glibc.malloc.hugetlb=1 tunable, set in the same re-execution), which Debian's kernels
//    give only to memory that asks: with 4 KB pages the step's operands span far more pages
//    than the TLB holds. A MALLOC_CONF or GLIBC_TUNABLES the user set is kept;
//    metrics.jsonl records how much memory the kernel did give in huge pages.
// RETORT_PROCESS_TUNING=0 turns all three off (for measuring them). bench/peer/run_peer.py
// measures each against the alternatives.
#pragma once
#include <string>

namespace retort {

// Call first in main(), with main's arguments; may not return (re-executes the program).
void setup_process(char** argv);

// The threads the BLAS (MKL) runs a product on, which are OpenMP's; 0 where it is not MKL.
int blas_threads();
// The allocator in use: "jemalloc 5.3.0 (freed pages kept, huge pages asked)" or
// "glibc malloc (huge pages asked)".
std::string allocator_summary();
// One line for the start-up banner: OpenMP's wait policy and idle spin, the BLAS threads and
// the allocator.
std::string process_summary();

}  // namespace retort
