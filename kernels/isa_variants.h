// kernels/isa_variants.h: RETORT_ISA_VARIANTS defines a kernel entry whose loop is compiled
// three times, for AVX-512, AVX2 and baseline x86-64, and runs the variant that kernel_isa()
// allows: the widest set this CPU has, capped by RETORT_KERNEL_ISA. One binary so runs on any
// x86-64 with the widest vectors the CPU has, and a machine with AVX-512 can run (and the
// tests do run) the baseline variant. We pick the variant ourselves rather than leave it to
// GCC's target_clones, whose load-time choice no setting can override. Variants are chosen by
// feature, never by CPU model: a clone named "arch=haswell" is taken only on that exact model.
// RETORT_ALWAYS_INLINE puts a loop body into each variant, compiled for that variant's ISA.
// The AVX-512 variant also takes BW, VL and DQ (every AVX-512 CPU since Skylake-X has them):
// without BW, bf16 rows (16-bit integers) would be converted in 256-bit halves.
#pragma once

#include "kernels/cpu_features.h"

#define RETORT_ALWAYS_INLINE inline __attribute__((always_inline))

namespace retort::kernels {

// The one of three variants of a kernel that kernel_isa() allows.
template <typename Function>
Function variant_for_isa(Function avx512, Function avx2, Function baseline) {
  switch (kernel_isa()) {
    case Isa::avx512:
      return avx512;
    case Isa::avx2:
      return avx2;
    case Isa::baseline:
      break;
  }
  return baseline;
}

}  // namespace retort::kernels

// RETORT_ISA_VARIANTS(name, (params), (args), impl) defines `void name(params)` that calls
// `impl(args)`, impl being an always-inline template, in the variant for kernel_isa(). The
// choice is made on the first call and kept.
#if defined(__x86_64__) && defined(__GNUC__)
#define RETORT_ISA_VARIANTS(name, params, args, impl)                                           \
  __attribute__((                                                                               \
      target("avx512f,avx512bw,avx512vl,avx512dq"))) static void name##_variant_avx512 params { \
    impl args;                                                                                  \
  }                                                                                             \
  __attribute__((target("avx2"))) static void name##_variant_avx2 params {                      \
    impl args;                                                                                  \
  }                                                                                             \
  static void name##_variant_baseline params {                                                  \
    impl args;                                                                                  \
  }                                                                                             \
  void name params {                                                                            \
    using Variant = void(*) params;                                                             \
    static const Variant chosen = ::retort::kernels::variant_for_isa<Variant>(                  \
        name##_variant_avx512, name##_variant_avx2, name##_variant_baseline);                   \
    chosen args;                                                                                \
  }
#else
#define RETORT_ISA_VARIANTS(name, params, args, impl) \
  void name params {                                  \
    impl args;                                        \
  }
#endif
