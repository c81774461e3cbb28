// kernels/cpu_features.cpp: see cpu_features.h.
#include "kernels/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace retort::kernels {
namespace {

Isa detect() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
#endif
  return Isa::baseline;
}

Isa cap_from_environment(Isa detected) {
  const char* cap = std::getenv("RETORT_KERNEL_ISA");
  if (!cap || !*cap) return detected;
  for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512})
    if (std::strcmp(cap, isa_name(isa)) == 0) return isa < detected ? isa : detected;
  std::fprintf(stderr, "error: RETORT_KERNEL_ISA='%s' is not one of baseline, avx2, avx512\n", cap);
  std::exit(2);
}

}  // namespace

Isa kernel_isa() {
  static const Isa isa = cap_from_environment(detect());
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    case Isa::baseline:
      break;
  }
  return "baseline";
}

}  // namespace retort::kernels
