// kernels/cpu_features.cpp: see cpu_features.h.
#include "kernels/cpu_features.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <thread>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

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

std::string cpu_signature() {
  std::string vendor = "unknown-vendor", brand;
  unsigned family = 0, model = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char name[13] = {};
    std::memcpy(name, &b, 4);
    std::memcpy(name + 4, &d, 4);
    std::memcpy(name + 8, &c, 4);
    vendor = name;
  }
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    // The displayed family and model: the extended fields count from family 15 on (AMD) or
    // for families 6 and 15 (Intel), as the kernel's /proc/cpuinfo shows them.
    const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
    family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
    model = base_family == 0xf || base_family == 0x6 ? base_model | (((a >> 16) & 0xf) << 4)
                                                     : base_model;
  }
  unsigned top = 0;
  if (__get_cpuid(0x80000000, &top, &b, &c, &d) && top >= 0x80000004) {
    char text[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      unsigned r[4];
      __get_cpuid(0x80000002 + leaf, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(text + 16 * leaf, r, 16);
    }
    brand = text;
    const size_t first = brand.find_first_not_of(' '), last = brand.find_last_not_of(' ');
    brand = first == std::string::npos ? "" : brand.substr(first, last - first + 1);
  }
#endif
  std::string line =
      vendor + " family " + std::to_string(family) + " model " + std::to_string(model);
  if (!brand.empty()) line += " (" + brand + ")";
  return line + ", " + isa_name(kernel_isa()) + ", " + std::to_string(available_cores()) + " cores";
}

int available_cores() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace retort::kernels
