// kernels/simd_clones.h: RETORT_SIMD_CLONES marks a function to be compiled for AVX-512,
// AVX2 and baseline x86-64 and picked at load time by CPU feature (GCC target_clones), so
// one binary runs on any x86-64 and its loops use the widest vectors the CPU has. Clones are
// named by feature on purpose: clones named by CPU model ("arch=haswell") are chosen only on
// that exact model, and an AMD EPYC got the scalar default, ten times slower.
// RETORT_ALWAYS_INLINE puts a loop body into each clone, compiled for that clone's ISA.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RETORT_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RETORT_SIMD_CLONES
#endif
#define RETORT_ALWAYS_INLINE inline __attribute__((always_inline))
