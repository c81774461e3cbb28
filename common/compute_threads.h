// common/compute_threads.h: one thread count for a step's compute, torch's intra-op (OpenMP)
// workers, on which the BLAS (MKL) runs too, so the GEMM peak behind MFU and the step run
// with the same threading.
#pragma once
#include <torch/torch.h>

namespace retort {

inline void set_compute_threads(int threads) {
  torch::set_num_threads(threads);  // MKL's count as well
}

}  // namespace retort
