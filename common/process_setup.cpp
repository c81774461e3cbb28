// common/process_setup.cpp: see process_setup.h.
#include "common/process_setup.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace retort {

void setup_process(char** argv) {
  const char* tuning = std::getenv("RETORT_PROCESS_TUNING");
  if (tuning && std::strcmp(tuning, "0") == 0) return;
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  }
  // The largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2): blocks below it
  // come from the heap and are reused; a trim threshold that is never reached and a generous
  // top pad keep the heap from shrinking and growing every step.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 256 << 20);
}

bool set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!set) return false;
  set(threads);
  return true;
}

int blas_threads() {
  using GetThreads = int (*)();
  auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : 0;
}

std::string process_summary() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const int blas = blas_threads();
  return std::string("OpenMP wait policy ") + (policy ? policy : "default (spinning)") +
         ", BLAS threads " + (blas > 0 ? std::to_string(blas) : "its own");
}

}  // namespace retort
