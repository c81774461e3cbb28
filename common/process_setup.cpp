// common/process_setup.cpp: see process_setup.h.
#include "common/process_setup.h"

#include <dlfcn.h>
#include <malloc.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace retort {

namespace {

// Debian's jemalloc (libjemalloc2), where setup.sh installs it.
constexpr const char* kJemallocPaths[] = {"/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
                                          "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                                          "/usr/lib64/libjemalloc.so.2"};
// Freed pages are never purged: the steps reuse the same sizes, so returning memory to the
// OS only to fault it in again is the cost this avoids (glibc's mallopt below does the same).
// thp:always asks the kernel for transparent huge pages (madvise(MADV_HUGEPAGE)) on every
// extent: Debian's kernels give them only to memory that asks (mode "madvise"), and with 4 KB
// pages the step's GEMM operands, activations and AdamW's four buffers span far more pages
// than the TLB holds. Two data-parallel ranks on this machine kind's 2 cores, 8 alternated
// pairs: step 1.740 -> 1.678 s (median), faster in 8 of 8.
constexpr const char* kJemallocConf = "dirty_decay_ms:-1,muzzy_decay_ms:-1,thp:always";
// The same request for glibc's malloc (glibc >= 2.35 reads it at start; older ones ignore it).
constexpr const char* kGlibcHugePages = "glibc.malloc.hugetlb=1";

// Passive alone makes libgomp's idle workers sleep at once (a spin count of 0), so each of the
// many short element-wise regions between two products woke every worker through a futex.
// 10000 spins (libgomp counts about 100000 a millisecond) bridge the gap between two such
// regions yet end long before a product of the step does; 100000 spins lost, the workers then
// spinning into the products (docs/benchmark_log.md has both measurements).
constexpr const char* kOmpIdleSpin = "10000";

using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);

Mallctl jemalloc_ctl() {
  return reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
}

const char* installed_jemalloc() {
  for (const char* path : kJemallocPaths)
    if (access(path, R_OK) == 0) return path;
  return nullptr;
}

bool is(const char* variable, const char* value) {
  const char* set = std::getenv(variable);
  return set && std::strcmp(set, value) == 0;
}

}  // namespace

void setup_process(char** argv) {
  if (is("RETORT_PROCESS_TUNING", "0")) return;
  if (is("RETORT_PRELOADED", "1")) {  // our own re-execution: children get no preload
    unsetenv("LD_PRELOAD");
    unsetenv("RETORT_PRELOADED");
  }
  bool restart = false;
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    if (!std::getenv("GOMP_SPINCOUNT")) setenv("GOMP_SPINCOUNT", kOmpIdleSpin, 1);
    restart = true;
  }
  const char* jemalloc = installed_jemalloc();
  if (!jemalloc_ctl() && jemalloc && !std::getenv("LD_PRELOAD") &&
      !is("RETORT_ALLOCATOR", "glibc")) {
    setenv("LD_PRELOAD", jemalloc, 1);
    if (!std::getenv("MALLOC_CONF")) setenv("MALLOC_CONF", kJemallocConf, 1);
    setenv("RETORT_PRELOADED", "1", 1);
    restart = true;
  }
  if (!jemalloc_ctl() && !std::getenv("LD_PRELOAD") && !std::getenv("GLIBC_TUNABLES")) {
    setenv("GLIBC_TUNABLES", kGlibcHugePages, 1);  // glibc stays the allocator: ask it too
    restart = true;
  }
  if (restart) execv("/proc/self/exe", argv);  // returns only on failure: run as we are
  if (jemalloc_ctl()) return;
  // glibc: the largest mmap threshold it accepts on 64-bit (HEAP_MAX_SIZE / 2): blocks below
  // it come from the heap and are reused; a trim threshold that is never reached and a
  // generous top pad keep the heap from shrinking and growing every step.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 256 << 20);
}

std::string allocator_summary() {
  Mallctl ctl = jemalloc_ctl();
  if (!ctl) {
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    return std::string("glibc malloc") +
           (tunables && std::strstr(tunables, kGlibcHugePages) ? " (huge pages asked)" : "");
  }
  const char* version = nullptr;
  size_t size = sizeof version;
  std::string name = "jemalloc";
  if (ctl("version", &version, &size, nullptr, 0) == 0 && version)
    name += " " + std::string(version).substr(0, std::string(version).find('-'));
  ssize_t decay = 0;
  size = sizeof decay;
  const bool kept = ctl("arenas.dirty_decay_ms", &decay, &size, nullptr, 0) == 0 && decay < 0;
  const char* thp = nullptr;
  size = sizeof thp;
  const bool huge =
      ctl("opt.thp", &thp, &size, nullptr, 0) == 0 && thp && std::strcmp(thp, "always") == 0;
  if (kept || huge)
    name += std::string(" (") + (kept ? "freed pages kept" : "") + (kept && huge ? ", " : "") +
            (huge ? "huge pages asked" : "") + ")";
  return name;
}

int blas_threads() {
  // MKL (the PyPI wheel's BLAS, linked into libtorch_cpu) runs its products on OpenMP's
  // threads, as many as torch::set_num_threads asked of it.
  using GetThreads = int (*)();
  auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "mkl_get_max_threads"));
  return get ? get() : 0;
}

std::string process_summary() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const int blas = blas_threads();
  const char* omp_spin = std::getenv("GOMP_SPINCOUNT");
  return std::string("OpenMP wait policy ") + (policy ? policy : "default (spinning)") +
         (omp_spin ? std::string(", OpenMP idle spin ") + omp_spin : std::string()) +
         ", BLAS threads " + (blas > 0 ? std::to_string(blas) : "unknown") + ", allocator " +
         allocator_summary();
}

}  // namespace retort
