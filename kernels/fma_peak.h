// kernels/fma_peak.h: the CPU's own fp32 bound, the denominator of MFU: independent chains of
// fused multiply-adds (more chains than their latency times their throughput), no memory, in
// the widest vectors kernel_isa() allows. A matrix product can approach this rate, never pass
// it, so an MFU against it stays below 100%.
#pragma once
#include <cstdint>

namespace retort::kernels {

// Runs `iterations` rounds on the calling thread. Returns the floating-point operations done
// (an FMA counts two); *sink gets a value of the chains, so the work cannot be optimised away.
double fma_chains(int64_t iterations, float* sink);

}  // namespace retort::kernels
